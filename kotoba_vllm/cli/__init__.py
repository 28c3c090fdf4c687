"""`python -m kotoba_vllm COMMAND ...` — each command lives in its own module.

A command module defines `HELP` (one line), `add_arguments(parser)` and
`run(args) -> int` (the exit status).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

COMMANDS: dict[str, str] = {
    "render": "kotoba_vllm.cli.render",
    "validate": "kotoba_vllm.cli.validate",
    "run": "kotoba_vllm.cli.run",
    "local": "kotoba_vllm.cli.local",
    "record": "kotoba_vllm.cli.record",
    "capacity": "kotoba_vllm.cli.capacity",
    "inspect": "kotoba_vllm.cli.inspect",
    "plan": "kotoba_vllm.cli.plan",
    "probe-links": "kotoba_vllm.cli.probe_links",
    "bench": "kotoba_vllm.cli.bench",
    "lora": "kotoba_vllm.cli.lora",
    "cache": "kotoba_vllm.cli.cache",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or (`only`) just that command: importing every command module
    (Ray planning, benchmarks, recording) would be start-up time paid by every `run`."""
    parser = argparse.ArgumentParser(prog="python -m kotoba_vllm",
                                     description="EDN-native client for vLLM, SGLang and llama.cpp servers.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, modname in COMMANDS.items():
        if only is not None and name != only:
            continue
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name == modname:
                continue  # command not built yet
            raise
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words[0] if words and words[0] in COMMANDS else None)
    args = parser.parse_args(words)
    if not getattr(args, "_run", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
