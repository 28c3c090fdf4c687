"""Every typed error about a request says whose request it was and which engine dialect sent it, on every
path: an error event inside a 200 stream as well as an error answer, and in `run`'s EDN and JSONL records;
a JSONL record names the refused field's key by line and column, as an EDN record does.

Against vLLM 0.33.0's own recorded bytes (tests/cassettes, its serving layer). The transport paths
(refused, timed out, broken) are held in tests/test_faults.py, every recorded error in
tests/test_cassettes_replay.py (`check_error`)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kotoba_vllm import BadRequest, dumps, kw, read_forms
from kotoba_vllm.batch._jsonl import key_column
from kotoba_vllm.cassettes import Cassette, load_cassettes
from kotoba_vllm.cassettes._loopback import LoopbackReplay
from kotoba_vllm.cassettes._replay import replay_async, replay_sync
from kotoba_vllm.cli import main

RECORDED = {c.id: c for c in load_cassettes()}
# vLLM's engine core died after three tokens: `data: {"error": {... "code": 500}}` inside the 200 stream
IN_STREAM = RECORDED["vllm/error-in-stream"]
# vLLM's 400 naming the refused field: `"param": "max_tokens"`
REFUSED = RECORDED["vllm/error-context-length"]
# a stream vLLM answered with our request id as its x-request-id (--enable-request-id-headers)
WITH_IDS = RECORDED["vllm/chat-fields-stream"]


def _refusal_in_stream() -> Cassette:
    """WITH_IDS's first recorded chunks, then vLLM's recorded refusal naming `max_tokens` as an error event.
    vLLM frames an error inside a stream so (`create_streaming_error_response`: the same ErrorResponse
    dumped as an error answer's body, as `data: ...`, then `data: [DONE]`; IN_STREAM shows the framing)."""
    assert WITH_IDS.how == REFUSED.how == IN_STREAM.how == "recorded"
    assert IN_STREAM.chunks is not None and IN_STREAM.chunks[-2].startswith(b'data: {"error":{"message"')
    assert WITH_IDS.chunks is not None and REFUSED.body is not None and b'"param":"max_tokens"' in REFUSED.body
    chunks = (*WITH_IDS.chunks[:3], b"data: " + REFUSED.body + b"\n\n", b"data: [DONE]\n\n")
    return attrs.evolve(WITH_IDS, name="refusal-in-stream", chunks=chunks)


@pytest.mark.parametrize("wire", ["default", "httpx"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_error_event_in_a_stream_names_the_engine_the_field_and_both_ids(mode: str, wire: str) -> None:
    c = _refusal_in_stream()
    out = replay_sync(c, wire) if mode == "sync" else asyncio.run(replay_async(c, wire))
    err = out.error
    assert isinstance(err, BadRequest) and err.partial_text == "Hello there", err
    edn = err.to_edn()
    assert edn[kw("vllm/error")] == kw("bad-request") and edn[kw("vllm/status")] == 400
    assert edn[kw("vllm/backend")] == kw("vllm")
    assert edn[kw("vllm/field")] == kw("vllm/max-tokens")
    assert edn[kw("vllm/details")][kw("param")] == "max_tokens"  # the engine's own word kept beside ours
    assert edn[kw("vllm/request-id")] == edn[kw("vllm/server-request-id")] == "kotoba-chat-fields-stream"


def _in_stream_request() -> str:
    call = IN_STREAM.call[kw("call/request")]
    assert isinstance(call, dict)
    return dumps({**call, kw("vllm/request-id"): "r-in-stream"}) + "\n"


def _in_stream_line() -> str:
    body = {"model": "kotoba-tiny", "messages": [{"role": "user", "content": "Hello there, world."}],
            "temperature": 0.0, "max_tokens": 16, "stream": True}
    return json.dumps({"custom_id": "r-in-stream", "method": "POST", "url": "/v1/chat/completions", "body": body})


@pytest.mark.parametrize("fmt", ["edn", "jsonl"])
def test_run_records_of_an_error_inside_a_stream_name_the_engine(fmt: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / f"r.{fmt}"
    f.write_text(_in_stream_request() if fmt == "edn" else _in_stream_line() + "\n")
    with LoopbackReplay(IN_STREAM) as srv:
        assert main(["run", str(f), "--base-url", srv.base_url, "--backend", "vllm", "--no-progress"]) == 1
    out = capsys.readouterr().out
    if fmt == "edn":
        (record,) = [x.value for x in read_forms(out)
                     if isinstance(x.value, dict) and kw("vllm/error") in x.value]  # the deltas before it
        assert record[kw("vllm/error")] == kw("server-failure") and record[kw("vllm/backend")] == kw("vllm")
        assert record[kw("vllm/request-id")] == "r-in-stream" and record[kw("vllm/partial-text")] == "Hello there,"
        return
    (line,) = [json.loads(x) for x in out.splitlines()]
    assert line["error"]["code"] == "server-failure" and line["kotoba"]["request_id"] == "r-in-stream"
    assert line["kotoba"]["backend"] == line["kotoba"]["error"]["backend"] == "vllm"


# Two lines refused for their token limit: one names it as vLLM does, one by OpenAI's alias; the second holds
# the wire name as a value too, which is no key.
LINES = [
    '{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "tiny", '
    '"messages": [{"role": "user", "content": "Hello there, world."}], "temperature": 0.0, "max_tokens": 10000000}}',
    '{"custom_id": "b", "url": "/v1/chat/completions", "method": "POST", "body": {"messages": [{"role": "user", '
    '"content": "max_tokens"}],  "max_completion_tokens" : 10000000, "model": "tiny"}}',
]


def test_jsonl_record_names_the_refused_keys_line_and_column(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "r.jsonl"
    f.write_text(LINES[0] + "\n\n" + LINES[1] + "\n")  # the blank line is skipped but counted
    with LoopbackReplay(REFUSED) as srv:
        assert main(["run", str(f), "--base-url", srv.base_url, "--backend", "vllm", "--no-progress"]) == 1
    records = sorted((json.loads(x) for x in capsys.readouterr().out.splitlines()),
                     key=lambda r: r["kotoba"]["request_index"])
    assert [r["kotoba"]["error"]["field"] for r in records] == ["max-tokens", "max-tokens"]
    assert [r["kotoba"]["where"] for r in records] == [f"{f}:1:1", f"{f}:3:1"]  # the line's own place, as before
    at = [LINES[0].index('"max_tokens"') + 1, LINES[1].index('"max_completion_tokens"') + 1]
    assert [r["kotoba"]["field_where"] for r in records] == [f"{f}:1:{at[0]}", f"{f}:3:{at[1]}"]


_keys = st.text(st.characters(exclude_categories=("Cs",)), max_size=6)
_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=6)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=3),
                       max_leaves=8)


@given(st.dictionaries(_keys, _values, min_size=1, max_size=5), _values, st.booleans())
def test_key_column_finds_the_body_key_itself(body: dict[str, object], other: object, ascii_only: bool) -> None:
    """The column is where json.dumps wrote that key of the body, whatever the same words stand for elsewhere."""
    decoys = {k: k for k in body}  # the same keys, and the same words as values, outside the body
    head = '{"other": ' + json.dumps([other, decoys], ensure_ascii=ascii_only) + ', "body": {'
    line = head
    where: dict[str, int] = {}  # each key's column, as written
    for i, (k, v) in enumerate(body.items()):
        line += ", " if i else ""
        where[k] = len(line) + 1
        line += json.dumps(k, ensure_ascii=ascii_only) + ": " + json.dumps(v, ensure_ascii=ascii_only)
    line += "}}"
    assert json.loads(line)["body"] == body
    for k in body:
        assert key_column(line, ("body", k)) == where[k]
    assert key_column(line, ("body", "\x00absent")) is None
