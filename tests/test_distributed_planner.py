"""Planner: evidence gate, strategy, memory-weighted contiguous partition, fits gates."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kotoba_vllm._edn import kw
from kotoba_vllm.distributed import partition_layers, plan, spans, spec_from_edn
from kotoba_vllm.distributed._planner import usable_bytes

GiB = 1024**3


def fleet(links: list[dict], kv_heads: int = 8, n: int = 4, engine: str = "vllm", **top):
    nodes = [{kw("node/name"): f"n{i}", kw("node/address"): f"10.0.0.{i}", kw("node/memory-bytes"): 80 * GiB,
              kw("node/os-reserve-bytes"): 4 * GiB} for i in range(n)]
    raw = {kw("dist/model"): {kw("model/id"): "m", kw("model/repo"): "org/m", kw("model/layers"): 80,
                              kw("model/weight-bytes"): 140 * GiB, kw("model/kv-heads"): kv_heads},
           kw("dist/nodes"): nodes, kw("dist/engine"): kw(engine), kw("dist/links"): links,
           **{kw(k): v for k, v in top.items()}}
    spec, problems = spec_from_edn(raw)
    assert spec is not None, problems
    return spec


def link(a: int, b: int, mbps: float = 40_000.0, method: str = "receiver-verified") -> dict:
    return {kw("link/from"): f"n{a}", kw("link/to"): f"n{b}", kw("link/method"): kw(method), kw("link/mbps"): mbps}


def test_one_unobserved_boundary_with_nominal_40g_plans_pipeline_partial_speed_zero() -> None:
    p, _ = plan(fleet([link(0, 1, method="nominal"), link(1, 2, method="nominal")]))
    assert p is not None
    assert (p.strategy, p.evidence, p.link_mbps) == ("pipeline", "partial", 0.0)
    assert p.to_edn()[kw("plan/coverage")][kw("plan/missing")] == [["n0", "n1"], ["n1", "n2"], ["n2", "n3"]]
    assert p.slowest is None


def test_every_boundary_verified_at_40g_and_kv_heads_divisible_plans_tensor() -> None:
    p, _ = plan(fleet([link(0, 1), link(1, 2), link(2, 3, 39_000.0)]))
    assert p is not None
    assert (p.strategy, p.evidence, p.link_mbps, p.tensor_parallel_size) == ("tensor", "measured", 39_000.0, 4)
    assert p.slowest is not None and (p.slowest.from_, p.slowest.to) == ("n2", "n3")


def test_kv_heads_not_dividing_ranks_falls_back() -> None:
    p, _ = plan(fleet([link(0, 1), link(1, 2), link(2, 3)], kv_heads=6))
    assert p is not None and p.strategy == "pipeline"


def test_expert_on_fast_link_with_more_experts_than_ranks() -> None:
    s = fleet([link(0, 1), link(1, 2), link(2, 3)], kv_heads=6)
    import attrs

    s = attrs.evolve(s, model=attrs.evolve(s.model, experts=64))
    p, _ = plan(s)
    assert p is not None and p.strategy == "expert"


def test_all_claims_is_unverified_and_slow_verified_is_pipeline() -> None:
    p, _ = plan(fleet([link(0, 1, method="nominal"), link(1, 2, method="instrument-limited"),
                       link(2, 3, method="unverified-transfer")]))
    assert p is not None and (p.evidence, p.link_mbps, p.strategy) == ("unverified", 0.0, "pipeline")
    p, _ = plan(fleet([link(0, 1, 933.0), link(1, 2, 940.0), link(2, 3, 935.0)]))
    assert p is not None and (p.evidence, p.link_mbps, p.strategy) == ("measured", 933.0, "pipeline")


def test_failed_transfer_is_not_a_speed() -> None:
    failed = {kw("link/from"): "n0", kw("link/to"): "n1", kw("link/method"): kw("receiver-verified"),
              kw("link/failure"): "short transfer: receiver counted 133120 of 16777216 bytes"}
    p, _ = plan(fleet([failed], n=2))
    assert p is not None and (p.evidence, p.link_mbps) == ("none", 0.0)
    assert p.failed_boundaries == (("n0", "n1"),)


def test_requested_tensor_without_evidence_is_refused_with_a_warning() -> None:
    p, problems = plan(fleet([], **{"dist/shard-strategy": kw("tensor")}))
    assert p is not None and p.strategy == "pipeline"
    assert [x.code for x in problems] == ["dist/strategy-refused"] and not problems[0].is_error


def test_size_disagreeing_with_nodes_is_a_problem_and_no_plan() -> None:
    p, problems = plan(fleet([], **{"dist/pipeline-parallel-size": 3}))
    assert p is None and problems[0].field == "dist/pipeline-parallel-size"


def test_model_too_big_and_node_too_small() -> None:
    s = fleet([], n=2)
    import attrs
    p, problems = plan(attrs.evolve(s, model=attrs.evolve(s.model, weight_bytes=200 * GiB)))
    assert p is None and [x.code for x in problems] == ["dist/model-too-big"]
    nodes = (s.nodes[0], attrs.evolve(s.nodes[1], memory_bytes=5 * GiB))
    p, problems = plan(attrs.evolve(s, nodes=nodes, model=attrs.evolve(s.model, weight_bytes=70 * GiB)))
    assert p is not None  # a small node just gets fewer layers
    assert p.nodes[1].end_layer - p.nodes[1].first_layer < 5
    tight = (attrs.evolve(s.nodes[0], memory_bytes=40 * GiB), attrs.evolve(s.nodes[1], memory_bytes=2 * GiB + 1))
    p, problems = plan(attrs.evolve(s, nodes=tight, model=attrs.evolve(s.model, weight_bytes=30 * GiB)))
    assert p is None and "dist/node-too-small" in [x.code for x in problems]


def test_why_and_edn_shape() -> None:
    p, _ = plan(fleet([link(0, 1, 933.0)], n=2))
    assert p is not None
    e = p.to_edn()
    assert e[kw("plan/evidence")] == kw("measured") and e[kw("plan/strategy")] == kw("pipeline")
    assert all(isinstance(w, str) for w in e[kw("plan/why")]) and len(e[kw("plan/why")]) >= 3
    assert [n[kw("plan/layers")] for n in e[kw("plan/nodes")]] == [[0, 40], [40, 80]]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 400), st.lists(st.integers(1, 10**12), min_size=1, max_size=12))
def test_partition_is_contiguous_covers_all_layers_and_is_proportional(layers: int, weights: list[int]) -> None:
    counts = partition_layers(layers, weights)
    assert sum(counts) == layers and all(c >= 0 for c in counts)
    sp = spans(counts)
    assert sp[0][0] == 0 and sp[-1][1] == layers
    assert all(a[1] == b[0] for a, b in zip(sp, sp[1:]))  # contiguous, no gap, no overlap
    total = sum(weights)
    for c, w in zip(counts, weights):
        assert abs(c - layers * w / total) < 1.0  # largest remainder: within one layer of exact share


def test_usable_memory_subtracts_reserve() -> None:
    s = fleet([], n=1)
    assert usable_bytes(s.nodes[0]) == 76 * GiB
