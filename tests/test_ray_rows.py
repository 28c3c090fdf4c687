"""The Ray stage's pure parts: a row's request shapes, the typed columns, the intent log, part-file runs."""

from __future__ import annotations

import json

import pytest

from kotoba_vllm._edn import kw, read_one
from kotoba_vllm._errors import AdmissionRejected, Unreachable
from kotoba_vllm._model import Choice, Figure, Response, Timings, Usage
from kotoba_vllm.ray import IntentLog, entry_from_row, entry_from_value
from kotoba_vllm._base_client import identify
from kotoba_vllm.ray._rows import COLUMNS, error_columns, flag_maybe_sent_twice, invalid_columns, ok_columns

CHAT = '{:vllm/endpoint :chat :vllm/model "m" :vllm/messages [{:vllm/role :user :vllm/content "hi"}]}'
LINE = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}}


def test_every_request_shape_reads_to_the_same_request() -> None:
    edn = entry_from_value(0, CHAT, "in.edn:4:1")
    as_map = entry_from_value(1, read_one(CHAT))
    line = entry_from_value(2, json.dumps(LINE), "in.jsonl:3:1")
    obj = entry_from_value(3, LINE)
    assert edn.sendable and as_map.sendable and line.sendable and obj.sendable
    assert edn.request == as_map.request
    assert line.request == obj.request and line.custom_id == "a"
    assert line.where == "in.jsonl:3:1"


def test_problems_keep_the_input_file_position() -> None:
    bad = CHAT[:-1] + ' :vllm/sampling {:vllm/temperature 9}}'
    e = entry_from_value(7, bad, "big.edn:120:1")
    assert not e.sendable
    assert e.problems[0].where == f"big.edn:120:{bad.index(':vllm/temperature') + 1}"
    broken = entry_from_value(8, "{:vllm/endpoint", "big.edn:130:5")
    assert broken.problems[0].code == "edn/syntax" and broken.problems[0].where == "big.edn:130:5"


def test_struct_nulls_from_a_json_column_are_absent_fields() -> None:
    row = {"request_index": 5, **LINE, "body": {**LINE["body"], "temperature": None, "seed": None}}
    assert entry_from_row(row).sendable


def test_a_row_without_an_index_is_a_programming_error_not_a_record() -> None:
    with pytest.raises(ValueError, match="request_index"):
        entry_from_row({"request": CHAT})


def test_columns_for_an_answer_an_error_and_an_invalid_request() -> None:
    e = entry_from_value(0, json.dumps(LINE))
    resp = Response(text="hey", choices=(Choice(text="hey", finish_reason="length"),),
                    usage=Usage(prompt_tokens=5, completion_tokens=2), backend="llamacpp",
                    endpoint_url="http://127.0.0.1:1/v1/chat/completions",
                    timings=Timings(prefill=Figure("server-reported", 5, 1.0, 5000.0),
                                    decode=Figure("server-reported", 2, 2.0, 1000.0)))
    ok = ok_columns(e, resp)
    assert set(ok) == set(COLUMNS)
    assert (ok["ok"], ok["sent"], ok["finish_reason"], ok["completion_tokens"]) == (True, True, "length", 2)
    assert (ok["prefill_provenance"], ok["decode_tokens_per_s"]) == ("server-reported", 1000.0)
    assert read_one(ok["record"])[kw("vllm/request-index")] == 0
    busy = error_columns(e, AdmissionRejected("busy", reason="all-slots-busy", sent=False, status=None))
    assert (busy["error"], busy["admission_reason"], busy["sent"]) == ("admission-rejected", "all-slots-busy", False)
    down = error_columns(e, identify(Unreachable("refused", endpoint="http://127.0.0.1:1"), e.request, "vllm"))
    assert (down["error"], down["sent"], down["backend"]) == ("unreachable", True, "vllm")  # as an answer's row
    bad = invalid_columns(entry_from_value(1, "[1 2]"))
    assert (bad["error"], bad["sent"]) == ("validation", False)
    flagged = flag_maybe_sent_twice(ok)
    rec = read_one(flagged["record"])
    assert flagged["maybe_sent_twice"] and rec[kw("vllm/maybe-sent-twice")] is True
    assert rec[kw("vllm/text")] == "hey"


def test_the_intent_log_tells_a_later_attempt_what_was_sent_and_answered(tmp_path) -> None:  # type: ignore[no-untyped-def]
    first = IntentLog(str(tmp_path))
    for i in (4095, 4096, 4097):
        first.sent(i)
    first.done(4096, {"ok": True, "record": "{}"})
    first.close()
    with open(next((tmp_path / "00000001").iterdir()), "a") as fh:
        fh.write('{"sent": 4098')  # torn by the writer's death: ignored
    later = IntentLog(str(tmp_path))
    unanswered, done = later.earlier(range(4090, 4100))
    assert unanswered == {4095, 4097}
    assert done == {4096: {"ok": True, "record": "{}"}}
    assert later.earlier([1]) == (set(), {})
