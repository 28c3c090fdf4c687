"""Every row of kotoba_vllm/_fields.py, given a value of the wrong type (and, where the row has bounds, one out
of range) in an EDN file: `validate` and `run` each report a problem naming the key and the file:line:column
where the key stands, and `run` sends nothing (counted at a loopback server). One file per engine, one
request per line, so N requests in are N records out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from faultserver import FaultServer, reply

from kotoba_vllm._edn import kw, read_all
from kotoba_vllm._fields import (BIAS, BOOL, BOOL_OR_WORD, FIELDS, INT, INTS, JSON, MAP, MAPS, NUM, STR, STR_OR_NUM,
                                 STR_OR_STRS, STRS, WORD, Field)
from kotoba_vllm.cli import main

# a value of the wrong type for each kind of field, as EDN text
WRONG = {BOOL.name: '"yes"', INT.name: '"3"', NUM.name: '"0.5"', STR.name: "5", WORD.name: "5",
         BOOL_OR_WORD.name: "5", STR_OR_NUM.name: "true", MAP.name: "5", JSON.name: "#{1}", INTS.name: '["a"]',
         STRS.name: "[1]", STR_OR_STRS.name: "5", BIAS.name: "5", MAPS.name: "[1]"}
# the start of a request on each route, ending where the field's key goes
ROUTE_HEAD = {"chat": '{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "hi"}] ',
              "completion": '{:vllm/endpoint :completion :vllm/prompt "hi" ',
              "generate": '{:vllm/endpoint :generate :vllm/prompt "hi" '}
ENGINES = ("vllm", "sglang", "llamacpp", "openai")


def test_every_kind_of_field_has_a_wrong_value_here() -> None:
    assert {f.kind.name for f in FIELDS if f.engines} <= set(WRONG)


def _out_of_range(f: Field) -> str | None:
    if f.lo is None and f.hi is None or f.kind is BIAS:
        return None
    if f.lo is not None:
        return str(int(f.lo) - 1) if f.kind is INT else repr(f.lo - 1.0)
    assert f.hi is not None
    return str(int(f.hi) + 1) if f.kind is INT else repr(f.hi + 1.0)


def _cases(engine: str) -> list[tuple[Field, str, str]]:
    """(row, route, bad value) for every field `engine` takes: its wrong type, and out of range where bounded."""
    out = []
    for f in FIELDS:
        where = f.engines.get(engine)
        if where is None:
            continue
        route = sorted(where.routes)[0]
        out.append((f, route, WRONG[f.kind.name]))
        bad = _out_of_range(f)
        if bad is not None:
            out.append((f, route, bad))
    return out


def _write(tmp_path: Path, engine: str) -> tuple[Path, list[tuple[str, str]]]:
    """One request a line; returns the file and, per line, (the key, "line:column" where it stands)."""
    lines, expected = [], []
    for n, (f, route, bad) in enumerate(_cases(engine), 1):
        head = ROUTE_HEAD[route]
        lines.append(f"{head}{f.edn} {bad}}}")
        expected.append((f.key, f"{n}:{len(head) + 1}"))
    path = tmp_path / f"{engine}-bad-fields.edn"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, expected


def _problem_for(problems: list[Any], key: str) -> Any:
    found = [p for p in problems if p.get(kw("vllm/field")) == kw(key) and p.get(kw("vllm/severity")) == kw("error")]
    assert found, f"no error naming :{key} in {problems}"
    return found[0]


@pytest.mark.parametrize("engine", ENGINES)
def test_validate_names_every_bad_field_with_its_file_line_and_column(engine: str, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path, expected = _write(tmp_path, engine)
    assert main(["validate", str(path), "--backend", engine]) == 1
    problems = read_all(capsys.readouterr().out)
    for index, (key, at) in enumerate(expected):
        mine = [p for p in problems if p[kw("vllm/request-index")] == index]
        p = _problem_for(mine, key)
        assert p[kw("vllm/where")] == f"{path}:{at}", (key, p)
        assert f":{key}" in p[kw("vllm/msg")]


def _count(seen: Any) -> Any:
    return reply({"object": "list", "data": [{"id": "m", "object": "model"}]})


@pytest.mark.parametrize("engine", ENGINES)
def test_run_records_every_bad_field_with_its_position_and_sends_nothing(engine: str, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path, expected = _write(tmp_path, engine)
    with FaultServer(_count) as srv:
        code = main(["run", str(path), "--base-url", srv.base_url, "--backend", engine, "--no-progress"])
        posted = [s.path for s in srv.seen if s.method == "POST"]
    assert code != 0 and posted == []
    records = read_all(capsys.readouterr().out)
    assert [r[kw("vllm/request-index")] for r in records] == list(range(len(expected)))
    for rec, (key, at) in zip(records, expected):
        assert rec[kw("vllm/error")] == kw("validation")
        p = _problem_for(rec[kw("vllm/problems")], key)
        assert p[kw("vllm/where")] == f"{path}:{at}", (key, p)


def _refuse_prompt_logprobs(seen: Any) -> Any:
    """vLLM's own refusal shape (ErrorResponse: message, type, param, code) for a field it will not take."""
    if seen.method == "POST":
        return reply({"error": {"message": "Requested prompt logprobs of 30, which is greater than max allowed: 20",
                                "type": "BadRequestError", "param": "prompt_logprobs", "code": 400}}, status=400)
    return _count(seen)


@pytest.mark.parametrize("fmt", ["edn", "jsonl"])
def test_an_engines_refusal_of_a_field_is_recorded_at_the_requests_position(fmt: str, tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "reqs.edn"
    path.write_text(ROUTE_HEAD["chat"] + "}\n\n  " + ROUTE_HEAD["chat"] + ":vllm.engine/prompt-logprobs 30}\n",
                    encoding="utf-8")
    out = tmp_path / f"out.{fmt}"
    with FaultServer(_refuse_prompt_logprobs) as srv:
        main(["run", str(path), "--base-url", srv.base_url, "--backend", "vllm", "--no-progress", "-o", str(out),
              "--concurrency", "1"])
    capsys.readouterr()
    if fmt == "edn":
        records = read_all(out.read_text(encoding="utf-8"))
        where = [r[kw("vllm/where")] for r in records]
        assert records[1][kw("vllm/details")][kw("param")] == "prompt_logprobs"
    else:
        import json
        lines = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
        where = [x["kotoba"]["where"] for x in lines]
        assert lines[1]["kotoba"]["error"]["details"]["param"] == "prompt_logprobs"
    assert where == [f"{path}:1:1", f"{path}:3:3"]
