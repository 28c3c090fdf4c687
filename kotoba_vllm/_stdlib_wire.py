"""The default sync wire: the standard library's `http.client` under a small keep-alive pool.

httpx's sync client spends ~4x the CPU of `http.client` per small request (its models, httpcore's
pool, h11); this wire keeps what `Client` needs and nothing else (docs/transport.md).

- One idle list per origin, behind a lock: threads sharing a `Client` each take their own
  connection, so connections never exceed the requests in flight; at most `keepalive` idle
  connections per origin are kept, each for `keepalive_s` seconds.
- Failures are raised as kotoba's own transport errors, once, where they are seen (`_wire_core`).
- Each attempt reports the resend rule's evidence positively: a connection taken from the idle
  list is *reused*; every byte read from a connection is counted, so "no response byte" is a
  count that did not move.
- gzip and deflate are advertised and decoded (as httpx and aiohttp do); no proxy is read from the
  environment (as the aiohttp wire): pass an `httpx.Client` for a proxy.
"""

from __future__ import annotations

import functools
import http.client
import io
import json as _json
import select
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, TypeVar, overload
from urllib.parse import urlsplit

import httpx

from ._errors import ConfigError, TransportError
from ._resend import AttemptEvidence
from ._wire_core import (ACCEPT_ENCODING, DECODE_ERRORS, DEFAULT_MAX_BYTES, Body, bad_url, failed, lost, not_read,
                         timed_out, too_large, unreachable)

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

_READ = 65536
_T = TypeVar("_T")


class _CountingReader(io.RawIOBase):
    """The socket's raw reader, counting every byte into its connection (the evidence)."""

    def __init__(self, raw: io.RawIOBase, conn: "_Connection", sock: socket.socket) -> None:
        self._raw, self._conn, self._sock = raw, conn, sock  # the socket: http.client lets go of it at will_close

    def readable(self) -> bool:
        return True

    def readinto(self, b: WriteableBuffer) -> int | None:
        conn = self._conn
        until = conn.until
        if until is not None:  # a deadline: no read waits past it
            left = until - time.monotonic()
            if left <= 0:
                raise _Expired()
            read_s = conn.read_s
            self._sock.settimeout(left if read_s is None or left < read_s else read_s)
        try:
            n: int | None = self._raw.readinto(b)
        except TimeoutError:
            if until is not None and time.monotonic() >= until:
                raise _Expired() from None
            raise
        if until is not None and time.monotonic() >= until:
            # the process ran only after the deadline (a starved machine): what came in meanwhile is not delivered
            raise _Expired()
        if n:
            conn.bytes_in += n
        return n

    def close(self) -> None:
        if not self.closed:
            self._raw.close()  # the socket's own reader: releases its reference to the socket
        super().close()


class _Expired(TimeoutError):
    """The connection's deadline (`_Connection.until`) passed during a read."""


class _Response(http.client.HTTPResponse):
    def __init__(self, sock: socket.socket, debuglevel: int = 0, method: str | None = None,
                 url: str | None = None, *, conn: "_Connection") -> None:
        # HTTPResponse asks its socket only for `makefile`: the shim hands it a counted reader
        super().__init__(_Shim(sock, conn), debuglevel, method, url)  # type: ignore[arg-type]


class _Shim:
    """What HTTPResponse asks of a socket: `makefile("rb")`, here a counted, buffered reader."""

    __slots__ = ("sock", "conn")

    def __init__(self, sock: socket.socket, conn: "_Connection") -> None:
        self.sock, self.conn = sock, conn

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_CountingReader(self.sock.makefile("rb", buffering=0), self.conn, self.sock), _READ)


class _Connection(http.client.HTTPConnection):
    """One kept-alive connection; `uses` requests carried, `bytes_in` bytes received."""

    def __init__(self, key: tuple[bool, str, int], host: str, port: int, timeout: float | None) -> None:
        super().__init__(host, port, timeout=timeout)
        self.key = key  # the origin's idle list it goes back to
        self.bytes_in = 0
        self.uses = 0
        self.idle_since = 0.0
        # The request's deadline (monotonic; None: none) and what it is, for the error: ("total", s) or
        # ("idle", s), which a stream moves on each data event; `read_s` the per-read timeout.
        self.until: float | None = None
        self.until_is: tuple[str, float | None] = ("total", None)
        self.read_s: float | None = None
        self.auto_open = 0  # we connect explicitly: a dropped connection never reconnects silently
        # http.client builds each response by calling this (a class there; here bound to the connection)
        self.response_class = self._response  # type: ignore[assignment]

    def _response(self, sock: socket.socket, debuglevel: int = 0, method: str | None = None,
                  url: str | None = None) -> _Response:
        return _Response(sock, debuglevel, method, url, conn=self)


class _TlsConnection(_Connection):
    def __init__(self, key: tuple[bool, str, int], host: str, port: int, timeout: float | None,
                 context: ssl.SSLContext) -> None:
        super().__init__(key, host, port, timeout)
        self._context = context

    def connect(self) -> None:
        super().connect()
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self.host)


class _Headers(dict[str, str]):
    """Response headers, case-insensitive (stored lower-cased; repeated ones joined by ", ")."""

    def __getitem__(self, key: str) -> str:
        return dict.__getitem__(self, key.lower())

    @overload
    def get(self, key: str, default: None = None, /) -> str | None: ...

    @overload
    def get(self, key: str, default: str, /) -> str: ...

    @overload
    def get(self, key: str, default: _T, /) -> str | _T: ...

    def get(self, key: str, default: object = None, /) -> object:
        return dict.get(self, key.lower(), default)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key.lower() if isinstance(key, str) else key)


def _headers(msg: http.client.HTTPMessage) -> _Headers:
    h: dict[str, str] = {}
    for k, v in msg.raw_items():  # as `items()` gives them: http.client's latin-1 text needs no sanitizing
        k = k.lower()
        prev = h.get(k)
        h[k] = v if prev is None else f"{prev}, {v}"
    return _Headers(h)


def _wire_error(e: BaseException, phase: str, url: str, timeout: httpx.Timeout) -> TransportError:
    """kotoba's transport error meaning the same failure; `phase` is connect, write or read."""
    msg = str(e) or type(e).__name__
    if isinstance(e, TimeoutError):  # socket.timeout is TimeoutError (an OSError): test it first
        return timed_out(phase, getattr(timeout, phase), url)
    if phase == "connect":
        return unreachable(url, msg)
    if isinstance(e, http.client.RemoteDisconnected):
        return lost(url, "Server disconnected without sending a response.")
    if isinstance(e, http.client.IncompleteRead):
        return lost(url, f"incomplete body: {msg}")
    if phase == "write" and isinstance(e, ValueError):  # a header value http.client refuses to write
        return failed(url, msg)
    return lost(url, msg)  # reset, broken pipe, EOF, or bytes that are not HTTP


WIRE_ERRORS = (OSError, http.client.HTTPException, ValueError, *DECODE_ERRORS)


class _Origin:
    """A parsed URL's origin: the key to its idle connections."""

    __slots__ = ("key", "tls", "host", "port", "target")

    def __init__(self, url: str) -> None:
        u = urlsplit(url)
        if u.scheme not in ("http", "https"):
            raise bad_url(url, f"Request URL has an unsupported protocol '{u.scheme}://'")
        if not u.hostname:
            raise bad_url(url, "Request URL is missing a host")
        self.tls = u.scheme == "https"
        self.host = u.hostname
        try:
            self.port = u.port or (443 if self.tls else 80)
        except ValueError as e:
            raise bad_url(url, e) from None
        self.key = (self.tls, self.host, self.port)
        self.target = (u.path or "/") + (f"?{u.query}" if u.query else "")


class StdlibAnswer:
    """An http.client response under httpx.Response's names; a body read to its end returns the
    connection to the pool, one closed early (or past a limit) closes the connection."""

    __slots__ = ("_r", "_conn", "_wire", "url", "status_code", "_headers", "_content", "_limit", "_timeout",
                 "is_closed")

    def __init__(self, r: http.client.HTTPResponse, conn: _Connection, wire: "StdlibWire", url: str,
                 max_bytes: int, timeout: httpx.Timeout) -> None:
        self._r, self._conn, self._wire, self.url = r, conn, wire, url
        self.status_code = r.status
        self._headers: _Headers | None = None
        self._content: bytes | None = None
        self._limit = max_bytes  # the body's size limit (received and decoded, each)
        self._timeout = timeout
        self.is_closed = False

    @property
    def headers(self) -> _Headers:
        # built when asked (an error answer, a stream's content type): most answers never are
        if self._headers is None:
            self._headers = _headers(self._r.msg)
        return self._headers

    def header(self, name: str) -> str | None:
        """`headers.get(name)` (repeats joined alike), without building the map: most answers never need it."""
        if self._headers is not None:
            return self._headers.get(name)
        return self._r.getheader(name)

    @property
    def content(self) -> bytes:
        if self._content is None:
            raise not_read(self.url)
        return self._content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def deadline(self, until: float | None, what: str, limit_s: float | None) -> None:
        """Move the deadline reads are held to (a stream's idle limit after each data event)."""
        self._conn.until, self._conn.until_is = until, (what, limit_s)

    def read(self) -> bytes:
        if self._content is None:
            r = self._r
            try:
                length = r.length
                if length is not None and length > self._limit:  # said up front: no byte need be read
                    raise too_large(self.url, self._limit, length, "received")
                encoding = r.msg.get("content-encoding")
                if length is not None and encoding is None:  # sent as is, Content-Length bytes: within the limit
                    self._content = r.read()
                else:
                    self._content = b"".join(self._bounded(Body(self.url, self._limit, encoding)))
            except TransportError:
                self.close()
                raise
            except WIRE_ERRORS as e:
                self.close()
                raise self._error(e) from e
            self._done()
        return self._content

    def iter_bytes(self) -> Iterator[bytes]:
        """Bytes as they arrive (`read1`: one socket read at most, chunked framing removed)."""
        try:
            yield from self._bounded(Body(self.url, self._limit, self._r.msg.get("content-encoding")))
        except TransportError:
            self.close()
            raise
        except WIRE_ERRORS as e:
            self.close()
            raise self._error(e) from e
        self._done()

    def _bounded(self, body: Body) -> Iterator[bytes]:
        """The body's decoded bytes as they arrive, through the bounded decoder (to the end: length,
        chunked or close-delimited)."""
        r = self._r
        while data := r.read1(_READ):
            if data := body.feed(data):
                yield data
        if r.length:  # read1 ends quietly at EOF: a Content-Length not met is a broken answer
            raise http.client.IncompleteRead(b"", r.length)
        if tail := body.end():
            yield tail

    def _error(self, e: BaseException) -> TransportError:
        if isinstance(e, _Expired):
            what, limit_s = self._conn.until_is
            return timed_out(what, limit_s, self.url)
        return _wire_error(e, "read", self.url, self._timeout)

    def _done(self) -> None:
        """The body was read to its end: the connection may carry the next request."""
        if not self.is_closed:
            self.is_closed = True
            reusable = not self._r.will_close
            self._r.close()  # http.client sends nothing more on a connection until its response is closed
            self._wire._release(self._conn, reusable)

    def close(self) -> None:
        if not self.is_closed:
            self.is_closed = True
            self._r.close()
            self._wire._release(self._conn, reusable=False)


class StdlibWire:
    name = "stdlib"

    def __init__(self, *, headers: Mapping[str, str], verify: bool = True, keepalive: int = 64,
                 keepalive_s: float | None = 5.0, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        # The key goes per request, so one request can be sent without it (withhold_key).
        base = {k.lower(): v for k, v in headers.items()}
        auth = base.pop("authorization", None)
        base["accept-encoding"] = ACCEPT_ENCODING
        self._base = {False: {**base, **({"authorization": auth} if auth else {})}, True: base}
        self._json = {w: {**h, "content-type": "application/json"} for w, h in self._base.items()}
        self.verify = verify
        self._keepalive = keepalive
        self._keepalive_s = keepalive_s if keepalive_s is not None else 5.0
        self._idle: dict[tuple[bool, str, int], list[_Connection]] = {}
        self._lock = threading.Lock()
        self._origin: Callable[[str], _Origin] = functools.lru_cache(maxsize=256)(_Origin)
        self._tls: ssl.SSLContext | None = None
        self.is_closed = False
        self.idle_dropped = 0  # idle connections found closed or expired at checkout, never sent on

    def _context(self) -> ssl.SSLContext:
        if self._tls is None:
            ctx = ssl.create_default_context()  # verifies certificates and host names
            if not self.verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._tls = ctx
        return self._tls


    def _checkout(self, o: _Origin) -> _Connection | None:
        """An idle connection to `o` still open and inside its keep-alive time, or None."""
        now = time.monotonic()
        while True:
            with self._lock:
                idle = self._idle.get(o.key)
                if not idle:
                    return None
                conn = idle.pop()
            sock = conn.sock
            if sock is not None and now - conn.idle_since < self._keepalive_s and not _readable(sock):
                return conn
            self.idle_dropped += 1  # what a test and a curious user can see of the servers' closes
            conn.close()  # expired, or the server closed it (or sent bytes nobody asked for) while idle

    def _release(self, conn: _Connection, reusable: bool) -> None:
        if reusable and conn.sock is not None and not self.is_closed:
            conn.idle_since = time.monotonic()
            with self._lock:
                idle = self._idle.setdefault(conn.key, [])
                if len(idle) < self._keepalive:
                    idle.append(conn)
                    return
        conn.close()

    def _connect(self, o: _Origin, url: str, timeout: httpx.Timeout, until: float | None,
                 limit_s: float | None) -> _Connection:
        connect_s = _within(timeout.connect, until)
        conn = (_TlsConnection(o.key, o.host, o.port, connect_s, self._context()) if o.tls
                else _Connection(o.key, o.host, o.port, connect_s))
        try:
            conn.connect()
        except WIRE_ERRORS as e:
            conn.close()
            if until is not None and isinstance(e, TimeoutError) and time.monotonic() >= until:
                raise timed_out("total", limit_s, url) from e
            raise _wire_error(e, "connect", url, timeout) from e
        if conn.sock is not None:  # small requests go out at once, not after the peer's delayed ACK
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def send(self, method: str, url: str, *, json: object = None, content: bytes | None = None,
             headers: Mapping[str, str] | None = None, timeout: httpx.Timeout, stream: bool = False,
             attempt: AttemptEvidence | None = None, withhold_key: bool = False,
             deadline_s: float | None = None, max_bytes: int | None = None) -> StdlibAnswer:
        """`deadline_s`: the whole request, from now to its last byte; `max_bytes`: the body's size limit
        (received and decoded; the wire's own by default)."""
        if self.is_closed:
            raise ConfigError("this client was closed; make a new one")
        until = None if deadline_s is None else time.monotonic() + deadline_s
        o = self._origin(url)
        if json is not None:
            content = _json.dumps(json, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
            h = self._json[withhold_key]
        else:
            h = self._base[withhold_key]
        if headers:
            h = {**h, **{k.lower(): v for k, v in headers.items()}}
        conn = self._checkout(o)
        if attempt is not None:
            attempt.connection(reused=conn is not None)
        if conn is None:
            conn = self._connect(o, url, timeout, until, deadline_s)
        conn.uses += 1
        conn.read_s = timeout.read
        start = conn.bytes_in
        sock = conn.sock
        assert sock is not None
        phase = "write"
        try:
            write_s = timeout.write
            if deadline_s is not None and (write_s is None or deadline_s < write_s):
                write_s = deadline_s  # the deadline (`until`) began microseconds ago: no clock read for that
            sock.settimeout(write_s)
            conn.request(method, o.target, body=content, headers=h)
            phase = "read"
            conn.until, conn.until_is = until, ("total", deadline_s)
            if until is None:  # else each read sets its own timeout, cut to the deadline (`_CountingReader`)
                sock.settimeout(timeout.read)
            r = conn.getresponse()
        except WIRE_ERRORS as e:
            conn.close()
            if attempt is not None:
                attempt.response(seen=conn.bytes_in > start)
            if until is not None and isinstance(e, TimeoutError) and time.monotonic() >= until:
                raise timed_out("total", deadline_s, url) from e
            raise _wire_error(e, phase, url, timeout) from e
        answer = StdlibAnswer(r, conn, self, url, self.max_bytes if max_bytes is None else max_bytes, timeout)
        if not stream:
            answer.read()
        return answer

    def close(self) -> None:
        self.is_closed = True
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for c in conns:
                c.close()

    def __del__(self) -> None:
        # a Client dropped without close(): its idle sockets close now, not whenever they are collected
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


def _within(limit_s: float | None, until: float | None) -> float | None:
    """A phase's timeout, cut to what is left of the deadline."""
    if until is None:
        return limit_s
    left = until - time.monotonic()
    if left < 0.001:
        left = 0.001
    return left if limit_s is None or left < limit_s else limit_s


def _readable(sock: socket.socket) -> bool:
    """An idle keep-alive socket is readable only when the server closed it (or misbehaved)."""
    try:
        p = select.poll()
        p.register(sock, select.POLLIN)
        return bool(p.poll(0))
    except (OSError, ValueError):
        return True
