"""`probe-links`: a receiver-verified link transfer, recorded as a `:link/*` observation.

    python -m kotoba_vllm probe-links --listen 9100            # on the receiving host
    python -m kotoba_vllm probe-links --send b:9100 --bytes 67108864 --spec s.edn --boundary a:b
"""

from __future__ import annotations

import argparse
import sys

from .._edn import dumps, kw, pretty, read_file
from ..distributed._probe import listen, observation, receive_one, send
from ..distributed._spec import link_to_edn

HELP = "measure a link with a receiver-verified transfer and record it (optionally into a spec)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_mutually_exclusive_group(required=True)
    g.add_argument("--listen", type=int, metavar="PORT", help="receive transfers on PORT")
    g.add_argument("--send", metavar="HOST:PORT", help="send to a listening receiver")
    parser.add_argument("--bytes", type=int, default=64 * 1024 * 1024, help="payload size (default 64 MiB)")
    parser.add_argument("--count", type=int, default=1, help="--listen: transfers to accept before exiting")
    parser.add_argument("--spec", help="--send: a spec whose :dist/links gets the observation")
    parser.add_argument("--boundary", metavar="A:B", help="--send: the node names at each end")
    parser.add_argument("--in-place", action="store_true", help="rewrite --spec instead of printing it")
    parser.add_argument("--timeout", type=float, default=60.0)


def run(args: argparse.Namespace) -> int:
    if args.listen is not None:
        with listen(args.listen) as s:
            print(f"listening on {args.listen}", file=sys.stderr, flush=True)
            for _ in range(args.count):
                expected, counted, timed, ns = receive_one(s, args.timeout)
                print(dumps(link_to_edn(observation("sender", "receiver", expected, counted, ns,
                                                           timed=timed))), flush=True)
        return 0
    host, _, port = args.send.rpartition(":")
    frm, to = (args.boundary.split(":", 1) if args.boundary else ("sender", "receiver"))
    obs = send(host, int(port), args.bytes, frm, to, args.timeout)
    edn = link_to_edn(obs)
    if not args.spec:
        print(dumps(edn))
        return 0 if obs.failure is None else 1
    spec = read_file(args.spec)[0].value
    links = spec.setdefault(kw("dist/links"), []) if isinstance(spec, dict) else None
    if not isinstance(links, list):
        print(f"error: {args.spec}: expected a spec map whose :dist/links is a vector", file=sys.stderr)
        return 2
    links.append(edn)
    text = pretty(spec) + "\n"
    if args.in_place:
        with open(args.spec, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(dumps(edn))
    else:
        sys.stdout.write(text)
    return 0 if obs.failure is None else 1
