"""OpenAI / vLLM batch JSONL: input lines become typed requests; output lines have run-batch's shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Union

import pydantic
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from kotoba_vllm._edn import kw
from kotoba_vllm._errors import AdmissionRejected, Unreachable
from kotoba_vllm._model import Choice, Response, Usage
from kotoba_vllm.batch import iter_entries
from kotoba_vllm.batch._jsonl import line_to_entry, output_line

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


# The per-line output model of vLLM's run_batch.py (BatchRequestOutput / BatchResponseData);
# vLLM's OpenAIBaseModel allows extra fields.
class BatchResponseData(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    status_code: int = 200
    request_id: str
    body: Optional[Union[ChatCompletion, Completion]] = None


class BatchRequestOutput(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    id: str
    custom_id: str
    response: Optional[BatchResponseData]
    error: Optional[Any]


def line(body: dict[str, Any], url: str = "/v1/chat/completions", **extra: Any) -> str:
    return json.dumps({"custom_id": "c1", "method": "POST", "url": url, "body": body, **extra})


def test_chat_body_maps_onto_the_edn_model() -> None:
    e = line_to_entry(0, line({"model": "m", "messages": [{"role": "system", "content": "s"},
                                                          {"role": "user", "content": [{"type": "text", "text": "t"}]}],
                               "max_tokens": 3, "temperature": 0.5, "stop": ["x"], "seed": 1,
                               "logprobs": True, "top_logprobs": 2}), "f.jsonl", 1)
    assert e.sendable and e.custom_id == "c1"
    r = e.request
    assert r is not None and r.endpoint == "chat" and r.model == "m" and r.request_id == "c1"
    assert r.messages[0].role == "system" and r.messages[1].content[0].text == "t"
    assert (r.sampling.max_tokens, r.sampling.temperature, r.sampling.stop, r.sampling.seed, r.sampling.logprobs) \
        == (3, 0.5, ("x",), 1, 2)


def test_max_completion_tokens_and_completions_url() -> None:
    e = line_to_entry(0, line({"prompt": "p", "max_completion_tokens": 2}, "/v1/completions"), "f", 1)
    assert e.request is not None and e.request.endpoint == "completion" and e.request.sampling.max_tokens == 2


@pytest.mark.parametrize("text, code, field", [
    (line({"messages": [], "frobnicate": 1}), "batch/unknown-field", "body/frobnicate"),
    (line({"messages": [{"role": "user", "content": "x", "weight": 1}]}), "batch/unknown-field", "body/weight"),
    (line({"input": "x"}, "/v1/classify"), "batch/url", "batch/url"),
    (line({"query": "q", "documents": ["a"], "frobnicate": 1}, "/v1/rerank"), "batch/unknown-field", "body/frobnicate"),
    (line({"text_1": "q", "queries": "q", "text_2": "a"}, "/score"), "batch/conflict", "body/queries"),
    (line({"messages": []}, method="GET"), "batch/method", "batch/method"),
    (json.dumps({"method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}}), "batch/custom-id",
     "batch/custom_id"),
    ("{not json", "batch/json", None),
])
def test_a_bad_line_is_a_validation_problem_naming_line_and_field(text: str, code: str, field: str | None) -> None:
    e = line_to_entry(4, text, "b.jsonl", 9)
    assert not e.sendable
    p = next(p for p in e.problems if p.code == code)
    assert p.where == "b.jsonl:9:1" and p.field == field


def test_example_file_reads_three_sendable_and_one_invalid() -> None:
    es = list(iter_entries(str(EXAMPLES / "batch.jsonl")))
    assert [e.sendable for e in es] == [True, True, True, False]
    assert [e.custom_id for e in es] == ["greet", "colour", "count", "unknown-field"]


def validate(text: str) -> BatchRequestOutput:
    return BatchRequestOutput.model_validate_json(text)


def test_output_lines_have_vllm_run_batch_shape() -> None:
    e = line_to_entry(0, line({"model": "m", "messages": [{"role": "user", "content": "hi"}]}), "f", 1)
    resp = Response(text="yo", choices=(Choice(index=0, text="yo", finish_reason="length"),), id="chatcmpl-1",
                    model="m", usage=Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5), backend="llamacpp",
                    endpoint_url="http://h/v1/chat/completions")
    ok = validate(output_line(e, result=resp))
    assert ok.custom_id == "c1" and ok.error is None and ok.response is not None
    assert isinstance(ok.response.body, ChatCompletion) and ok.response.body.choices[0].message.content == "yo"
    assert json.loads(output_line(e, result=resp))["kotoba"]["endpoint_url"] == "http://h/v1/chat/completions"

    rejected = validate(output_line(e, error=AdmissionRejected("full", reason="queue-full", status=429)))
    assert rejected.response is not None and rejected.response.status_code == 429 and rejected.response.body is None
    assert rejected.error == {"code": "admission-rejected", "message": "full"}

    down = validate(output_line(e, error=Unreachable("refused")))
    assert down.response is None and down.error["code"] == "unreachable"

    bad = line_to_entry(1, line({"messages": [], "zz": 1}), "f", 2)
    invalid = validate(output_line(bad, problems=bad.problems))
    assert invalid.response is None and invalid.error["code"] == "validation" and "zz" in invalid.error["message"]
    assert json.loads(output_line(bad, problems=bad.problems))["kotoba"]["request_index"] == 1


def test_completion_output_body_is_an_openai_completion() -> None:
    e = line_to_entry(0, line({"prompt": "p"}, "/v1/completions"), "f", 1)
    resp = Response(text="t", choices=(Choice(index=0, text="t", finish_reason="stop"),), model="m")
    out = validate(output_line(e, result=resp))
    assert isinstance(out.response.body, Completion) and out.response.body.choices[0].text == "t"  # type: ignore[union-attr]


_ = kw


def test_jsonl_resume_reads_answered_positions_and_drops_a_torn_line(tmp_path: Path) -> None:
    from kotoba_vllm.batch import load_existing

    e = [line_to_entry(i, line({"messages": [{"role": "user", "content": "x"}]}), "f", i + 1) for i in range(4)]
    resp = Response(text="y", choices=(Choice(index=0, text="y", finish_reason="stop"),), model="m")
    out = tmp_path / "out.jsonl"
    full = [output_line(x, result=resp) for x in e[:3]]
    out.write_text("\n".join(full) + "\n" + full[0][:30], encoding="utf-8")  # crash mid-line
    existing = load_existing(str(out), "jsonl")
    assert existing.done == {0, 1, 2}
    assert out.read_text(encoding="utf-8").splitlines() == full  # the torn tail is gone


# vLLM's RerankResponse and ScoreResponse (pooling/scoring/protocol.py, 0.32.0 and 0.33.0), as run-batch's body
class _RerankDocument(pydantic.BaseModel):
    text: Optional[str] = None


class _RerankResult(pydantic.BaseModel):
    index: int
    document: _RerankDocument
    relevance_score: float


class _RerankUsage(pydantic.BaseModel):
    prompt_tokens: int
    total_tokens: int


class VllmRerankResponse(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    id: str
    model: str
    usage: _RerankUsage
    results: list[_RerankResult]


class _ScoreData(pydantic.BaseModel):
    index: int
    object: str
    score: float


class _UsageInfo(pydantic.BaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: Optional[int] = 0


class VllmScoreResponse(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    id: str
    object: str
    created: int
    model: str
    data: list[_ScoreData]
    usage: _UsageInfo


@pytest.mark.parametrize("url", ["/v1/rerank", "/rerank", "/v2/rerank", "http://127.0.0.1:9/v1/rerank"])
def test_run_batch_rerank_urls_map_to_the_typed_rerank(url: str) -> None:
    e = line_to_entry(0, line({"model": "m", "query": "q", "documents": ["a", "b"], "top_n": 1, "user": "u"}, url),
                      "f", 1)
    r = e.request
    assert e.sendable and r is not None and r.endpoint == "rerank" and r.request_id == "c1"
    assert (r.query, r.documents, r.top_n, r.model) == ("q", ("a", "b"), 1, "m")
    if "://" in url:
        assert r.base_url == "http://127.0.0.1:9"


@pytest.mark.parametrize("pair", [("text_1", "text_2"), ("queries", "documents"), ("queries", "items"),
                                  ("data_1", "data_2")])
@pytest.mark.parametrize("url", ["/score", "/v1/score"])
def test_run_batch_score_urls_and_every_pair_form_map_to_the_typed_score(url: str, pair: tuple[str, str]) -> None:
    e = line_to_entry(0, line({"model": "m", pair[0]: "q", pair[1]: ["a", "b"]}, url), "f", 1)
    r = e.request
    assert e.sendable and r is not None and r.endpoint == "score" and (r.text_1, r.text_2) == ("q", ("a", "b"))


def test_classify_and_pooling_urls_say_run_batch_takes_neither() -> None:
    for ep in ("classify", "pooling"):
        e = line_to_entry(0, line({"input": "x"}, f"/{ep}"), "f", 1)
        [p] = e.problems
        assert p.field == "batch/url" and f":vllm/endpoint :{ep}" in p.msg


def test_rerank_and_score_output_lines_are_vllms_run_batch_bodies() -> None:
    from kotoba_vllm._model import RerankResponse, RerankResult, ScoreResponse

    e = line_to_entry(0, line({"query": "q", "documents": ["a", "b"]}, "/v1/rerank"), "f", 1)
    ranked = RerankResponse(results=(RerankResult(index=1, score=0.9, document="b"), RerankResult(index=0, score=0.1)),
                            id="score-c1", model="m", usage=Usage(prompt_tokens=7, total_tokens=7),
                            request_id="c1", server_request_id="c1")
    out = json.loads(output_line(e, result=ranked))
    assert out["custom_id"] == "c1" and out["error"] is None and out["response"]["status_code"] == 200
    body = VllmRerankResponse.model_validate(out["response"]["body"])
    assert [(x.index, x.relevance_score, x.document.text) for x in body.results] == [(1, 0.9, "b"), (0, 0.1, None)]
    assert body.id == "score-c1" and out["kotoba"]["server_request_id"] == "c1"

    e = line_to_entry(0, line({"text_1": "q", "text_2": ["a", "b"]}, "/score"), "f", 1)
    scored = ScoreResponse(scores=(0.25, 0.75), model="m", usage=Usage(prompt_tokens=9, total_tokens=9))
    out = json.loads(output_line(e, result=scored))
    body2 = VllmScoreResponse.model_validate(out["response"]["body"])
    assert [(d.index, d.score, d.object) for d in body2.data] == [(0, 0.25, "score"), (1, 0.75, "score")]
    assert body2.usage.prompt_tokens == 9
