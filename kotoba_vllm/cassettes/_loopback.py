"""A cassette served from a real loopback socket, for wires respx cannot intercept (aiohttp).

Every request is answered with the recorded status and headers; a recorded stream goes out
chunked, one HTTP chunk per recorded read with a short pause between them (TCP_NODELAY), so
a character split across reads in the recording usually reaches the client split too (the
client must cope with any boundary anyway). The request bodies received are kept.
"""

from __future__ import annotations

import asyncio
import socket
import threading

from ._format import Cassette

PAUSE_S = 0.003
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error",
            503: "Service Unavailable"}


class _Replay(asyncio.Protocol):
    def __init__(self, server: "LoopbackReplay") -> None:
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # a TCP server's connections are full transports
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].decode("latin-1").lower()
        length = 0
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip() == "content-length":
                length = int(value.strip())
        if len(self.buf) < end + 4 + length:
            return
        body, self.buf = self.buf[end + 4:end + 4 + length], self.buf[end + 4 + length:]
        self.server.sent.append(body)
        self.server.sent_headers.append({name.strip(): value.strip() for name, _, value in
                                         (line.partition(":") for line in head.split("\r\n")[1:])})
        self.server.answering(asyncio.get_running_loop().create_task(self._answer()))

    async def _answer(self) -> None:
        c, t = self.server.cassette, self.transport
        assert t is not None
        chunks = c.chunks if c.chunks is not None else ((c.body,) if c.body else ())
        headers = [(k, v) for k, v in c.headers.items() if k not in ("content-length", "transfer-encoding",
                                                                      "connection")]
        streamed = c.chunks is not None
        headers.append(("transfer-encoding", "chunked") if streamed else
                       ("content-length", str(sum(len(x) for x in chunks))))
        head = f"HTTP/1.1 {c.status} {_REASONS.get(c.status, 'Status')}\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
        t.write(head.encode("latin-1"))
        if not streamed:
            t.write(b"".join(chunks))
            return
        for piece in chunks:
            if piece:
                t.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
                await asyncio.sleep(PAUSE_S)
        t.write(b"0\r\n\r\n")


class LoopbackReplay:
    """`with LoopbackReplay(cassette) as srv:` — `srv.base_url`, `srv.sent` (request bodies) and
    `srv.sent_headers`."""

    def __init__(self, cassette: Cassette) -> None:
        self.cassette = cassette
        self.sent: list[bytes] = []
        self.sent_headers: list[dict[str, str]] = []  # each request's headers, names lower-cased
        self.base_url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="cassette-loopback")
        self._server: asyncio.Server | None = None
        self._answers: set[asyncio.Task[None]] = set()  # held so none is collected or left pending at exit

    def answering(self, task: "asyncio.Task[None]") -> None:
        self._answers.add(task)
        task.add_done_callback(self._answers.discard)

    def __enter__(self) -> "LoopbackReplay":
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(
            self._loop.create_server(lambda: _Replay(self), "127.0.0.1", 0), self._loop)
        self._server = server = fut.result(10)
        self.base_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        server = self._server
        assert server is not None, "__exit__ without __enter__"

        async def stop() -> None:
            server.close()
            for task in list(self._answers):  # a client that left mid-stream leaves its answer sleeping
                task.cancel()
            await asyncio.gather(*self._answers, return_exceptions=True)
            await server.wait_closed()
        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()
