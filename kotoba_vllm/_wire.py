"""The async client's transports ("wires"): how bytes move, and nothing else.

`AsyncClient` talks to a wire: send one request, get one answer (`status_code`, `headers`,
`content`, `aread`, `aiter_bytes`, `aclose`, `is_closed` — the names httpx.Response has, so the
httpx wire hands its responses through untouched). Failures are raised as httpx exception types
whatever the wire, so error mapping (`transport_error`) and the resend rule (`may_resend`) are
transport-neutral. Every wire fills the `Attempt` it is given: did this attempt open a new
connection, did any response byte arrive — the evidence the resend rule needs.

- `HttpxWire`: an `httpx.AsyncClient` (a caller's own, or ours); evidence from httpx's trace hook.
- `AiohttpWire` (`_aiohttp_wire`): the default when aiohttp is installed; measured 3-5x less client
  CPU per request than httpx 0.28 at 16-256 in flight (benchmarks/README.md).

The sync `Client` has the same pair: `StdlibWire` (`_stdlib_wire`, http.client, the default) and
`HttpxSyncWire` (a caller's `httpx.Client`), answering with `read`, `iter_bytes`, `close`.
"""

from __future__ import annotations

import functools
from typing import Any, AsyncIterator, Callable, Iterator, Mapping, Protocol

import httpx

from ._aiohttp_wire import AiohttpWire
from ._base_client import AsyncAttempt, Attempt
from ._resend import AttemptEvidence
from ._stdlib_wire import StdlibWire


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

    async def send(self, method: str, url: str, *, json: Any = None, content: bytes | None = None,
                   headers: Mapping[str, str] | None = None, timeout: httpx.Timeout, stream: bool = False,
                   attempt: Attempt | None = None, withhold_key: bool = False) -> Answer:
        """`withhold_key`: send this request without the Authorization header the wire carries."""

    async def aclose(self) -> None: ...


class HttpxWire:
    """An httpx.AsyncClient as a wire. `extra_headers` go on every request (a caller's client does not
    carry ours)."""

    name = "httpx"

    def __init__(self, http: httpx.AsyncClient, extra_headers: Mapping[str, str] | None = None) -> None:
        self.http = http
        self._headers = extra_headers
        # parsing a URL string costs as much as the rest of building a request
        self._url: Callable[[str], httpx.URL] = functools.lru_cache(maxsize=256)(httpx.URL)


    async def send(self, method: str, url: str, *, json: Any = None, content: bytes | None = None,
                   headers: Mapping[str, str] | None = None, timeout: httpx.Timeout, stream: bool = False,
                   attempt: Attempt | None = None, withhold_key: bool = False) -> Answer:
        h = self._headers if headers is None else ({**self._headers, **headers} if self._headers else headers)
        ext = {"trace": attempt if isinstance(attempt, AsyncAttempt) else _AsyncHook(attempt)} if attempt else None
        request = self.http.build_request(method, self._url(url), json=json, content=content, headers=h,
                                          timeout=timeout, extensions=ext)
        if withhold_key:  # the caller's client may carry one too
            request.headers.pop("authorization", None)
        return await self.http.send(request, stream=stream)

    async def aclose(self) -> None:
        await self.http.aclose()

    @property
    def is_closed(self) -> bool:
        return self.http.is_closed


class _AsyncHook:
    """httpcore awaits the trace hook in async code: adapt a plain `Attempt`."""

    __slots__ = ("attempt",)

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt

    async def __call__(self, name: str, info: Mapping[str, Any]) -> None:
        self.attempt(name, info)


def default_wire(headers: Mapping[str, str], timeout: httpx.Timeout, verify: bool,
                 limits: httpx.Limits) -> AsyncWire:
    """aiohttp: the measured fastest (docs/transport.md)."""
    return AiohttpWire(headers=headers, verify=verify, limit=limits.max_connections or 0,
                       keepalive_s=limits.keepalive_expiry)


# ------------------------------------------------------------------ sync


class SyncAnswer(Protocol):
    """What a sync wire returns; `content` is filled for non-streamed sends."""

    status_code: int

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def content(self) -> bytes: ...

    @property
    def text(self) -> str: ...

    @property
    def is_closed(self) -> bool: ...

    def read(self) -> bytes: ...

    def iter_bytes(self) -> Iterator[bytes]: ...

    def close(self) -> None: ...


class SyncWire(Protocol):
    name: str

    def send(self, method: str, url: str, *, json: Any = None, content: bytes | None = None,
             headers: Mapping[str, str] | None = None, timeout: httpx.Timeout, stream: bool = False,
             attempt: AttemptEvidence | None = None, withhold_key: bool = False) -> SyncAnswer:
        """`withhold_key`: send this request without the Authorization header the wire carries."""

    def close(self) -> None: ...


class HttpxSyncWire:
    """A caller's httpx.Client as a wire: its own proxies, mocks (respx), event hooks and performance.
    `extra_headers` (ours) go on every request; evidence from httpx's trace hook."""

    name = "httpx"

    def __init__(self, http: httpx.Client, extra_headers: Mapping[str, str] | None = None) -> None:
        self.http = http
        self._headers = extra_headers
        # parsing a URL string costs as much as the rest of building a request
        self._url: Callable[[str], httpx.URL] = functools.lru_cache(maxsize=256)(httpx.URL)


    def send(self, method: str, url: str, *, json: Any = None, content: bytes | None = None,
             headers: Mapping[str, str] | None = None, timeout: httpx.Timeout, stream: bool = False,
             attempt: AttemptEvidence | None = None, withhold_key: bool = False) -> SyncAnswer:
        h = self._headers if headers is None else ({**self._headers, **headers} if self._headers else headers)
        ext = {"trace": attempt} if isinstance(attempt, Attempt) else None
        request = self.http.build_request(method, self._url(url), json=json, content=content, headers=h,
                                          timeout=timeout, extensions=ext)
        if withhold_key:  # the caller's client may carry one too
            request.headers.pop("authorization", None)
        return self.http.send(request, stream=stream)

    def close(self) -> None:
        self.http.close()


def default_sync_wire(headers: Mapping[str, str], verify: bool, limits: httpx.Limits) -> SyncWire:
    """http.client under our keep-alive pool: the measured fastest sync wire (docs/transport.md)."""
    return StdlibWire(headers=headers, verify=verify, keepalive=1024 if limits.max_keepalive_connections is None else limits.max_keepalive_connections,
                      keepalive_s=limits.keepalive_expiry)
