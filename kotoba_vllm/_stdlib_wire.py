"""The default sync wire: the standard library's `http.client` under a small keep-alive pool.

httpx's sync client spends ~4x the CPU of `http.client` per small request (its models, httpcore's
pool, h11); this wire keeps what `Client` needs and nothing else (docs/transport.md).

- One idle list per origin, behind a lock: threads sharing a `Client` each take their own
  connection, so connections never exceed the requests in flight; at most `keepalive` idle
  connections per origin are kept, each for `keepalive_s` seconds.
- Failures are raised as the httpx exception types `transport_error` and `may_resend` read.
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
import zlib
from typing import Any, Callable, Iterator, Mapping
from urllib.parse import urlsplit

import httpx

from ._errors import ConfigError
from ._resend import AttemptEvidence

ACCEPT_ENCODING = "gzip, deflate"
_READ = 65536


class _CountingReader(io.RawIOBase):
    """The socket's raw reader, counting every byte into its connection (the evidence)."""

    def __init__(self, raw: Any, conn: "_Connection") -> None:
        self._raw, self._conn = raw, conn

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int | None:
        n: int | None = self._raw.readinto(b)
        if n:
            self._conn.bytes_in += n
        return n

    def close(self) -> None:
        if not self.closed:
            self._raw.close()  # the socket's own reader: releases its reference to the socket
        super().close()


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
        return io.BufferedReader(_CountingReader(self.sock.makefile("rb", buffering=0), self.conn), _READ)


class _Connection(http.client.HTTPConnection):
    """One kept-alive connection; `uses` requests carried, `bytes_in` bytes received."""

    def __init__(self, key: tuple[bool, str, int], host: str, port: int, timeout: float | None) -> None:
        super().__init__(host, port, timeout=timeout)
        self.key = key  # the origin's idle list it goes back to
        self.bytes_in = 0
        self.uses = 0
        self.idle_since = 0.0
        self.auto_open = 0  # we connect explicitly: a dropped connection never reconnects silently
        # http.client builds each response by calling this (a class there; here bound to the connection)
        self.response_class = self._response  # type: ignore[assignment]

    def _response(self, sock: socket.socket, *args: Any, **kwargs: Any) -> _Response:
        return _Response(sock, *args, conn=self, **kwargs)


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

    def get(self, key: str, default: Any = None) -> Any:
        return dict.get(self, key.lower(), default)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key.lower() if isinstance(key, str) else key)


def _headers(msg: http.client.HTTPMessage) -> _Headers:
    h = _Headers()
    for k, v in msg.items():
        k = k.lower()
        h[k] = f"{dict.__getitem__(h, k)}, {v}" if dict.__contains__(h, k) else v
    return h


def _as_httpx(e: BaseException, phase: str) -> httpx.HTTPError:
    """The httpx exception type meaning the same failure; `phase` is connect, write or read."""
    msg = str(e) or type(e).__name__
    if isinstance(e, TimeoutError):  # socket.timeout is TimeoutError (an OSError): test it first
        return {"connect": httpx.ConnectTimeout, "write": httpx.WriteTimeout}.get(phase, httpx.ReadTimeout)(msg)
    if phase == "connect":
        return httpx.ConnectError(msg)
    if isinstance(e, http.client.RemoteDisconnected):
        return httpx.RemoteProtocolError("Server disconnected without sending a response.")
    if isinstance(e, http.client.IncompleteRead):
        return httpx.RemoteProtocolError(f"incomplete body: {msg}")
    if phase == "write" and isinstance(e, ValueError):  # a header value http.client refuses to write
        return httpx.LocalProtocolError(msg)
    if isinstance(e, (http.client.HTTPException, ValueError, zlib.error)):  # bytes that are not HTTP
        return httpx.RemoteProtocolError(msg)
    if phase == "write":
        return httpx.WriteError(msg)
    return httpx.ReadError(msg)


WIRE_ERRORS = (OSError, http.client.HTTPException, ValueError, zlib.error)


class _Origin:
    """A parsed URL's origin: the key to its idle connections."""

    __slots__ = ("key", "tls", "host", "port", "target")

    def __init__(self, url: str) -> None:
        u = urlsplit(url)
        if u.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"Request URL has an unsupported protocol '{u.scheme}://': {url}")
        if not u.hostname:
            raise httpx.UnsupportedProtocol(f"Request URL is missing a host: {url}")
        self.tls = u.scheme == "https"
        self.host = u.hostname
        try:
            self.port = u.port or (443 if self.tls else 80)
        except ValueError as e:
            raise httpx.UnsupportedProtocol(f"invalid URL {url}: {e}") from None
        self.key = (self.tls, self.host, self.port)
        self.target = (u.path or "/") + (f"?{u.query}" if u.query else "")


class StdlibAnswer:
    """An http.client response under httpx.Response's names; a body read to its end returns the
    connection to the pool, one closed early closes the connection."""

    __slots__ = ("_r", "_conn", "_wire", "status_code", "_headers", "_content", "_decoder", "is_closed")

    def __init__(self, r: http.client.HTTPResponse, conn: _Connection, wire: "StdlibWire") -> None:
        self._r, self._conn, self._wire = r, conn, wire
        self.status_code = r.status
        self._headers: _Headers | None = None
        self._content: bytes | None = None
        self._decoder = _decoder(r.msg.get("content-encoding"))
        self.is_closed = False

    @property
    def headers(self) -> _Headers:
        # built when asked (an error answer, a stream's content type): most answers never are
        if self._headers is None:
            self._headers = _headers(self._r.msg)
        return self._headers

    @property
    def content(self) -> bytes:
        if self._content is None:
            raise httpx.ResponseNotRead()
        return self._content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def read(self) -> bytes:
        if self._content is None:
            try:
                raw = self._r.read()  # to the end (length, chunked or close-delimited)
                self._content = raw if self._decoder is None else self._decoder.decompress(raw) + self._decoder.flush()
            except WIRE_ERRORS as e:
                self.close()
                raise _as_httpx(e, "read") from e
            self._done()
        return self._content

    def iter_bytes(self) -> Iterator[bytes]:
        """Bytes as they arrive (`read1`: one socket read at most, chunked framing removed)."""
        r, dec = self._r, self._decoder
        try:
            while True:
                data = r.read1(_READ)
                if not data:
                    break
                if dec is not None:
                    data = dec.decompress(data)
                    if not data:
                        continue
                yield data
            if dec is not None and (tail := dec.flush()):
                yield tail
        except WIRE_ERRORS as e:
            self.close()
            raise _as_httpx(e, "read") from e
        self._done()

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


def _decoder(encoding: str | None) -> Any:
    if not encoding or encoding == "identity":
        return None
    enc = encoding.strip().lower()
    if enc == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if enc == "deflate":
        return _Deflate()
    return None  # an encoding we did not ask for: the bytes as sent (as aiohttp and httpx do for unknown ones)


class _Deflate:
    """'deflate' is zlib-wrapped by the spec, raw in some servers: try the first, fall back to the second."""

    def __init__(self) -> None:
        self._d: Any = None

    def decompress(self, data: bytes) -> bytes:
        if self._d is None:
            self._d = zlib.decompressobj()
            try:
                return bytes(self._d.decompress(data))
            except zlib.error:
                self._d = zlib.decompressobj(-zlib.MAX_WBITS)
        return bytes(self._d.decompress(data))

    def flush(self) -> bytes:
        return bytes(self._d.flush()) if self._d is not None else b""


class StdlibWire:
    name = "stdlib"

    def __init__(self, *, headers: Mapping[str, str], verify: bool = True, keepalive: int = 64,
                 keepalive_s: float | None = 5.0) -> None:
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

    def _connect(self, o: _Origin, timeout: httpx.Timeout) -> _Connection:
        conn = (_TlsConnection(o.key, o.host, o.port, timeout.connect, self._context()) if o.tls
                else _Connection(o.key, o.host, o.port, timeout.connect))
        try:
            conn.connect()
        except WIRE_ERRORS as e:
            conn.close()
            raise _as_httpx(e, "connect") from e
        if conn.sock is not None:  # small requests go out at once, not after the peer's delayed ACK
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def send(self, method: str, url: str, *, json: Any = None, content: bytes | None = None,
             headers: Mapping[str, str] | None = None, timeout: httpx.Timeout, stream: bool = False,
             attempt: AttemptEvidence | None = None, withhold_key: bool = False) -> StdlibAnswer:
        if self.is_closed:
            raise ConfigError("this client was closed; make a new one")
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
            attempt.new_connection = conn is None
        if conn is None:
            conn = self._connect(o, timeout)
        conn.uses += 1
        start = conn.bytes_in
        sock = conn.sock
        assert sock is not None
        phase = "write"
        try:
            sock.settimeout(timeout.write)
            conn.request(method, o.target, body=content, headers=h)
            phase = "read"
            sock.settimeout(timeout.read)
            r = conn.getresponse()
        except WIRE_ERRORS as e:
            conn.close()
            if attempt is not None:
                attempt.got_response = conn.bytes_in > start
            raise _as_httpx(e, phase) from e
        answer = StdlibAnswer(r, conn, self)
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


def _readable(sock: socket.socket) -> bool:
    """An idle keep-alive socket is readable only when the server closed it (or misbehaved)."""
    try:
        p = select.poll()
        p.register(sock, select.POLLIN)
        return bool(p.poll(0))
    except (OSError, ValueError):
        return True
