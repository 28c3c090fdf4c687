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
    (line({"messages": []}, "/v1/rerank"), "batch/url", "batch/url"),
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
