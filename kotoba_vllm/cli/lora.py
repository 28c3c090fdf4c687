"""`lora list|load|unload|scale`: the LoRA adapters a server holds, as typed calls (answers in EDN)."""

from __future__ import annotations

import argparse
import sys

from .._endpoint_calls import scale_request
from .._model import LoraListRequest, LoraLoadRequest, LoraUnloadRequest, Request
from ._control import add_server_arguments, run_control

HELP = ("LoRA adapters: list them (every engine), load/unload one (vLLM, SGLang), or set the scales of those "
        "loaded at start (llama.cpp); the answer as EDN.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("verb", choices=["list", "load", "unload", "scale"])
    p.add_argument("name", nargs="?", help="load/unload: the adapter's name (what requests then use as model)")
    p.add_argument("path", nargs="?", help="load: the adapter's directory on the server")
    p.add_argument("--scale", action="append", default=[], metavar="ID=SCALE",
                   help="scale (llama.cpp): an adapter id and its scale, e.g. 0=0.5 (0 switches it off); repeatable")
    add_server_arguments(p)


def _request(args: argparse.Namespace) -> Request | str:
    if args.verb == "list":
        return LoraListRequest()
    if args.verb == "scale":
        scales: dict[int, float] = {}
        for item in args.scale:
            ident, eq, value = item.partition("=")
            try:
                scales[int(ident)] = float(value)
            except ValueError:
                return f"--scale {item!r} is not ID=SCALE (e.g. 0=0.5)"
            if not eq:
                return f"--scale {item!r} is not ID=SCALE (e.g. 0=0.5)"
        return scale_request(scales) if scales else "scale needs at least one --scale ID=SCALE"
    if not args.name:
        return f"{args.verb} needs the adapter's name"
    if args.verb == "unload":
        return LoraUnloadRequest(lora_name=args.name)
    if not args.path:
        return "load needs the adapter's name and its path on the server"
    return LoraLoadRequest(lora_name=args.name, lora_path=args.path)


def run(args: argparse.Namespace) -> int:
    return run_control(args, _request)
