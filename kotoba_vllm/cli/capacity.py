"""`capacity URL... [--backend B]`: every member's capacity answer, then the pool's, as EDN."""

from __future__ import annotations

import argparse

import httpx

from .._edn import Edn, Keyword, kw
from ..capacity import ALL_SLOTS_BUSY, SLOT_AVAILABLE, merge_pool_capacity, probe_endpoints
from ..capacity._probe import PROBE_TIMEOUT, now_iso
from .._wire import default_sync_wire
from .._wire_core import PROBE_MAX_BYTES
from ..distributed import DIFFERS, UNVERIFIABLE, check_servers, plan_file
from ._common import add_endpoint_arguments, bounded_probe_wire, emit, endpoints_from, probe_headers

HELP = ("Ask every server's capacity at once (llama.cpp slots, vLLM/SGLang running and waiting) and print each "
        "answer and the merged pool answer as EDN.")

EXIT = {SLOT_AVAILABLE: 0, ALL_SLOTS_BUSY: 1}  # anything else (unmeasured): 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_endpoint_arguments(p, "the pool members, in pool order")
    p.add_argument("--timeout", type=float, default=None,
                   help=f"probe timeout in seconds (default {PROBE_TIMEOUT.read}; connect {PROBE_TIMEOUT.connect})")
    p.add_argument("--server-load-tracked", action="store_true",
                   help="the vLLM members run with --enable-server-load-tracking: ask /load and report its "
                        "number (otherwise vLLM answers 0 whatever the load, and it is not asked)")
    p.add_argument("--pretty", action="store_true", help="pretty-print EDN")
    p.epilog = "exit status: 0 a member has a measured free slot, 1 every member measured busy, 3 unmeasured"


def run(args: argparse.Namespace) -> int:
    got = endpoints_from(args)
    if got is None:
        return 2
    urls, backend, cfg = got.urls, got.backend, got.pool
    load_tracked = bool(args.server_load_tracked)
    timeout = PROBE_TIMEOUT if args.timeout is None else httpx.Timeout(args.timeout, connect=min(0.5, args.timeout))
    if cfg is not None:
        load_tracked = load_tracked or cfg.server_load_tracked
        if args.timeout is None and cfg.probe_timeout_s:
            timeout = httpx.Timeout(cfg.probe_timeout_s, connect=min(0.5, cfg.probe_timeout_s))
    headers = probe_headers(args.api_key)  # the key is never echoed into a :capacity/reason
    # over http.client: each probe's deadline holds every read (a trickling member cannot hold the command)
    wire = default_sync_wire(headers, True, httpx.Limits(), PROBE_MAX_BYTES)
    try:
        answers = probe_endpoints(urls, backend or "auto", http=wire, timeout=timeout, load_tracked=load_tracked)
    finally:
        wire.close()
    for a in answers:
        emit(a.to_edn(), pretty_print=args.pretty)
    pool = merge_pool_capacity(answers, at=now_iso())
    emit(pool.to_edn(), pretty_print=args.pretty)
    if cfg is not None and cfg.plan is not None:
        emit(drift_report(cfg.plan, urls, headers), pretty_print=args.pretty)
    return EXIT.get(pool.verdict, 3)


def drift_report(spec_path: str, urls: list[str], headers: dict[str, str]) -> dict[Keyword, Edn]:
    """`{:pool/plan "spec.edn" :pool/drifted [...] :pool/unverifiable [...]}`: the members whose reported
    configuration differs from the plan the pool file names (each with the differing properties)."""
    out: dict[Keyword, Edn] = {kw("pool/plan"): spec_path}
    p, problems = plan_file(spec_path)
    if p is None:
        out[kw("pool/plan-problems")] = [x.to_edn() for x in problems if x.is_error]
        return out
    wire = bounded_probe_wire(headers)
    try:
        checks = check_servers(p, urls, http=wire)
    finally:
        wire.close()
    out[kw("pool/drifted")] = [{kw("check/endpoint"): c.endpoint,
                                kw("check/properties"): [d.to_edn() for d in c.differs()]}
                               for c in checks if c.verdict == DIFFERS]
    out[kw("pool/unverifiable")] = [c.endpoint for c in checks if c.verdict == UNVERIFIABLE]
    return out
