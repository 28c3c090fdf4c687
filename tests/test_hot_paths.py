"""The performance rewrites on the client's hot paths answer exactly what the plain code did."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from httpx_sse._decoders import SSEDecoder, SSELineDecoder

import kotoba_vllm.dialects.openai as oa
from kotoba_vllm._base_client import SseDecoder, not_event_stream


def reference_events(raw: bytes) -> list[tuple[str | None, str]]:
    """httpx-sse over the whole body, keeping events that carry data or a name (what the client used)."""
    lines, dec, out = SSELineDecoder(), SSEDecoder(), []
    for line in lines.decode(raw.decode("utf-8", "replace")) + lines.flush():
        sse = dec.decode(line.rstrip("\n"))
        if sse is not None and (sse.data or sse.event):
            out.append((None if sse.event in ("", "message") else sse.event, sse.data))
    return out


def split_feed(raw: bytes, cuts: list[int]) -> list[tuple[str | None, str]]:
    dec, out, last = SseDecoder(), [], 0
    for c in sorted(set(cuts)) + [len(raw)]:
        out += dec.feed(raw[last:c])
        last = c
    return [(e, d) for e, d in out if d or e]


FIELDS = st.sampled_from([b"data: ", b"data:", b"event: ", b"id: ", b": comment", b"retry: ", b"data:  "])
LINE = st.tuples(FIELDS, st.sampled_from([b"{\"a\": 1}", b"x", b"", b"[DONE]", "é漢".encode(), b"\xff"]))
EOL = st.sampled_from([b"\n", b"\r\n", b"\r"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(LINE, EOL, st.booleans()), max_size=12), st.lists(st.integers(0, 200), max_size=8))
def test_sse_decoder_matches_httpx_sse_at_any_chunk_boundary(parts, cuts) -> None:
    raw = b"".join(f + v + eol + (eol if blank else b"") for (f, v), eol, blank in parts)
    # event-name-only events differ in httpx-sse (it never resets the id); compare data events
    assert [x for x in split_feed(raw, [c % (len(raw) + 1) for c in cuts]) if x[1]] == \
        [x for x in reference_events(raw) if x[1]]


def test_sse_decoder_splits_crlf_across_chunks_without_an_extra_blank_line() -> None:
    dec = SseDecoder()
    assert dec.feed(b"data: a\r") == []
    assert dec.feed(b"\ndata: b\r\n\r\n") == [(None, "a\nb")]
    assert dec.feed(b"event: error\ndata: {}\n\n") == [("error", "{}")]


def test_not_event_stream_names_the_content_type() -> None:
    assert not_event_stream("text/event-stream; charset=utf-8") is None
    assert "application/json" in (not_event_stream("application/json") or "")


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("data", ['{"a": 1}', ' {"a": [1, 2.5, null]} ', '{"x": NaN}', '{"big": 123456789012345678901234567890}',
                                  '"\\ud800"', '{"a": 1} x', "", "[DONE"])
def test_json_chunk_answers_and_fails_like_json_loads(monkeypatch, fast, data) -> None:
    monkeypatch.setattr(oa, "ORJSON", fast and oa.ORJSON)  # orjson when installed, and the plain path
    try:
        want = json.loads(data)
    except ValueError:
        with pytest.raises(ValueError):
            oa.json_chunk(data)
        return
    got = oa.json_chunk(data)
    assert repr(got) == repr(want)
