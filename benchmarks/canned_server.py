"""A canned-response OpenAI-compatible server on loopback, so the client dominates the clock.

Raw asyncio protocol, standard library only: HTTP/1.1 keep-alive, no parsing beyond the
request line, `content-length` and (for POSTs) the JSON body. Answers are prebuilt bytes:

- `POST /v1/chat/completions` (and `/v1/completions`): a small chat answer, or, when the body
  says `"stream": true`, an SSE stream of `max_tokens` chunks (default `--chunks`) plus a usage
  chunk and `[DONE]`, sent chunked in one write.
- `GET /v1/models`, `GET /health`: tiny JSON. Anything else: 404 (so backend detection says "openai").
- `GET /_stats`: connections accepted, requests by path and 429s since start (the benchmark counts
  connections per contender from it; its own connection is counted too).
- `--slots N`: a server with N slots: `GET /slots` reports them busy or idle in llama.cpp's shape,
  and a POST beyond N in flight is answered 429 at once (a fleet member that refuses rather than queues).

`--delay-ms N` answers every POST N ms after reading it (a server that takes time, as a GPU does),
without blocking the others. `--ports 2` listens on two ports in the same process (two pool
members with exactly the server resources one member has alone).

Run it in its own process: `python benchmarks/canned_server.py [--port 0]` prints `PORT <n>` once
listening. `CannedServer()` is a context manager that does exactly that from Python.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
from typing import Any

CREATED = 1_700_000_000
MODEL = "canned"


def chat_body() -> bytes:
    return json.dumps({
        "id": "chatcmpl-canned", "object": "chat.completion", "created": CREATED, "model": MODEL,
        "system_fingerprint": "fp_canned",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there, friend."},
                     "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
    }, separators=(",", ":")).encode()


def _chunk(delta: dict[str, Any], finish: str | None, usage: dict[str, int] | None = None) -> bytes:
    obj: dict[str, Any] = {"id": "chatcmpl-canned", "object": "chat.completion.chunk", "created": CREATED,
                           "model": MODEL, "system_fingerprint": "fp_canned",
                           "choices": [] if usage else [{"index": 0, "delta": delta, "logprobs": None,
                                                         "finish_reason": finish}]}
    if usage:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def stream_body(n: int) -> bytes:
    """`n` content chunks (the first also carries the role), a usage chunk, `[DONE]`."""
    parts = [_chunk({"role": "assistant", "content": "tok0 "}, None)]
    parts += [_chunk({"content": f"tok{i} "}, None) for i in range(1, n - 1)]
    parts.append(_chunk({"content": "end"}, "stop"))
    parts.append(_chunk({}, None, {"prompt_tokens": 9, "completion_tokens": n, "total_tokens": 9 + n}))
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def _response(status: str, body: bytes, ctype: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: " + ctype + b"\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


CHAT = _response("200 OK", chat_body())
MODELS = _response("200 OK", json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model",
                                                                      "owned_by": "canned"}]}).encode())
HEALTH = _response("200 OK", b'{"status":"ok"}')
TOO_MANY = _response("429 Too Many Requests", b'{"error":{"message":"all slots are busy","type":"rate_limit"}}')
NOT_FOUND = _response("404 Not Found", b'{"error":{"message":"not found","type":"not_found_error"}}')


class _Streams:
    """Prebuilt chunked SSE answers by chunk count (built once per count)."""

    def __init__(self) -> None:
        self.cache: dict[int, bytes] = {}

    def get(self, n: int) -> bytes:
        out = self.cache.get(n)
        if out is None:
            body = stream_body(max(2, n))
            out = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                   b"transfer-encoding: chunked\r\n\r\n" + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
            self.cache[n] = out
        return out


class Stats:
    def __init__(self, slots: int = 0) -> None:
        self.connections = 0
        self.requests: dict[str, int] = {}
        self.slots = slots  # 0: no limit; else answers 429 to a POST beyond this many in flight
        self.in_flight = 0
        self.rejected = 0


class Http(asyncio.Protocol):
    def __init__(self, streams: _Streams, default_chunks: int, delay_s: float = 0.0,
                 stats: Stats | None = None) -> None:
        self.buf = b""
        self.streams, self.default_chunks = streams, default_chunks
        self.delay_s = delay_s
        self.stats = stats or Stats()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.stats.connections += 1

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end]
            length = 0
            lower = head.lower()
            i = lower.find(b"content-length:")
            if i >= 0:
                j = lower.find(b"\r\n", i)
                length = int(lower[i + 15:j if j >= 0 else len(lower)])
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            assert self.transport is not None
            out = self.answer(head, body)
            stats = self.stats
            if head[:4] == b"POST" and stats.slots:
                if stats.in_flight >= stats.slots:
                    stats.rejected += 1
                    self.transport.write(TOO_MANY)
                    continue
                stats.in_flight += 1
                asyncio.get_running_loop().call_later(self.delay_s, self._write, out, True)
            elif self.delay_s and head[:4] == b"POST":
                asyncio.get_running_loop().call_later(self.delay_s, self._write, out)
            else:
                self.transport.write(out)

    def _write(self, data: bytes, slot: bool = False) -> None:
        if slot:
            self.stats.in_flight -= 1
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def answer(self, head: bytes, body: bytes) -> bytes:
        line = head.split(b"\r\n", 1)[0]
        method, path = line.split(b" ", 2)[:2]
        path = path.split(b"?", 1)[0]
        key = path.decode("latin-1")
        self.stats.requests[key] = self.stats.requests.get(key, 0) + 1
        if path == b"/_stats":
            return _response("200 OK", json.dumps({"connections": self.stats.connections,
                                                   "requests": self.stats.requests,
                                                   "rejected": self.stats.rejected}).encode())
        if method == b"GET" and path == b"/slots" and self.stats.slots:  # llama.cpp's shape
            busy = self.stats.in_flight
            return _response("200 OK", json.dumps([{"id": i, "is_processing": i < busy}
                                                   for i in range(self.stats.slots)]).encode())
        if method == b"POST" and path in (b"/v1/chat/completions", b"/v1/completions"):
            try:
                req = json.loads(body) if body else {}
            except ValueError:
                return _response("400 Bad Request", b'{"error":{"message":"bad json"}}')
            if req.get("stream"):
                return self.streams.get(int(req.get("max_tokens") or self.default_chunks))
            return CHAT
        if method == b"GET" and path == b"/v1/models":
            return MODELS
        if method == b"GET" and path == b"/health":
            return HEALTH
        return NOT_FOUND


async def serve(host: str, port: int, chunks: int, delay_ms: float = 0.0, ports: int = 1, slots: int = 0) -> None:
    """Listen on `ports` ports (the first is `port`, the rest any free one), each with its own stats:
    several "servers" sharing one process and one event loop."""
    loop = asyncio.get_running_loop()
    streams = _Streams()
    servers = []
    for i in range(ports):
        stats = Stats(slots)
        servers.append(await loop.create_server(lambda stats=stats: Http(streams, chunks, delay_ms / 1e3, stats),
                                                host, port if i == 0 else 0, backlog=4096))
    print("PORT " + " ".join(str(s.sockets[0].getsockname()[1]) for s in servers), flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


class CannedServer:
    """Start the canned server in a child process; `.base_url` once ready; stop on exit.
    `ports=2`: the same process listens on two ports (`.base_urls`), each counted apart."""

    def __init__(self, chunks: int = 1000, delay_ms: float = 0.0, cpu: int | None = None, ports: int = 1,
                 slots: int = 0) -> None:
        self.chunks = chunks
        self.slots = slots
        self.delay_ms = delay_ms
        self.cpu = cpu  # pin to this core (taskset) when given and available
        self.ports = ports
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""
        self.base_urls: list[str] = []

    def stats(self, port_index: int = 0) -> dict[str, Any]:
        import urllib.request
        with urllib.request.urlopen(self.base_urls[port_index] + "/_stats", timeout=10) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    def __enter__(self) -> "CannedServer":
        argv = [sys.executable, os.path.abspath(__file__), "--port", "0", "--chunks", str(self.chunks),
                "--delay-ms", str(self.delay_ms), "--ports", str(self.ports), "--slots", str(self.slots)]
        if self.cpu is not None and shutil.which("taskset"):
            argv = ["taskset", "-c", str(self.cpu)] + argv
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"canned server did not start: {line!r}")
        self.base_urls = [f"http://127.0.0.1:{int(p)}" for p in line.split()[1:]]
        self.base_url = self.base_urls[0]
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--chunks", type=int, default=1000, help="chunks per stream when the body has no max_tokens")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="answer every POST this many ms after reading it")
    ap.add_argument("--ports", type=int, default=1, help="listen on this many ports in this one process")
    ap.add_argument("--slots", type=int, default=0,
                    help="a server with this many slots: GET /slots reports them (llama.cpp's shape) and a POST "
                         "beyond this many in flight is answered 429 at once (0: no limit)")
    a = ap.parse_args()
    if a.host not in ("127.0.0.1", "::1", "localhost"):
        raise SystemExit("loopback only")
    try:
        asyncio.run(serve(a.host, a.port, a.chunks, a.delay_ms, a.ports, a.slots))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
