"""A fault-injection HTTP/1.1 server for tests: real loopback sockets, driven per test.

An asyncio server runs in a background thread. For every request it reads, it asks the
test's `script(seen) -> Steps` what to do; the steps are plain data executed in order:

    bytes          write them (headers, body, SSE chunks)
    Sleep(s)       wait (slow headers / slow body; the client's timeout should fire first);
                   cut short when the client hangs up, so no server socket outlives its client
    RESET          abort with SO_LINGER 0: the peer sees a TCP RST
    CLOSE          half-close cleanly (FIN) without finishing
    (end of list)  the response is complete; keep the connection for the next request

`FaultServer.seen` records every request (connection number, index on that connection,
method, path, headers, body), so tests count at the server what the client really sent.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
from typing import Any, Callable, Iterable, Sequence, Union

import attrs


@attrs.frozen
class Sleep:
    seconds: float


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


RESET = _Marker("RESET")
CLOSE = _Marker("CLOSE")

Step = Union[bytes, Sleep, _Marker]
Steps = Sequence[Step]


@attrs.frozen
class Seen:
    """One request as the server read it."""

    conn: int  # 0-based connection number
    index: int  # 0-based request number on that connection
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


# ------------------------------------------------------------------ response builders (pure)

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error",
            503: "Service Unavailable"}


def head(status: int = 200, headers: Iterable[tuple[str, str]] = (), *, length: int | None = None,
         chunked: bool = False, close: bool = False) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    lines += [f"{k}: {v}" for k, v in headers]
    if length is not None:
        lines.append(f"content-length: {length}")
    if chunked:
        lines.append("transfer-encoding: chunked")
    if close:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def reply(body: bytes | str | Any, status: int = 200, headers: Iterable[tuple[str, str]] = (),
          *, close: bool = False) -> list[Step]:
    """A complete response with a Content-Length (a dict/list body is sent as JSON)."""
    if isinstance(body, str):
        raw = body.encode()
    elif isinstance(body, bytes):
        raw = body
    else:
        raw = json.dumps(body).encode()
    hs = [("content-type", "application/json"), *headers]
    return [head(status, hs, length=len(raw), close=close) + raw]


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


LAST_CHUNK = b"0\r\n\r\n"


def sse_head(status: int = 200, content_type: str = "text/event-stream") -> bytes:
    return head(status, [("content-type", content_type), ("cache-control", "no-cache")], chunked=True)


def sse_event(data: bytes | str | Any) -> bytes:
    """One `data:` event as a chunk (a dict is sent as JSON)."""
    if isinstance(data, str):
        raw = data.encode()
    elif isinstance(data, bytes):
        raw = data
    else:
        raw = json.dumps(data).encode()
    return chunk(b"data: " + raw + b"\n\n")


def chat_chunk(text: str | None = None, finish: str | None = None) -> dict[str, Any]:
    delta = {"content": text} if text is not None else {}
    return {"id": "chatcmpl-f", "object": "chat.completion.chunk", "model": "fault",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def chat_answer(text: str = "ok") -> dict[str, Any]:
    return {"id": "chatcmpl-f", "object": "chat.completion", "model": "fault",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def sse_stream(pieces: Sequence[str], *, done: bool = True) -> list[Step]:
    """A whole, well-formed chat stream: one event per piece, a finish chunk, [DONE]."""
    out: list[Step] = [sse_head()]
    out += [sse_event(chat_chunk(p)) for p in pieces]
    out.append(sse_event(chat_chunk(None, "stop")))
    if done:
        out.append(sse_event("[DONE]"))
    out.append(LAST_CHUNK)
    return out


def ok(seen: Seen) -> list[Step]:
    """Default script: a chat answer, streamed when the request asked for it."""
    body = seen.json() or {}
    if body.get("stream"):
        return sse_stream(["Hel", "lo"])
    return reply(chat_answer("Hello"))


# ------------------------------------------------------------------ the server


class FaultServer:
    """`with FaultServer(script) as srv: Client(srv.base_url, backend="vllm")...`"""

    def __init__(self, script: Callable[[Seen], Steps] = ok, *, keep_seen: bool = True) -> None:
        self.script = script
        self.keep_seen = keep_seen  # off for 10,000-stream runs: the record itself would look like a leak
        self.count = 0
        self.seen: list[Seen] = []
        self.connections = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="faultserver", daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FaultServer":
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        fut.result(timeout=10)
        return self

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=512)
        self.port = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        async def _stop() -> None:
            assert self._server is not None
            self._server.close()
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> "FaultServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def reset_counts(self) -> None:
        with self._lock:
            self.seen.clear()
            self.connections = 0
            self.count = 0

    @property
    def requests(self) -> int:
        return self.count

    @property
    def active(self) -> int:
        """Connections the server still holds open."""
        return len(self._tasks)

    def wait_idle(self, limit_s: float = 10.0) -> int:
        """Wait (bounded) until every connection is closed; the number still open."""
        import time
        end = time.monotonic() + limit_s
        while self._tasks and time.monotonic() < end:
            time.sleep(0.01)
        return len(self._tasks)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        with self._lock:
            conn = self.connections
            self.connections += 1
        try:
            index = 0
            while True:
                seen = await _read_request(reader, conn, index)
                if seen is None:
                    break
                with self._lock:
                    self.count += 1
                    if self.keep_seen:
                        self.seen.append(seen)
                if not await self._execute(self.script(seen), reader, writer):
                    return
                index += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # stop() cancels handlers; returning keeps asyncio's stream callback quiet
        finally:
            self._tasks.discard(task)
            if not writer.transport.is_closing():
                writer.transport.abort()

    async def _execute(self, steps: Steps, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Run the steps; False when the connection is gone."""
        for step in steps:
            if isinstance(step, bytes):
                writer.write(step)
                await writer.drain()
            elif isinstance(step, Sleep):
                # the client sends nothing while it waits for an answer: any read result means it hung up
                hangup = asyncio.ensure_future(reader.read(1))
                done, _ = await asyncio.wait([hangup], timeout=step.seconds)
                if done:
                    hangup.exception()  # retrieved: a reset here is the expected hang-up
                    return False
                hangup.cancel()
            elif step is RESET:
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return False
            elif step is CLOSE:
                writer.close()
                return False
        return True


async def _read_request(reader: asyncio.StreamReader, conn: int, index: int) -> Seen | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None  # the client closed the connection
    lines = raw.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0"))
    body = await reader.readexactly(n) if n else b""
    return Seen(conn, index, method, path, headers, body)


def refused_url() -> str:
    """A loopback URL nobody listens on (the port was bound, then released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"
