"""The aiohttp wire encodes a request body with one C JSON encoder made once: the bytes and the errors
stay exactly `json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)`'s."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kotoba_vllm._aiohttp_wire import encode_body

KEYS = st.text(max_size=5) | st.integers() | st.booleans() | st.none() | st.floats() | st.tuples(st.integers())
SCALARS = (st.none() | st.booleans() | st.floats(allow_nan=True, allow_infinity=True) | st.integers()
           | st.sampled_from([1e16, 1e-7, -0.0, 2**64, -2**70, 10**30]) | st.text(st.characters(codec=None))
           | st.sampled_from(["\ud800", "a\udfff", "\u2028", '"\\\n']) | st.builds(object) | st.binary(max_size=3))
BODIES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                      | st.dictionaries(KEYS, inner, max_size=4), max_leaves=12)


def outcome(encode: Any, body: Any) -> tuple[str, Any]:
    try:
        return "ok", encode(body)
    except Exception as e:  # noqa: BLE001 - the error itself is what is compared
        return type(e).__name__, str(e)


def dumps(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


@settings(max_examples=500, deadline=None)
@given(BODIES)
def test_body_bytes_and_errors_are_json_dumps(body: Any) -> None:
    assert outcome(encode_body, body) == outcome(dumps, body)


def test_a_chat_body() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "héllo \"x\""}], "max_tokens": 4,
            "temperature": 0.7, "stop": ["\n"], "stream": False, "seed": None}
    assert encode_body(body) == dumps(body)
