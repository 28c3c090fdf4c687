"""A server's refusal that names the refused field (vLLM's `param`) says which EDN key it came from, and in
`run` where that key is in the request file. Against vLLM 0.33.0's own recorded 400 (its serving layer,
tests/cassettes/vllm/error-context-length: `param` "max_tokens")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kotoba_vllm import BadRequest, kw, read_forms
from kotoba_vllm._fields import EXTRA_BODY, key_of_param
from kotoba_vllm.cassettes import load_cassettes
from kotoba_vllm.cassettes._loopback import LoopbackReplay
from kotoba_vllm.cassettes._replay import replay_async, replay_sync
from kotoba_vllm.cli import main

REFUSED = next(c for c in load_cassettes("vllm") if c.name == "error-context-length")
# vLLM's pydantic refusal of a pass-through value: `param` "body.truncate_prompt_tokens" (scripts/record-vllm --only fields)
PASSED_THROUGH = next(c for c in load_cassettes("vllm-fields") if c.name == "extra-body-refused")


def test_the_recording_names_the_field() -> None:
    assert REFUSED.how == "recorded" and REFUSED.status == 400
    assert '"param":"max_tokens"' in REFUSED.raw.decode()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_typed_error_names_the_edn_key_and_the_engine(mode: str) -> None:
    out = replay_sync(REFUSED) if mode == "sync" else asyncio.run(replay_async(REFUSED))
    err = out.error
    assert isinstance(err, BadRequest) and err.status == 400
    assert err.field == "vllm/max-tokens" and err.backend == "vllm"
    edn = err.to_edn()
    assert edn[kw("vllm/field")] == kw("vllm/max-tokens") and edn[kw("vllm/backend")] == kw("vllm")
    assert edn[kw("vllm/details")][kw("param")] == "max_tokens"  # the engine's own word kept beside ours


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_pydantic_location_of_a_pass_through_field_names_the_pass_through(mode: str) -> None:
    assert PASSED_THROUGH.how == "recorded" and '"param":"body.truncate_prompt_tokens"' in PASSED_THROUGH.raw.decode()
    out = replay_sync(PASSED_THROUGH) if mode == "sync" else asyncio.run(replay_async(PASSED_THROUGH))
    err = out.error
    assert isinstance(err, BadRequest) and err.status == 400 and "int_parsing" in err.message
    assert err.field == EXTRA_BODY and err.to_edn()[kw("vllm/field")] == kw(EXTRA_BODY)
    assert err.request_id == "kotoba-extra-body-refused"


def test_param_forms_vllm_writes() -> None:
    # VLLMValidationError.parameter, a pydantic location (clean_loc_for_param), a JSON position, a non-field
    assert key_of_param("vllm", "max_tokens") == "vllm/max-tokens"
    assert key_of_param("vllm", "body.messages.0.content") == "vllm/messages"
    assert key_of_param("vllm", "body.min_tokens") == "vllm/min-tokens"
    assert key_of_param("vllm", "body.15") is None and key_of_param("vllm", "input_tokens") is None
    assert key_of_param("vllm", "body.top_k", {"top_k": "many"}) == EXTRA_BODY  # sent by the pass-through


REQUESTS = """{:vllm/endpoint :chat
 :vllm/messages [{:vllm/role :user :vllm/content "Hello there, world."}]
 :vllm/model "tiny"
 :vllm/sampling {:vllm/temperature 0.0
                 :vllm/max-tokens 10000000}}
"""


PASSING_THROUGH = """{:vllm/endpoint :chat
 :vllm/messages [{:vllm/role :user :vllm/content "Hello there, world."}]
 :vllm/model "kotoba-tiny"
 :vllm/sampling {:vllm/temperature 0.0 :vllm/max-tokens 8}
 :vllm/request-id "kotoba-extra-body-refused"
   :vllm/extra-body {"truncate_prompt_tokens" "many"}}
"""


@pytest.mark.parametrize("which", ["param", "pydantic-location"])
def test_run_record_names_the_key_and_its_line(which: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c, text, key, at = ((REFUSED, REQUESTS, "vllm/max-tokens", "5:18") if which == "param" else
                        (PASSED_THROUGH, PASSING_THROUGH, EXTRA_BODY, "6:4"))
    f = tmp_path / "r.edn"
    f.write_text(text)
    with LoopbackReplay(c) as srv:
        assert main(["run", str(f), "--base-url", srv.base_url, "--backend", "vllm", "--no-progress"]) == 1
    (record,) = [x.value for x in read_forms(capsys.readouterr().out)]
    assert record[kw("vllm/error")] == kw("bad-request") and record[kw("vllm/backend")] == kw("vllm")
    assert record[kw("vllm/field")] == kw(key)
    assert record[kw("vllm/field-where")] == f"{f}:{at}"
    assert record[kw("vllm/where")] == f"{f}:1:1"  # the request's own place, as before


def test_in_a_file_that_is_one_vector_each_record_names_its_own_key(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "r.edn"
    f.write_text("[" + REQUESTS.strip() + "\n " + REQUESTS.strip().replace("10000000", "20000000") + "]\n")
    with LoopbackReplay(REFUSED) as srv:
        assert main(["run", str(f), "--base-url", srv.base_url, "--backend", "vllm", "--no-progress"]) == 1
    records = sorted((x.value for x in read_forms(capsys.readouterr().out)),
                     key=lambda r: r[kw("vllm/request-index")])
    assert [r[kw("vllm/field-where")] for r in records] == [f"{f}:5:18", f"{f}:10:18"]
