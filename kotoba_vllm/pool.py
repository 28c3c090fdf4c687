"""`Pool` / `AsyncPool`: one client per member, early admission, conversation affinity.

Admission reads a shared capacity view (`capacity/_view.py`): one probe round over every
member at a time (short timeouts), at most `capacity_interval_s` old when read (0.5 s by
default; a request that finds it older takes the next round, and requests arriving during
a round wait for it), combined with the pool's own count of requests in flight per member.
Measured-busy members are demoted without re-sorting the rest; the request goes to:

- the conversation's earlier member while it has a free slot (prefix cache); a request
  *extends* an earlier one to count as its conversation (or names it: `conversation=`);
- else the member with a measured free slot and the fewest of our requests in flight;
- else, when some member could not be measured, the unmeasured one with the fewest of
  our requests in flight — admitted, and the response says `capacity/enforced? false`;
- else every member was measured busy within the bound and none has finished one of our
  requests since: `AdmissionRejected(reason="all-slots-busy", sent=False,
  capacity=<pool EDN>)` and nothing is sent.

`capacity_interval_s=0` probes before every request (the strictest view, the most probes).

One call, one HTTP request: a 429 (or any error) from the chosen member is raised as
is, never retried on another member behind the caller's back. Every response names
its member (`endpoint_url`, `extras["pool/member"]`).

`send`/`stream` take the same arguments as `Client.send`/`Client.stream` (plus an
optional `conversation=` id), so a pool can stand wherever a client does.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, AsyncIterator, Collection, Generic, Iterator, Mapping, Sequence, TypeVar, overload

import attrs
import httpx

from ._base_client import (DeadlineArg, MessagesInput, RequestInput, TimeoutArg, api_key_or_env, chat_request, client_headers,
                           identify, server_root, streaming, to_request)
from ._client import AsyncClient, AsyncStream, Client, CommonOptions, Stream
from ._wire import AsyncWire, HttpxSyncWire, HttpxWire, SyncWire, default_sync_wire, default_wire
from ._wire_core import DEFAULT_MAX_BYTES, PROBE_MAX_BYTES
from ._codec import BOOL, KW, MANY, NUM, STR, keep_extra_text
from ._edn import Edn, EdnMap, Keyword, kw, plain_edn, read_file
from ._errors import AdmissionRejected, ConfigError
from ._memo import IdentityMemo
from ._model import (BACKENDS, AnyResponse, DetokenizeRequest, DetokenizeResponse, EmbeddingRequest, EmbeddingResponse,
                     Request, Response, StreamDelta, TextRequest, TokenizeRequest, TokenizeResponse)
from .capacity._affinity import Affinity
from .capacity._answer import PoolCapacity
from .capacity._probe import PROBE_TIMEOUT, aprobe_endpoints, now_iso, probe_deadline, probe_endpoints
from .capacity._verdict import Admission, merge_pool_capacity
from .capacity._view import DEFAULT_INTERVAL_S, CapacityView

if TYPE_CHECKING:
    from typing_extensions import Unpack


class _PoolOptions(CommonOptions, total=False):
    """What `Pool(...)` and `AsyncPool(...)` take after their members, besides their own `http_client`."""

    probe_timeout: float | httpx.Timeout | None
    affinity_entries: int
    capacity_interval_s: float
    server_load_tracked: bool


class PoolOptions(_PoolOptions, total=False):
    """`Pool(...)`'s keyword arguments after its members (forwarded by `Pool.from_config`)."""

    http_client: httpx.Client | None


class AsyncPoolOptions(_PoolOptions, total=False):
    """`AsyncPool(...)`'s keyword arguments after its members."""

    http_client: httpx.AsyncClient | None


R = TypeVar("R", bound=Request)
C = TypeVar("C", Client, AsyncClient)  # a pool's member clients
_Result = TypeVar("_Result")  # what a background task answers
# How long the async pool keeps a probe connection idle: past the default interval plus a probe
PROBE_KEEPALIVE_S = 5.0

# ------------------------------------------------------------------ pool files


@attrs.frozen
class PoolConfig:
    """`{:pool/members ["http://a:8080" "http://b:8080"] :pool/backend :llamacpp :pool/probe-timeout-s 1.5}`.
    The API key never lives in the file: pass it, or set KOTOBA_VLLM_API_KEY.
    `:pool/server-load-tracked? true`: the vLLM members run with --enable-server-load-tracking, so
    their `/load` counts (untracked, vLLM answers 0 whatever the load, and it is not asked)."""

    # The "edn" metadata is the key table: the reader's known keys and schemas/pool.edn come from it.
    members: tuple[str, ...] = attrs.field(metadata={"edn": "pool/members", "codec": MANY(STR)})
    backend: str = attrs.field(default="auto", metadata={"edn": "pool/backend", "codec": KW("auto", *BACKENDS)})
    probe_timeout_s: float | None = attrs.field(default=None, metadata={"edn": "pool/probe-timeout-s", "codec": NUM})
    model: str | None = attrs.field(default=None, metadata={"edn": "pool/model", "codec": STR})
    server_load_tracked: bool = attrs.field(default=False,
                                            metadata={"edn": "pool/server-load-tracked?", "codec": BOOL})
    # seconds a probe round is read for before the next (0: a round before every request); None: the default
    capacity_interval_s: float | None = attrs.field(default=None,
                                                    metadata={"edn": "pool/capacity-interval-s", "codec": NUM})
    # the distributed spec the members are meant to serve (relative to the pool file): `capacity` holds each
    # member's reported configuration against its plan and says which drifted
    plan: str | None = attrs.field(default=None, metadata={"edn": "pool/plan", "codec": STR})


def pool_config_from_edn(m: Edn, where: str = "pool") -> PoolConfig:
    """Read a pool map; raises ValueError naming the key."""
    m = plain_edn(m)
    if not isinstance(m, dict):
        raise ConfigError(f"{where}: a pool is a map with :pool/members")
    known = {kw(a.metadata["edn"]) for a in attrs.fields(PoolConfig)}
    unknown = [k for k in m if k not in known]
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {' '.join(str(k) for k in unknown)}")
    members = m.get(kw("pool/members"))
    if not isinstance(members, (list, tuple)) or not members or not all(isinstance(u, str) for u in members):
        raise ConfigError(f"{where}: :pool/members must be a non-empty vector of URL strings")
    backend = m.get(kw("pool/backend"), kw("auto"))
    if not isinstance(backend, Keyword) or backend.name not in ("auto", *BACKENDS):
        raise ConfigError(f"{where}: :pool/backend must be one of :auto {' '.join(':' + b for b in BACKENDS)}")
    t = m.get(kw("pool/probe-timeout-s"))
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0):
        raise ConfigError(f"{where}: :pool/probe-timeout-s must be a positive number")
    model = m.get(kw("pool/model"))
    if model is not None and not isinstance(model, str):
        raise ConfigError(f"{where}: :pool/model must be a string")
    tracked = m.get(kw("pool/server-load-tracked?"), False)
    if not isinstance(tracked, bool):
        raise ConfigError(f"{where}: :pool/server-load-tracked? must be true or false")
    interval = m.get(kw("pool/capacity-interval-s"))
    if interval is not None and (isinstance(interval, bool) or not isinstance(interval, (int, float))
                                 or not interval >= 0 or interval == float("inf")):
        raise ConfigError(f"{where}: :pool/capacity-interval-s must be a number of seconds >= 0 (0 probes before "
                          f"every request), got {interval!r}")
    plan = m.get(kw("pool/plan"))
    if plan is not None and (not isinstance(plan, str) or not plan):
        raise ConfigError(f"{where}: :pool/plan must be the path of a distributed spec (a string)")
    return PoolConfig(tuple(u for u in members if isinstance(u, str)), backend.name, None if t is None else float(t),
                      model, tracked, None if interval is None else float(interval), plan)


def load_pool_config(path: str) -> PoolConfig:
    """Raises `EdnError` (located) or ValueError."""
    forms = read_file(path)
    if len(forms) != 1:
        raise ConfigError(f"{path}: expected exactly one pool map, found {len(forms)} forms")
    cfg = pool_config_from_edn(forms[0].value, forms[0].where)
    if cfg.plan is not None and not os.path.isabs(cfg.plan) and path != "-":
        cfg = attrs.evolve(cfg, plan=os.path.join(os.path.dirname(path), cfg.plan))
    return cfg


# ------------------------------------------------------------------ shared decisions


class _PoolCore(Generic[C]):
    clients: dict[str, C]

    def __init__(self, base_urls: Sequence[str], *, backend: str, probe_timeout: float | httpx.Timeout | None,
                 affinity_entries: int, capacity_interval_s: float = DEFAULT_INTERVAL_S,
                 server_load_tracked: bool = False) -> None:
        members = [server_root(u) for u in base_urls]  # ".../v1" names the same server
        if not members:
            raise ConfigError("a pool needs at least one member URL")
        dupes = sorted({u for u in members if members.count(u) > 1})
        if dupes:
            raise ConfigError(f"duplicate pool member(s): {', '.join(dupes)}")
        if backend != "auto" and backend not in BACKENDS:
            raise ConfigError(f"backend must be one of auto, {', '.join(BACKENDS)}; got {backend!r}")
        self.members: tuple[str, ...] = tuple(members)
        self.backend = backend
        self.probe_timeout = probe_timeout if isinstance(probe_timeout, httpx.Timeout) else (
            PROBE_TIMEOUT if probe_timeout is None else httpx.Timeout(probe_timeout, connect=min(0.5, probe_timeout)))
        self.affinity = Affinity(affinity_entries)
        self.server_load_tracked = server_load_tracked
        # how long past the interval the previous round may still be read while the next one runs: one
        # round's deadline (every probe ends by it), so a slow member never holds a decision
        self._round_limit_s = probe_deadline(self.probe_timeout) + 0.25
        self._detected: dict[str, str] = {}
        self.last_capacity: PoolCapacity | None = None
        self.view = CapacityView(self.members, capacity_interval_s)
        self._noted_cap: PoolCapacity | None = None  # the round `_notes` were made for
        self._notes: IdentityMemo[Admission, dict[str, Edn]] = IdentityMemo(1024)  # the round's admissions' extras

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self.members)!r}, backend={self.backend!r})"

    def _for_pool(self, req: R) -> R:
        # The pool picks the member; a URL baked into the request would bypass admission.
        return attrs.evolve(req, base_url=None) if req.base_url else req

    def _teach(self, client: Client | AsyncClient, member: str) -> None:
        b = self._detected.get(member)
        if b is not None and self.backend == "auto":
            client.learn_backend(member, b)  # the probe already detected it: no second detection

    def _place(self, req: Request, cap: PoolCapacity, conversation: str | None,
               among: Collection[str] | None = None) -> tuple[Admission, C]:
        """Choose a member for `req` on round `cap` (only from `among` when given) and count it in flight there
        (`_done` ends it); the member's client, taught the backend the probe detected."""
        self.last_capacity = cap
        adm = self.view.take(cap, self.affinity.lookup(req, conversation), among)
        if adm.member is None:
            # nothing was sent, so no dialect sent it: the request's id only
            raise identify(AdmissionRejected(
                f"every pool member ({len(self.members)}) was measured busy; nothing was sent",
                reason="all-slots-busy", sent=False, status=None, capacity=cap.to_edn()), req)
        client = self.clients[adm.member]
        self._teach(client, adm.member)
        return adm, client

    def _done(self, member: str) -> None:
        self.view.end(member, time.monotonic())

    def _annotate(self, resp: AnyResponse, adm: Admission, cap: PoolCapacity) -> AnyResponse:
        if not isinstance(resp, Response):
            return resp  # embeddings/tokenize answers: endpoint_url names the member
        return self._annotate_text(resp, adm, cap)

    def _annotate_text(self, resp: Response, adm: Admission, cap: PoolCapacity) -> Response:
        if self._noted_cap is not cap:
            self._noted_cap = cap
            self._notes.clear()
        # The same few admissions recur (the view hands out the ones it made): their extras are made once a
        # round, found by identity (an attrs hash is a Python call), and their EDN text is kept for the records
        notes = self._notes.get(id(adm))
        if notes is None:
            a = cap.answer_for(adm.member or "")
            notes = {"capacity/enforced?": adm.enforced, "pool/member": adm.member, "pool/why": adm.why}
            if a is not None:
                notes["capacity/verdict"] = kw(a.verdict)
            for name, v in notes.items():
                keep_extra_text(name, v)
            self._notes.keep(adm, notes)
        # `resp` is the answer our member client just made for this call and handed to nobody else: its
        # extras dict is added to in place (a copy of the whole response costs more than the rest of
        # the pool's work per request)
        resp.extras.update(notes)
        return resp


def _retrieve(f: "asyncio.Future[_Result]") -> None:
    if not f.cancelled():
        f.exception()


def _attach(e: AdmissionRejected, cap: PoolCapacity) -> AdmissionRejected:
    if e.capacity is None:
        e.capacity = cap.to_edn()
    return e


# ------------------------------------------------------------------ sync


class PoolStream:
    """A member's `Stream`, plus which member and why; `.response` carries the pool extras."""

    def __init__(self, pool: "Pool", inner: Stream, req: Request, adm: Admission, cap: PoolCapacity,
                 conversation: str | None) -> None:
        self._pool, self._inner, self._req, self._conv = pool, inner, req, conversation
        self.admission, self.capacity = adm, cap
        self.member: str = adm.member or ""
        self.response: Response | None = None
        self._open = True

    def _end(self) -> None:
        if self._open:
            self._open = False
            self._pool._done(self.member)

    @property
    def partial_text(self) -> str:
        return self._inner.partial_text

    @property
    def endpoint_url(self) -> str:
        return self._inner.endpoint_url

    def __iter__(self) -> Iterator[StreamDelta]:
        try:
            yield from self._inner
        finally:
            self._end()
        assert self._inner.response is not None  # the member's stream ended normally
        self.response = self._pool._annotate_text(self._inner.response, self.admission, self.capacity)
        self._pool.affinity.remember(self._req, self.member, self._conv)

    def until_done(self) -> Response:
        for _ in self:
            pass
        assert self.response is not None
        return self.response

    def close(self) -> None:
        self._end()
        self._inner.close()

    def __enter__(self) -> "PoolStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Pool(_PoolCore[Client]):
    """`Pool(["http://a:8080", "http://b:8080"], backend="llamacpp", api_key=...)`."""

    def __init__(self, base_urls: Sequence[str], *, backend: str = "auto", api_key: str | None = None,
                 timeout: float | httpx.Timeout | None = None, headers: Mapping[str, str] | None = None,
                 model: str | None = None, probe_timeout: float | httpx.Timeout | None = None,
                 affinity_entries: int = 4096, capacity_interval_s: float = DEFAULT_INTERVAL_S,
                 server_load_tracked: bool = False, http_client: httpx.Client | None = None,
                 deadline: float | None = None, stream_idle_s: float | None = None,
                 max_response_bytes: int = DEFAULT_MAX_BYTES) -> None:
        super().__init__(base_urls, backend=backend, probe_timeout=probe_timeout, affinity_entries=affinity_entries,
                         capacity_interval_s=capacity_interval_s, server_load_tracked=server_load_tracked)
        self._refresh = threading.Lock()
        self._round_lock = threading.Lock()
        self._round: threading.Thread | None = None  # the background probe round, if one runs
        self.model = model
        # `http_client`: the caller's httpx client for every member (its own performance, its proxies and mocks)
        self._own_http = http_client is None
        self.clients = {
            u: Client(u, backend=backend, api_key=api_key, timeout=timeout, headers=headers, model=model,
                      http_client=http_client, deadline=deadline, stream_idle_s=stream_idle_s,
                      max_response_bytes=max_response_bytes)
            for u in self.members}
        # Probes go the way the members' requests go: over one http.client wire for every member, or
        # over the caller's httpx client (its proxies, its mocks). The wire is shared by the probe threads.
        probe_headers = client_headers(api_key_or_env(api_key), headers)
        self._probe_wire: SyncWire = (
            HttpxSyncWire(http_client, probe_headers) if http_client is not None
            else default_sync_wire(probe_headers, True, httpx.Limits(max_keepalive_connections=None,
                                                                     keepalive_expiry=PROBE_KEEPALIVE_S),
                                   PROBE_MAX_BYTES))
        self._executor = ThreadPoolExecutor(max_workers=min(32, 4 * len(self.members)),
                                            thread_name_prefix="kotoba-capacity")

    @classmethod
    def from_config(cls, config: PoolConfig, **kwargs: Unpack[PoolOptions]) -> "Pool":
        kwargs.setdefault("backend", config.backend)
        kwargs.setdefault("probe_timeout", config.probe_timeout_s)
        kwargs.setdefault("model", config.model)
        kwargs.setdefault("server_load_tracked", config.server_load_tracked)
        if config.capacity_interval_s is not None:
            kwargs.setdefault("capacity_interval_s", config.capacity_interval_s)
        return cls(config.members, **kwargs)

    def close(self) -> None:
        if self._own_http:
            for c in self.clients.values():
                c.close()
            self._probe_wire.close()  # a caller's client is the caller's to close
        self._executor.shutdown(wait=False)

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def capacity(self) -> PoolCapacity:
        """merge-pool-capacity: every member asked at once (a new round; the view keeps it)."""
        started, starts = time.monotonic(), self.view.starts()
        answers = probe_endpoints(self.members, self.backend, http=self._probe_wire, timeout=self.probe_timeout,
                                  executor=self._executor, detected=self._detected,
                                  load_tracked=self.server_load_tracked)
        cap = merge_pool_capacity(answers, at=now_iso())
        self.view.record(cap, started, starts)
        return cap

    def _current(self) -> PoolCapacity:
        """The shared view, refreshed by one round when it is older than the interval. While that round
        runs (in the background), decisions read the previous one as long as it started at most the
        interval plus one round's deadline ago; with no round yet, or past that, they wait for one."""
        view = self.view
        if view.interval_s <= 0:
            return self.capacity()
        now = time.monotonic()
        if not view.fresh(now):
            if view.snapshot is not None and now - view.started <= view.interval_s + self._round_limit_s:
                self._start_round()
                return view.snapshot
            with self._refresh:
                if not view.fresh(time.monotonic()):
                    self.capacity()
        assert view.snapshot is not None
        return view.snapshot

    def _start_round(self) -> None:
        with self._round_lock:
            if self._round is None or not self._round.is_alive():
                self._round = threading.Thread(target=self._background_round, name="kotoba-capacity-round",
                                               daemon=True)
                self._round.start()

    def _background_round(self) -> None:
        with self._refresh:  # one round at a time: a waiting decision may have started one already
            if not self.view.fresh(time.monotonic()):
                self.capacity()

    def _admit(self, request: R, conversation: str | None) -> tuple[R, Admission, PoolCapacity, Client]:
        req = self._for_pool(request)
        cap = self._current()
        adm, client = self._place(req, cap, conversation)
        return req, adm, cap, client

    @overload
    def send(self, request: TextRequest, *, timeout: TimeoutArg = None, deadline: DeadlineArg = None,
             conversation: str | None = None, checked: bool = False) -> Response: ...
    @overload
    def send(self, request: EmbeddingRequest, *, timeout: TimeoutArg = None, deadline: DeadlineArg = None,
             conversation: str | None = None, checked: bool = False) -> EmbeddingResponse: ...
    @overload
    def send(self, request: TokenizeRequest, *, timeout: TimeoutArg = None, deadline: DeadlineArg = None,
             conversation: str | None = None, checked: bool = False) -> TokenizeResponse: ...
    @overload
    def send(self, request: DetokenizeRequest, *, timeout: TimeoutArg = None, deadline: DeadlineArg = None,
             conversation: str | None = None, checked: bool = False) -> DetokenizeResponse: ...
    @overload
    def send(self, request: RequestInput, *, timeout: TimeoutArg = None, deadline: DeadlineArg = None,
             conversation: str | None = None, checked: bool = False) -> AnyResponse: ...

    def send(self, request: RequestInput, *, timeout: TimeoutArg = None, deadline: DeadlineArg = None,
             conversation: str | None = None, checked: bool = False) -> AnyResponse:
        """Same as `Client.send`, through the pool."""
        req, adm, cap, client = self._admit(to_request(request), conversation)
        try:
            resp = client.send(req, timeout=timeout, deadline=deadline, checked=checked)
        except AdmissionRejected as e:
            raise _attach(e, cap)
        finally:
            self._done(adm.member or "")
        self.affinity.remember(req, adm.member or "", conversation)
        return self._annotate(resp, adm, cap)

    def stream(self, request: TextRequest | EdnMap, *, timeout: TimeoutArg = None, deadline: DeadlineArg = None,
               conversation: str | None = None) -> PoolStream:
        """Same as `Client.stream`, through the pool."""
        req, adm, cap, client = self._admit(streaming(request), conversation)
        try:
            inner = client.stream(req, timeout=timeout, deadline=deadline)
        except BaseException as e:
            self._done(adm.member or "")
            raise _attach(e, cap) if isinstance(e, AdmissionRejected) else e
        return PoolStream(self, inner, req, adm, cap, conversation)

    def chat(self, messages: MessagesInput, *, model: str | None = None, conversation: str | None = None,
             timeout: TimeoutArg = None, deadline: DeadlineArg = None, **sampling: object) -> Response:
        req = chat_request(messages, model if model is not None else self.model, None, False, sampling, None)
        return self.send(req, timeout=timeout, deadline=deadline, conversation=conversation)

    def stream_chat(self, messages: MessagesInput, *, model: str | None = None, conversation: str | None = None,
                    timeout: TimeoutArg = None, deadline: DeadlineArg = None, **sampling: object) -> PoolStream:
        req = chat_request(messages, model if model is not None else self.model, None, True, sampling, None)
        return self.stream(req, timeout=timeout, deadline=deadline, conversation=conversation)


# ------------------------------------------------------------------ async


class AsyncPoolStream:
    def __init__(self, pool: "AsyncPool", inner: AsyncStream, req: Request, adm: Admission, cap: PoolCapacity,
                 conversation: str | None) -> None:
        self._pool, self._inner, self._req, self._conv = pool, inner, req, conversation
        self.admission, self.capacity = adm, cap
        self.member: str = adm.member or ""
        self.response: Response | None = None
        self._open = True

    def _end(self) -> None:
        if self._open:
            self._open = False
            self._pool._done(self.member)

    @property
    def partial_text(self) -> str:
        return self._inner.partial_text

    @property
    def endpoint_url(self) -> str:
        return self._inner.endpoint_url

    async def __aiter__(self) -> AsyncIterator[StreamDelta]:
        try:
            async for d in self._inner:
                yield d
        finally:
            self._end()
        assert self._inner.response is not None  # the member's stream ended normally
        self.response = self._pool._annotate_text(self._inner.response, self.admission, self.capacity)
        self._pool.affinity.remember(self._req, self.member, self._conv)

    async def until_done(self) -> Response:
        async for _ in self:
            pass
        assert self.response is not None
        return self.response

    async def aclose(self) -> None:
        self._end()
        await self._inner.aclose()

    async def __aenter__(self) -> "AsyncPoolStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncPool(_PoolCore[AsyncClient]):
    """Asynchronous twin of `Pool`."""

    def __init__(self, base_urls: Sequence[str], *, backend: str = "auto", api_key: str | None = None,
                 timeout: float | httpx.Timeout | None = None, headers: Mapping[str, str] | None = None,
                 model: str | None = None, probe_timeout: float | httpx.Timeout | None = None,
                 affinity_entries: int = 4096, capacity_interval_s: float = DEFAULT_INTERVAL_S,
                 server_load_tracked: bool = False, http_client: httpx.AsyncClient | None = None,
                 deadline: float | None = None, stream_idle_s: float | None = None,
                 max_response_bytes: int = DEFAULT_MAX_BYTES) -> None:
        super().__init__(base_urls, backend=backend, probe_timeout=probe_timeout, affinity_entries=affinity_entries,
                         capacity_interval_s=capacity_interval_s, server_load_tracked=server_load_tracked)
        self.model = model
        self._round: asyncio.Future[PoolCapacity] | None = None  # the probe round under way, if any
        # how long past the interval the previous round may still be read while the next one runs
        # `http_client`: the caller's httpx client for every member (its own performance, its proxies and mocks)
        self._own_http = http_client is None
        self.clients = {
            u: AsyncClient(u, backend=backend, api_key=api_key, timeout=timeout, headers=headers, model=model,
                           http_client=http_client, deadline=deadline, stream_idle_s=stream_idle_s,
                           max_response_bytes=max_response_bytes)
            for u in self.members}
        # Probes go the way the members' requests go: over one aiohttp wire for every member (made
        # on first use), or over the caller's httpx client (its proxies, its mocks).
        probe_headers = client_headers(api_key_or_env(api_key), headers)
        self._probe_wire: AsyncWire = (
            HttpxWire(http_client, probe_headers) if http_client is not None
            else default_wire(probe_headers, self.probe_timeout, True,
                              httpx.Limits(max_connections=None, keepalive_expiry=PROBE_KEEPALIVE_S), PROBE_MAX_BYTES))

    @classmethod
    def from_config(cls, config: PoolConfig, **kwargs: Unpack[AsyncPoolOptions]) -> "AsyncPool":
        kwargs.setdefault("backend", config.backend)
        kwargs.setdefault("probe_timeout", config.probe_timeout_s)
        kwargs.setdefault("model", config.model)
        kwargs.setdefault("server_load_tracked", config.server_load_tracked)
        if config.capacity_interval_s is not None:
            kwargs.setdefault("capacity_interval_s", config.capacity_interval_s)
        return cls(config.members, **kwargs)

    async def aclose(self) -> None:
        if self._round is not None and not self._round.done():
            self._round.cancel()
        if self._own_http:
            for c in self.clients.values():
                await c.aclose()
            await self._probe_wire.aclose()  # a caller's client is the caller's to close

    async def __aenter__(self) -> "AsyncPool":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def capacity(self) -> PoolCapacity:
        """merge-pool-capacity: every member asked at once (a new round; the view keeps it)."""
        started, starts = time.monotonic(), self.view.starts()
        answers = await aprobe_endpoints(self.members, self.backend, http=self._probe_wire, timeout=self.probe_timeout,
                                         detected=self._detected, load_tracked=self.server_load_tracked)
        cap = merge_pool_capacity(answers, at=now_iso())
        self.view.record(cap, started, starts)
        return cap

    async def _current(self) -> PoolCapacity:
        """The shared view, refreshed by one round when it is older than the interval. While that
        round runs, decisions read the previous one as long as it started at most the interval plus
        one probe timeout ago (the documented bound); past that, or with no round yet, they wait."""
        view = self.view
        if view.interval_s <= 0:
            return await self.capacity()
        cap = self._readable(time.monotonic())
        if cap is None:
            await asyncio.shield(self._start_round())  # one round at a time; the others read its result
            cap = view.snapshot
        assert cap is not None
        return cap

    def _readable(self, now: float) -> PoolCapacity | None:
        """The round a decision may read now without waiting (starting the next round when this one is
        older than the interval); None: wait for a round (none yet, past the bound, or interval 0)."""
        view = self.view
        if view.fresh(now) and view.interval_s > 0:
            return view.snapshot
        if view.interval_s <= 0:
            return None
        self._start_round()
        if view.snapshot is None or now - view.started > view.interval_s + self._round_limit_s:
            return None
        return view.snapshot

    def _start_round(self) -> "asyncio.Future[PoolCapacity]":
        r = self._round
        if r is None or r.done() or r.get_loop() is not asyncio.get_running_loop():
            r = self._round = asyncio.ensure_future(self.capacity())
            r.add_done_callback(_retrieve)  # a failed background round is seen by the next waiter, not logged
        return r

    async def _admit(self, request: R, conversation: str | None, among: Collection[str] | None = None
                     ) -> tuple[R, Admission, PoolCapacity, AsyncClient]:
        req = self._for_pool(request)
        cap = self._readable(time.monotonic())
        if cap is None:
            cap = await self._current()
        adm, client = self._place(req, cap, conversation, among)
        return req, adm, cap, client

    @overload
    async def send(self, request: TextRequest, *, timeout: TimeoutArg = None, deadline: DeadlineArg = None,
                   conversation: str | None = None, checked: bool = False,
                   among: Collection[str] | None = None) -> Response: ...
    @overload
    async def send(self, request: EmbeddingRequest, *, timeout: TimeoutArg = None, deadline: DeadlineArg = None,
                   conversation: str | None = None, checked: bool = False,
                   among: Collection[str] | None = None) -> EmbeddingResponse: ...
    @overload
    async def send(self, request: TokenizeRequest, *, timeout: TimeoutArg = None, deadline: DeadlineArg = None,
                   conversation: str | None = None, checked: bool = False,
                   among: Collection[str] | None = None) -> TokenizeResponse: ...
    @overload
    async def send(self, request: DetokenizeRequest, *, timeout: TimeoutArg = None, deadline: DeadlineArg = None,
                   conversation: str | None = None, checked: bool = False,
                   among: Collection[str] | None = None) -> DetokenizeResponse: ...
    @overload
    async def send(self, request: RequestInput, *, timeout: TimeoutArg = None, deadline: DeadlineArg = None,
                   conversation: str | None = None, checked: bool = False,
                   among: Collection[str] | None = None) -> AnyResponse: ...

    async def send(self, request: RequestInput, *, timeout: TimeoutArg = None, deadline: DeadlineArg = None,
                   conversation: str | None = None, checked: bool = False,
                   among: Collection[str] | None = None) -> AnyResponse:
        """`among`: only these members may be chosen (a batch's flow control passes the member it keeps a
        limit for); the choice is still the view's, and a refusal the same."""
        req, adm, cap, client = await self._admit(to_request(request), conversation, among)
        try:
            resp = await client.send(req, timeout=timeout, deadline=deadline, checked=checked)
        except AdmissionRejected as e:
            raise _attach(e, cap)
        finally:
            self._done(adm.member or "")
        self.affinity.remember(req, adm.member or "", conversation)
        return self._annotate(resp, adm, cap)

    async def stream(self, request: TextRequest | EdnMap, *, timeout: TimeoutArg = None, deadline: DeadlineArg = None,
                     conversation: str | None = None, among: Collection[str] | None = None) -> AsyncPoolStream:
        """`among`: only these members may be chosen (as for `send`)."""
        req, adm, cap, client = await self._admit(streaming(request), conversation, among)
        try:
            inner = await client.stream(req, timeout=timeout, deadline=deadline)
        except BaseException as e:
            self._done(adm.member or "")
            raise _attach(e, cap) if isinstance(e, AdmissionRejected) else e
        return AsyncPoolStream(self, inner, req, adm, cap, conversation)

    async def chat(self, messages: MessagesInput, *, model: str | None = None, conversation: str | None = None,
                   timeout: TimeoutArg = None, deadline: DeadlineArg = None, **sampling: object) -> Response:
        req = chat_request(messages, model if model is not None else self.model, None, False, sampling, None)
        return await self.send(req, timeout=timeout, deadline=deadline, conversation=conversation)


__all__ = ["AsyncPool", "AsyncPoolStream", "Pool", "PoolConfig", "PoolStream", "load_pool_config",
           "pool_config_from_edn"]
