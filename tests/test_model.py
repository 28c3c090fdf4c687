"""The typed model: EDN -> typed -> EDN is identity; typed -> EDN text -> typed is equality."""

from __future__ import annotations

from typing import Any

import pytest
from _strategies import request_maps, request_maps_by_endpoint, responses, stream_deltas, timings
from hypothesis import given, settings

from kotoba_vllm import (ChatRequest, Message, Response, Sampling, StreamDelta, Timings, from_edn, request_from_edn,
                         request_to_edn, to_edn)
from kotoba_vllm._codec import StructureError
from kotoba_vllm._edn import dumps, kw, pretty, read_forms, read_one

# The map the Clojure library kotoba-lang/vllm builds for a chat call.
CLOJURE_CHAT = """{:vllm/endpoint :chat
 :vllm/model "qwen2.5-7b"
 :vllm/messages [{:vllm/role :system :vllm/content "Be brief."}
                 {:vllm/role :user :vllm/content "hi"}]
 :vllm/sampling {:vllm/temperature 0.7 :vllm/top-p 1.0 :vllm/max-tokens 512}
 :vllm/base-url "http://localhost:8000"}"""


def test_clojure_library_map_reads_and_writes_unchanged() -> None:
    m = read_one(CLOJURE_CHAT)
    req, problems = request_from_edn(m)
    assert problems == []
    assert isinstance(req, ChatRequest)
    assert req.model == "qwen2.5-7b" and req.base_url == "http://localhost:8000"
    assert req.messages[1] == Message(role="user", content="hi")
    assert req.sampling == Sampling(temperature=0.7, top_p=1.0, max_tokens=512)
    back = request_to_edn(req)
    assert back == m
    assert read_one(dumps(back)) == m and read_one(pretty(back)) == m


def test_clojure_map_without_endpoint_is_inferred_from_its_shape() -> None:
    m = read_one('{:vllm/model "m" :vllm/prompt "Once"}')
    req, problems = request_from_edn(m)
    assert problems == [] and req is not None and req.endpoint == "completion"


@pytest.mark.parametrize("endpoint", sorted(request_maps_by_endpoint))
def test_each_endpoint_has_a_generator(endpoint: str) -> None:
    # guard: a new endpoint without a strategy would silently escape the property test below
    assert endpoint in request_maps_by_endpoint


@settings(max_examples=300, deadline=None)
@given(request_maps)
def test_edn_to_typed_to_edn_is_identity(m: dict[Any, Any]) -> None:
    req, problems = request_from_edn(m)
    assert problems == [], problems
    assert request_to_edn(req) == m  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(request_maps)
def test_typed_to_edn_text_to_typed_is_equality(m: dict[Any, Any]) -> None:
    req, _ = request_from_edn(m)
    [form] = list(read_forms(pretty(request_to_edn(req))))  # type: ignore[arg-type]
    again, problems = request_from_edn(form.value, form)
    assert problems == [] and again == req


@settings(max_examples=200, deadline=None)
@given(responses)
def test_response_round_trips_through_edn_text(r: Response) -> None:
    assert from_edn(read_one(dumps(to_edn(r))), Response) == r
    assert from_edn(read_one(pretty(to_edn(r))), Response) == r


@settings(max_examples=100, deadline=None)
@given(stream_deltas)
def test_stream_delta_round_trips(d: StreamDelta) -> None:
    assert from_edn(read_one(dumps(to_edn(d))), StreamDelta) == d


@settings(max_examples=100, deadline=None)
@given(timings)
def test_timings_round_trip(t: Timings) -> None:
    assert from_edn(read_one(dumps(to_edn(t))), Timings) == t


def test_stream_delta_shape_is_the_design_shape() -> None:
    # both keys always, as DESIGN §3 and the Clojure library write them; no text is nil
    assert to_edn(StreamDelta(delta="He")) == {kw("vllm/delta"): "He", kw("vllm/finish-reason"): None}
    assert to_edn(StreamDelta(finish_reason="stop")) == {kw("vllm/delta"): None, kw("vllm/finish-reason"): kw("stop")}
    assert from_edn({kw("vllm/delta"): "He", kw("vllm/finish-reason"): None}, StreamDelta) == StreamDelta(delta="He")


def test_unmeasured_timings_say_unavailable_not_zero() -> None:
    edn = to_edn(Timings())
    assert edn[kw("vllm/decode")] == {kw("vllm/provenance"): kw("unavailable")}


def test_tool_calls_and_multipart_content_keep_their_shape() -> None:
    m = read_one("""{:vllm/endpoint :chat
      :vllm/messages [{:vllm/role :user
                       :vllm/content [{:vllm/type :text :vllm/text "what is this?"}
                                      {:vllm/type :image-url :vllm/url "http://x/cat.png" :vllm/detail "low"}]}
                      {:vllm/role :assistant :vllm/content ""
                       :vllm/tool-calls [{:vllm/id "c1" :vllm/type :function :vllm/name "f"
                                          :vllm/arguments "{}"}]}
                      {:vllm/role :tool :vllm/tool-call-id "c1" :vllm/content "42"}]
      :vllm/tools [{:type "function" :function {:name "f" :parameters {:type "object"}}}]
      :vllm/tool-choice "auto"}""")
    req, problems = request_from_edn(m)
    assert problems == []
    assert req.messages[0].content[1].url == "http://x/cat.png"  # type: ignore[union-attr,index]
    assert req.messages[1].tool_calls[0].name == "f"  # type: ignore[union-attr,index]
    assert request_to_edn(req) == m  # type: ignore[arg-type]


def test_engine_extras_are_kept_as_namespaced_data() -> None:
    m = read_one('{:vllm/endpoint :generate :vllm/prompt "p" :llamacpp/cache-prompt true :llamacpp/id-slot 1}')
    req, _ = request_from_edn(m)
    assert req.extras == {"llamacpp/cache-prompt": True, "llamacpp/id-slot": 1}  # type: ignore[union-attr]
    assert request_to_edn(req) == m  # type: ignore[arg-type]


def test_from_edn_on_bad_data_raises_with_problems() -> None:
    with pytest.raises(StructureError) as ei:
        from_edn({kw("vllm/temperature"): "hot"}, Sampling)
    [p] = ei.value.problems
    assert p.field == "vllm/temperature" and "a number" in p.msg


def test_nil_means_absent() -> None:
    m = read_one('{:vllm/endpoint :chat :vllm/model nil :vllm/messages [{:vllm/role :user :vllm/content "hi"}]}')
    req, problems = request_from_edn(m)
    assert problems == [] and req.model is None  # type: ignore[union-attr]
