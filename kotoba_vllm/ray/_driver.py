"""`run INPUT --ray -o DIR`: the whole pipeline on Ray Data, from the driver's side.

read (numbered, streaming) -> RequestStage actors (pool, bounded in flight, intent log)
-> part files in DIR + DIR/summary.edn. The driver holds task references and counts, never the
requests or records. The intent log lives in DIR/.intent until every input has a record.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections import Counter
from typing import Any

import ray
import ray.data

from .._edn import EdnError, kw, pretty
from .._errors import ConfigError, LocalServerError
from ..local import LlamaServer
from ..pool import load_pool_config
from ._read import detect_input_format, read_requests
from ..batch._flow import DEFAULT_HEADROOM
from ._stage import RequestStage
from ._summary import summary_edn
from ._write import done_indices, part_files, records_datasink

INTENT_DIR = ".intent"
SUMMARY = "summary.edn"


def run_pipeline(input_path: str, output_dir: str, *, pool: Any, input_format: str | None = None,
                 output_format: str | None = None, resume: bool = False, block_rows: int = 256,
                 actors: int = 2, actor_cpus: float = 0.5, concurrency: int = 8, timeout: float | None = None,
                 backend: str = "auto", stage: type[RequestStage] = RequestStage,
                 stage_kwargs: dict[str, Any] | None = None, flow_control: bool = True, requeue_rejected: int = 0,
                 headroom: int = DEFAULT_HEADROOM) -> dict[str, Any]:
    """Send every request of `input_path` through Ray Data (already initialised) into `output_dir`.
    Returns the counts (`outcomes`, `rows`, `sent`, `maybe_sent_twice`, `files`, `already_done`);
    writes `summary.edn`. `stage` and `stage_kwargs` let a caller run its own subclass."""
    started = time.perf_counter()
    in_fmt = detect_input_format(input_path, input_format)
    out_fmt = output_format or ("parquet" if in_fmt == "parquet" else "jsonl")
    if part_files(output_dir) and not resume:
        raise ConfigError(f"{output_dir} already holds records; resume to complete it, "
                              "or choose an empty directory")
    os.makedirs(output_dir, exist_ok=True)
    skip = done_indices(output_dir) if resume else None
    intent = os.path.abspath(os.path.join(output_dir, INTENT_DIR))
    sink = records_datasink(output_dir, out_fmt)
    ds = read_requests(input_path, in_fmt, block_rows=block_rows, skip=skip)
    kwargs = {"pool": pool, "backend": backend, "concurrency": concurrency, "timeout": timeout,
              "intent_dir": intent, "flow_control": flow_control, "batch_lines": out_fmt == "jsonl",
              "requeue_rejected": requeue_rejected, "headroom": headroom,
              **(stage_kwargs or {})}
    ds = ds.map_batches(stage, batch_size=block_rows, batch_format="pyarrow",
                        compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=actor_cpus,
                        fn_constructor_kwargs=kwargs)
    ds.write_datasink(sink, ray_remote_args={"num_cpus": 0.25})
    shutil.rmtree(intent, ignore_errors=True)  # every input has its record now
    stats = dict(sink.stats, already_done=0 if skip is None else len(skip))
    summary = summary_edn(stats, already_done=stats["already_done"], elapsed_s=time.perf_counter() - started,
                          output=output_dir)
    stats["summary"] = summary
    with open(os.path.join(output_dir, SUMMARY), "w", encoding="utf-8") as fh:
        fh.write(pretty(summary) + "\n")
    return stats


def run_ray(args: argparse.Namespace) -> int:
    """The CLI's `--ray` path."""
    out = args.output
    if not out:
        print("error: --ray needs -o OUTPUT_DIR", file=sys.stderr)
        return 2
    if args.file == "-" or not os.path.exists(args.file):
        print(f"error: {args.file}: --ray reads a file (EDN, JSONL or Parquet)", file=sys.stderr)
        return 2
    if args.api_key:
        print("error: with --ray the API key reaches workers only through their environment: set "
              "KOTOBA_VLLM_API_KEY where the workers run (a local Ray started here inherits this shell's)",
              file=sys.stderr)
        return 2
    if os.path.exists(out) and not os.path.isdir(out):
        print(f"error: {out} exists and is not a directory", file=sys.stderr)
        return 2
    if part_files(out) and not args.resume:
        print(f"error: {out} already holds records; --resume completes it, or choose an empty directory",
              file=sys.stderr)
        return 2
    pool: Any = list(args.base_url or []) or None
    if args.pool:
        try:
            pool = load_pool_config(args.pool)  # read here: workers need not see the file
        except (EdnError, ValueError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if pool is None and not args.local and os.environ.get("KOTOBA_VLLM_BASE_URL"):
        pool = [os.environ["KOTOBA_VLLM_BASE_URL"]]
    if pool is None and not args.local:
        print("error: --ray needs --pool, --base-url, $KOTOBA_VLLM_BASE_URL or --local", file=sys.stderr)
        return 2

    server = None
    started_ray = False
    try:
        if args.local:
            try:
                server = LlamaServer(args.model, n_ctx=2048, parallel=2).start()
            except LocalServerError as e:
                print(f"error: could not start a local llama-server: {e}", file=sys.stderr)
                return 3
            print(f";; local llama-server at {server.base_url}", file=sys.stderr)
            pool = [server.base_url]
        if not ray.is_initialized():  # a caller's own ray.init() wins
            # "local" starts a Ray here even when `ray start` left one running; --ray-address auto joins it.
            ray.init(address=args.ray_address or "local", include_dashboard=False if not args.ray_address
                     else None, log_to_driver=False)
            started_ray = True
        ray.data.DataContext.get_current().enable_progress_bars = not args.no_progress
        backend = "llamacpp" if args.local and args.backend == "auto" else args.backend
        try:
            stats = run_pipeline(args.file, out, pool=pool, input_format=args.input_format,
                                 output_format=args.format, resume=args.resume, block_rows=args.block_rows,
                                 actors=args.ray_actors, actor_cpus=args.ray_actor_cpus,
                                 concurrency=args.concurrency, timeout=args.timeout, backend=backend,
                                 flow_control=args.flow_control != "off", requeue_rejected=args.requeue_rejected,
                                 headroom=args.headroom)
        except EdnError as e:  # the file's shape, found while planning its read (e.g. '[' never closed)
            print(f"error: {e}", file=sys.stderr)
            return 2
    finally:
        if started_ray:
            ray.shutdown()
        if server is not None:
            server.stop()
    outcomes: Counter[str] = stats["outcomes"]
    parts = " ".join(f"{k}={n}" for k, n in sorted(outcomes.items())) or "nothing"
    already = stats["already_done"]
    twice = stats["maybe_sent_twice"]
    print(f";; ray batch complete: {stats['rows']} records ({parts}) in {stats['files']} files"
          f"{f', {already} already done' if already else ''}; {stats['sent']} sent"
          f"{f', {twice} maybe sent twice' if twice else ''}; {os.path.join(out, SUMMARY)}", file=sys.stderr)
    if args.summary:
        with open(args.summary, "w", encoding="utf-8") as fh:
            fh.write(pretty(stats["summary"]) + "\n")
    return 1 if any(k != "ok" for k in outcomes) else 0
