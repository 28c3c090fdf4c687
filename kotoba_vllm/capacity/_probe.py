"""I/O shells for the capacity probes: GET every path of every member at once, with
short timeouts, and hand the bytes to the pure verdicts. Sync (threads) and async
(asyncio tasks) differ only at the call sites. The probes go over the clients' wires (`AsyncPool`
probes over aiohttp and `Pool` over http.client, as their members send; a caller's httpx client
through the httpx wires).

Every probe is bounded whole: its answer's size (`PROBE_MAX_BYTES`) and its time, connect to last
byte (`probe_deadline`: the connect plus the read timeout). A round never waits past that deadline
for a member: one still running is unmeasured ("probe deadline"), and the others are read.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import time
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Mapping, Protocol, Sequence

import httpx

from .._base_client import DETECTION_PROBES, USER_AGENT, decide_backend, server_root
from .._errors import ConfigError, RequestTimeout, TransportError, Unreachable
from .._model import BACKENDS
from .._wire import AsyncWire, HttpxSyncWire, HttpxWire, SyncWire
from .._wire_core import PROBE_MAX_BYTES
from ..dialects._http import decode_json
from ._answer import CapacityAnswer, PoolCapacity
from ._parse import Fetched, failure
from ._verdict import capacity_answer, merge_pool_capacity, probe_paths, unmeasured

# A probe that takes longer than this is itself the answer: unmeasured, with the reason.
PROBE_TIMEOUT = httpx.Timeout(1.5, connect=0.5)
DEFAULT_HEADERS = {"user-agent": USER_AGENT, "accept": "application/json, text/plain"}

Job = tuple[str, str]  # (base URL, path)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def probe_deadline(timeout: httpx.Timeout) -> float:
    """A whole probe's deadline: its connect plus its read timeout (2 s by default)."""
    return (timeout.connect or 0.0) + (timeout.read or PROBE_TIMEOUT.read or 1.5)


def _transport_reason(e: TransportError, timeout: httpx.Timeout) -> str:
    if isinstance(e, RequestTimeout) and e.phase == "connect":
        return f"connect timed out after {timeout.connect} s"
    if isinstance(e, RequestTimeout) and e.phase == "total":
        return f"probe deadline: no whole answer within {e.limit_s} s"
    if isinstance(e, RequestTimeout):
        return f"timed out after {timeout.read} s ({e.phase} timeout)"
    if isinstance(e, Unreachable):
        return f"connection refused or unreachable ({e.message})"
    return f"{type(e).__name__}: {e.message or 'no detail'}"


def _past_deadline(path: str, deadline_s: float) -> Fetched:
    return Fetched(path, error=f"probe deadline: no whole answer within {deadline_s} s", ms=deadline_s * 1000)


class _Got(Protocol):
    """What a probe reads of an answer: an httpx.Response, or a wire's answer."""

    @property
    def status_code(self) -> int: ...

    @property
    def content(self) -> bytes: ...


def _fetched(path: str, t0: float, r: _Got | None = None, error: str | None = None) -> Fetched:
    ms = round((time.perf_counter() - t0) * 1000, 3)
    if r is None:
        return Fetched(path, error=error, ms=ms)
    return Fetched(path, status=r.status_code, body=r.content, ms=ms)


# ------------------------------------------------------------------ pure glue


def detect_from(got: Sequence[Fetched]) -> tuple[str | None, str | None]:
    """Backend from the detection probes' answers (first hit in probe order). (None,
    reason) when no probe got any HTTP answer; "openai" when it answered but is none of
    the engines we know."""
    for f in got:
        if failure(f) is None and decide_backend(f.path, f.status or 0, decode_json(f.body)):
            return decide_backend(f.path, f.status or 0, decode_json(f.body)), None
    if all(f.error is not None for f in got):
        return None, "backend detection failed: " + "; ".join(failure(f) or "" for f in got)
    return "openai", None


def _check_backend(backend: str) -> None:
    if backend != "auto" and backend not in BACKENDS:
        raise ConfigError(f"backend must be one of auto, {', '.join(BACKENDS)}; got {backend!r}")


def _plan(endpoints: Sequence[str], backends: Sequence[str], load_tracked: bool = False) -> list[Job]:
    return [(e, p) for e, b in zip(endpoints, backends) for p in probe_paths(b, load_tracked)]


def _answers(endpoints: Sequence[str], backends: Sequence[str | None], reasons: Sequence[str | None],
             got: Mapping[Job, Fetched], at: str, load_tracked: bool = False) -> list[CapacityAnswer]:
    out = []
    for e, b, why in zip(endpoints, backends, reasons):
        if b is None:
            out.append(unmeasured(e, None, why or "backend unknown", at=at, reachable=False))
            continue
        paths = probe_paths(b, load_tracked)
        out.append(capacity_answer(e, b, {p: got[(e, p)] for p in paths}, at))
    return out


def _normalise(endpoints: Sequence[str], backend: str | Sequence[str]) -> tuple[list[str], list[str]]:
    eps = [server_root(e) for e in endpoints]  # an OpenAI-style ".../v1" is the same server
    bs = [backend] * len(eps) if isinstance(backend, str) else list(backend)
    if len(bs) != len(eps):
        raise ConfigError("one backend per endpoint")
    for b in bs:
        _check_backend(b)
    return eps, bs


# ------------------------------------------------------------------ sync


def fetch_all(http: httpx.Client | SyncWire, jobs: Sequence[Job], *, headers: Mapping[str, str] | None = None,
              timeout: httpx.Timeout = PROBE_TIMEOUT, executor: Executor | None = None) -> dict[Job, Fetched]:
    """GET every (base, path) concurrently over a sync wire (which carries its own headers; `headers` go
    on top) or an httpx client; a failure is recorded, never raised. Returns by the probe deadline."""
    wire: SyncWire = HttpxSyncWire(http, dict(headers or DEFAULT_HEADERS)) if isinstance(http, httpx.Client) else http
    deadline_s = probe_deadline(timeout)

    def one(job: Job) -> Fetched:
        base, path = job
        t0 = time.perf_counter()
        try:
            r = wire.send("GET", base + path, headers=headers, timeout=timeout, deadline_s=deadline_s,
                          max_bytes=PROBE_MAX_BYTES)
        except TransportError as e:
            return _fetched(path, t0, error=_transport_reason(e, timeout))
        return _fetched(path, t0, r)

    if not jobs:
        return {}
    own = executor is None
    pool = executor if executor is not None else ThreadPoolExecutor(max_workers=min(32, len(jobs)))
    try:
        futures: list[Future[Fetched]] = [pool.submit(one, j) for j in jobs]
        wait_futures(futures, timeout=deadline_s + 0.25)  # each probe ends itself by then; never wait past it
        return {j: f.result() if f.done() else _past_deadline(j[1], deadline_s) for j, f in zip(jobs, futures)}
    finally:
        if own:
            pool.shutdown(wait=False)


def probe_endpoints(endpoints: Sequence[str], backend: str | Sequence[str] = "auto", *,
                    http: httpx.Client | SyncWire | None = None, headers: Mapping[str, str] | None = None,
                    timeout: httpx.Timeout = PROBE_TIMEOUT, executor: Executor | None = None,
                    detected: dict[str, str] | None = None, load_tracked: bool = False) -> list[CapacityAnswer]:
    """Ask every endpoint at once; answers in endpoint order. `detected` caches
    auto-detected backends across calls (only successful detections are kept).
    `load_tracked`: the vLLM members run with --enable-server-load-tracking, so their `/load`
    is asked and its number kept (otherwise it reads 0 whatever the load)."""
    eps, bs = _normalise(endpoints, backend)
    own = http is None
    client = http or httpx.Client(timeout=timeout)
    try:
        at = now_iso()
        known, reasons = detect_all(client, eps, bs, headers=headers, timeout=timeout, detected=detected,
                                    executor=executor)
        got = fetch_all(client, _plan(eps, [b or "" for b in known], load_tracked), headers=headers,
                        timeout=timeout, executor=executor)
        return _answers(eps, known, reasons, got, at, load_tracked)
    finally:
        if own:
            client.close()


def probe_capacity(endpoint: str, backend: str = "auto", **kwargs: object) -> CapacityAnswer:
    """One endpoint's capacity answer (never raises for an unreachable server)."""
    # arg-type: kwargs are probe_endpoints' keyword arguments, passed through unchanged.
    return probe_endpoints([endpoint], backend, **kwargs)[0]  # type: ignore[arg-type]


def probe_pool(endpoints: Sequence[str], backend: str | Sequence[str] = "auto", **kwargs: object) -> PoolCapacity:
    """merge-pool-capacity over a live pool: every member asked, concurrently."""
    # arg-type: kwargs are probe_endpoints' keyword arguments, passed through unchanged.
    return merge_pool_capacity(probe_endpoints(endpoints, backend, **kwargs), at=now_iso())  # type: ignore[arg-type]


def _resolve(eps: Sequence[str], bs: Sequence[str], detected: Mapping[str, str] | None
             ) -> tuple[list[str | None], list[str | None]]:
    known: list[str | None] = [detected.get(e, b) if (b == "auto" and detected) else b for e, b in zip(eps, bs)]
    return known, [None] * len(eps)


def _apply_detection(eps: Sequence[str], known: list[str | None], reasons: list[str | None], todo: Sequence[int],
                     det: Mapping[Job, Fetched], detected: dict[str, str] | None) -> None:
    for i in todo:
        b, why = detect_from([det[(eps[i], p)] for p, _ in DETECTION_PROBES])
        known[i], reasons[i] = b, why
        if b is not None and detected is not None:
            detected[eps[i]] = b


# ------------------------------------------------------------------ async


async def afetch_all(http: httpx.AsyncClient | AsyncWire, jobs: Sequence[Job], *,
                     headers: Mapping[str, str] | None = None,
                     timeout: httpx.Timeout = PROBE_TIMEOUT) -> dict[Job, Fetched]:
    """GET every (base, path) at once over a wire (which carries its own headers; `headers` go on top)
    or an httpx client; a failure is recorded, never raised. A probe still running at the probe
    deadline is cancelled (its connection closed) and recorded as past it."""
    wire: AsyncWire = (HttpxWire(http, dict(headers or DEFAULT_HEADERS)) if isinstance(http, httpx.AsyncClient)
                       else http)
    deadline_s = probe_deadline(timeout)

    async def one(job: Job) -> Fetched:
        base, path = job
        t0 = time.perf_counter()
        try:
            r = await wire.send("GET", base + path, headers=headers, timeout=timeout, max_bytes=PROBE_MAX_BYTES)
        except TransportError as e:
            return _fetched(path, t0, error=_transport_reason(e, timeout))
        return _fetched(path, t0, r)

    if not jobs:
        return {}
    tasks = [asyncio.ensure_future(one(j)) for j in jobs]
    try:
        _, pending = await asyncio.wait(tasks, timeout=deadline_s)
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()  # closes its connection: the member's server stops sending
    return {j: t.result() if t.done() and not t.cancelled() and t not in pending else _past_deadline(j[1], deadline_s)
            for j, t in zip(jobs, tasks)}


async def aprobe_endpoints(endpoints: Sequence[str], backend: str | Sequence[str] = "auto", *,
                           http: httpx.AsyncClient | AsyncWire | None = None, headers: Mapping[str, str] | None = None,
                           timeout: httpx.Timeout = PROBE_TIMEOUT, detected: dict[str, str] | None = None,
                           load_tracked: bool = False) -> list[CapacityAnswer]:
    eps, bs = _normalise(endpoints, backend)
    own = http is None
    client = http or httpx.AsyncClient(timeout=timeout)
    try:
        at = now_iso()
        known, reasons = await adetect_all(client, eps, bs, headers=headers, timeout=timeout, detected=detected)
        got = await afetch_all(client, _plan(eps, [b or "" for b in known], load_tracked), headers=headers,
                               timeout=timeout)
        return _answers(eps, known, reasons, got, at, load_tracked)
    finally:
        if own:
            await client.aclose()


async def aprobe_capacity(endpoint: str, backend: str = "auto", **kwargs: object) -> CapacityAnswer:
    # arg-type: kwargs are aprobe_endpoints' keyword arguments, passed through unchanged.
    return (await aprobe_endpoints([endpoint], backend, **kwargs))[0]  # type: ignore[arg-type]


async def aprobe_pool(endpoints: Sequence[str], backend: str | Sequence[str] = "auto",
                      **kwargs: object) -> PoolCapacity:
    # arg-type: kwargs are aprobe_endpoints' keyword arguments, passed through unchanged.
    return merge_pool_capacity(await aprobe_endpoints(endpoints, backend, **kwargs), at=now_iso())  # type: ignore[arg-type]


# ------------------------------------------------------------------ detection for other probes


def detect_all(http: httpx.Client | SyncWire, endpoints: Sequence[str], backends: Sequence[str], *,
               headers: Mapping[str, str] | None = None, timeout: httpx.Timeout = PROBE_TIMEOUT,
               detected: dict[str, str] | None = None, executor: Executor | None = None
               ) -> tuple[list[str | None], list[str | None]]:
    """Each endpoint's backend (auto ones asked at once) and, where none was found, why."""
    known, reasons = _resolve(endpoints, backends, detected)
    todo = [i for i, b in enumerate(known) if b == "auto"]
    if todo:
        det = fetch_all(http, [(endpoints[i], p) for i in todo for p, _ in DETECTION_PROBES], headers=headers,
                        timeout=timeout, executor=executor)
        _apply_detection(endpoints, known, reasons, todo, det, detected)
    return known, reasons


async def adetect_all(http: httpx.AsyncClient | AsyncWire, endpoints: Sequence[str], backends: Sequence[str], *,
                      headers: Mapping[str, str] | None = None, timeout: httpx.Timeout = PROBE_TIMEOUT,
                      detected: dict[str, str] | None = None) -> tuple[list[str | None], list[str | None]]:
    known, reasons = _resolve(endpoints, backends, detected)
    todo = [i for i, b in enumerate(known) if b == "auto"]
    if todo:
        det = await afetch_all(http, [(endpoints[i], p) for i in todo for p, _ in DETECTION_PROBES],
                               headers=headers, timeout=timeout)
        _apply_detection(endpoints, known, reasons, todo, det, detected)
    return known, reasons


def normalise_endpoints(endpoints: Sequence[str], backend: str | Sequence[str]) -> tuple[list[str], list[str]]:
    """Server roots and one checked backend per endpoint (a ConfigError otherwise)."""
    return _normalise(endpoints, backend)
