"""A stream read is checked once for 19-digit runs (integers orjson reads as floats, json as ints); every event
whose bytes hold one must be flagged, however the bytes were split into reads, so its JSON goes to json."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from kotoba_vllm._base_client import SseDecoder, StreamRun
from kotoba_vllm._model import ChatRequest, Message
from kotoba_vllm.dialects import get_dialect

LONG_RUN = re.compile(r"\d{19}")

line_text = st.lists(st.one_of(st.sampled_from(["a", "b", "{", "}", ",", " ", ":", '"']),
                               st.integers(min_value=0, max_value=10**25).map(str)), max_size=8).map("".join)
events = st.lists(st.lists(line_text, min_size=1, max_size=3), min_size=1, max_size=6)


def _wire(evs: list[list[str]], crlf: bool) -> bytes:
    nl = "\r\n" if crlf else "\n"
    return "".join("".join(f"data: {line}{nl}" for line in lines) + nl for lines in evs).encode()


@settings(max_examples=300, deadline=None)
@given(events, st.lists(st.integers(min_value=0, max_value=400), max_size=12), st.booleans())
def test_every_event_holding_a_19_digit_run_is_flagged_wherever_the_reads_split(
        evs: list[list[str]], cuts: list[int], crlf: bool) -> None:
    raw = _wire(evs, crlf)
    points = sorted({min(c, len(raw)) for c in cuts})
    reads = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)])]
    dec = SseDecoder()
    got = [p for r in reads for p in dec.payloads(r)]
    assert [d for _, d, _ in got] == ["\n".join(lines) for lines in evs]
    for _, data, wide in got:
        if LONG_RUN.search(data):
            assert wide, f"unflagged: {data!r} in reads {reads!r}"


def test_a_wide_integer_split_across_reads_reaches_the_caller_as_the_integer_json_reads() -> None:
    """A tool-call delta's 65-bit number, cut in the middle and spread over two data lines' reads."""
    big = 2**64 + 12345
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "t", "type": "function",
                                                                "function": {"name": "f", "arguments": "{}"},
                                                                "x_serial": big}]},
                          "finish_reason": None}]}
    text = json.dumps(chunk)
    at = text.index(str(big)) + 10
    stream = (b"data: " + text[:at].encode(), text[at:].encode() + b"\n\n",
              b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":'
              b'[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
    req = ChatRequest(messages=(Message(role="user", content="hi"),), model="m")
    plan_dialect = get_dialect("openai")
    run = StreamRun.__new__(StreamRun)  # only the decoding half: no plan, no clock
    run.decoder = plan_dialect.stream_decoder(req, "http://127.0.0.1:1/v1/chat/completions")
    run.first, run.token_times, run.finished, run.sent = None, [], False, 0.0
    dec = SseDecoder()
    deltas = [d for r in stream for ev, data, wide in dec.payloads(r) for d in run.on_data(data, ev, wide)]
    calls = [d.tool_calls for d in deltas if d.tool_calls]
    assert calls, deltas
    serial = [v for k, v in calls[0][0].items() if getattr(k, "name", "") == "x_serial"]
    assert serial == [big] and type(serial[0]) is int
