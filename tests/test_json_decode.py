"""Answers and stream chunks are decoded by orjson when it is installed: the values and the errors
stay exactly json's (orjson reads integers wider than 64 bits as floats, and refuses NaN, Infinity,
lone surrogates and invalid UTF-8, which json reads)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kotoba_vllm.dialects import _http
from kotoba_vllm.dialects._http import decode_json, loads_as_json

pytest.importorskip("orjson")  # the `fast` extra; without it both are json.loads itself

SCALARS = (st.none() | st.booleans() | st.floats(allow_nan=True, allow_infinity=True)
           | st.integers() | st.integers(min_value=-2**70, max_value=2**70)
           | st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -2**63, -2**63 - 1, 10**19, -10**19, 10**30])
           | st.text(st.characters(codec=None, exclude_categories=("Cs",))) | st.sampled_from(["\ud800", "a\udfff"]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                                            max_size=4), max_leaves=12)


def json_answer(text: bytes | str) -> tuple[str, str]:
    try:
        return "ok", repr(json.loads(text))
    except (ValueError, RecursionError) as e:
        return "error", type(e).__name__


def ours(text: bytes | str) -> tuple[str, str]:
    try:
        return "ok", repr(loads_as_json(text))
    except (ValueError, RecursionError) as e:
        return "error", type(e).__name__


@settings(max_examples=400, deadline=None)
@given(VALUES, st.booleans(), st.booleans())
def test_what_json_writes_reads_back_as_json_reads_it(value, ascii_only, as_bytes) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)  # NaN, Infinity, big ints and lone surrogates included
    data = text.encode("utf-8", "surrogatepass") if as_bytes else text
    assert ours(data) == json_answer(data)
    want = json_answer(data.decode("utf-8", "replace") if isinstance(data, bytes) else data)
    got = decode_json(data)
    assert (repr(got) if got is not None else None) == (want[1] if want[0] == "ok" and want[1] != "None" else None)


@pytest.mark.parametrize("raw", [b'{"n": 123456789012345678901234567890}', b'[18446744073709551616, -9223372036854775809]',
                                 b'{"x": NaN, "y": -Infinity}', b'"\\ud83d"', b'{"a": "\xff"}', b'\xef\xbb\xbf{}',
                                 b'{"a": 1} x', b"", b"[" * 5000 + b"]" * 5000, b'{"a": 1, "a": 2}', b"1e400"])
def test_the_cases_orjson_reads_otherwise_get_json_s_answer(raw) -> None:
    want = json_answer(raw.decode("utf-8", "replace"))
    got = decode_json(raw)
    assert (repr(got) if got is not None else None) == (want[1] if want[0] == "ok" else None)


def test_orjson_is_the_one_used_when_installed() -> None:
    assert _http.ORJSON
