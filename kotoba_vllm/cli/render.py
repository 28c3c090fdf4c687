"""`render FILE --backend B`: the HTTP request each engine would get, sending nothing."""

from __future__ import annotations

import argparse
import json
import re
import sys

from .._edn import EdnError, kw
from .._validate import validate
from ..dialects import DIALECTS, Dialect, get_dialect
from ._common import Entry, emit, iter_request_entries, problem_record

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
HELP = "Print the HTTP request each engine would receive for every request in FILE (nothing is sent)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE", help="EDN request files ('-' for stdin)")
    p.add_argument("--backend", "-b", choices=sorted(DIALECTS), default="openai",
                   help="engine dialect to render for (default: openai)")
    p.add_argument("--format", "-f", choices=("edn", "json"), default="edn",
                   help="edn: one EDN map per request; json: one JSON object per line with method, path, body")


def run(args: argparse.Namespace) -> int:
    dialect = get_dialect(args.backend)
    status = 0
    for path in args.files:
        try:
            for entry in iter_request_entries(path):  # streamed: each request is printed as it is read
                status |= _render(entry, dialect, args)
        except (EdnError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return status


def _render(entry: Entry, dialect: Dialect, args: argparse.Namespace) -> int:
    problems = list(entry.problems)
    if entry.request is not None:
        problems += entry.located(validate(entry.request, args.backend))
    errors = [p for p in problems if p.is_error]
    if errors or entry.request is None:
        rec = problem_record(entry, errors)
        rec[kw("vllm/backend")] = kw(args.backend)
        if args.format == "json":
            print(json.dumps({"error": "validation", "index": entry.index, "where": entry.where,
                              "problems": [str(p) for p in errors]}))
        else:
            emit(rec)
        return 1
    http = dialect.render(entry.request)
    if args.format == "json":
        text = json.dumps(http.to_json_obj(), ensure_ascii=False)
        if _LONE_SURROGATE.search(text):  # "\ud83d" alone has no UTF-8 form: keep JSON's escape
            text = json.dumps(http.to_json_obj())
        print(text)
    else:
        emit(http.to_edn())
    return 0
