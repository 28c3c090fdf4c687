"""Live tier: a deadline that fires closes the connection, and vLLM's real engine aborts the request
(its own `vllm:num_requests_running` gauge drops back to 0), on the sync and the async client, streamed
or not. Without the close the engine would keep generating thousands of tokens nobody reads.

This machine can leave a process unscheduled for seconds while vLLM's CPU engine runs (a 10 ms sleep
has been seen to wake 4 s late, and a test process to make no request for half a minute). A request
short enough for the engine to finish inside such a stall would pass for aborted only when this process
ran on time, so the request asks for 30,000 tokens, about 4 minutes of this engine's decoding. A raise
in that window leaves the request mid-decode, and a count short of 30,000 can only mean vLLM aborted
it. The "admission" engine serves it (32,768-token context; the default one's is 2,048), one request
at a time."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import pytest

from _vllm_engine import VllmEngine
from kotoba_vllm import AsyncClient, Client, RequestTimeout

pytestmark = pytest.mark.live
LONG = {"max_tokens": 30000, "min_tokens": 30000, "ignore_eos": True, "temperature": 1.0}
DEADLINE_S = 1.5


def generated(engine: VllmEngine) -> float:
    """vLLM's own count of tokens generated: a request run to its end adds its 30000."""
    return engine.metric("vllm:generation_tokens_total")


def assert_aborted(engine: VllmEngine, call: Callable[[], None]) -> None:
    """One request the client gave up on at its deadline: vLLM generated fewer tokens than it asked for."""
    engine.wait_queue(0, 0)
    before = generated(engine)
    t0 = time.monotonic()
    call()  # raises RequestTimeout(phase="total"), checked inside
    late = time.monotonic() - t0 - DEADLINE_S
    engine.wait_queue(0, 0, timeout=400)  # vLLM saw the connection go and aborted, or ran it to its end
    tokens = generated(engine) - before
    assert tokens < LONG["max_tokens"], f"vLLM ran all {tokens:.0f} tokens (the client raised {late:.2f} s late)"


@pytest.mark.parametrize("stream", [False, True], ids=["answer", "stream"])
def test_a_sync_deadline_aborts_the_engines_request(vllm_admission: VllmEngine, stream: bool) -> None:
    def call() -> None:
        with Client(vllm_admission.base_url, backend="vllm", deadline=DEADLINE_S) as c, \
                pytest.raises(RequestTimeout) as ei:
            if stream:
                with c.stream_chat("hold", **LONG) as s:
                    for _ in s:
                        pass
            else:
                c.chat("hold", **LONG)
        assert ei.value.phase == "total"

    assert_aborted(vllm_admission, call)


@pytest.mark.parametrize("stream", [False, True], ids=["answer", "stream"])
def test_an_async_deadline_aborts_the_engines_request(vllm_admission: VllmEngine, stream: bool) -> None:
    async def go() -> None:
        async with AsyncClient(vllm_admission.base_url, backend="vllm", deadline=DEADLINE_S) as c:
            with pytest.raises(RequestTimeout) as ei:
                if stream:
                    s = await c.stream_chat("hold", **LONG)
                    async for _ in s:
                        pass
                else:
                    await c.chat("hold", **LONG)
            assert ei.value.phase == "total"

    assert_aborted(vllm_admission, lambda: asyncio.run(go()))
