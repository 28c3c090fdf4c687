"""A problem found after typing names the line and column of the key it is about."""

from __future__ import annotations

from pathlib import Path

import pytest

from kotoba_vllm import kw, read_forms
from kotoba_vllm.cli import main

REQ = """{:vllm/endpoint :chat
 :vllm/messages [{:vllm/role :user :vllm/content "hi"}]
 :vllm/sampling {:vllm/max-tokens 4
                 :vllm/temperature 9.0}}
"""


def test_validate_names_the_keys_line_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "r.edn"
    f.write_text(REQ)
    assert main(["validate", str(f), "--backend", "vllm"]) == 1
    (problem,) = [x.value for x in read_forms(capsys.readouterr().out)]
    assert problem[kw("vllm/field")] == kw("vllm/temperature")
    assert problem[kw("vllm/where")] == f"{f}:4:18"


def test_engine_problem_is_located_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "r.edn"
    f.write_text(REQ.replace("9.0", "0.5").replace(":vllm/max-tokens 4", ":vllm/max-tokens 4 :vllm/best-of 2"))
    assert main(["validate", str(f), "--backend", "vllm"]) == 1
    (problem,) = [x.value for x in read_forms(capsys.readouterr().out)]
    assert problem[kw("vllm/field")] == kw("vllm/best-of") and problem[kw("vllm/engine")] == kw("vllm")
    assert problem[kw("vllm/where")] == f"{f}:3:37"


def test_batch_record_of_an_invalid_request_names_the_key(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "r.edn"
    f.write_text(REQ)
    # Nothing is sent (the request is invalid), so no server is needed behind the URL.
    assert main(["run", str(f), "--base-url", "http://127.0.0.1:9", "--backend", "vllm", "--no-progress"]) == 1
    (record,) = [x.value for x in read_forms(capsys.readouterr().out)]
    (problem,) = record[kw("vllm/problems")]
    assert problem[kw("vllm/where")] == f"{f}:4:18"
