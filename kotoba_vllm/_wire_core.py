"""What every wire shares, sans-I/O: the errors it raises (kotoba's own, raised once, where the failure
is seen), the response-size limit and the bounded gzip/deflate decoder.

A wire (`_stdlib_wire`, `_aiohttp_wire`, the httpx wires in `_wire`) raises only `TransportError`s:

- `Unreachable`: the connection could not be made (refused, DNS, TLS), or the URL cannot be sent to;
- `RequestTimeout(phase=connect|write|read|pool|total)`: a per-phase timeout, or the whole-request
  deadline (`total`);
- `ResponseTooLarge`: the body passed the limit, counted on the bytes received and again on the bytes
  decoded (a gzip bomb stops at the limit, not at the memory's end); the connection is closed;
- `TransportError(connection_lost=True)`: the connection failed under the request (reset, EOF, bytes
  that are not HTTP) - the one failure the resend rule may act on;
- `TransportError`: anything else the wire could not do.
"""

from __future__ import annotations

import zlib
from typing import Protocol

from ._errors import RequestTimeout, ResponseTooLarge, TransportError, Unreachable

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
"""An answer's size limit (received and decoded, each): generous, so a 48 MiB answer passes."""
PROBE_MAX_BYTES = 4 * 1024 * 1024
"""A capacity probe's (a `/metrics` page is tens of KiB)."""
ACCEPT_ENCODING = "gzip, deflate"
_STEP = 65536  # decoded bytes per decompress call: a bomb never inflates more than this past the limit


def timed_out(phase: str, limit_s: float | None, url: str) -> RequestTimeout:
    what = "deadline" if phase == "total" else "timeout"
    return RequestTimeout(f"{phase} {what} after {limit_s} s talking to {url}", phase=phase, limit_s=limit_s,
                          endpoint=url)


def unreachable(url: str, why: object) -> Unreachable:
    return Unreachable(f"cannot connect to {url}: {why}", endpoint=url)


def bad_url(url: str, why: object) -> Unreachable:
    return Unreachable(f"bad URL {url}: {why}", endpoint=url)


def lost(url: str, why: object) -> TransportError:
    """The connection failed under the request (the resend rule's one case)."""
    return TransportError(f"{url}: {why}", endpoint=url, connection_lost=True)


def failed(url: str, why: object) -> TransportError:
    return TransportError(f"{url}: {why}", endpoint=url)


def not_read(url: str) -> TransportError:
    return TransportError("the answer's body was not read", endpoint=url)


def too_large(url: str, limit: int, read: int, what: str) -> ResponseTooLarge:
    said = {"received": "bytes received", "decoded": "bytes after decompression",
            "sse-line": "bytes in one event-stream line"}[what]
    return ResponseTooLarge(f"answer from {url} passed the size limit: more than {limit} {said} "
                            f"({read} read); the connection was closed", limit_bytes=limit, read_bytes=read,
                            what=what, endpoint=url)


class Body:
    """One response body, bounded: feed what the socket gave (`received`), get the decoded bytes back;
    `ResponseTooLarge` once either count passes `limit`. `encoding` is the Content-Encoding header."""

    __slots__ = ("url", "limit", "received", "decoded", "_dec")

    def __init__(self, url: str, limit: int, encoding: str | None) -> None:
        self.url, self.limit = url, limit
        self.received = self.decoded = 0
        self._dec = None if encoding is None else _decoder(encoding)  # most bodies are sent as is

    def feed(self, data: bytes) -> bytes:
        self.received += len(data)
        if self.received > self.limit:
            raise too_large(self.url, self.limit, self.received, "received")
        dec = self._dec
        if dec is None:
            self.decoded = self.received
            return data
        out: bytes = dec.decompress(data, _STEP)
        if len(out) == _STEP or dec.unconsumed_tail:  # a high ratio: inflate step by step, counting as we go
            parts = [out]
            n = self.decoded + len(out)
            while len(out) == _STEP or dec.unconsumed_tail:
                if n > self.limit:
                    raise too_large(self.url, self.limit, n, "decoded")
                out = dec.decompress(dec.unconsumed_tail, _STEP)
                n += len(out)
                parts.append(out)
            out = b"".join(parts)
        self.decoded += len(out)
        if self.decoded > self.limit:
            raise too_large(self.url, self.limit, self.decoded, "decoded")
        return out

    def end(self) -> bytes:
        """What the decoder still holds (nothing for a body sent as is)."""
        if self._dec is None:
            return b""
        tail = bytes(self._dec.flush())
        self.decoded += len(tail)
        if self.decoded > self.limit:
            raise too_large(self.url, self.limit, self.decoded, "decoded")
        return tail


class Decompressor(Protocol):
    """What zlib's decompress objects and `_Deflate` share, as `Body` uses it."""

    @property
    def unconsumed_tail(self) -> bytes: ...

    def decompress(self, data: bytes, max_length: int, /) -> bytes: ...

    def flush(self) -> bytes: ...


def _decoder(encoding: str | None) -> Decompressor | None:
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
        self._d: Decompressor | None = None
        self.unconsumed_tail = b""

    def decompress(self, data: bytes, max_length: int, /) -> bytes:
        d = self._d
        if d is None:
            d = self._d = zlib.decompressobj()
            try:
                return self._step(d, data, max_length)
            except zlib.error:
                d = self._d = zlib.decompressobj(-zlib.MAX_WBITS)
        return self._step(d, data, max_length)

    def _step(self, d: Decompressor, data: bytes, max_length: int) -> bytes:
        out = bytes(d.decompress(data, max_length))
        self.unconsumed_tail = d.unconsumed_tail
        return out

    def flush(self) -> bytes:
        return bytes(self._d.flush()) if self._d is not None else b""


DECODE_ERRORS = (zlib.error,)
