"""The default async wire: aiohttp (C HTTP parser, a connection pool that hands out an idle
connection without scanning every connection per request).

aiohttp's failures are raised as kotoba's own transport errors, once, here (`_wire_core`); bodies
are read through the bounded decoder (aiohttp's own decompression is off: it has no size limit), and
each attempt reports the resend rule's evidence positively:

- *reused*: the connector handed this attempt a connection that had served a request before
  (`Connector.connect`, read through a context variable set for the attempt);
- *response bytes*: the connection's protocol counts every byte it receives, so "no response
  byte arrived" is a count that did not move during the attempt, not an inference from an
  error message.

Until that evidence exists an attempt counts as on a new connection: never resent.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json as _json
from typing import AsyncIterator, Callable, Mapping

import aiohttp
import httpx
from aiohttp.client_proto import ResponseHandler
from aiohttp.tracing import Trace
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from ._errors import ConfigError, TransportError
from ._resend import AttemptEvidence
from ._wire_core import (ACCEPT_ENCODING, DECODE_ERRORS, DEFAULT_MAX_BYTES, Body, bad_url, failed, lost, not_read,
                         timed_out, too_large, unreachable)

_WATCH: contextvars.ContextVar["_Watch | None"] = contextvars.ContextVar("kotoba_attempt", default=None)
JSON_HEADERS = {"content-type": "application/json"}
_JSON_ENCODER = _json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_C_ENCODE = _json.encoder.c_make_encoder  # type: ignore[attr-defined]  # json's C accelerator: untyped in typeshed
# `JSONEncoder.encode` builds its C encoder on every call (a third of a small body's cost): one C encoder, the
# same bytes and errors. Without a circular-reference check: a body is a dialect's render, whose containers
# are all new (EDN data goes through `edn_to_json`), so it can hold no cycle.
_ENCODE_PARTS = None if _C_ENCODE is None else _C_ENCODE(
    None, _JSON_ENCODER.default, _json.encoder.encode_basestring, None, ":", ",", False, False, False)


def encode_body(obj: object) -> bytes:
    """`json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)` as UTF-8."""
    if _ENCODE_PARTS is None:  # pragma: no cover - a Python without json's C accelerator
        return _JSON_ENCODER.encode(obj).encode()
    return "".join(_ENCODE_PARTS(obj, 0)).encode()


class CountingHandler(ResponseHandler):
    """aiohttp's protocol, counting received bytes and the requests it has carried, with its per-read
    deadline (`sock_read`) kept lazily.

    aiohttp cancels its read timer and schedules a new one on every chunk, and cancels it at the end of
    every body: two timers made and two cancelled per request, each cancelled one left in the event
    loop's heap until swept. Here a chunk only moves the deadline; one timer per connection stays
    scheduled across its requests and, when it comes due, fires the timeout only if the deadline has
    not moved since, else waits until the new deadline. The timeout fires at the same instant as
    aiohttp's (the last re-arm plus the limit); a body's end disarms it without cancelling."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.bytes_in = 0
        self.uses = 0
        self._read_deadline: float | None = None  # None: disarmed

    def data_received(self, data: bytes) -> None:
        self.bytes_in += len(data)
        super().data_received(data)

    def _reschedule_timeout(self) -> None:
        timeout = self._read_timeout
        if not timeout:
            self._cancel_read_timer()
            return
        deadline = self._read_deadline = self._loop.time() + timeout
        timer = self._read_timeout_handle
        if timer is None or timer.when() > deadline:  # none pending, or one due after the new deadline
            if timer is not None:
                timer.cancel()
            self._read_timeout_handle = self._loop.call_at(deadline, self._read_timer_due)

    def _drop_timeout(self) -> None:
        self._read_deadline = None  # the timer stays scheduled for this connection's next request

    def _read_timer_due(self) -> None:
        timer, self._read_timeout_handle = self._read_timeout_handle, None
        deadline = self._read_deadline
        if deadline is None or timer is None:
            return
        if deadline <= timer.when():
            self._on_read_timeout()
        else:
            self._read_timeout_handle = self._loop.call_at(deadline, self._read_timer_due)

    def _cancel_read_timer(self) -> None:
        self._read_deadline = None
        if self._read_timeout_handle is not None:
            self._read_timeout_handle.cancel()
            self._read_timeout_handle = None

    # A connection that ends takes its timer with it (the timer holds the connection until due).
    def close(self) -> None:
        super().close()
        self._cancel_read_timer()

    def abort(self) -> None:
        super().abort()
        self._cancel_read_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        self._cancel_read_timer()


class Connector(aiohttp.TCPConnector):
    """A TCPConnector whose connections count bytes, and which tells the current attempt whether
    the connection it hands out is reused."""

    def __init__(self, *, limit: int = 100, limit_per_host: int = 0, keepalive_timeout: float = 15.0,
                 ssl: bool = True) -> None:  # aiohttp's own defaults
        super().__init__(limit=limit, limit_per_host=limit_per_host, keepalive_timeout=keepalive_timeout, ssl=ssl)
        # aiohttp builds every connection's protocol with this factory (TCP and TLS alike).
        self._factory = functools.partial(CountingHandler, loop=self._loop)  # type: ignore[assignment]

    async def connect(self, req: aiohttp.ClientRequest, traces: list[Trace],
                      timeout: aiohttp.ClientTimeout) -> aiohttp.connector.Connection:
        conn = await super().connect(req, traces, timeout)
        watch = _WATCH.get()
        proto = conn.protocol
        if watch is not None and isinstance(proto, CountingHandler):
            watch.attempt.connection(reused=proto.uses != 0)
            proto.uses += 1
            watch.proto, watch.start = proto, proto.bytes_in
        return conn


def _wire_error(e: BaseException, url: str, timeout: httpx.Timeout) -> TransportError:
    """kotoba's transport error meaning the same failure."""
    msg = str(e) or type(e).__name__
    if isinstance(e, aiohttp.ConnectionTimeoutError):
        return timed_out("connect", timeout.connect, url)
    if isinstance(e, (aiohttp.SocketTimeoutError, aiohttp.ServerTimeoutError, TimeoutError)):
        return timed_out("read", timeout.read, url)
    if isinstance(e, aiohttp.ClientConnectorError):
        return unreachable(url, msg)
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return lost(url, "Server disconnected without sending a complete response")
    if isinstance(e, aiohttp.ClientPayloadError):
        return lost(url, f"incomplete body: {msg}")
    if isinstance(e, aiohttp.NonHttpUrlClientError):
        return bad_url(url, msg)
    if isinstance(e, aiohttp.InvalidURL):
        return bad_url(url, f"invalid URL: {msg}")
    if isinstance(e, (aiohttp.ClientOSError, aiohttp.ClientResponseError, *DECODE_ERRORS)):
        return lost(url, msg)  # reset, broken pipe, or the server's bytes are not HTTP
    return failed(url, msg)


WIRE_ERRORS = (aiohttp.ClientError, TimeoutError, *DECODE_ERRORS)


async def _read_body(r: aiohttp.ClientResponse, url: str, limit: int) -> bytes:
    """The whole body, bounded: received and decoded bytes each at most `limit`."""
    content = r.content
    data = await content.readany()
    encoding = r.headers.get("content-encoding")
    if encoding is None and len(data) <= limit and content.is_eof():
        return data  # the whole body in one read, sent as is: within the limit as received
    return await _read_rest(r, Body(url, limit, encoding), data)


async def _read_rest(r: aiohttp.ClientResponse, body: Body, first: bytes) -> bytes:
    """The rest of a body through the bounded decoder, `first` being what was read of it already."""
    length = r.content_length
    if length is not None and length > body.limit:  # said up front: no more need be read
        raise too_large(body.url, body.limit, length, "received")
    content = r.content
    parts = [body.feed(first)]
    while data := await content.readany():
        parts.append(body.feed(data))
    parts.append(body.end())
    return b"".join(parts)


class AiohttpAnswer:
    """An aiohttp response under httpx.Response's names."""

    __slots__ = ("_r", "status_code", "headers", "_content", "url", "_limit", "_timeout")

    def __init__(self, r: aiohttp.ClientResponse, url: str, limit: int, timeout: httpx.Timeout,
                 content: bytes | None = None) -> None:
        self._r = r
        self.status_code = r.status
        self.headers: Mapping[str, str] = r.headers
        self._content = content
        self.url, self._limit = url, limit  # the body's size limit (received and decoded, each)
        self._timeout = timeout

    @property
    def content(self) -> bytes:
        if self._content is None:
            raise not_read(self.url)
        return self._content

    @property
    def text(self) -> str:
        return self.content.decode(self._r.charset or "utf-8", "replace")

    @property
    def is_closed(self) -> bool:
        return self._r.closed

    async def aread(self) -> bytes:
        if self._content is None:
            try:
                self._content = await _read_body(self._r, self.url, self._limit)
            except TransportError:
                self._r.close()
                raise
            except WIRE_ERRORS as e:
                self._r.close()
                raise _wire_error(e, self.url, self._timeout) from e
        return self._content

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        body = Body(self.url, self._limit, self._r.headers.get("content-encoding"))
        try:
            async for data in self._r.content.iter_any():
                data = body.feed(data)
                if data:
                    yield data
            if tail := body.end():
                yield tail
        except TransportError:
            self._r.close()
            raise
        except WIRE_ERRORS as e:
            self._r.close()
            raise _wire_error(e, body.url, self._timeout) from e

    async def aclose(self) -> None:
        # A body read to its end returns the connection to the pool; one left unread closes it.
        self._r.release()

    def abort(self) -> None:
        """Close the connection now (a deadline or a limit): never back to the pool."""
        self._r.close()


class _Watch:
    """One attempt's evidence: the connection aiohttp chose, and its byte count when handed over."""

    __slots__ = ("attempt", "proto", "start")

    def __init__(self, attempt: AttemptEvidence) -> None:
        self.attempt = attempt
        self.proto: CountingHandler | None = None
        self.start = 0

    def settle(self) -> None:
        """After a failure: did any response byte arrive during this attempt?"""
        if self.proto is not None:  # the count is the evidence either way: moved, or positively not
            self.attempt.response(seen=self.proto.bytes_in > self.start)


class AiohttpWire:
    name = "aiohttp"

    def __init__(self, *, headers: Mapping[str, str], verify: bool = True, limit: int = 256,
                 keepalive_s: float | None = 5.0, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        # The key goes per request (a session's default header cannot be left off one request).
        self._headers = CIMultiDict((k, v) for k, v in headers.items() if k.lower() != "authorization")
        self._headers["accept-encoding"] = ACCEPT_ENCODING  # what the bounded decoder reads
        auth = {k: v for k, v in headers.items() if k.lower() == "authorization"}
        # by withhold_key; read-only multidicts, which aiohttp merges without copying them into one first
        self._extra = {False: CIMultiDictProxy(CIMultiDict(auth)) if auth else None, True: None}
        self._extra_json = {False: CIMultiDictProxy(CIMultiDict({**JSON_HEADERS, **auth})),
                            True: CIMultiDictProxy(CIMultiDict(JSON_HEADERS))}
        self._verify = verify
        self._limit = limit
        self._keepalive = keepalive_s if keepalive_s is not None else 5.0
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._url: Callable[[str], URL] = functools.lru_cache(maxsize=256)(URL)
        self._timeouts: dict[tuple[float | None, ...], aiohttp.ClientTimeout] = {}

    @property
    def verify(self) -> bool:
        return self._verify

    @property
    def is_closed(self) -> bool:
        return self._closed

    def _open(self) -> aiohttp.ClientSession:
        # Made on first use: aiohttp binds a session to the running event loop.
        conn = Connector(limit=self._limit, limit_per_host=0, keepalive_timeout=self._keepalive,
                         ssl=self._verify)  # True: verify certificates and host names (aiohttp default)
        self._session = aiohttp.ClientSession(connector=conn, headers=self._headers, auto_decompress=False,
                                              cookie_jar=aiohttp.DummyCookieJar(), trust_env=False)
        return self._session


    def _timeout(self, t: httpx.Timeout) -> aiohttp.ClientTimeout:
        key = (t.connect, t.read, t.write, t.pool)
        out = self._timeouts.get(key)
        if out is None:
            # `connect` bounds waiting for a pooled connection plus connecting; `sock_read` every read
            pool_and_connect = None if t.pool is None or t.connect is None else t.pool + t.connect
            out = self._timeouts[key] = aiohttp.ClientTimeout(total=None, connect=pool_and_connect,
                                                              sock_connect=t.connect, sock_read=t.read)
        return out

    async def send(self, method: str, url: str, *, json: object = None, content: bytes | None = None,
                   headers: Mapping[str, str] | None = None, timeout: httpx.Timeout, stream: bool = False,
                   attempt: AttemptEvidence | None = None, withhold_key: bool = False,
                   max_bytes: int | None = None) -> AiohttpAnswer:
        """`max_bytes`: the body's size limit (received and decoded; the wire's own by default). The
        whole-request deadline is the caller's (`AsyncClient`): cancelling a send closes its connection."""
        if self._closed:
            raise ConfigError("this client was closed; make a new one")
        session = self._session or self._open()
        extra: Mapping[str, str] | None
        if json is not None:
            content = encode_body(json)
            extra = self._extra_json[withhold_key]
        else:
            extra = self._extra[withhold_key]
        headers = extra if headers is None else ({**extra, **headers} if extra else headers)
        watch = _Watch(attempt) if attempt is not None else None
        token = _WATCH.set(watch)
        try:
            r = await session.request(method, self._url(url), data=content, headers=headers,
                                      timeout=self._timeout(timeout), allow_redirects=False)
        except WIRE_ERRORS as e:
            if watch is not None:
                watch.settle()
            raise _wire_error(e, url, timeout) from e
        finally:
            _WATCH.reset(token)
        limit = self.max_bytes if max_bytes is None else max_bytes
        if stream:
            return AiohttpAnswer(r, url, limit, timeout)
        try:
            data = await _read_body(r, url, limit)
        except TransportError:
            r.close()
            raise
        except WIRE_ERRORS as e:
            r.close()
            raise _wire_error(e, url, timeout) from e
        except BaseException:  # cancelled (a deadline): the connection goes, never back to the pool
            r.close()
            raise
        return AiohttpAnswer(r, url, limit, timeout, data)

    async def aclose(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
