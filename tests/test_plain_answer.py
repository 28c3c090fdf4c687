"""The common chat answer (one choice, a plain text message) is typed in one step; whatever the server
sends, that gives exactly the `Response` (or the error) the general parser gives."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kotoba_vllm._model import ChatRequest, Message
from kotoba_vllm._timings import ClientClock
from kotoba_vllm.dialects import get_dialect
from kotoba_vllm.dialects.openai import Dialect
from kotoba_vllm.dialects.vllm import VllmDialect


class GeneralOnly(Dialect):
    """The same protocol, forced through the general parser (it overrides a parsing method)."""

    def parse_usage(self, u: Any) -> Any:
        return super().parse_usage(u)


class GeneralVllm(VllmDialect):
    def parse_usage(self, u: Any) -> Any:
        return super().parse_usage(u)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=4), inner,
                                                                                  max_size=2), max_leaves=4)
_maybe = st.just(None) | _json  # a field absent or null, or any JSON


def _some(key: str, value: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(st.just({}), value.map(lambda v: {key: v}))


_message = st.builds(lambda *parts: {k: v for p in parts for k, v in p.items()},
                     _some("role", st.just("assistant") | _json),
                     _some("content", st.text(max_size=8) | _maybe),
                     _some("tool_calls", st.just([]) | st.just(None) | _json),
                     _some("reasoning_content", st.just(None) | st.text(max_size=3) | _json),
                     _some("reasoning", st.just(None) | st.text(max_size=3)))
_choice = st.builds(lambda *parts: {k: v for p in parts for k, v in p.items()},
                    _some("index", st.integers(-3, 3) | _maybe),
                    _some("message", _message | _json),
                    _some("finish_reason", st.sampled_from(["stop", "length", ""]) | _maybe),
                    _some("logprobs", st.just(None) | _json))
# mostly the common shape, with each optional part absent, null or empty
_plain_choice = st.fixed_dictionaries(
    {"message": st.fixed_dictionaries({"content": st.text(max_size=8)},
                                      optional={"role": st.just("assistant"), "tool_calls": st.just([]) | st.none(),
                                                "reasoning_content": st.none(), "reasoning": st.none()})},
    optional={"index": st.integers(-2, 2) | _maybe, "finish_reason": st.sampled_from(["stop", "length"]) | _maybe,
              "logprobs": st.none()})
_usage = st.fixed_dictionaries({}, optional={"prompt_tokens": st.integers(-1, 20) | _maybe,
                                             "completion_tokens": st.integers(0, 20) | _maybe,
                                             "total_tokens": st.integers(0, 40),
                                             "prompt_tokens_details": st.just(None) | _json})
_answer = st.fixed_dictionaries({}, optional={
    "id": _maybe, "model": st.text(max_size=5) | _maybe, "created": st.integers(-5, 2**60) | _maybe,
    "system_fingerprint": _maybe, "usage": _usage | _maybe,
    "choices": st.lists(_plain_choice, min_size=1, max_size=1) | st.lists(_choice | _plain_choice | _json,
                                                                          max_size=2) | _json})

_REQ = ChatRequest(messages=(Message(role="user", content="hi"),), request_id="r-1")
_CLOCK = ClientClock(sent=1.0, done=1.25)


def _outcome(dialect: Dialect, obj: Any) -> Any:
    try:
        return dialect.parse(_REQ, obj, "http://h/v1/chat/completions", _CLOCK)
    except Exception as e:  # noqa: BLE001 - the refusal itself is what is compared
        return (type(e), str(e))


@settings(max_examples=400)
@given(_answer)
def test_plain_chat_answer_is_typed_as_the_general_parser_types_it(obj: dict[str, Any]) -> None:
    assert _outcome(get_dialect("openai"), obj) == _outcome(GeneralOnly(), obj)
    assert _outcome(get_dialect("vllm"), obj) == _outcome(GeneralVllm(), obj)


def test_the_usual_answer_takes_the_one_step_path() -> None:
    obj = {"id": "x", "model": "m", "created": 1, "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hello", "tool_calls": [],
                                 "reasoning_content": None}, "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}}
    fast = get_dialect("vllm").parse_plain_chat(_REQ, obj, "u", _CLOCK)
    assert fast is not None and fast.text == "Hello" and fast.finish_reason == "stop"
    assert fast.timings is not None and fast.timings.end_to_end.ms == 250.0
    assert isinstance(get_dialect("vllm"), VllmDialect)


def test_dialects_that_parse_their_own_way_never_take_it() -> None:
    obj = {"choices": [{"message": {"content": "x"}}]}
    assert GeneralOnly().parse_plain_chat(_REQ, obj, "u", _CLOCK) is None
    for engine in ("llamacpp", "sglang"):
        assert get_dialect(engine).parse_plain_chat(_REQ, obj, "u", _CLOCK) is None
