"""`write_edn` / the batch record writer: the text the generic path (`dumps(to_edn(x))`) writes,
byte for byte, without building the maps. `dumps` itself is held to the real Clojure reader and to
edn_format in test_clojure_interop.py / test_edn.py, so equal text reads the same everywhere."""

from __future__ import annotations

from typing import Any

import edn_format
from hypothesis import given, settings
from hypothesis import strategies as st

from _strategies import responses, stream_deltas, usages
from kotoba_vllm._codec import keep_extra_text, write_edn
from kotoba_vllm._edn import dumps, kw, pretty, read_one
from kotoba_vllm._model import ChatRequest, EmbeddingResponse, Message, Response, TokenizeResponse, to_edn
from kotoba_vllm.batch import BatchEntry, Recorder

embeddings = st.builds(EmbeddingResponse, embeddings=st.lists(st.lists(st.floats(-1e3, 1e3), max_size=3)
                                                              .map(tuple), max_size=2).map(tuple),
                       model=st.none() | st.text(max_size=8), usage=st.none() | usages,
                       request_id=st.none() | st.integers(0, 9))
tokens = st.builds(TokenizeResponse, tokens=st.lists(st.integers(0, 10**6), max_size=5).map(tuple))


@settings(max_examples=300)
@given(st.one_of(responses, stream_deltas, embeddings, tokens))
def test_write_edn_is_the_generic_text_byte_for_byte(value: Any) -> None:
    assert write_edn(value) == dumps(to_edn(value))


def _generic_record(e: BatchEntry, resp: Any) -> str:
    """What Recorder.ok wrote before it had a direct writer: the record as maps, then dumps."""
    rec: dict[Any, Any] = {kw("vllm/request-index"): e.index}
    if e.request_id is not None:
        rec[kw("vllm/request-id")] = e.request_id
    rec.update(to_edn(resp))
    rec[kw("vllm/request-index")] = e.index
    if e.request_id is not None:
        rec[kw("vllm/request-id")] = e.request_id
    return dumps(rec)


@settings(max_examples=300)
@given(responses, st.lists(stream_deltas, max_size=3), st.integers(0, 10**6),
       st.none() | st.text(max_size=8) | st.integers(0, 99))
def test_a_batch_record_is_the_generic_text_and_reads_back_in_both_readers(
        resp: Response, deltas: list[Any], index: int, request_id: Any) -> None:
    req = ChatRequest(messages=(Message(role="user", content="hi"),), request_id=request_id)
    e = BatchEntry(index, "f.edn:1:1", req)
    lines = Recorder("edn").ok(e, resp, deltas)
    assert lines == [dumps(to_edn(d)) for d in deltas] + [_generic_record(e, resp)]
    assert edn_format.loads(lines[-1]) == read_one(lines[-1])  # edn_format reads what we read


@settings(max_examples=200)
@given(responses, st.lists(stream_deltas, max_size=2), st.none() | st.text(max_size=8))
def test_a_pretty_record_is_the_same_record_as_the_compact_one_with_the_generic_layout(
        resp: Response, deltas: list[Any], request_id: Any) -> None:
    # `run --pretty` lays line breaks over the one writer's text: the same values, and pretty()'s layout of them
    req = ChatRequest(messages=(Message(role="user", content="hi"),), request_id=request_id)
    e = BatchEntry(7, "f.edn:1:1", req)
    compact, shown = Recorder("edn").ok(e, resp, deltas), Recorder("edn", pretty_print=True).ok(e, resp, deltas)
    assert shown[:-1] == compact[:-1]  # deltas stay one line each
    assert shown[-1] == pretty(read_one(_generic_record(e, resp)))
    assert read_one(shown[-1]) == read_one(compact[-1])


@settings(max_examples=200)
@given(st.dictionaries(st.sampled_from(["pool/member", "pool/why", "capacity/enforced?", "capacity/verdict",
                                        "vllm/text", "vllm/request-index", "vllm/request-id", "sglang/meta"]),
                       st.none() | st.booleans() | st.text(max_size=8) | st.sampled_from([kw("capacity-free")]),
                       max_size=5),
       st.none() | st.integers(0, 99))
def test_records_with_pool_extras_are_the_generic_text_every_time(extras: dict[str, Any], request_id: Any) -> None:
    # the pool's extras (and extras named like a field or like the record's head keys), written twice:
    # the second time from the writer's cached key texts
    resp = Response(text="hi", extras=extras)
    req = ChatRequest(messages=(Message(role="user", content="hi"),), request_id=request_id)
    e = BatchEntry(3, "f.edn:1:1", req)
    for _ in range(2):
        assert Recorder("edn").ok(e, resp, []) == [_generic_record(e, resp)]
        assert write_edn(resp) == dumps(to_edn(resp))


@settings(max_examples=200)
@given(st.dictionaries(st.sampled_from(["pool/member", "pool/why", "capacity/enforced?", "capacity/verdict",
                                        "sglang/meta"]),
                       st.none() | st.booleans() | st.integers(-2, 2) | st.text(max_size=8)
                       | st.sampled_from([kw("capacity-free")]) | st.lists(st.integers(0, 3), max_size=2),
                       max_size=5),
       st.integers(0, 3))
def test_extras_whose_text_is_kept_write_the_same_record(extras: dict[str, Any], kept: int) -> None:
    # a pool keeps its notes' texts (`keep_extra_text`); a record is still the generic text, whichever extras
    # were kept, and a value equal to a kept one but another object (1 and True), or the same value under
    # another name, is written as itself
    for name, v in list(extras.items())[:kept]:
        keep_extra_text(name, v)
    keep_extra_text("pool/member", 1)
    keep_extra_text("pool/why", True)
    keep_extra_text("sglang/meta", [0])  # mutable: never kept
    resp = Response(text="hi", extras=extras)
    e = BatchEntry(3, "f.edn:1:1", ChatRequest(messages=(Message(role="user", content="hi"),)))
    assert Recorder("edn").ok(e, resp, []) == [_generic_record(e, resp)]
    assert write_edn(resp) == dumps(to_edn(resp))


def test_a_traceback_through_a_generated_writer_shows_its_source() -> None:
    """The per-class writer is generated source registered with linecache (as attrs does): a failure
    inside it shows the generated line, not an empty frame."""
    import traceback

    from kotoba_vllm._codec import class_spec
    from kotoba_vllm._model import Response
    write = class_spec(Response).field_writer(frozenset())
    try:
        write(object())  # no `.text`: fails on the generated line that reads it
    except AttributeError:
        shown = traceback.format_exc()
    else:
        raise AssertionError("an object without the fields was written")
    assert "<kotoba_vllm generated write_fields Response" in shown and "v = obj.text" in shown, shown
