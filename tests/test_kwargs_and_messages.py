"""Keyword sampling arguments are checked exactly as the EDN `:vllm/sampling` map is, and
OpenAI-style dict messages keep `tool_calls`, `tool_call_id` and `name` (or are refused clearly)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import respx

from kotoba_vllm import AsyncClient, Client, KotobaError, ValidationError
from kotoba_vllm._edn import kw

BASE = "http://engine.test:8000"
CHAT_URL = BASE + "/v1/chat/completions"
ANSWER = {"id": "x", "object": "chat.completion", "model": "m",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}


def _codes(e: ValidationError) -> list[tuple[str, str | None]]:
    return sorted((p.code, p.field) for p in e.problems if p.is_error)


@pytest.mark.parametrize("kwargs, edn", [
    ({"temperature": "hot"}, {kw("vllm/temperature"): "hot"}),
    ({"max_tokens": True}, {kw("vllm/max-tokens"): True}),
    ({"max_tokens": 2.5}, {kw("vllm/max-tokens"): 2.5}),
    ({"temperature": 9.0}, {kw("vllm/temperature"): 9.0}),
    ({"top_p": float("nan")}, {kw("vllm/top-p"): float("nan")}),
    ({"stop": [1, 2]}, {kw("vllm/stop"): [1, 2]}),
    ({"n": 2, "best_of": 1}, {kw("vllm/n"): 2, kw("vllm/best-of"): 1}),
])
def test_keyword_sampling_is_checked_exactly_like_edn(kwargs: dict[str, Any], edn: dict[Any, Any]) -> None:
    with respx.mock(assert_all_called=False) as m:
        route = m.post(CHAT_URL).respond(200, json=ANSWER)
        with Client(BASE, backend="vllm", http_client=httpx.Client()) as c:  # respx: httpx
            with pytest.raises(ValidationError) as by_kwargs:
                c.chat("hi", **kwargs)
            with pytest.raises(ValidationError) as by_edn:
                c.send({kw("vllm/endpoint"): kw("chat"), kw("vllm/sampling"): edn,
                        kw("vllm/messages"): [{kw("vllm/role"): kw("user"), kw("vllm/content"): "hi"}]})
        assert route.call_count == 0  # nothing was sent
    assert _codes(by_kwargs.value) == _codes(by_edn.value) != []


def test_good_keyword_sampling_goes_on_the_wire() -> None:
    with respx.mock(assert_all_called=False) as m:
        route = m.post(CHAT_URL).respond(200, json=ANSWER)
        with Client(BASE, backend="vllm", http_client=httpx.Client()) as c:  # respx: httpx
            c.chat("hi", temperature=0.2, max_tokens=5, stop=("a", "b"))
        body = json.loads(route.calls[0].request.content)
    assert body["temperature"] == 0.2 and body["max_tokens"] == 5 and body["stop"] == ["a", "b"]


def test_unknown_keyword_is_a_validation_error() -> None:
    with Client(BASE, backend="vllm") as c, pytest.raises(ValidationError, match="temprature"):
        c.chat("hi", temprature=0.1)


TOOL_TURNS = [
    {"role": "user", "content": "weather?", "name": "alice"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Kyoto\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"},
]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_openai_dict_messages_keep_tool_calls_ids_and_names(mode: str) -> None:
    with respx.mock(assert_all_called=False) as m:
        route = m.post(CHAT_URL).respond(200, json=ANSWER)
        if mode == "sync":
            with Client(BASE, backend="vllm", http_client=httpx.Client()) as c:  # respx: httpx
                c.chat(TOOL_TURNS)
        else:
            import asyncio

            async def go() -> None:
                async with AsyncClient(BASE, backend="vllm", http_client=httpx.AsyncClient()) as c:  # respx: httpx
                    await c.chat(TOOL_TURNS)
            asyncio.run(go())
        sent = json.loads(route.calls[0].request.content)["messages"]
    assert sent[0]["name"] == "alice"
    call = sent[1]["tool_calls"][0]
    assert call["id"] == "call_1" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Kyoto"}
    assert sent[2]["tool_call_id"] == "call_1" and sent[2]["name"] == "get_weather"


@pytest.mark.parametrize("messages, says", [
    ([{"content": "no role"}], "role"),
    ([{"role": "user", "content": "x", "bogus": 1}], "bogus"),
    ([{"role": "wizard", "content": "x"}], "role"),
    ([42], "int"),
    ([{"role": "assistant", "tool_calls": [{"id": "c", "function": "not-a-map"}]}], "name"),
    ({"role": "user", "content": "a dict, not a list"}, "list of messages"),
])
def test_bad_messages_are_refused_with_a_typed_error(messages: Any, says: str) -> None:
    with respx.mock(assert_all_called=False) as m:
        route = m.post(CHAT_URL).respond(200, json=ANSWER)
        with Client(BASE, backend="vllm", http_client=httpx.Client()) as c:  # respx: httpx
            with pytest.raises(KotobaError) as ei:
                c.chat(messages)
        assert route.call_count == 0
    assert isinstance(ei.value, ValidationError) and says in str(ei.value)
