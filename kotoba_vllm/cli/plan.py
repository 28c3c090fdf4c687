"""`plan SPEC.edn [--engine E] [--format edn|sh]`: a distributed plan and its launch commands."""

from __future__ import annotations

import argparse
import sys

from .._edn import dumps, kw, pretty
from ..distributed import commands_to_edn, emit, plan_file, shell_lines

HELP = "plan a distributed deployment from an EDN spec and print the engines' launch commands"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="distributed spec (.edn, - for stdin)")
    parser.add_argument("--engine", choices=("vllm", "sglang", "llamacpp"), help="overrides :dist/engine")
    parser.add_argument("--format", choices=("edn", "sh"), default="edn",
                        help="edn: the plan with its commands; sh: shell lines, one per command")


def run(args: argparse.Namespace) -> int:
    p, problems = plan_file(args.spec, args.engine)
    errors = [x for x in problems if x.is_error]
    for w in problems:
        if not w.is_error:
            print(dumps(w.to_edn()), file=sys.stderr)
    if p is None or errors:
        for e in errors:
            print(dumps(e.to_edn()))
        return 1
    cmds = emit(p)
    if args.format == "sh":
        sys.stdout.write("".join(f"# {line}\n" for line in p.why))
        sys.stdout.write(shell_lines(cmds))
    else:
        out = p.to_edn()
        out[kw("plan/commands")] = commands_to_edn(cmds)
        print(pretty(out))
    return 0
