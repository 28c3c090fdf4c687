"""`cache reset|save|restore|erase`: a server's prefix cache, as typed calls (answers in EDN)."""

from __future__ import annotations

import argparse

from .._model import CacheResetRequest, Request, SlotRequest
from ._control import add_server_arguments, run_control

HELP = ("Prefix cache control: reset it (vLLM /reset_prefix_cache, SGLang /flush_cache), or save, restore or "
        "erase one llama.cpp slot (--slot-save-path); the answer as EDN.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("verb", choices=["reset", "save", "restore", "erase"])
    p.add_argument("--slot", type=int, default=None, metavar="ID", help="save/restore/erase: the slot id")
    p.add_argument("--filename", default=None,
                   help="save/restore: a bare file name inside the server's --slot-save-path")
    add_server_arguments(p)


def _request(args: argparse.Namespace) -> Request | str:
    if args.verb == "reset":
        return CacheResetRequest()
    if args.slot is None:
        return f"{args.verb} needs --slot ID"
    # the filename rules (needed for save/restore, a bare name) are validation's: a problem, nothing sent
    return SlotRequest(action=args.verb, slot_id=args.slot, filename=args.filename)


def run(args: argparse.Namespace) -> int:
    return run_control(args, _request)
