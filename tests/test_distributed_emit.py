"""Emitters: engines' own commands, flags that the engines' parsers define, shell quoting."""

from __future__ import annotations

import glob
import shlex
import subprocess
import sys

import pytest

from kotoba_vllm._edn import kw, read_one
from kotoba_vllm.distributed import emit, engine_flags, flags_of, plan_file, shell_lines
from kotoba_vllm.distributed._emit import Command

EXAMPLES = sorted(glob.glob("examples/distributed/*.edn"))


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llamacpp"])
@pytest.mark.parametrize("path", EXAMPLES)
def test_emitted_flags_are_defined_by_the_engines_parser(path: str, engine: str) -> None:
    p, problems = plan_file(path, engine)
    if p is None and engine == "llamacpp":
        assert any(x.field in ("model/path", "node/role") for x in problems), problems  # needs a GGUF, no PD
        return
    assert p is not None, problems
    known = engine_flags(engine)
    checked = 0
    for c in emit(p):
        if c.parser is None:
            assert c.role in ("ray-head", "ray-worker", "rpc-server", "router")  # Ray's, ggml's, a router's CLI
            continue
        assert c.parser == engine
        assert known.unknown(flags_of(c.argv, short=engine == "llamacpp")) == [], (known.version, c.argv)
        checked += 1
    assert checked


def test_flag_data_names_its_version_and_catches_a_rename() -> None:
    v, s = engine_flags("vllm"), engine_flags("sglang")
    assert v.version == "0.33.0" and s.version == "0.5.23"
    assert {"--tensor-parallel-size", "--pipeline-parallel-size", "--distributed-executor-backend"} <= v.flags
    assert {"--tp-size", "--pp-size", "--nnodes", "--node-rank", "--dist-init-addr"} <= s.flags
    assert v.unknown(["--tensor-parallel-sz"]) == ["--tensor-parallel-sz"]


def test_vllm_multi_node_uses_ray() -> None:
    p, _ = plan_file("examples/distributed/multi-node-vllm.edn")
    cmds = emit(p)
    assert [c.role for c in cmds] == ["ray-head", "ray-worker", "ray-worker", "ray-worker", "server"]
    serve = cmds[-1].argv
    assert serve[:3] == ("vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct")
    assert serve[serve.index("--distributed-executor-backend") + 1] == "ray"
    assert serve[serve.index("--tensor-parallel-size") + 1] == "4"
    assert cmds[1].argv[cmds[1].argv.index("--address") + 1] == "10.0.0.10:6379"


def test_vllm_pipeline_passes_the_weighted_split() -> None:
    p, _ = plan_file("examples/distributed/multi-node-sglang.edn", "vllm")
    serve = emit(p)[-1]
    assert dict(serve.env) == {"VLLM_PP_LAYER_PARTITION": "34,15,15"}
    assert serve.argv[serve.argv.index("--pipeline-parallel-size") + 1] == "3"


def test_sglang_every_node_has_rank_and_init_addr() -> None:
    p, _ = plan_file("examples/distributed/multi-node-sglang.edn")
    cmds = emit(p)
    assert [c.argv[c.argv.index("--node-rank") + 1] for c in cmds] == ["0", "1", "2"]
    assert {c.argv[c.argv.index("--dist-init-addr") + 1] for c in cmds} == {"192.168.1.11:5000"}
    assert all(c.argv[c.argv.index("--nnodes") + 1] == "3" for c in cmds)


def test_llamacpp_rpc_ring() -> None:
    p, _ = plan_file("examples/distributed/two-node-llamacpp-rpc.edn")
    cmds = emit(p, {"rpc-server": "/opt/bin/ggml-rpc-server"})
    assert [c.role for c in cmds] == ["rpc-server", "rpc-server", "server"]
    assert cmds[0].argv == ("/opt/bin/ggml-rpc-server", "-H", "127.0.0.1", "-p", "50052")
    head = cmds[-1].argv
    assert head[head.index("--rpc") + 1] == "127.0.0.1:50052,127.0.0.1:50053"
    assert head[head.index("--split-mode") + 1] == "layer"
    assert head[head.index("--tensor-split") + 1] == "3,1"


def test_shell_lines_quote_and_round_trip_through_shlex() -> None:
    c = Command("a", "server", ("llama-server", "-m", "/models/my model's.gguf", "--alias", "x; rm -rf /"),
                (("VLLM_PP_LAYER_PARTITION", "1,2"),))
    line = shell_lines([c]).splitlines()[1]
    parts = shlex.split(line)
    assert parts[0] == "VLLM_PP_LAYER_PARTITION=1,2" and tuple(parts[1:]) == c.argv


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kotoba_vllm", *args], capture_output=True, text=True, timeout=60)


def test_cli_plan_edn_and_sh() -> None:
    r = _cli("plan", "examples/distributed/multi-node-vllm.edn")
    assert r.returncode == 0, r.stderr
    out = read_one(r.stdout)
    assert out[kw("plan/strategy")] == kw("tensor") and len(out[kw("plan/commands")]) == 5
    r = _cli("plan", "examples/distributed/two-node-llamacpp-rpc.edn", "--format", "sh")
    assert r.returncode == 0 and "--tensor-split 3,1" in r.stdout and "ggml-rpc-server -H 127.0.0.1" in r.stdout


def test_cli_plan_problems_exit_1(tmp_path) -> None:
    bad = tmp_path / "bad.edn"
    bad.write_text('{:dist/model {:model/id "m" :model/repo "r" :model/layers 0 :model/weight-bytes 1}\n'
                   ' :dist/nodes []}')
    r = _cli("plan", str(bad))
    assert r.returncode == 1
    problems = [read_one(line) for line in r.stdout.splitlines()]
    fields = {p[kw("vllm/field")] for p in problems}
    assert {kw("model/layers"), kw("dist/nodes")} <= fields
    assert all(p[kw("vllm/where")].startswith(str(bad) + ":") for p in problems)
