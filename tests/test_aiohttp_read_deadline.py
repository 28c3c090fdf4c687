"""The default async wire's read timeout (kept lazily: one timer per connection, moved by each chunk)
fires exactly as a per-chunk timer would: after `read` seconds without a byte, on any request of a
kept-alive connection, and never while bytes keep coming or while the connection sits idle."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any

import pytest

from kotoba_vllm import AsyncClient, RequestTimeout

BODY = json.dumps({"id": "c", "object": "chat.completion", "model": "m",
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                                "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(BODY)
STALL = None  # in a script: send nothing more on this request


class ScriptedServer:
    """One keep-alive connection at a time; request i is answered by scripts[i]: (pause s, bytes) steps."""

    def __init__(self, scripts: list[list[Any]]) -> None:
        self.scripts = scripts
        self.connections = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.held: list[socket.socket] = []
        threading.Thread(target=self._run, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _run(self) -> None:
        i = 0
        try:
            while True:
                c, _ = self.sock.accept()
                self.connections += 1
                self.held.append(c)
                while i < len(self.scripts):
                    if not self._read_request(c):
                        break
                    for step in self.scripts[i]:
                        if step is STALL:
                            break
                        pause, data = step
                        time.sleep(pause)
                        c.sendall(data)
                    i += 1
        except OSError:
            pass

    @staticmethod
    def _read_request(c: socket.socket) -> bool:
        buf = b""
        while b"\r\n\r\n" not in buf:
            got = c.recv(65536)
            if not got:
                return False
            buf += got
        head, _, rest = buf.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        while len(rest) < length:
            rest += c.recv(65536)
        return True

    def close(self) -> None:
        for c in self.held:
            c.close()
        self.sock.close()


def whole() -> list[Any]:
    return [(0, HEAD + BODY)]


def trickled(pause: float, pieces: int) -> list[Any]:
    data = HEAD + BODY
    step = -(-len(data) // pieces)
    return [(pause, data[i:i + step]) for i in range(0, len(data), step)]


async def _chats(url: str, timeouts: list[float], idle: float = 0.0) -> list[Any]:
    out: list[Any] = []
    async with AsyncClient(url, backend="openai", model="m") as c:
        for t in timeouts:
            started = time.monotonic()
            try:
                out.append((await c.chat("hi", timeout=t)).text)
            except RequestTimeout as e:
                out.append((e.phase, e.limit_s, time.monotonic() - started))
            await asyncio.sleep(idle)
    return out


def run(scripts: list[list[Any]], timeouts: list[float], idle: float = 0.0) -> tuple[list[Any], int]:
    srv = ScriptedServer(scripts)
    try:
        return asyncio.run(asyncio.wait_for(_chats(srv.base_url, timeouts, idle), 30)), srv.connections
    finally:
        srv.close()


def test_bytes_that_keep_coming_never_time_out_though_the_whole_answer_takes_longer() -> None:
    # 6 pieces 0.15 s apart: 0.9 s in all, never 0.4 s without a byte
    out, conns = run([trickled(0.15, 6), trickled(0.15, 6)], [0.4, 0.4])
    assert out == ["Hello", "Hello"] and conns == 1


def test_a_stall_on_a_kept_alive_connection_times_out_after_the_limit() -> None:
    out, conns = run([whole(), [(0.1, HEAD), STALL]], [0.3, 0.3])
    assert out[0] == "Hello" and conns == 1
    phase, limit, took = out[1]
    assert (phase, limit) == ("read", 0.3) and 0.38 <= took < 1.5  # 0.1 s to the head, then 0.3 s of silence


def test_a_shorter_limit_on_the_next_request_is_not_held_back_by_the_longer_one() -> None:
    out, _ = run([whole(), [STALL]], [20.0, 0.3])
    assert out[0] == "Hello"
    phase, limit, took = out[1]
    assert (phase, limit) == ("read", 0.3) and 0.28 <= took < 1.5


@pytest.mark.parametrize("idle", [0.0, 0.5])
def test_a_connection_idle_past_the_limit_serves_the_next_request(idle: float) -> None:
    # the timer of the first request comes due while nothing is being read: no timeout, same connection
    out, conns = run([whole(), whole(), trickled(0.1, 3)], [0.3, 0.3, 0.3], idle=idle)
    assert out == ["Hello", "Hello", "Hello"] and conns == 1
