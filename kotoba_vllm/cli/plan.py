"""`plan SPEC.edn [--engine E] [--format edn|sh] [--check URL... [--strict]]`: a distributed plan and its
launch commands, or the plan held against the servers that should be running it."""

from __future__ import annotations

import argparse
import sys

from .._edn import dumps, kw, pretty
from ..distributed import check_exit, check_servers, commands_to_edn, emit, plan_file, shell_lines, unknown_flags
from ._common import emit as emit_edn
from ._common import bounded_probe_wire, probe_headers

HELP = "plan a distributed deployment from an EDN spec and print the engines' launch commands"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="distributed spec (.edn, - for stdin)")
    parser.add_argument("--engine", choices=("vllm", "sglang", "llamacpp"), help="overrides :dist/engine")
    parser.add_argument("--format", choices=("edn", "sh"), default="edn",
                        help="edn: the plan with its commands; sh: shell lines, one per command")
    parser.add_argument("--check", nargs="+", metavar="URL",
                        help="ask these servers what they run and compare each property the plan fixes")
    parser.add_argument("--strict", action="store_true",
                        help="with --check: a property the servers do not report also fails (exit 1)")
    parser.add_argument("--api-key", help="bearer token for --check (also $KOTOBA_VLLM_API_KEY); never printed")
    parser.add_argument("--pretty", action="store_true", help="with --check: pretty-print EDN")
    parser.epilog = ("exit status: 0 a plan (with --check: nothing differs), 1 problems, an emitted flag its engine "
                     "does not define, or (--check) a property differs (--strict: or is unverifiable)")


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
    if args.check:
        wire = bounded_probe_wire(probe_headers(args.api_key))
        try:
            checks = check_servers(p, args.check, http=wire)
        finally:
            wire.close()
        for check in checks:
            emit_edn(check.to_edn(), pretty_print=args.pretty)
        return check_exit(checks, strict=args.strict)
    cmds = emit(p)
    unknown = [(c, unknown_flags(c)) for c in cmds]
    bad = [(c, label, flags) for c, (label, flags) in unknown if flags]
    for c, label, flags in bad:
        print(f"error: node {c.node} ({c.role}): {label} does not define {' '.join(flags)}", file=sys.stderr)
    if args.format == "sh":
        sys.stdout.write("".join(f"# {line}\n" for line in p.why))
        sys.stdout.write(shell_lines(cmds))
    else:
        out = p.to_edn()
        out[kw("plan/commands")] = commands_to_edn(cmds)
        print(pretty(out))
    return 1 if bad else 0
