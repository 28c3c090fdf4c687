"""What `AsyncClient` and `Client` reuse from one request to the next (plain OpenAI-style messages
typed directly, a Sampling's checks and wire form remembered, token-count figures shared) gives
exactly what building everything afresh gives: the same typed messages, the same refusals, the
same JSON body on the wire."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kotoba_vllm import AsyncClient, ValidationError
from kotoba_vllm._base_client import as_messages
from kotoba_vllm._codec import structure_located
from kotoba_vllm._model import ROLES, ChatRequest, Message, Sampling, Usage
from kotoba_vllm._openai_messages import message_to_edn
from kotoba_vllm._timings import ClientClock, build_timings
from kotoba_vllm._validate import validate
from kotoba_vllm.dialects import get_dialect

from faultserver import FaultServer, chat_answer, reply

# Roles the model knows and a few it does not; any text, any shape the caller may pass.
_roles = st.sampled_from(ROLES) | st.text(max_size=10)
_contents = st.text(max_size=30) | st.none() | st.integers() | st.lists(st.text(max_size=5), max_size=2)


def _read_generally(messages: list[Any]) -> tuple[Message, ...] | str:
    """The general reader's answer (message_to_edn, then the EDN structurer), or its error code."""
    out = []
    for m in messages:
        edn, unknown = message_to_edn(m)
        if unknown:
            return "unknown"
        msg, problems = structure_located(edn, Message)
        if msg is None:
            return "invalid"
        out.append(msg)
    return tuple(out)


@given(st.lists(st.fixed_dictionaries({"role": _roles, "content": _contents}), max_size=3))
def test_plain_dict_messages_type_exactly_as_the_general_reader_does(messages: list[dict[str, Any]]) -> None:
    general = _read_generally(messages)
    try:
        got: tuple[Message, ...] | str = as_messages(messages)
    except ValidationError:
        got = "invalid"
    if general == "unknown":
        general = "invalid"
    assert got == general
    assert as_messages(tuple(messages)) == got if got != "invalid" else True


def test_a_message_with_more_than_role_and_content_keeps_every_field() -> None:
    msgs = as_messages([{"role": "tool", "content": "42", "tool_call_id": "c1"}])
    assert msgs == (Message(role="tool", content="42", tool_call_id="c1"),)


@pytest.mark.parametrize("backend", ["openai", "vllm", "sglang", "llamacpp"])
def test_a_repeated_sampling_renders_the_same_body_and_a_structured_one_renders_afresh(backend: str) -> None:
    d = get_dialect(backend)
    plain = Sampling(temperature=0.5, max_tokens=8, seed=3)
    msgs = (Message(role="user", content="hi"),)
    first = d.render(ChatRequest(messages=msgs, sampling=plain)).body
    again = d.render(ChatRequest(messages=msgs, sampling=plain)).body
    equal = d.render(ChatRequest(messages=msgs, sampling=Sampling(temperature=0.5, max_tokens=8, seed=3))).body
    assert first == again == equal
    assert first is not again  # each request its own body
    schema: dict[str, Any] = {"type": "object"}
    structured = Sampling(guided_json=schema, stop=("x",))
    before = json.dumps(d.render(ChatRequest(messages=msgs, sampling=structured)).body, sort_keys=True)
    schema["required"] = ["a"]  # a caller's map changed between two sends: the second send shows it
    after = json.dumps(d.render(ChatRequest(messages=msgs, sampling=structured)).body, sort_keys=True)
    assert '"required"' in after and '"required"' not in before


def test_a_sampling_found_clean_is_still_checked_against_each_engine_and_endpoint() -> None:
    s = Sampling(max_tokens=4, min_p=0.1)
    req = ChatRequest(messages=(Message(role="user", content="hi"),), sampling=s)
    assert not [p for p in validate(req, "vllm") if p.is_error]
    assert not [p for p in validate(req, "vllm") if p.is_error]
    # openai-style servers do not honour min_p: refused every time, remembered or not
    for _ in range(2):
        assert [p.code for p in validate(req, "openai") if p.is_error] == ["engine/unsupported"]
    bad = Sampling(temperature=float("nan"))
    for _ in range(2):
        assert [p.code for p in validate(ChatRequest(messages=req.messages, sampling=bad)) if p.is_error] == \
            ["sampling/range"]


def test_token_count_figures_are_equal_whether_shared_or_not() -> None:
    u = Usage(prompt_tokens=9, completion_tokens=4, total_tokens=13, cached_tokens=2)
    a = build_timings(None, u, ClientClock(sent=0.0, done=0.5))
    b = build_timings(None, u, ClientClock(sent=0.0, done=0.25))
    assert (a.prefill.tokens, a.decode.tokens, a.cached.tokens) == (7, 4, 2)
    # prompt_tokens - cached_tokens is ours to compute, so it says so
    assert a.prefill == b.prefill and a.prefill.provenance == "computed" and a.prefill.ms is None
    assert (a.end_to_end.ms, b.end_to_end.ms) == (500.0, 250.0)


async def test_the_wire_body_of_repeated_keyword_calls_is_what_one_call_sends() -> None:
    with FaultServer(lambda seen: reply(chat_answer("ok"))) as srv:
        async with AsyncClient(srv.base_url, backend="openai", model="m") as c:
            for i in range(3):
                r = await c.chat([{"role": "user", "content": f"hi {i}"}], max_tokens=4, temperature=0.5)
                assert r.text == "ok"
        bodies = [s.json() for s in srv.seen]
    assert bodies == [{"model": "m", "messages": [{"role": "user", "content": f"hi {i}"}], "temperature": 0.5,
                       "max_tokens": 4} for i in range(3)]


_counts = st.none() | st.integers(min_value=0, max_value=2**20)


@given(st.none() | st.builds(Usage, prompt_tokens=_counts, completion_tokens=_counts, cached_tokens=_counts),
       st.floats(min_value=0.0, max_value=1e4, allow_nan=False))
def test_a_whole_answers_timings_are_what_the_general_rules_give(usage: Usage | None, wall: float) -> None:
    from kotoba_vllm._timings import ServerTimings
    quick = build_timings(None, usage, ClientClock(sent=1.0, done=1.0 + wall))
    general = build_timings(ServerTimings(), usage, ClientClock(sent=1.0, done=1.0 + wall))  # no fast path
    assert quick == general


def test_a_freed_dialects_clean_sampling_is_not_taken_for_another_engines() -> None:
    """The clean-Sampling memo is per dialect: a dialect built, used and freed must not lend its verdict to a
    different engine's dialect that happens to get the same memory (id) afterwards."""
    from kotoba_vllm.dialects.openai import Dialect

    class Honours(Dialect):
        pass

    class Ignores(Dialect):
        sampling_support = {"chat": frozenset()}

    sampling = Sampling(temperature=0.5)
    req = ChatRequest(messages=(Message(role="user", content="hi"),), sampling=sampling)
    for _ in range(50):  # with the memo keyed by id(dialect), CPython reused the freed memory and this failed
        first = Honours()
        assert first.problems(req) == []
        del first
        second = Ignores()
        assert [p.code for p in second.problems(req)] == ["engine/unsupported"]


def test_a_service_sending_a_new_sampling_every_time_holds_a_bounded_number_and_renders_each_right() -> None:
    """The memos keep Samplings alive (so their ids stay theirs); a caller that builds a fresh Sampling for every
    request must not see them pile up, and a Sampling rendered again after the memo started over is still right."""
    import gc
    import weakref

    d = get_dialect("vllm")
    msgs = (Message(role="user", content="hi"),)
    first = Sampling(temperature=0.0, max_tokens=1)
    first_body = d.render(ChatRequest(messages=msgs, sampling=first)).body
    alive = [weakref.ref(first)]
    for i in range(1, 3000):
        s = Sampling(temperature=round(i / 3000, 4), max_tokens=i)
        req = ChatRequest(messages=msgs, sampling=s)
        assert not [p for p in validate(req, "vllm") if p.is_error]
        body = d.render(req).body
        assert (body["temperature"], body["max_tokens"]) == (round(i / 3000, 4), i)
        alive.append(weakref.ref(s))
    del s, req
    gc.collect()
    held = sum(r() is not None for r in alive)
    assert 0 < held <= 2 * 1024  # two memos of 1,024 at most; the rest were let go
    assert d.render(ChatRequest(messages=msgs, sampling=first)).body == first_body
