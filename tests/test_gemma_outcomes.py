"""Prefix-cache affinity as an outcome, reduced from benchmarks/llamacpp_outcomes.py: conversations with
growing transcripts through two real Gemma llama-servers, by the pool (conversation affinity) and by
round-robin, the same requests in the same order. The direction is asserted, from the servers' own
`timings.cache_n`: affinity keeps every conversation on one member and gets more of the re-sent
transcript from cache. No timing is asserted (the full-size run and its prefill times: the benchmark)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import _start

pytestmark = pytest.mark.live

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from llamacpp_outcomes import affinity_summary, conversation_order, serve_policy  # noqa: E402


@pytest.fixture(scope="module")
def second_gemma() -> Iterator[str]:
    server: Any = _start(model="gemma3-270m", n_ctx=4096, parallel=2, threads=1)
    yield server.base_url
    server.stop()


def test_affinity_serves_more_of_the_resent_transcript_from_cache_than_round_robin(
        gemma_url: str, second_gemma: str) -> None:
    order = conversation_order(2, 3, seed=3)
    urls = [gemma_url, second_gemma]
    # other topics for each policy: the members' caches hold nothing of the other policy's transcripts
    rows = (serve_policy("round-robin", order, urls, max_tokens=4, seed=3, topic_offset=2)
            + serve_policy("affinity", order, urls, max_tokens=4, seed=3, topic_offset=4))
    s = affinity_summary(rows)
    aff, rr = s["affinity"], s["round-robin"]
    assert aff["member-switches"] == 0 and rr["member-switches"] > 0, s
    assert aff["later-turn-cached-tokens"] > rr["later-turn-cached-tokens"], s
    # with affinity every later turn is served from the cache, nearly all of what it sends again
    assert all(r["cache-n"] > 0 for r in rows if r["policy"] == "affinity" and r["turn"] > 1), rows
    assert aff["resent-cache-hit"] >= 0.8, s
