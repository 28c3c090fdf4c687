"""Resource hygiene: thousands of cancelled or abandoned streams, sync and async, against the
fault server, leave no open sockets, no pending asyncio tasks and flat memory. Everything is
asserted on counts (file descriptors, tasks, traced bytes), never on time.

Default run: 1,000 streams per flavour; `-m slow` or KOTOBA_VLLM_HYGIENE=long selects the 10,000 profile.
Ways a stream is left, in turn:
  closed     `with` block left after the first delta
  dropped    first delta read, then the stream object dropped mid-iteration
  unread     opened and dropped without reading a byte (`Stream.__del__` releases it)
  cancelled  (async) the task consuming it is cancelled while the server is mid-stream
"""

from __future__ import annotations

import asyncio
import gc
import os
import tracemalloc
from typing import Any, Iterator

import httpx
import pytest

from faultserver import LAST_CHUNK, FaultServer, Seen, Sleep, Step, chat_chunk, sse_event, sse_head
from kotoba_vllm import _client
from kotoba_vllm._client import AsyncClient, Client

MSGS = [{"role": "user", "content": "hi"}]
# Bytes of traced memory a stream may leave behind on average once warm: a leaked response,
# stream or connection costs kilobytes each, so a real leak overshoots this by far.
PER_STREAM_BYTES = 200
WARMUP = 200


def _count(request: pytest.FixtureRequest, profile: str) -> int:
    # The long profile is marked slow: deselected unless `-m slow` or KOTOBA_VLLM_HYGIENE=long (tests/_live.py).
    return 10_000 if profile == "long" else 1_000


def long_stream(seen: Seen) -> list[Step]:
    """A first token at once, then the server dawdles: every client leaves mid-stream."""
    return [sse_head(), sse_event(chat_chunk("tok")), Sleep(5.0), sse_event(chat_chunk(None, "stop")),
            LAST_CHUNK]


def report(request: pytest.FixtureRequest, line: str) -> None:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capman = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capman is not None:
        with capman.global_and_fixture_disabled():  # shown in the run's output, not swallowed by capture
            reporter.write_line("")
            reporter.write_line(line)


def sockets() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


@pytest.fixture
def server() -> Iterator[FaultServer]:
    with FaultServer(long_stream, keep_seen=False) as srv:
        yield srv


PROFILES = ["default", pytest.param("long", marks=pytest.mark.slow)]


@pytest.mark.parametrize("wire", ["stdlib", "httpx"])  # the default wire, and a caller's httpx client
@pytest.mark.parametrize("profile", PROFILES)
def test_sync_abandoned_streams_leave_nothing(server: FaultServer, profile: str, wire: str,
                                              request: pytest.FixtureRequest) -> None:
    n = _count(request, profile)
    base_sockets = sockets()
    http = httpx.Client(timeout=10, limits=_client._limits()) if wire == "httpx" else None
    client = Client(server.base_url, backend="vllm", timeout=10, http_client=http)
    assert client.transport == wire

    def one(i: int) -> None:
        way = i % 3
        if way == 0:  # closed
            with client.stream_chat(MSGS) as s:
                for _ in s:
                    break
        elif way == 1:  # dropped mid-iteration
            s = client.stream_chat(MSGS)
            it = iter(s)
            assert next(it).delta == "tok"
            del it, s
        else:  # unread
            s = client.stream_chat(MSGS)
            del s

    for i in range(WARMUP):
        one(i)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        one(i)
        # no stream keeps its connection: open client sockets never pile up
        if i % 250 == 0:
            assert sockets() - base_sockets <= 32, f"{sockets() - base_sockets} sockets open after {i} streams"
    # The fault server shares this process: let it finish its side of every stream first, or a loaded
    # machine counts its lagging handlers as our memory.
    server.wait_idle()
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    client.close()
    assert server.wait_idle() == 0
    assert sockets() <= base_sockets  # <=: sockets of earlier tests may still be closing
    assert server.requests == n + WARMUP  # one request per stream, none resent
    report(request, f"hygiene sync ({wire}): {n} streams (closed/dropped/unread), sockets left 0, "
                    f"traced memory {grown:+d} bytes ({grown / n:+.1f} B/stream)")
    assert grown < n * PER_STREAM_BYTES, f"memory grew {grown} bytes over {n} streams"


@pytest.mark.parametrize("wire", ["aiohttp", "httpx"])  # the default wire, and a caller's httpx client
@pytest.mark.parametrize("profile", PROFILES)
def test_async_cancelled_and_abandoned_streams_leave_nothing(server: FaultServer, profile: str, wire: str,
                                                             request: pytest.FixtureRequest) -> None:
    n = _count(request, profile)
    base_sockets = sockets()

    async def main() -> tuple[int, list[Any], int]:
        http = httpx.AsyncClient(timeout=10, limits=_client._limits()) if wire == "httpx" else None
        client = AsyncClient(server.base_url, backend="vllm", timeout=10, http_client=http)
        assert client.transport == wire
        baseline = asyncio.all_tasks()  # the runner's own tasks

        async def one(i: int) -> None:
            way = i % 4
            if way == 0:  # closed
                async with await client.stream_chat(MSGS) as s:
                    async for _ in s:
                        break
            elif way == 1:  # dropped mid-iteration (the async generator is finalized by the loop)
                s = await client.stream_chat(MSGS)
                async for d in s:
                    assert d.delta == "tok"
                    break
                del s
            elif way == 2:  # unread
                s = await client.stream_chat(MSGS)
                del s
            else:  # cancelled while the server is mid-stream
                first = asyncio.Event()

                async def consume() -> Any:
                    s = await client.stream_chat(MSGS)
                    async for _ in s:
                        first.set()
                    return s.response

                task = asyncio.create_task(consume())
                await first.wait()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task

        async def settle() -> None:
            for _ in range(5):  # let finalizers' close tasks run
                await asyncio.sleep(0)
            gc.collect()
            for _ in range(5):
                await asyncio.sleep(0)

        for i in range(WARMUP):
            await one(i)
        await settle()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            await one(i)
            if i % 250 == 0:
                assert sockets() - base_sockets <= 32, f"{sockets() - base_sockets} sockets after {i} streams"
        await settle()
        await asyncio.to_thread(server.wait_idle)  # the in-process server's handlers are not our memory
        await settle()
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        pending = [t for t in asyncio.all_tasks() - baseline if not t.done()]
        await client.aclose()
        return grown, pending, len(_client._CLOSING)

    grown, pending, closing = asyncio.run(asyncio.wait_for(main(), 600))
    assert pending == [] and closing == 0
    assert server.wait_idle() == 0
    assert sockets() <= base_sockets  # <=: sockets of earlier tests may still be closing
    assert server.requests == n + WARMUP
    report(request, f"hygiene async ({wire}): {n} streams (closed/dropped/unread/cancelled), sockets left 0, "
                    f"pending tasks 0, traced memory {grown:+d} bytes ({grown / n:+.1f} B/stream)")
    assert grown < n * PER_STREAM_BYTES, f"memory grew {grown} bytes over {n} streams"
