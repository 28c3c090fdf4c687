"""Spec: EDN -> typed -> EDN identity, kotodama keys, and located problems for bad specs."""

from __future__ import annotations

import glob

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kotoba_vllm._edn import dumps, kw, read_forms, read_one
from kotoba_vllm.distributed import load_spec, spec_from_edn, spec_to_edn

BASE = """{:dist/model {:model/id "m" :model/path "/m.gguf" :model/layers 32
              :model/weight-bytes 4000000000 :model/kv-heads 8}
 :dist/nodes [{:node/name "a" :node/address "10.0.0.1" :node/memory-bytes 8000000000}
              {:node/name "b" :node/address "10.0.0.2" :node/memory-bytes 8000000000}]
 :dist/links [{:link/from "a" :link/to "b" :link/method :receiver-verified :link/mbps 933.0}]}"""


def _form(text: str, source: str = "spec.edn"):
    return list(read_forms(text, source))[0]


@pytest.mark.parametrize("path", sorted(glob.glob("examples/distributed/*.edn")))
def test_examples_load_and_round_trip(path: str) -> None:
    spec, problems = load_spec(path)
    assert spec is not None, problems
    again, _ = spec_from_edn(spec_to_edn(spec))
    assert again == spec


def test_kotodama_keys_mean_the_dist_keys() -> None:
    text = BASE[:-1] + " :kotodama/tensor-parallel-size 1 :kotodama/pipeline-parallel-size 2" \
        " :kotodama/shard-strategy :pipeline :kotodama/paged-kv-cache? true}"
    spec, problems = spec_from_edn(read_one(text))
    assert spec is not None and problems == []
    assert (spec.tensor_parallel_size, spec.pipeline_parallel_size, spec.shard_strategy, spec.paged_kv_cache) \
        == (1, 2, "pipeline", True)
    assert kw("dist/pipeline-parallel-size") in spec_to_edn(spec)


def test_alias_and_canonical_together_is_a_problem() -> None:
    text = BASE[:-1] + " :kotodama/tensor-parallel-size 1 :dist/tensor-parallel-size 1}"
    f = _form(text)
    spec, problems = spec_from_edn(f.value, f)
    assert spec is None and any(p.code == "dist/duplicate-key" for p in problems)


# (text in BASE, its replacement, field, code, text the problem must point at)
BAD = [
    (':model/id "m"', ':model/id 3', "model/id", "dist/type", ":model/id 3"),
    (':model/layers 32', ':model/layers 0', "model/layers", "dist/type", ":model/layers 0"),
    (':model/kv-heads 8', ':model/kv-heads 8 :model/colour "red"', "model/colour", "dist/unknown-key",
     ":model/colour"),
    ('"10.0.0.1" :node/memory-bytes 8000000000', '"10.0.0.1" :node/memory-bytes -5', "node/memory-bytes",
     "dist/type", ":node/memory-bytes -5"),
    ('"10.0.0.2" :node/memory-bytes 8000000000', '"10.0.0.2" :node/memory-bytes 8 :node/os-reserve-bytes 9',
     "node/os-reserve-bytes", "dist/node-too-small", ":node/os-reserve-bytes 9"),
    (':dist/nodes [', ':dist/engine "vllm" :dist/nodes [', "dist/engine", "dist/type", ':dist/engine "vllm"'),
    (':dist/nodes [', ':dist/shard-strategy :diagonal :dist/nodes [', "dist/shard-strategy", "dist/type",
     ":dist/shard-strategy"),
    (':link/to "b"', ':link/to "zz"', "link/to", "dist/unknown-node", ':link/to "zz"'),
    (':link/method :receiver-verified', ':link/method :vibes', "link/method", "dist/type", ":link/method :vibes"),
    (':dist/nodes [', ':dist/wat 1 :dist/nodes [', "dist/wat", "dist/unknown-key", ":dist/wat"),
    ('"b" :node/address', '"a" :node/address', "node/name", "dist/duplicate-node", ':node/name "a"'),
]


@pytest.mark.parametrize("old,new,field,code,located", BAD)
def test_every_bad_spec_names_key_and_position(old: str, new: str, field: str, code: str, located: str) -> None:
    assert old in BASE
    text = BASE.replace(old, new, 1)
    f = _form(text)
    spec, problems = spec_from_edn(f.value, f)
    assert spec is None
    hits = [p for p in problems if p.field == field and p.code == code]
    assert hits, problems
    line, col = map(int, hits[0].where.split(":")[1:])
    offset = sum(len(x) + 1 for x in text.split("\n")[: line - 1]) + col - 1
    assert text[offset:].startswith(located), (hits[0].where, text[offset:offset + 30])


def test_missing_required_keys_and_speed_xor_failure() -> None:
    spec, problems = spec_from_edn(read_one('{:dist/model {:model/id "m"} :dist/links [{:link/from "a" '
                                            ':link/to "b" :link/method :nominal}]}'))
    codes = {(p.code, p.field) for p in problems}
    assert ("dist/missing-key", "dist/nodes") in codes
    assert ("dist/missing-key", "model/layers") in codes
    assert ("dist/link-result", "link/mbps") in codes


def test_problems_are_edn_data() -> None:
    f = _form(BASE.replace(":model/layers 32", ":model/layers -1"))
    _, problems = spec_from_edn(f.value, f)
    edn = problems[0].to_edn()
    assert edn[kw("vllm/field")] == kw("model/layers") and edn[kw("vllm/where")].startswith("spec.edn:1:")


names = st.text("abcdefghij", min_size=1, max_size=6)


@st.composite
def specs(draw):  # canonical :dist/* specs; typed -> EDN -> typed must be identity
    n = draw(st.integers(1, 5))
    node_names = draw(st.lists(names, min_size=n, max_size=n, unique=True))
    nodes = []
    for nm in node_names:
        node = {kw("node/name"): nm, kw("node/address"): f"10.0.0.{len(nodes) + 1}",
                kw("node/memory-bytes"): draw(st.integers(1, 2**40))}
        if draw(st.booleans()):
            node[kw("node/os-reserve-bytes")] = draw(st.integers(0, node[kw("node/memory-bytes")] - 1))
        if draw(st.booleans()):
            node[kw("node/port")] = draw(st.integers(1, 65535))
        nodes.append(node)
    model = {kw("model/id"): draw(names), kw("model/layers"): draw(st.integers(1, 200)),
             kw("model/weight-bytes"): draw(st.integers(1, 2**42)), kw("model/repo"): "org/m"}
    if draw(st.booleans()):
        model[kw("model/kv-heads")] = draw(st.integers(1, 64))
    spec = {kw("dist/model"): model, kw("dist/nodes"): nodes}
    for key, strat in (("dist/engine", st.sampled_from(["vllm", "sglang", "llamacpp"]).map(kw)),
                       ("dist/shard-strategy", st.sampled_from(["auto", "tensor", "pipeline"]).map(kw)),
                       ("dist/paged-kv-cache?", st.booleans()),
                       ("dist/pipeline-parallel-size", st.integers(1, 8))):
        if draw(st.booleans()):
            spec[kw(key)] = draw(strat)
    if n > 1 and draw(st.booleans()):
        spec[kw("dist/links")] = [
            {kw("link/from"): a, kw("link/to"): b, kw("link/method"): kw("receiver-verified"),
             kw("link/mbps"): draw(st.floats(0.5, 1e6, allow_nan=False))}
            for a, b in zip(node_names, node_names[1:])]
    return spec


@settings(max_examples=150, deadline=None)
@given(specs())
def test_round_trip_edn_typed_edn_is_identity(raw) -> None:
    spec, problems = spec_from_edn(raw)
    assert spec is not None, problems
    out = spec_to_edn(spec)
    assert out == raw
    assert read_one(dumps(out)) == raw  # maps are unordered: equal as data, not as text
    assert spec_from_edn(read_one(dumps(out)))[0] == spec
