"""`Client` and `AsyncClient`: I/O only.

Every decision lives in `_base_client`; these classes move bytes through a wire (`_wire`: by
default http.client for `Client`, aiohttp for `AsyncClient`; a caller's httpx client when given).
One call sends one request; the only resend is onto a fresh connection after a reused keep-alive
one failed before any response byte (see `may_resend`).
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Awaitable, Iterable, Iterator, Mapping, TypedDict, TypeVar, overload

import attrs
import httpx

from ._base_client import (DETECT_DEADLINE_S, DETECT_TIMEOUT, DETECTION_PROBES, SERVER_EXIT_WAIT_S, AsyncAttempt,
                           Attempt, BaseClient, DeadlineArg, MessagesInput, Plan, RequestInput, SseDecoder, StreamRun,
                           TimeoutArg, answer_error, broken_stream, decide_backend, identify, may_resend,
                           not_event_stream, streaming)
from ._deadlines import Deadlines, Watch, expired
from ._edn import Edn, EdnMap
from ._endpoint_calls import R, AsyncEndpointCalls, EndpointCalls, checked, embedding_request
from ._errors import KotobaError, ProtocolError, RequestTimeout, TransportError
from ._model import (AnyResponse, DetokenizeRequest, DetokenizeResponse, EmbeddingRequest, EmbeddingResponse, Health,
                     ModelsResponse, Request, Response, StreamDelta, TextRequest, TokenizeRequest, TokenizeResponse)
from ._resend import MAX_RESENDS
from .dialects import get_dialect
from .dialects._http import decode_json
from ._wire import Answer, AsyncWire, HttpxSyncWire, HttpxWire, SyncAnswer, SyncWire, default_sync_wire, default_wire
from ._wire_core import DEFAULT_MAX_BYTES, lost
from .server_config import CONFIG_TIMEOUT, ServerConfig, aserver_configs, server_configs

T = TypeVar("T")
_CLOSING: set["asyncio.Task[None]"] = set()  # closes of dropped async streams, kept until done


def _limits() -> httpx.Limits:
    return httpx.Limits(max_connections=256, max_keepalive_connections=64, keepalive_expiry=5.0)



def _death(client: BaseClient, err: TransportError) -> KotobaError | None:
    """After a transport failure against a server this caller started: why it died (signal, log tail), if it did."""
    server = client.managed_server
    if server is None or isinstance(err, RequestTimeout):
        return None
    return _located(server.failure(SERVER_EXIT_WAIT_S), err)


async def _adeath(client: BaseClient, err: TransportError) -> KotobaError | None:
    """`_death` without blocking the loop while a dying server is reaped."""
    server = client.managed_server
    if server is None or isinstance(err, RequestTimeout):
        return None
    return _located(server.failure() or await asyncio.to_thread(server.failure, SERVER_EXIT_WAIT_S), err)


def _located(died: KotobaError | None, err: KotobaError) -> KotobaError | None:
    if died is not None:
        died.endpoint = died.endpoint or err.endpoint
    return died

class Stream:
    """A streamed answer: iterate for `StreamDelta`s; `.response` is the assembled answer after the end.

    Closing early (or leaving the `with` block) closes the connection."""

    def __init__(self, client: "Client", plan: Plan, response: SyncAnswer, sent: float | None = None,
                 until: float | None = None, deadline_s: float | None = None) -> None:
        self._client, self._plan, self._http = client, plan, response
        self._until, self._deadline_s = until, deadline_s  # the whole request's deadline (monotonic)
        self._run = StreamRun(plan, sent, response.headers.get("x-request-id"))
        self.response: Response | None = None

    @property
    def partial_text(self) -> str:
        return self._run.partial_text

    @property
    def endpoint_url(self) -> str:
        return self._plan.url

    def __iter__(self) -> Iterator[StreamDelta]:
        run, plan = self._run, self._plan
        try:
            try:
                why = not_event_stream(self._http.headers.get("content-type", ""))
                if why is not None:
                    raise ProtocolError(f"not an event stream: {why}", endpoint=plan.url,
                                        partial_text=run.partial_text)
                sse = SseDecoder(plan.url, self._client.max_sse_line)
                idle_s, until, http = self._client.stream_idle_s, self._until, self._http
                for chunk in http.iter_bytes():
                    got = False
                    for event, data, wide in sse.payloads(chunk):
                        got = True
                        yield from run.on_data(data, event, wide)
                    if got and idle_s is not None:  # a data event: the idle limit starts again (comments never)
                        idle = time.monotonic() + idle_s
                        if until is None or idle < until:
                            http.deadline(idle, "idle", idle_s)
                        else:
                            http.deadline(until, "total", self._deadline_s)
            except TransportError as e:
                raise (_death(self._client, e) or broken_stream(e, plan.url, run.partial_text)) from e
            self.response = run.on_end()
        except KotobaError as e:  # an error event, a broken or late stream: whose request, which server's id
            identify(e, plan.request, plan.dialect.name, run.server_request_id)
            raise
        finally:
            self._http.close()

    def until_done(self) -> Response:
        """Consume the rest and return the assembled response."""
        for _ in self:
            pass
        assert self.response is not None
        return self.response

    def close(self) -> None:
        self._http.close()

    def __del__(self) -> None:
        # A stream dropped unread would otherwise hold its pooled connection forever
        # (256 of them exhaust the pool); closing an already-closed response is a no-op.
        try:
            self._http.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncStream:
    """Async twin of `Stream`. Cancelling the consuming task closes the connection."""

    def __init__(self, client: "AsyncClient", plan: Plan, response: Answer,
                 sent: float | None = None, watch: Watch | None = None) -> None:
        self._client, self._plan, self._http = client, plan, response
        self._watch = watch  # the whole request's deadline, armed when the request went out
        self._run = StreamRun(plan, sent, response.headers.get("x-request-id"))
        self.response: Response | None = None

    @property
    def partial_text(self) -> str:
        return self._run.partial_text

    @property
    def endpoint_url(self) -> str:
        return self._plan.url

    async def __aiter__(self) -> AsyncIterator[StreamDelta]:
        run, plan = self._run, self._plan
        try:
            try:
                why = not_event_stream(self._http.headers.get("content-type", ""))
                if why is not None:
                    raise ProtocolError(f"not an event stream: {why}", endpoint=plan.url,
                                        partial_text=run.partial_text)
                client = self._client
                sse = SseDecoder(plan.url, client.max_sse_line)
                deadlines, idle_s, watch = client.deadlines, client.stream_idle_s, self._watch
                until, total_s = (None, None) if watch is None else (watch.when, watch.limit_s)
                chunks = self._http.aiter_bytes().__aiter__()
                try:
                    while True:
                        if watch is not None:
                            if watch.fired:
                                raise watch.timed_out(plan.url)
                            watch.task = asyncio.current_task()
                        try:
                            chunk = await chunks.__anext__()
                        except StopAsyncIteration:
                            break
                        except asyncio.CancelledError:
                            if watch is not None and expired(watch):
                                raise watch.timed_out(plan.url) from None
                            raise
                        if watch is not None:
                            watch.task = None
                        got = False
                        # lazily: many async streams are open at once, each holding only what it has read
                        for event, data, wide in sse.payloads(chunk):
                            got = True
                            for d in run.on_data(data, event, wide):
                                yield d
                        if got and idle_s is not None:  # a data event: the idle limit starts again
                            idle = deadlines.now() + idle_s if watch is not None else None
                            if watch is None:
                                watch = deadlines.arm(idle_s, what="idle", waiting=False)
                            elif idle is not None and (until is None or idle < until):
                                deadlines.move(watch, idle, "idle", idle_s)
                            elif until is not None and total_s is not None:
                                deadlines.move(watch, until, "total", total_s)
                finally:
                    if watch is not None:
                        deadlines.disarm(watch)
            except TransportError as e:
                raise (await _adeath(self._client, e) or broken_stream(e, plan.url, run.partial_text)) from e
            self.response = run.on_end()
        except KotobaError as e:  # as in `Stream`
            identify(e, plan.request, plan.dialect.name, run.server_request_id)
            raise
        finally:
            await self._http.aclose()

    async def until_done(self) -> Response:
        async for _ in self:
            pass
        assert self.response is not None
        return self.response

    async def aclose(self) -> None:
        await self._http.aclose()

    def __del__(self) -> None:
        # A stream dropped unread would hold its pooled connection forever; release it on the
        # loop that owns it (the same way asyncio finalizes abandoned async generators).
        if self._http.is_closed:
            return
        try:
            task = asyncio.get_running_loop().create_task(self._http.aclose())
        except RuntimeError:  # no running loop: nothing can be awaited any more
            return
        _CLOSING.add(task)
        task.add_done_callback(_CLOSING.discard)

    async def __aenter__(self) -> "AsyncStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class CommonOptions(TypedDict, total=False):
    """The keyword arguments every client and pool takes (forwarded as `**options`, checked by name and type)."""

    backend: str
    api_key: str | None
    timeout: float | httpx.Timeout | None
    headers: Mapping[str, str] | None
    model: str | None
    deadline: float | None
    stream_idle_s: float | None
    max_response_bytes: int


class ClientOptions(CommonOptions, total=False):
    """`Client(...)`'s keyword arguments."""

    verify: bool
    http_client: httpx.Client | None
    trusted_origins: Iterable[str]


class AsyncClientOptions(CommonOptions, total=False):
    """`AsyncClient(...)`'s keyword arguments."""

    verify: bool
    http_client: httpx.AsyncClient | None
    trusted_origins: Iterable[str]


class Client(BaseClient, EndpointCalls):
    """Synchronous client. `Client(base_url, backend="auto"|"vllm"|"sglang"|"llamacpp"|"openai")`.

    Limits (docs/trust.md): `timeout` each phase, `deadline` the whole call (seconds), `stream_idle_s`
    between a stream's data events, `max_response_bytes` every answer's body."""

    def __init__(self, base_url: str | None = None, *, backend: str = "auto", api_key: str | None = None,
                 timeout: float | httpx.Timeout | None = None, headers: Mapping[str, str] | None = None,
                 model: str | None = None, verify: bool = True, http_client: httpx.Client | None = None,
                 trusted_origins: Iterable[str] = (), deadline: float | None = None,
                 stream_idle_s: float | None = None, max_response_bytes: int = DEFAULT_MAX_BYTES) -> None:
        super().__init__(base_url, backend=backend, api_key=api_key, timeout=timeout, headers=headers, model=model,
                         trusted_origins=trusted_origins, deadline=deadline, stream_idle_s=stream_idle_s,
                         max_response_bytes=max_response_bytes)
        # A caller's httpx client is used as it is (our headers go on each request); by default the
        # measured fastest sync wire (http.client under our keep-alive pool), carrying our headers itself.
        self._wire: SyncWire = (HttpxSyncWire(http_client, self._headers, max_response_bytes) if http_client is not None
                                else default_sync_wire(self._headers, verify, _limits(), max_response_bytes))
        self._has_key = self._has_key or (http_client is not None and "authorization" in http_client.headers)

    @property
    def transport(self) -> str:
        """Which wire moves the bytes: "stdlib" (http.client, default) or "httpx" (a client passed as `http_client`)."""
        return self._wire.name

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        self._wire.close()

    def send_raw(self, method: str, url: str, *, content: bytes | None = None,
                 timeout: TimeoutArg = None) -> SyncAnswer:
        """One request on this client's wire with its headers, read whole; no decisions, no resend."""
        return self._wire.send(method, url, content=content, timeout=self._timeout_for(timeout),
                               deadline_s=self.deadline_s)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ I/O primitives

    def _send(self, plan: Plan, timeout: httpx.Timeout, stream: bool, deadline_s: float | None) -> SyncAnswer:
        http = plan.http
        until = None if deadline_s is None else time.monotonic() + deadline_s
        left = deadline_s
        for _ in range(MAX_RESENDS + 1):
            attempt = Attempt()
            try:
                return self._wire.send(http.method, plan.url, json=http.body, headers=http.headers, timeout=timeout,
                                       stream=stream, attempt=attempt, withhold_key=plan.key_withheld,
                                       deadline_s=left)
            except TransportError as e:
                if may_resend(e, attempt):
                    self.resends += 1
                    plan.sends += 1  # the same request, its id too, onto a fresh connection: the answer says so
                    left = None if until is None else until - time.monotonic()
                    continue
                died = _death(self, e)  # no answer: still whose request it was, which engine dialect sent it
                if died is not None:
                    raise identify(died, plan.request, plan.dialect.name) from e
                raise identify(e, plan.request, plan.dialect.name)
        raise identify(lost(plan.url, "every pooled connection was stale"), plan.request, plan.dialect.name)

    def detect_backend(self, base_url: str | None = None) -> str:
        """Ask the server's own endpoints which engine it is (cached per base URL)."""
        base = (base_url or self.base_url).rstrip("/")
        if self._backend != "auto":
            return self._backend
        if base in self._detected:
            return self._detected[base]
        found = "openai"
        until = time.monotonic() + DETECT_DEADLINE_S  # the whole detection, every probe in it
        for path, _ in DETECTION_PROBES:
            try:
                r = self._wire.send("GET", base + path, timeout=DETECT_TIMEOUT, withhold_key=self._key_withheld(base),
                                    deadline_s=max(until - time.monotonic(), 0.001), max_bytes=self.probe_max_bytes)
            except TransportError as e:
                if self.detection_fatal(e):
                    raise
                continue
            hit = self._identify(base, path, r.status_code, decode_json(r.content))
            if hit:
                found = hit
                break
        self._detected[base] = found
        return found

    def _prepare(self, request: RequestInput, checked: bool = False) -> Plan:
        req = self._with_defaults(self._to_request(request))
        base = self._base_for(req)
        return self._plan(req, self._backend_for(base) or self.detect_backend(base), base, checked)

    # ------------------------------------------------------------ the surface

    @overload
    def send(self, request: TextRequest, *, timeout: TimeoutArg = None, deadline: DeadlineArg = None,
             checked: bool = False) -> Response: ...
    @overload
    def send(self, request: EmbeddingRequest, *, timeout: TimeoutArg = None,
             deadline: DeadlineArg = None, checked: bool = False) -> EmbeddingResponse: ...
    @overload
    def send(self, request: TokenizeRequest, *, timeout: TimeoutArg = None,
             deadline: DeadlineArg = None, checked: bool = False) -> TokenizeResponse: ...
    @overload
    def send(self, request: DetokenizeRequest, *, timeout: TimeoutArg = None,
             deadline: DeadlineArg = None, checked: bool = False) -> DetokenizeResponse: ...
    @overload
    def send(self, request: RequestInput, *, timeout: TimeoutArg = None, deadline: DeadlineArg = None,
             checked: bool = False) -> AnyResponse: ...

    def send(self, request: RequestInput, *, timeout: TimeoutArg = None, deadline: DeadlineArg = None,
             checked: bool = False) -> AnyResponse:
        """Send a typed request or an EDN request map; return the typed answer (its type follows
        the request's: `ChatRequest` -> `Response`, `TokenizeRequest` -> `TokenizeResponse`, ...).
        A streaming request is consumed and its assembled response returned. `deadline`: seconds for
        the whole call (else the request's `:vllm/deadline-s`, else the client's). `checked=True`: the
        request already passed the engine-independent checks (a batch entry's `checked`), so only the
        engine's support is checked before sending."""
        plan = self._prepare(request, checked)
        t = self._timeout_for(timeout)
        d = self._deadline_for(deadline, plan.request)
        if plan.http.stream:
            return self._open_stream(plan, t, d).until_done()
        sent = time.perf_counter()
        r = self._send(plan, t, False, d)
        return self._finish(plan, r, sent, r.header("x-request-id"))

    def stream(self, request: TextRequest | EdnMap, *, timeout: TimeoutArg = None,
               deadline: DeadlineArg = None) -> Stream:
        """Open a stream for a typed request or EDN map (streaming is switched on)."""
        plan = self._prepare(streaming(request))
        return self._open_stream(plan, self._timeout_for(timeout), self._deadline_for(deadline, plan.request))

    def _open_stream(self, plan: Plan, timeout: httpx.Timeout, deadline_s: float | None) -> Stream:
        sent = time.perf_counter()
        until = None if deadline_s is None else time.monotonic() + deadline_s
        r = self._send(plan, timeout, True, deadline_s)
        if r.status_code >= 300:
            try:
                raw = r.read()
            finally:
                r.close()
            raise self._http_error(r.status_code, raw, r.headers, plan)
        return Stream(self, plan, r, sent, until, deadline_s)

    def chat(self, messages: MessagesInput, *, model: str | None = None, tools: Edn = None,
             extras: Mapping[str, Edn] | None = None, timeout: TimeoutArg = None, deadline: DeadlineArg = None,
             **sampling: object) -> Response:
        return self.send(self._chat_request(messages, model, tools, False, sampling, extras), timeout=timeout,
                         deadline=deadline)

    def stream_chat(self, messages: MessagesInput, *, model: str | None = None, tools: Edn = None,
                    extras: Mapping[str, Edn] | None = None, timeout: TimeoutArg = None,
                    deadline: DeadlineArg = None, **sampling: object) -> Stream:
        return self.stream(self._chat_request(messages, model, tools, True, sampling, extras), timeout=timeout,
                           deadline=deadline)

    def completion(self, prompt: str, *, model: str | None = None, native: bool = False,
                   extras: Mapping[str, Edn] | None = None, timeout: TimeoutArg = None, deadline: DeadlineArg = None,
                   **sampling: object) -> Response:
        """`/v1/completions`, or the engine's native route (`native=True`: llama.cpp `/completion`, SGLang `/generate`)."""
        return self.send(self._completion_request(prompt, model, False, sampling, extras, native), timeout=timeout,
                         deadline=deadline)

    def stream_completion(self, prompt: str, *, model: str | None = None, native: bool = False,
                          extras: Mapping[str, Edn] | None = None, timeout: TimeoutArg = None,
                          deadline: DeadlineArg = None, **sampling: object) -> Stream:
        return self.stream(self._completion_request(prompt, model, True, sampling, extras, native), timeout=timeout,
                           deadline=deadline)

    def embeddings(self, input: str | Iterable[str], *, model: str | None = None, dimensions: int | None = None,
                   encoding_format: str | None = None, request_id: str | int | None = None) -> EmbeddingResponse:
        return self.send(checked(embedding_request(input, model, dimensions, encoding_format, request_id)))

    def _typed(self, req: Request, cls: type[R], timeout: TimeoutArg) -> R:
        resp = self.send(req, timeout=timeout)
        assert isinstance(resp, cls)  # each endpoint's dialect parser builds its one response class
        return resp

    def tokenize(self, text: str, *, model: str | None = None, add_special: bool | None = None) -> TokenizeResponse:
        return self.send(TokenizeRequest(text=text, model=model, add_special=add_special))

    def detokenize(self, tokens: Iterable[int], *, model: str | None = None) -> DetokenizeResponse:
        return self.send(DetokenizeRequest(tokens=tuple(tokens), model=model))

    def models(self) -> ModelsResponse:
        backend = self.detect_backend()
        dialect = get_dialect(backend)
        url = self.base_url + dialect.models_path
        r = self._wire.send("GET", url, timeout=self.timeout, deadline_s=self.deadline_s)
        if r.status_code >= 300:  # no request of the caller's: the engine that answered is still said
            raise identify(answer_error(r.status_code, r.content, r.headers, url), None, backend,
                           r.headers.get("x-request-id"))
        return dialect.parse_models(decode_json(r.content), url)

    def server_config(self, *, timeout: TimeoutArg = None) -> ServerConfig:
        """What this client's server says it runs: engine and version, model, context, slots, parallel
        sizes, speculative and KV cache settings, each field with the endpoint and key it came from and
        `:unreported` where the engine does not say. Never raises for a server that fails: its answer is
        unmeasured, with the reason. Asks this client's own base URL only (its key goes nowhere else)."""
        [cfg] = server_configs([self.base_url], self._backend_for(self.base_url) or "auto", http=self._wire,
                               timeout=CONFIG_TIMEOUT if timeout is None else self._timeout_for(timeout),
                               detected=self._detected)
        return cfg

    def health(self) -> Health:
        """Never raises for an answer: `ok` false with the status and the server's message."""
        backend = self._backend if self._backend != "auto" else self._detected.get(self.base_url, "llamacpp")
        url = self.base_url + get_dialect(backend).health_path
        try:
            r = self._wire.send("GET", url, timeout=DETECT_TIMEOUT, deadline_s=DETECT_DEADLINE_S,
                                max_bytes=self.probe_max_bytes)
        except TransportError as err:
            return Health(ok=False, status=None, endpoint_url=url, detail=err.message)
        detail = None if r.status_code == 200 else r.text[:300]
        return Health(ok=r.status_code == 200, status=r.status_code, endpoint_url=url,
                      backend=self._backend_for(self.base_url), detail=detail)


class AsyncClient(BaseClient, AsyncEndpointCalls):
    """Asynchronous twin of `Client`: aiohttp by default, or a caller's `httpx.AsyncClient` as `http_client`
    (the same limits: docs/trust.md)."""

    def __init__(self, base_url: str | None = None, *, backend: str = "auto", api_key: str | None = None,
                 timeout: float | httpx.Timeout | None = None, headers: Mapping[str, str] | None = None,
                 model: str | None = None, verify: bool = True,
                 http_client: httpx.AsyncClient | None = None, trusted_origins: Iterable[str] = (),
                 deadline: float | None = None, stream_idle_s: float | None = None,
                 max_response_bytes: int = DEFAULT_MAX_BYTES) -> None:
        super().__init__(base_url, backend=backend, api_key=api_key, timeout=timeout, headers=headers, model=model,
                         trusted_origins=trusted_origins, deadline=deadline, stream_idle_s=stream_idle_s,
                         max_response_bytes=max_response_bytes)
        # A caller's httpx client is used as it is (our headers go on each request); by default the
        # measured fastest wire (aiohttp), carrying our headers itself.
        self._wire: AsyncWire = (HttpxWire(http_client, self._headers, max_response_bytes) if http_client is not None
                                 else default_wire(self._headers, self.timeout, verify, _limits(), max_response_bytes))
        self._has_key = self._has_key or (http_client is not None and "authorization" in http_client.headers)
        self.deadlines = Deadlines()  # every call's whole-request deadline, on one timer

    @property
    def transport(self) -> str:
        """Which wire moves the bytes: "aiohttp" (default) or "httpx" (a client passed as `http_client`)."""
        return self._wire.name

    async def aclose(self) -> None:
        await self._wire.aclose()

    async def send_raw(self, method: str, url: str, *, content: bytes | None = None,
                       timeout: TimeoutArg = None) -> Answer:
        """One request on this client's wire with its headers, read whole; no decisions, no resend."""
        return await self._bounded(self._wire.send(method, url, content=content, timeout=self._timeout_for(timeout)),
                                   self.deadline_s, url)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _bounded(self, call: Awaitable[T], deadline_s: float | None, url: str) -> T:
        """`call`, ended by `RequestTimeout(phase="total")` (its connection closed) at the deadline."""
        if deadline_s is None:
            return await call
        watch = self.deadlines.arm(deadline_s)
        try:
            return await call
        except asyncio.CancelledError:
            if expired(watch):
                raise watch.timed_out(url) from None
            raise
        finally:
            self.deadlines.disarm(watch)

    async def _send(self, plan: Plan, timeout: httpx.Timeout, stream: bool) -> Answer:
        http = plan.http
        for _ in range(MAX_RESENDS + 1):
            attempt = AsyncAttempt()
            try:
                return await self._wire.send(http.method, plan.url, json=http.body, headers=http.headers,
                                             timeout=timeout, stream=stream, attempt=attempt,
                                             withhold_key=plan.key_withheld)
            except TransportError as e:
                if may_resend(e, attempt):
                    self.resends += 1
                    plan.sends += 1  # the same request, its id too, onto a fresh connection: the answer says so
                    continue
                died = await _adeath(self, e)  # as in `Client._send`
                if died is not None:
                    raise identify(died, plan.request, plan.dialect.name) from e
                raise identify(e, plan.request, plan.dialect.name)
        raise identify(lost(plan.url, "every pooled connection was stale"), plan.request, plan.dialect.name)

    async def detect_backend(self, base_url: str | None = None) -> str:
        base = (base_url or self.base_url).rstrip("/")
        if self._backend != "auto":
            return self._backend
        if base in self._detected:
            return self._detected[base]
        found = "openai"
        until = time.monotonic() + DETECT_DEADLINE_S  # the whole detection, every probe in it
        for path, _ in DETECTION_PROBES:
            try:
                r = await self._bounded(self._wire.send("GET", base + path, timeout=DETECT_TIMEOUT,
                                                        withhold_key=self._key_withheld(base),
                                                        max_bytes=self.probe_max_bytes),
                                        max(until - time.monotonic(), 0.001), base + path)
            except TransportError as e:
                if self.detection_fatal(e):
                    raise
                continue
            hit = self._identify(base, path, r.status_code, decode_json(r.content))
            if hit:
                found = hit
                break
        self._detected[base] = found
        return found

    async def _prepare(self, request: RequestInput, checked: bool = False) -> Plan:
        req = self._with_defaults(self._to_request(request))
        base = self._base_for(req)
        return self._plan(req, self._backend_for(base) or await self.detect_backend(base), base, checked)

    @overload
    async def send(self, request: TextRequest, *, timeout: TimeoutArg = None,
                   deadline: DeadlineArg = None, checked: bool = False) -> Response: ...
    @overload
    async def send(self, request: EmbeddingRequest, *, timeout: TimeoutArg = None,
                   deadline: DeadlineArg = None, checked: bool = False) -> EmbeddingResponse: ...
    @overload
    async def send(self, request: TokenizeRequest, *, timeout: TimeoutArg = None,
                   deadline: DeadlineArg = None, checked: bool = False) -> TokenizeResponse: ...
    @overload
    async def send(self, request: DetokenizeRequest, *, timeout: TimeoutArg = None,
                   deadline: DeadlineArg = None, checked: bool = False) -> DetokenizeResponse: ...
    @overload
    async def send(self, request: RequestInput, *, timeout: TimeoutArg = None,
                   deadline: DeadlineArg = None, checked: bool = False) -> AnyResponse: ...

    async def send(self, request: RequestInput, *, timeout: TimeoutArg = None,
                   deadline: DeadlineArg = None, checked: bool = False) -> AnyResponse:
        plan = await self._prepare(request, checked)
        t = self._timeout_for(timeout)
        d = self._deadline_for(deadline, plan.request)
        if plan.http.stream:
            return await (await self._open_stream(plan, t, d)).until_done()
        sent = time.perf_counter()
        if d is None:
            r = await self._send(plan, t, stream=False)
        else:  # `_bounded` inline: one coroutine fewer per request
            deadlines = self.deadlines
            watch = deadlines.arm(d)
            try:
                r = await self._send(plan, t, stream=False)
            except asyncio.CancelledError:
                if expired(watch):  # no answer by the deadline: still whose request, which engine
                    raise identify(watch.timed_out(plan.url), plan.request, plan.dialect.name) from None
                raise
            finally:
                deadlines.disarm(watch)
        return self._finish(plan, r, sent, r.headers.get("x-request-id"))

    async def stream(self, request: TextRequest | EdnMap, *, timeout: TimeoutArg = None,
                     deadline: DeadlineArg = None) -> AsyncStream:
        plan = await self._prepare(streaming(request))
        return await self._open_stream(plan, self._timeout_for(timeout), self._deadline_for(deadline, plan.request))

    async def _open_stream(self, plan: Plan, timeout: httpx.Timeout, deadline_s: float | None) -> AsyncStream:
        sent = time.perf_counter()
        watch = None if deadline_s is None else self.deadlines.arm(deadline_s)
        try:
            r = await self._send(plan, timeout, stream=True)
            if r.status_code >= 300:
                try:
                    raw = await r.aread()
                finally:
                    await r.aclose()
                raise self._http_error(r.status_code, raw, r.headers, plan)
        except asyncio.CancelledError:
            if watch is not None and expired(watch):
                raise identify(watch.timed_out(plan.url), plan.request, plan.dialect.name) from None
            raise
        except BaseException:
            if watch is not None:
                self.deadlines.disarm(watch)
            raise
        if watch is not None:
            watch.task = None  # the stream's reads wait on it from here (see AsyncStream)
        return AsyncStream(self, plan, r, sent, watch)

    async def chat(self, messages: MessagesInput, *, model: str | None = None, tools: Edn = None,
                   extras: Mapping[str, Edn] | None = None, timeout: TimeoutArg = None,
                   deadline: DeadlineArg = None, **sampling: object) -> Response:
        return await self.send(self._chat_request(messages, model, tools, False, sampling, extras), timeout=timeout,
                               deadline=deadline)

    async def stream_chat(self, messages: MessagesInput, *, model: str | None = None, tools: Edn = None,
                          extras: Mapping[str, Edn] | None = None, timeout: TimeoutArg = None,
                          deadline: DeadlineArg = None, **sampling: object) -> AsyncStream:
        return await self.stream(self._chat_request(messages, model, tools, True, sampling, extras), timeout=timeout,
                                 deadline=deadline)

    async def completion(self, prompt: str, *, model: str | None = None, native: bool = False,
                         extras: Mapping[str, Edn] | None = None, timeout: TimeoutArg = None,
                         deadline: DeadlineArg = None, **sampling: object) -> Response:
        return await self.send(self._completion_request(prompt, model, False, sampling, extras, native),
                               timeout=timeout, deadline=deadline)

    async def stream_completion(self, prompt: str, *, model: str | None = None, native: bool = False,
                                extras: Mapping[str, Edn] | None = None, timeout: TimeoutArg = None,
                                deadline: DeadlineArg = None, **sampling: object) -> AsyncStream:
        return await self.stream(self._completion_request(prompt, model, True, sampling, extras, native),
                                 timeout=timeout, deadline=deadline)

    async def embeddings(self, input: str | Iterable[str], *, model: str | None = None, dimensions: int | None = None,
                         encoding_format: str | None = None, request_id: str | int | None = None) -> EmbeddingResponse:
        return await self.send(checked(embedding_request(input, model, dimensions, encoding_format, request_id)))

    async def _typed(self, req: Request, cls: type[R], timeout: TimeoutArg) -> R:
        resp = await self.send(req, timeout=timeout)
        assert isinstance(resp, cls)  # each endpoint's dialect parser builds its one response class
        return resp

    async def tokenize(self, text: str, *, model: str | None = None,
                       add_special: bool | None = None) -> TokenizeResponse:
        return await self.send(TokenizeRequest(text=text, model=model, add_special=add_special))

    async def detokenize(self, tokens: Iterable[int], *, model: str | None = None) -> DetokenizeResponse:
        return await self.send(DetokenizeRequest(tokens=tuple(tokens), model=model))

    async def models(self) -> ModelsResponse:
        backend = await self.detect_backend()
        dialect = get_dialect(backend)
        url = self.base_url + dialect.models_path
        r = await self._bounded(self._wire.send("GET", url, timeout=self.timeout), self.deadline_s, url)
        if r.status_code >= 300:  # as in `Client.models`
            raise identify(answer_error(r.status_code, r.content, r.headers, url), None, backend,
                           r.headers.get("x-request-id"))
        return dialect.parse_models(decode_json(r.content), url)

    async def server_config(self, *, timeout: TimeoutArg = None) -> ServerConfig:
        """`Client.server_config`, awaited."""
        [cfg] = await aserver_configs([self.base_url], self._backend_for(self.base_url) or "auto", http=self._wire,
                                      timeout=CONFIG_TIMEOUT if timeout is None else self._timeout_for(timeout),
                                      detected=self._detected)
        return cfg

    async def health(self) -> Health:
        backend = self._backend if self._backend != "auto" else self._detected.get(self.base_url, "llamacpp")
        url = self.base_url + get_dialect(backend).health_path
        try:
            r = await self._bounded(self._wire.send("GET", url, timeout=DETECT_TIMEOUT,
                                                    max_bytes=self.probe_max_bytes), DETECT_DEADLINE_S, url)
        except TransportError as err:
            return Health(ok=False, status=None, endpoint_url=url, detail=err.message)
        detail = None if r.status_code == 200 else r.text[:300]
        return Health(ok=r.status_code == 200, status=r.status_code, endpoint_url=url,
                      backend=self._backend_for(self.base_url), detail=detail)
