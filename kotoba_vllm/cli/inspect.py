"""`inspect URL... [--backend B]`: what each server says it runs, one EDN map per endpoint."""

from __future__ import annotations

import argparse

import httpx

from ..server_config import CONFIG_TIMEOUT, server_configs
from ._common import add_endpoint_arguments, bounded_probe_wire, emit, endpoints_from, probe_headers

HELP = ("Ask each server what it runs (engine and version, model, context, slots, parallel sizes, speculative "
        "decoding, disaggregation, KV cache, quantization, modalities, sleep state) and print one EDN map per "
        "endpoint, every field with its source or :unreported.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_endpoint_arguments(p, "each is asked what it runs")
    p.add_argument("--timeout", type=float, default=None,
                   help=f"per-request timeout in seconds (default {CONFIG_TIMEOUT.read})")
    p.add_argument("--pretty", action="store_true", help="pretty-print EDN")
    p.epilog = "exit status: 0 every endpoint answered, 3 some endpoint is unmeasured, 2 bad arguments"


def run(args: argparse.Namespace) -> int:
    got = endpoints_from(args)
    if got is None:
        return 2
    timeout = CONFIG_TIMEOUT if args.timeout is None else httpx.Timeout(args.timeout, connect=min(1.0, args.timeout))
    wire = bounded_probe_wire(probe_headers(args.api_key))
    try:
        configs = server_configs(got.urls, got.backend or "auto", http=wire, timeout=timeout)
    finally:
        wire.close()
    for c in configs:
        emit(c.to_edn(), pretty_print=args.pretty)
    return 0 if all(c.measured for c in configs) else 3
