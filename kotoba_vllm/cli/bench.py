"""`bench --base-url URL [--base-url URL2 ...]`: streamed load, prefill and decode apart, per endpoint."""

from __future__ import annotations

import argparse
import sys

from .._edn import EdnError, pretty
from .._errors import PromptError
from ..bench._prompts import chat, load_prompts
from ..bench._report import plot, render_table, to_edn
from ..bench._runner import BenchConfig, PoolTarget, build_prompts, run as run_bench
from ..dialects import DIALECTS
from ..pool import load_pool_config

HELP = ("Benchmark one or more endpoints (streamed): TTFT, prefill and decode rates apart, inter-token and "
        "end-to-end latency per endpoint, checked against the server's own /metrics.")

DEFAULT_PROMPT = "Write a short paragraph about rivers."


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"concurrency levels are integers separated by commas, got {text!r}")
    if not levels or any(c < 1 for c in levels):
        raise argparse.ArgumentTypeError("concurrency levels must be >= 1")
    return levels


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", action="append", metavar="URL",
                   help="an endpoint to measure; repeat for several (each is measured and reported on its own)")
    p.add_argument("--pool", action="append", metavar="FILE.edn",
                   help="a pool file ({:pool/members [...]}): requests go through the pool's admission; "
                        "rows are per answering member")
    p.add_argument("--backend", "-b", choices=["auto", *sorted(DIALECTS)], default="auto")
    p.add_argument("--prompts", metavar="FILE.edn", help="EDN file of strings and/or :vllm/* request maps")
    p.add_argument("--prompt", action="append", metavar="TEXT", help="a user message (repeatable)")
    p.add_argument("--long-prompt-tokens", type=int, metavar="N",
                   help="add a prompt of about N tokens (sized with the server's tokenizer), where prefill dominates")
    p.add_argument("--concurrency", type=_levels, default=(1,), metavar="1,4,16",
                   help="concurrency levels, run one after another (default 1)")
    p.add_argument("--requests", type=int, default=8, metavar="N", help="requests per endpoint per level (default 8)")
    p.add_argument("--max-tokens", type=int, default=32, metavar="N",
                   help="max tokens per answer unless the request sets its own (default 32)")
    p.add_argument("--model", help="model name to send")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="per-request timeout (default 300 s)")
    p.add_argument("--warmup", type=int, default=1, metavar="N", help="unmeasured requests per endpoint first (default 1)")
    p.add_argument("--reuse-cache", action="store_true",
                   help="let the prefix cache serve repeated prompts (default: a nonce makes every prefill real)")
    p.add_argument("--no-metrics", action="store_true", help="do not read the servers' /metrics")
    p.add_argument("--output", "-o", metavar="FILE.edn", help="write the EDN report here")
    p.add_argument("--plot", metavar="FILE.png", help="draw latency distributions per endpoint (PNG)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    if args.requests < 1:
        print("error: --requests must be >= 1", file=sys.stderr)
        return 2
    targets = tuple(dict.fromkeys(u.rstrip("/") for u in args.base_url or ()))
    pools = []
    for path in args.pool or ():
        try:
            pc = load_pool_config(path)
        except (EdnError, OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        pools.append(PoolTarget(label=f"pool {path}", members=pc.members,
                                backend=args.backend if args.backend != "auto" else pc.backend,
                                probe_timeout_s=pc.probe_timeout_s))
    if not targets and not pools:
        print("error: give at least one --base-url or --pool", file=sys.stderr)
        return 2
    first = targets[0] if targets else pools[0].members[0]
    try:
        prompts = load_prompts(args.prompts) if args.prompts else []
    except (EdnError, OSError, PromptError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    prompts += [chat(t) for t in args.prompt or ()]
    if not prompts and not args.long_prompt_tokens:
        prompts = [chat(DEFAULT_PROMPT)]
    try:
        prompts = build_prompts(prompts, args.long_prompt_tokens, first, args.backend)
    except Exception as e:  # noqa: BLE001 - the long prompt could not be sized: say so, do not guess
        print(f"error: could not build the long prompt against {first}: {e}", file=sys.stderr)
        return 1
    config = BenchConfig(base_urls=targets, prompts=tuple(prompts), backend=args.backend,
                         concurrency=args.concurrency, requests=args.requests, max_tokens=args.max_tokens,
                         model=args.model, timeout_s=args.timeout, warmup=args.warmup,
                         bust_cache=not args.reuse_cache, read_metrics=not args.no_metrics, pools=tuple(pools))
    report = run_bench(config, progress=not args.quiet)
    sys.stdout.write(render_table(report))
    edn = pretty(to_edn(report))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(edn + "\n")
    else:
        sys.stdout.write("\n" + edn + "\n")
    if args.plot:
        plot(report, args.plot)
    failed = all(not s.ok for s in report.samples)
    return 1 if failed else 0
