"""Live tier: a deadline that fires closes the connection, and vLLM's real engine aborts the request
(its own `vllm:num_requests_running` gauge drops back to 0), on the sync and the async client, streamed
or not. Without the close the engine would keep generating thousands of tokens nobody reads."""

from __future__ import annotations

import asyncio

import pytest

from _vllm_engine import VllmEngine
from kotoba_vllm import AsyncClient, Client, RequestTimeout

pytestmark = pytest.mark.live
LONG = {"max_tokens": 1900, "min_tokens": 1900, "ignore_eos": True, "temperature": 1.0}


def generated(engine: VllmEngine) -> float:
    """vLLM's own count of tokens generated: a request run to its end adds its 1900."""
    return engine.metric("vllm:generation_tokens_total")


@pytest.mark.parametrize("stream", [False, True], ids=["answer", "stream"])
def test_a_sync_deadline_aborts_the_engines_request(vllm_engine: VllmEngine, stream: bool) -> None:
    vllm_engine.wait_queue(0, 0)
    before = generated(vllm_engine)
    with Client(vllm_engine.base_url, backend="vllm", deadline=1.5) as c, pytest.raises(RequestTimeout) as ei:
        if stream:
            with c.stream_chat("hold", **LONG) as s:
                for _ in s:
                    pass
        else:
            c.chat("hold", **LONG)
    assert ei.value.phase == "total"
    vllm_engine.wait_queue(0, 0, timeout=30)  # vLLM saw the connection go and aborted the request
    assert generated(vllm_engine) - before < LONG["max_tokens"]  # stopped short: aborted, not finished


@pytest.mark.parametrize("stream", [False, True], ids=["answer", "stream"])
def test_an_async_deadline_aborts_the_engines_request(vllm_engine: VllmEngine, stream: bool) -> None:
    async def go() -> None:
        async with AsyncClient(vllm_engine.base_url, backend="vllm", deadline=1.5) as c:
            with pytest.raises(RequestTimeout) as ei:
                if stream:
                    s = await c.stream_chat("hold", **LONG)
                    async for _ in s:
                        pass
                else:
                    await c.chat("hold", **LONG)
            assert ei.value.phase == "total"

    vllm_engine.wait_queue(0, 0)
    before = generated(vllm_engine)
    asyncio.run(go())
    vllm_engine.wait_queue(0, 0, timeout=30)
    assert generated(vllm_engine) - before < LONG["max_tokens"]  # stopped short: aborted, not finished
