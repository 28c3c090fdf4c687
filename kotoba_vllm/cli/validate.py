"""`validate FILE... [--backend B]`: problems as EDN; non-zero exit on any error."""

from __future__ import annotations

import argparse
import sys

from .._edn import EdnError, kw
from .._validate import validate
from ..dialects import DIALECTS
from ..batch import with_request_ids
from ..batch._media import with_local_media
from ._common import emit, iter_request_entries

HELP = "Check request files: ranges, unknown keys, and what the chosen engine honours. Exit 1 on any error."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", help="EDN request files ('-' for stdin)")
    p.add_argument("--backend", "-b", choices=sorted(DIALECTS), default=None,
                   help="also check what this engine honours")


def run(args: argparse.Namespace) -> int:
    status = 0
    for path in args.files:
        try:
            for entry in with_request_ids(with_local_media(iter_request_entries(path))):  # streamed: a 1,000,000-request file in flat memory
                problems = list(entry.problems)
                if entry.request is not None:
                    problems += entry.located(validate(entry.request, args.backend))
                for p in problems:
                    rec = p.to_edn()
                    rec.setdefault(kw("vllm/where"), entry.where)
                    rec[kw("vllm/request-index")] = entry.index
                    emit(rec)
                    if p.is_error:
                        status = 1
        except (EdnError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            status = 1
    return status
