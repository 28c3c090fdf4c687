"""The planner: spec in, plan (or problems) out. Pure; every decision carries a reason.

Order of decisions: link evidence -> gated link speed -> strategy -> usable memory ->
layer partition -> fits gates. Ranks are nodes, in spec order; the boundaries a plan
needs are the consecutive pairs (a pipeline hands activations from stage i to i+1,
a tensor group's ring all-reduce crosses the same pairs).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import attrs

from .._edn import Edn, Keyword, kw
from .._problems import Problem
from ._spec import DistSpec, LinkObservation, NodeSpec

FAST_LINK_MBPS = 20_000.0  # DESIGN §6: tensor/expert parallel only at >= 20 Gbps
DEFAULT_OS_RESERVE_BYTES = 2 * 1024**3  # an OS and the server process, when the spec names none
DEFAULT_PORTS = {"vllm": 8000, "sglang": 30000, "llamacpp": 8080}


@attrs.frozen
class NodePlan:
    name: str
    address: str
    rank: int
    usable_bytes: int
    port: Optional[int]
    first_layer: int  # [first_layer, end_layer); the whole model for tensor/expert ranks
    end_layer: int
    weight_bytes: int  # what this rank holds
    fits: bool


@attrs.frozen
class Plan:
    engine: str
    strategy: str  # single-node | pipeline | tensor | expert
    tensor_parallel_size: int
    pipeline_parallel_size: int
    evidence: str  # measured | partial | none | unverified
    link_mbps: float  # gated: 0.0 unless evidence is measured
    expected_boundaries: tuple[tuple[str, str], ...]
    observed_boundaries: tuple[tuple[str, str], ...]  # carrying a receiver-verified speed
    failed_boundaries: tuple[tuple[str, str], ...]  # only failed transfers, no speed
    slowest: Optional[LinkObservation]  # slowest receiver-verified boundary
    nodes: tuple[NodePlan, ...]
    fits: bool
    paged_kv_cache: bool
    port: int
    model_id: str
    model_ref: str  # path (preferred) or repo: what the engine loads
    layers: int
    why: tuple[str, ...]

    def to_edn(self) -> dict[Keyword, Edn]:
        def pair(b: tuple[str, str]) -> list[str]:
            return [b[0], b[1]]

        slow = None
        if self.slowest is not None:
            s = self.slowest
            slow = {kw("link/from"): s.from_, kw("link/to"): s.to, kw("link/mbps"): s.mbps,
                    kw("link/method"): kw(s.method)}
        return {
            kw("plan/engine"): kw(self.engine),
            kw("plan/model"): self.model_id,
            kw("plan/model-ref"): self.model_ref,
            kw("plan/strategy"): kw(self.strategy),
            kw("plan/tensor-parallel-size"): self.tensor_parallel_size,
            kw("plan/pipeline-parallel-size"): self.pipeline_parallel_size,
            kw("plan/evidence"): kw(self.evidence),
            kw("plan/link-mbps"): self.link_mbps,
            kw("plan/coverage"): {
                kw("plan/observed"): len(self.observed_boundaries),
                kw("plan/expected"): len(self.expected_boundaries),
                kw("plan/missing"): [pair(b) for b in self.expected_boundaries
                                     if b not in self.observed_boundaries],
                kw("plan/failed"): [pair(b) for b in self.failed_boundaries]},
            kw("plan/slowest-link"): slow,
            kw("plan/fits?"): self.fits,
            kw("plan/paged-kv-cache?"): self.paged_kv_cache,
            kw("plan/port"): self.port,
            kw("plan/nodes"): [{
                kw("node/name"): n.name, kw("node/address"): n.address, kw("plan/rank"): n.rank,
                kw("plan/usable-bytes"): n.usable_bytes, kw("plan/layers"): [n.first_layer, n.end_layer],
                kw("plan/weight-bytes"): n.weight_bytes, kw("plan/fits?"): n.fits,
                **({kw("node/port"): n.port} if n.port is not None else {})} for n in self.nodes],
            kw("plan/why"): list(self.why),
        }


# ---------------------------------------------------------------- evidence


def boundaries(nodes: Sequence[NodeSpec]) -> tuple[tuple[str, str], ...]:
    return tuple((a.name, b.name) for a, b in zip(nodes, nodes[1:]))


def _on(obs: LinkObservation, b: tuple[str, str]) -> bool:
    return {obs.from_, obs.to} == set(b)  # a link is measured in one direction, used in both


def link_evidence(nodes: Sequence[NodeSpec], links: Sequence[LinkObservation]) -> dict[str, Any]:
    """Evidence class, gated speed, coverage and the slowest verified boundary."""
    need = boundaries(nodes)
    verified: dict[tuple[str, str], LinkObservation] = {}
    claimed: set[tuple[str, str]] = set()
    failed: list[tuple[str, str]] = []
    for b in need:
        obs = [o for o in links if _on(o, b)]
        good = [o for o in obs if o.method == "receiver-verified" and o.mbps is not None]
        if good:
            # Several transfers on one boundary: the slowest is what a plan can rely on.
            verified[b] = min(good, key=lambda o: o.mbps or 0.0)
        elif any(o.mbps is not None for o in obs):
            claimed.add(b)
        elif obs:
            failed.append(b)
    if not need:
        evidence = "none"
    elif len(verified) == len(need):
        evidence = "measured"
    elif len(verified) + len(claimed) == len(need):
        evidence = "unverified"  # every boundary has a number, some only from a claim
    elif verified or claimed:
        evidence = "partial"
    else:
        evidence = "none"
    slowest = min(verified.values(), key=lambda o: o.mbps or 0.0) if verified else None
    gated = float(slowest.mbps or 0.0) if evidence == "measured" and slowest is not None else 0.0
    return {"evidence": evidence, "link_mbps": gated, "expected": need,
            "observed": tuple(b for b in need if b in verified), "failed": tuple(failed), "slowest": slowest}


# ---------------------------------------------------------------- strategy


def choose_strategy(spec: DistSpec, engine: str, ranks: int, link_mbps: float) -> tuple[str, list[str]]:
    """DESIGN §6, in order: tensor, expert, pipeline. Only gated (measured) speed counts."""
    m = spec.model
    if ranks == 1:
        return "single-node", ["one node: nothing to split"]
    if engine == "llamacpp":
        return "pipeline", ["llama.cpp RPC splits by layer (--split-mode layer): pipeline"]
    fast = link_mbps >= FAST_LINK_MBPS
    speed = (f"gated link speed {link_mbps:g} Mbit/s" + ("" if link_mbps else " (0 unless every boundary "
             "carries a receiver-verified transfer)"))
    if fast and m.kv_heads is not None and m.kv_heads % ranks == 0:
        return "tensor", [f"{speed} >= {FAST_LINK_MBPS:g} and {m.kv_heads} kv-heads divide {ranks} ranks: tensor"]
    if fast and m.experts is not None and m.experts > ranks:
        return "expert", [f"{speed} >= {FAST_LINK_MBPS:g} and {m.experts} experts > {ranks} ranks: expert"]
    if not fast:
        return "pipeline", [f"{speed} < {FAST_LINK_MBPS:g}: pipeline"]
    return "pipeline", [f"{speed} is fast but kv-heads ({m.kv_heads}) do not divide {ranks} ranks "
                        f"and experts ({m.experts}) do not outnumber them: pipeline"]


# ---------------------------------------------------------------- memory


def usable_bytes(node: NodeSpec) -> int:
    reserve = DEFAULT_OS_RESERVE_BYTES if node.os_reserve_bytes is None else node.os_reserve_bytes
    return max(0, node.memory_bytes - reserve)


def partition_layers(layers: int, weights: Sequence[int], caps: Sequence[int] | None = None) -> list[int]:
    """Layer counts proportional to `weights` (largest remainder), summing to `layers`.

    A leftover layer goes to the largest remainder among ranks that still have room
    under `caps` (max layers each), so rounding does not overfill a small node.
    """
    total = sum(weights)
    if total <= 0:
        return [0] * len(weights)
    quotas = [layers * w / total for w in weights]
    counts = [int(q) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    left = layers - sum(counts)
    for room_only in (True, False):
        for i in order:
            if left == 0:
                break
            if room_only and caps is not None and counts[i] + 1 > caps[i]:
                continue
            counts[i] += 1
            left -= 1
    return counts


def spans(counts: Sequence[int]) -> list[tuple[int, int]]:
    out, start = [], 0
    for c in counts:
        out.append((start, start + c))
        start += c
    return out


# ---------------------------------------------------------------- plan


def _problem(code: str, msg: str, field: str | None, path: tuple[str | int, ...],
             where: Callable[[Sequence[str | int]], str | None], severity: str = "error") -> Problem:
    return Problem(severity, code, msg, field=field, where=where(path))


def _no_where(path: Sequence[str | int]) -> str | None:
    return None


def plan(spec: DistSpec, engine: str | None = None,
         where: Callable[[Sequence[str | int]], str | None] = _no_where) -> tuple[Plan | None, list[Problem]]:
    """A plan, or the problems that stop one. `engine` overrides `:dist/engine`."""
    eng = engine or spec.engine or "vllm"
    nodes, m, n = spec.nodes, spec.model, len(spec.nodes)
    problems: list[Problem] = []
    why: list[str] = []
    ev = link_evidence(nodes, spec.links or ())
    why.append(f"evidence {ev['evidence']}: {len(ev['observed'])} of {len(ev['expected'])} boundaries "
               f"carry a receiver-verified transfer")
    for b in ev["failed"]:
        why.append(f"boundary {b[0]}-{b[1]}: only failed transfers, no speed")
    strategy, reasons = choose_strategy(spec, eng, n, ev["link_mbps"])
    why += reasons
    asked = spec.shard_strategy
    if asked not in (None, "auto") and n > 1 and asked != strategy:
        problems.append(_problem("dist/strategy-refused",
                                 f"asked for {asked}, but the evidence gives {strategy} ({reasons[-1]})",
                                 "dist/shard-strategy", ("dist/shard-strategy",), where, "warn"))
        why.append(f"asked for {asked}; planned {strategy} instead")
    tp, pp = (n, 1) if strategy in ("tensor", "expert") else (1, n)
    for key, want, got in (("dist/tensor-parallel-size", spec.tensor_parallel_size, tp),
                           ("dist/pipeline-parallel-size", spec.pipeline_parallel_size, pp)):
        if want is not None and want != got:
            problems.append(_problem("dist/size-mismatch",
                                     f":{key} {want} disagrees with {n} node(s) planned as {strategy} "
                                     f"(tensor {tp} x pipeline {pp}); one rank per node", key, (key,), where))
    if strategy in ("single-node", "pipeline") and m.layers < n:
        problems.append(_problem("dist/too-few-layers", f"{m.layers} layers cannot fill {n} pipeline stages",
                                 "model/layers", ("dist/model", "model/layers"), where))
    usable = [usable_bytes(x) for x in nodes]
    per_layer = m.weight_bytes / m.layers
    kv = spec.kv_cache_bytes or 0
    if strategy in ("tensor", "expert"):
        share = -(-(m.weight_bytes + kv) // n)  # every rank holds 1/n of every layer (and of the KV cache)
        counts = [m.layers] * n
        held = [share] * n
        rng = [(0, m.layers)] * n
        why.append(f"each of {n} ranks holds 1/{n} of the weights: {share} bytes")
    else:
        caps = [int(u // (per_layer + kv / m.layers)) if per_layer else m.layers for u in usable]
        counts = partition_layers(m.layers, usable, caps)
        rng = spans(counts)
        held = [int(c * per_layer + kv * c / m.layers) for c in counts]
        if n > 1:
            why.append("layers split contiguously in proportion to usable memory: "
                       + ", ".join(f"{x.name} {c}" for x, c in zip(nodes, counts)))
    why.append("usable memory = memory - OS reserve: " + ", ".join(
        f"{x.name} {u}" + (" (default reserve)" if x.os_reserve_bytes is None else "")
        for x, u in zip(nodes, usable)))
    if not kv:
        why.append("KV cache not budgeted (no :dist/kv-cache-bytes)")
    total_need = m.weight_bytes + kv
    fits_all = total_need <= sum(usable)
    if not fits_all:
        problems.append(_problem("dist/model-too-big", f"model needs {total_need} bytes; the nodes offer "
                                 f"{sum(usable)} usable", "model/weight-bytes",
                                 ("dist/model", "model/weight-bytes"), where))
    node_plans = []
    for i, (x, u, (a, b), h) in enumerate(zip(nodes, usable, rng, held)):
        ok = h <= u
        if not ok and fits_all:
            problems.append(_problem("dist/node-too-small", f"node {x.name!r} would hold {h} bytes "
                                     f"but has {u} usable", "node/memory-bytes",
                                     ("dist/nodes", i, "node/memory-bytes"), where))
        if strategy == "pipeline" and counts[i] == 0 and m.layers >= n:
            problems.append(_problem("dist/node-too-small", f"node {x.name!r} gets no layers", "node/memory-bytes",
                                     ("dist/nodes", i, "node/memory-bytes"), where))
        node_plans.append(NodePlan(x.name, x.address, i, u, x.port, a, b, h, ok))
    paged = True if spec.paged_kv_cache is None else spec.paged_kv_cache
    if eng == "llamacpp" and spec.paged_kv_cache:
        problems.append(_problem("dist/engine-unsupported", "llama.cpp has no paged KV cache; its own "
                                 "KV cache is used", "dist/paged-kv-cache?", ("dist/paged-kv-cache?",), where, "warn"))
        paged = False
    if eng in ("vllm", "sglang") and spec.paged_kv_cache is False:
        problems.append(_problem("dist/engine-unsupported", f"{eng} always pages its KV cache",
                                 "dist/paged-kv-cache?", ("dist/paged-kv-cache?",), where, "warn"))
        paged = True
    if eng == "llamacpp" and m.path is None:
        problems.append(_problem("dist/missing-key", "llama.cpp loads a GGUF file: :model/path is required",
                                 "model/path", ("dist/model",), where))
    if any(p.is_error for p in problems):
        return None, problems
    result = Plan(
        engine=eng, strategy=strategy, tensor_parallel_size=tp, pipeline_parallel_size=pp,
        evidence=ev["evidence"], link_mbps=ev["link_mbps"], expected_boundaries=ev["expected"],
        observed_boundaries=ev["observed"], failed_boundaries=ev["failed"], slowest=ev["slowest"],
        nodes=tuple(node_plans), fits=all(x.fits for x in node_plans) and fits_all, paged_kv_cache=paged,
        port=spec.port or DEFAULT_PORTS[eng], model_id=m.id,
        model_ref=m.path or m.repo or m.id,
        layers=m.layers, why=tuple(why))
    return result, problems
