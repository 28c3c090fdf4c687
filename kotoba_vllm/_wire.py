"""The async client's transports ("wires"): how bytes move, and nothing else.

`AsyncClient` talks to a wire: send one request, get one answer (`status_code`, `headers`,
`content`, `aread`, `aiter_bytes`, `aclose`, `is_closed`: the names httpx.Response has). Every wire
raises kotoba's own `TransportError`s, once, where it sees the failure (`_wire_core`), reads every
body through the bounded decoder (a size limit on the bytes received and on the bytes decoded), and
fills the `AttemptEvidence` it is given: did this attempt reuse a connection, did any response byte
arrive — the evidence the resend rule needs.

- `HttpxWire`: an `httpx.AsyncClient` (a caller's own, or ours); evidence from httpx's trace hook.
- `AiohttpWire` (`_aiohttp_wire`): the default when aiohttp is installed; measured 3-5x less client
  CPU per request than httpx 0.28 at 16-256 in flight (benchmarks/README.md).

The sync `Client` has the same pair: `StdlibWire` (`_stdlib_wire`, http.client, the default) and
`HttpxSyncWire` (a caller's `httpx.Client`), answering with `read`, `iter_bytes`, `close`.
"""

from __future__ import annotations

import functools
import time
from typing import AsyncIterator, Callable, Iterator, Mapping, Protocol

import httpx

from ._aiohttp_wire import AiohttpWire
from ._base_client import AsyncAttempt, Attempt, trace_event
from ._errors import TransportError
from ._resend import AttemptEvidence
from ._stdlib_wire import StdlibWire
from ._wire_core import DEFAULT_MAX_BYTES, Body, bad_url, failed, lost, not_read, timed_out, too_large, unreachable

_PHASES = {httpx.ConnectTimeout: "connect", httpx.ReadTimeout: "read", httpx.WriteTimeout: "write",
           httpx.PoolTimeout: "pool"}
HTTPX_ERRORS = (httpx.HTTPError, httpx.InvalidURL)
_DECODED_HERE = frozenset({"", "identity", "gzip", "deflate"})  # other encodings: httpx decodes them


def from_httpx(e: Exception, url: str, timeout: httpx.Timeout) -> TransportError:
    """kotoba's transport error meaning the same httpx failure (a caller's httpx client)."""
    msg = str(e) or type(e).__name__
    if isinstance(e, httpx.TimeoutException):
        phase = _PHASES.get(type(e), "read")
        return timed_out(phase, getattr(timeout, phase), url)
    if isinstance(e, httpx.ConnectError):
        return unreachable(url, msg)
    if isinstance(e, (httpx.UnsupportedProtocol, httpx.InvalidURL)):
        return bad_url(url, msg)
    if isinstance(e, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        return lost(url, msg)
    return failed(url, msg)


def _body(r: httpx.Response, url: str, max_bytes: int) -> tuple[Body, bool]:
    """The bounded body for an httpx response, and whether it reads raw bytes (decoded by `Body`)."""
    enc = r.headers.get("content-encoding", "").strip().lower()
    raw = enc in _DECODED_HERE
    length = r.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise too_large(url, max_bytes, int(length), "received")
    return Body(url, max_bytes, enc if raw else None), raw


def _cut(timeout: httpx.Timeout, until: float | None) -> httpx.Timeout:
    """Every phase's timeout cut to what is left of the deadline."""
    if until is None:
        return timeout
    left = max(until - time.monotonic(), 0.001)
    return httpx.Timeout(connect=_min(timeout.connect, left), read=_min(timeout.read, left),
                         write=_min(timeout.write, left), pool=_min(timeout.pool, left))


def _min(a: float | None, b: float) -> float:
    return b if a is None or b < a else a


class Answer(Protocol):
    """What a wire returns; `content` is filled for non-streamed sends."""

    status_code: int

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def content(self) -> bytes: ...

    @property
    def text(self) -> str: ...

    @property
    def is_closed(self) -> bool: ...

    async def aread(self) -> bytes: ...

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class AsyncWire(Protocol):
    name: str

    async def send(self, method: str, url: str, *, json: object = None, content: bytes | None = None,
                   headers: Mapping[str, str] | None = None, timeout: httpx.Timeout, stream: bool = False,
                   attempt: AttemptEvidence | None = None, withhold_key: bool = False,
                   max_bytes: int | None = None) -> Answer:
        """`withhold_key`: send this request without the Authorization header the wire carries;
        `max_bytes`: the body's size limit (the wire's own by default). Raises `TransportError`s only;
        cancelling it closes its connection."""

    async def aclose(self) -> None: ...


class HttpxWire:
    """An httpx.AsyncClient as a wire. `extra_headers` go on every request (a caller's client does not
    carry ours)."""

    name = "httpx"

    def __init__(self, http: httpx.AsyncClient, extra_headers: Mapping[str, str] | None = None,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.http = http
        self.max_bytes = max_bytes
        self._headers = extra_headers
        # parsing a URL string costs as much as the rest of building a request
        self._url: Callable[[str], httpx.URL] = functools.lru_cache(maxsize=256)(httpx.URL)


    async def send(self, method: str, url: str, *, json: object = None, content: bytes | None = None,
                   headers: Mapping[str, str] | None = None, timeout: httpx.Timeout, stream: bool = False,
                   attempt: AttemptEvidence | None = None, withhold_key: bool = False,
                   max_bytes: int | None = None) -> Answer:
        h = self._headers if headers is None else ({**self._headers, **headers} if self._headers else headers)
        ext = {"trace": attempt if isinstance(attempt, AsyncAttempt) else _AsyncHook(attempt)} if attempt else None
        try:
            request = self.http.build_request(method, self._url(url), json=json, content=content, headers=h,
                                              timeout=timeout, extensions=ext)
            if withhold_key:  # the caller's client may carry one too
                request.headers.pop("authorization", None)
            r = await self.http.send(request, stream=True)
        except HTTPX_ERRORS as e:
            raise from_httpx(e, url, timeout) from e
        try:
            answer = HttpxAnswer(r, *_body(r, url, self.max_bytes if max_bytes is None else max_bytes), timeout)
            if not stream:
                await answer.aread()
        except BaseException:
            await r.aclose()
            raise
        return answer

    async def aclose(self) -> None:
        await self.http.aclose()

    @property
    def is_closed(self) -> bool:
        return self.http.is_closed


class HttpxAnswer:
    """An httpx response read through the bounded body; httpx's failures raised as kotoba's."""

    __slots__ = ("_r", "_body", "_raw", "_timeout", "_content", "until", "until_is", "status_code")

    def __init__(self, r: httpx.Response, body: Body, raw: bool, timeout: httpx.Timeout) -> None:
        self._r, self._body, self._raw, self._timeout = r, body, raw, timeout
        self.status_code = r.status_code
        self._content: bytes | None = None
        # the sync wire's deadline (monotonic; None: none), checked as each piece arrives
        self.until: float | None = None
        self.until_is: tuple[str, float | None] = ("total", None)

    @property
    def headers(self) -> Mapping[str, str]:
        return self._r.headers

    def header(self, name: str) -> str | None:
        value: str | None = self._r.headers.get(name)
        return value

    @property
    def content(self) -> bytes:
        if self._content is None:
            raise not_read(self._body.url)
        return self._content

    @property
    def text(self) -> str:
        return self.content.decode(self._r.encoding or "utf-8", "replace")

    @property
    def is_closed(self) -> bool:
        return self._r.is_closed

    def _error(self, e: Exception) -> TransportError:
        return from_httpx(e, self._body.url, self._timeout)

    def _replayed(self) -> bytes:
        """A response read already (a mock's reused one): its decoded content, bounded all the same."""
        self._body = Body(self._body.url, self._body.limit, None)
        return self._body.feed(self._r.content)

    def _check(self) -> None:
        if self.until is not None and time.monotonic() >= self.until:
            raise timed_out(*self.until_is, self._body.url)

    def deadline(self, until: float | None, what: str, limit_s: float | None) -> None:
        self.until, self.until_is = until, (what, limit_s)

    async def aread(self) -> bytes:
        if self._content is None:
            self._content = b"".join([d async for d in self.aiter_bytes()])
        return self._content

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        r, body = self._r, self._body
        try:
            if r.is_stream_consumed:
                yield self._replayed()
                return
            async for data in (r.aiter_raw() if self._raw else r.aiter_bytes()):
                if data := body.feed(data):
                    yield data
            if tail := body.end():
                yield tail
        except TransportError:
            await r.aclose()
            raise
        except HTTPX_ERRORS as e:
            await r.aclose()
            raise self._error(e) from e

    async def aclose(self) -> None:
        await self._r.aclose()

    def read(self) -> bytes:
        if self._content is None:
            self._content = b"".join(self.iter_bytes())
        return self._content

    def iter_bytes(self) -> Iterator[bytes]:
        r, body = self._r, self._body
        try:
            if r.is_stream_consumed:
                yield self._replayed()
                return
            for data in (r.iter_raw() if self._raw else r.iter_bytes()):
                self._check()
                if data := body.feed(data):
                    yield data
            if tail := body.end():
                yield tail
        except TransportError:
            r.close()
            raise
        except HTTPX_ERRORS as e:
            r.close()
            raise self._error(e) from e

    def close(self) -> None:
        self._r.close()


class _AsyncHook:
    """httpcore awaits the trace hook in async code: any evidence reports through it."""

    __slots__ = ("attempt",)

    def __init__(self, attempt: AttemptEvidence) -> None:
        self.attempt = attempt

    async def __call__(self, name: str, info: Mapping[str, object]) -> None:
        trace_event(self.attempt, name)


def default_wire(headers: Mapping[str, str], timeout: httpx.Timeout, verify: bool,
                 limits: httpx.Limits, max_bytes: int = DEFAULT_MAX_BYTES) -> AsyncWire:
    """aiohttp: the measured fastest (docs/transport.md)."""
    return AiohttpWire(headers=headers, verify=verify, limit=limits.max_connections or 0,
                       keepalive_s=limits.keepalive_expiry, max_bytes=max_bytes)


# ------------------------------------------------------------------ sync


class SyncAnswer(Protocol):
    """What a sync wire returns; `content` is filled for non-streamed sends."""

    status_code: int

    @property
    def headers(self) -> Mapping[str, str]: ...

    def header(self, name: str) -> str | None:
        """One header's value (`headers.get(name)`, without building the whole map where that costs)."""

    @property
    def content(self) -> bytes: ...

    @property
    def text(self) -> str: ...

    @property
    def is_closed(self) -> bool: ...

    def read(self) -> bytes: ...

    def iter_bytes(self) -> Iterator[bytes]: ...

    def deadline(self, until: float | None, what: str, limit_s: float | None) -> None:
        """Hold the rest of the body to `until` (monotonic), reported as a `what` ("total", "idle") timeout."""

    def close(self) -> None: ...


class SyncWire(Protocol):
    name: str

    def send(self, method: str, url: str, *, json: object = None, content: bytes | None = None,
             headers: Mapping[str, str] | None = None, timeout: httpx.Timeout, stream: bool = False,
             attempt: AttemptEvidence | None = None, withhold_key: bool = False,
             deadline_s: float | None = None, max_bytes: int | None = None) -> SyncAnswer:
        """`withhold_key`: send this request without the Authorization header the wire carries;
        `deadline_s`: the whole request's; `max_bytes`: the body's size limit (the wire's own by
        default). Raises `TransportError`s only."""

    def close(self) -> None: ...


class HttpxSyncWire:
    """A caller's httpx.Client as a wire: its own proxies, mocks (respx), event hooks and performance.
    `extra_headers` (ours) go on every request; evidence from httpx's trace hook."""

    name = "httpx"

    def __init__(self, http: httpx.Client, extra_headers: Mapping[str, str] | None = None,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.http = http
        self.max_bytes = max_bytes
        self._headers = extra_headers
        # parsing a URL string costs as much as the rest of building a request
        self._url: Callable[[str], httpx.URL] = functools.lru_cache(maxsize=256)(httpx.URL)


    def send(self, method: str, url: str, *, json: object = None, content: bytes | None = None,
             headers: Mapping[str, str] | None = None, timeout: httpx.Timeout, stream: bool = False,
             attempt: AttemptEvidence | None = None, withhold_key: bool = False,
             deadline_s: float | None = None, max_bytes: int | None = None) -> SyncAnswer:
        """httpx has no whole-request deadline: each phase's timeout is cut to what is left of it, and
        it is checked again as each piece of the body arrives."""
        until = None if deadline_s is None else time.monotonic() + deadline_s
        h = self._headers if headers is None else ({**self._headers, **headers} if self._headers else headers)
        ext = {"trace": attempt if isinstance(attempt, Attempt) else functools.partial(trace_event, attempt)} \
            if attempt else None
        cut = _cut(timeout, until)
        try:
            request = self.http.build_request(method, self._url(url), json=json, content=content, headers=h,
                                              timeout=cut, extensions=ext)
            if withhold_key:  # the caller's client may carry one too
                request.headers.pop("authorization", None)
            r = self.http.send(request, stream=True)
        except HTTPX_ERRORS as e:
            if until is not None and isinstance(e, httpx.TimeoutException) and time.monotonic() >= until - 0.01:
                raise timed_out("total", deadline_s, url) from e
            raise from_httpx(e, url, timeout) from e
        try:
            answer = HttpxAnswer(r, *_body(r, url, self.max_bytes if max_bytes is None else max_bytes), timeout)
            answer.deadline(until, "total", deadline_s)
            if not stream:
                answer.read()
        except BaseException:
            r.close()
            raise
        return answer

    def close(self) -> None:
        self.http.close()


def default_sync_wire(headers: Mapping[str, str], verify: bool, limits: httpx.Limits,
                      max_bytes: int = DEFAULT_MAX_BYTES) -> SyncWire:
    """http.client under our keep-alive pool: the measured fastest sync wire (docs/transport.md)."""
    keepalive = 1024 if limits.max_keepalive_connections is None else limits.max_keepalive_connections
    return StdlibWire(headers=headers, verify=verify, keepalive=keepalive, keepalive_s=limits.keepalive_expiry,
                      max_bytes=max_bytes)
