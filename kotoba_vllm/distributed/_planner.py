"""The planner: spec in, plan (or problems) out. Pure; every decision carries a reason.

Order of decisions: link evidence -> gated link speed -> strategy -> usable memory ->
layer partition -> fits gates. Ranks are nodes, in spec order; the boundaries a plan
needs are the consecutive pairs (a pipeline hands activations from stage i to i+1,
a tensor group's ring all-reduce crosses the same pairs).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, TypedDict

import attrs

from .._edn import Edn, Keyword, kw
from .._problems import Problem
from ._spec import DistSpec, LinkObservation, NodeSpec, SpeculativeSpec

FAST_LINK_MBPS = 20_000.0  # DESIGN §6: tensor/expert parallel only at >= 20 Gbps
DEFAULT_MEMORY_FRACTION = 0.9  # of each accelerator's memory, when the spec names none (vLLM's own default)
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
    weight_bytes: int  # what this rank holds (per accelerator when the node names its accelerators)
    fits: bool
    accelerators: Optional[int] = None
    role: Optional[str] = None  # prefill | decode (PD disaggregation)
    stage: int = 0  # pipeline stage this node serves
    serve_port: Optional[int] = None  # its own HTTP port (DP replicas and PD instances serve per node)


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
    data_parallel_size: int = 1
    expert_parallel_size: int = 1  # 1: off
    accelerators_per_node: Optional[int] = None  # None: one rank per node (CPU / llama.cpp RPC)
    context_length: Optional[int] = None
    slots: Optional[int] = None
    memory_fraction: Optional[float] = None
    kv_cache_bytes: Optional[int] = None
    speculative: Optional[SpeculativeSpec] = None
    disaggregated: bool = False

    @property
    def replica_nodes(self) -> int:
        """Nodes one replica spans (1 when a replica fits inside a node)."""
        if self.accelerators_per_node is None:
            return len(self.nodes)
        return max(1, -(-(self.tensor_parallel_size * self.pipeline_parallel_size) // self.accelerators_per_node))

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
                **({kw("node/port"): n.port} if n.port is not None else {}),
                **({kw("plan/accelerators"): n.accelerators} if n.accelerators is not None else {}),
                **({kw("plan/stage"): n.stage} if self.pipeline_parallel_size > 1 else {}),
                **({kw("node/serve-port"): n.serve_port} if n.serve_port is not None else {})} for n in self.nodes],
            kw("plan/why"): list(self.why),
            **self._fleet_edn(),
        }

    def _fleet_edn(self) -> dict[Keyword, Edn]:
        out: dict[Keyword, Edn] = {kw("plan/data-parallel-size"): self.data_parallel_size,
                                   kw("plan/expert-parallel-size"): self.expert_parallel_size,
                                   kw("plan/disaggregated?"): self.disaggregated}
        for key, v in (("accelerators-per-node", self.accelerators_per_node), ("context-length", self.context_length),
                       ("slots", self.slots), ("memory-fraction", self.memory_fraction),
                       ("kv-cache-bytes", self.kv_cache_bytes)):
            if v is not None:
                out[kw("plan/" + key)] = v
        if self.speculative is not None:
            sp = self.speculative
            out[kw("plan/speculative")] = {kw("speculative/method"): kw(sp.method), **(
                {kw("speculative/draft-model"): sp.draft_model} if sp.draft_model else {}), **(
                {kw("speculative/tokens"): sp.tokens} if sp.tokens else {})}
        roles = {n.name: n.role for n in self.nodes if n.role}
        if roles:
            out[kw("plan/roles")] = {k: kw(v) for k, v in roles.items()}
        return out


# ---------------------------------------------------------------- evidence


def boundaries(nodes: Sequence[NodeSpec]) -> tuple[tuple[str, str], ...]:
    return tuple((a.name, b.name) for a, b in zip(nodes, nodes[1:]))


def _on(obs: LinkObservation, b: tuple[str, str]) -> bool:
    return {obs.from_, obs.to} == set(b)  # a link is measured in one direction, used in both


class LinkEvidence(TypedDict):
    evidence: str  # measured | unverified | partial | none
    link_mbps: float  # the gated speed: the slowest verified boundary's, 0 unless every boundary is measured
    expected: tuple[tuple[str, str], ...]  # every boundary between adjacent nodes
    observed: tuple[tuple[str, str], ...]  # those with a receiver-verified transfer
    failed: tuple[tuple[str, str], ...]  # those with failed transfers only
    slowest: LinkObservation | None


def link_evidence(nodes: Sequence[NodeSpec], links: Sequence[LinkObservation]) -> LinkEvidence:
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


@attrs.frozen
class Layout:
    """How the ranks are split: what the node-rank or the accelerator planner decided."""

    strategy: str
    tp: int
    pp: int
    nodes: tuple[NodePlan, ...]
    fits_all: bool
    dp: int = 1
    ep: int = 1
    accelerators: Optional[int] = None


def _node_layout(spec: DistSpec, eng: str, link_mbps: float, why: list[str], problems: list[Problem],
                 where: Callable[[Sequence[str | int]], str | None]) -> Layout:
    """One rank per node (CPU nodes, llama.cpp RPC): DESIGN §6 as it always was."""
    nodes, m, n = spec.nodes, spec.model, len(spec.nodes)
    strategy, reasons = choose_strategy(spec, eng, n, link_mbps)
    why += reasons
    asked = spec.shard_strategy
    if asked not in (None, "auto") and n > 1 and asked != strategy:
        problems.append(_problem("dist/strategy-refused",
                                 f"asked for {asked}, but the evidence gives {strategy} ({reasons[-1]})",
                                 "dist/shard-strategy", ("dist/shard-strategy",), where, "warn"))
        why.append(f"asked for {asked}; planned {strategy} instead")
    tp, pp = (n, 1) if strategy in ("tensor", "expert") else (1, n)
    _check_sizes(spec, tp, pp, f"{n} node(s) planned as {strategy} (tensor {tp} x pipeline {pp}); one rank per node",
                 problems, where)
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
        node_plans.append(NodePlan(x.name, x.address, i, u, x.port, a, b, h, ok, stage=i if pp > 1 else 0,
                                   serve_port=x.serve_port))
    return Layout(strategy, tp, pp, tuple(node_plans), fits_all)


def _check_sizes(spec: DistSpec, tp: int, pp: int, planned: str, problems: list[Problem],
                 where: Callable[[Sequence[str | int]], str | None]) -> None:
    for key, want, got in (("dist/tensor-parallel-size", spec.tensor_parallel_size, tp),
                           ("dist/pipeline-parallel-size", spec.pipeline_parallel_size, pp)):
        if want is not None and want != got:
            problems.append(_problem("dist/size-mismatch", f":{key} {want} disagrees with {planned}", key, (key,),
                                     where))


def tensor_size(need: int, per_node: int, kv_heads: int | None) -> int:
    """The smallest tensor-parallel group inside one node that holds `need` accelerators' worth:
    it divides the node's accelerators and the kv-heads divide it or it divides them."""
    for t in range(max(1, need), per_node + 1):
        if per_node % t == 0 and (kv_heads is None or kv_heads % t == 0 or t % kv_heads == 0):
            return t
    return per_node


def _accelerator_layout(spec: DistSpec, eng: str, link_mbps: float, why: list[str], problems: list[Problem],
                        where: Callable[[Sequence[str | int]], str | None]) -> Layout:
    """Nodes with accelerators: tensor parallel inside a node, pipeline across nodes (tensor across nodes
    only on a measured fast link), data-parallel replicas in what is left, expert parallel for MoE."""
    nodes, m, n = spec.nodes, spec.model, len(spec.nodes)
    g = min(x.accelerators or 1 for x in nodes)
    a = min(x.accelerator_memory_bytes or 0 for x in nodes)
    if len({x.accelerators for x in nodes}) > 1 or len({x.accelerator_memory_bytes for x in nodes}) > 1:
        problems.append(_problem("dist/uneven-accelerators", f"nodes differ in accelerators; planned on the "
                                 f"smallest: {g} x {a} bytes", "node/accelerators", ("dist/nodes",), where, "warn"))
    frac = spec.memory_fraction or DEFAULT_MEMORY_FRACTION
    budget = int(a * frac)
    kv = spec.kv_cache_bytes or 0
    need_bytes = m.weight_bytes + kv
    need = max(1, -(-need_bytes // budget))
    why.append(f"needs {need_bytes} bytes (weights {m.weight_bytes} + KV {kv}); each accelerator offers {budget} "
               f"({frac:g} of {a}): at least {need} accelerator(s) per replica")
    pd = any(x.role for x in nodes)
    span = 1
    if need == 1:
        tp, pp = 1, 1
        why.append("fits one accelerator: no tensor or pipeline parallelism")
    elif need <= g:
        tp, pp = tensor_size(need, g, m.kv_heads), 1
        why.append(f"fits one node: tensor parallel {tp} inside the node (the node's own interconnect; "
                   "no link evidence needed)")
    else:
        span = -(-need // g)
        tp_node = tensor_size(g, g, m.kv_heads)
        fast = link_mbps >= FAST_LINK_MBPS
        across = g * span
        if pd:
            problems.append(_problem("dist/model-too-big", f"a disaggregated layout runs one instance per node, and "
                                     f"the model needs {need} accelerators; a node has {g}", "model/weight-bytes",
                                     ("dist/model", "model/weight-bytes"), where))
            tp, pp = tp_node, 1
        elif fast and (m.kv_heads is None or m.kv_heads % across == 0 or across % m.kv_heads == 0):
            tp, pp = across, 1
            why.append(f"gated link speed {link_mbps:g} Mbit/s >= {FAST_LINK_MBPS:g}: tensor parallel {tp} across "
                       f"{span} nodes")
        else:
            tp, pp = tp_node, span
            speed = f"gated link speed {link_mbps:g} Mbit/s" + ("" if link_mbps else " (0 unless every boundary "
                                                                 "carries a receiver-verified transfer)")
            why.append(f"needs {span} nodes: tensor parallel {tp} inside each node, pipeline {pp} across nodes "
                       f"({speed} < {FAST_LINK_MBPS:g}: no tensor parallel across nodes)")
        if span > n:
            problems.append(_problem("dist/model-too-big", f"model needs {need_bytes} bytes: {need} accelerators, "
                                     f"{span} nodes of {g}; the spec has {n}", "model/weight-bytes",
                                     ("dist/model", "model/weight-bytes"), where))
    replica_nodes = max(1, -(-(tp * pp) // g))
    if pd:
        dp = 1
        why.append("disaggregated: each node runs one instance of its role (" + ", ".join(
            f"{x.name} {x.role}" for x in nodes) + ")" + (f"; {g - tp} accelerator(s) a node left idle"
                                                           if g > tp else ""))
    elif replica_nodes > 1:
        dp = max(1, n // replica_nodes)
    else:
        dp = (g // (tp * pp)) * n
    if not pd and spec.data_parallel_size is not None:
        if spec.data_parallel_size > dp:
            problems.append(_problem("dist/size-mismatch", f":dist/data-parallel-size {spec.data_parallel_size} "
                                     f"needs more accelerators than the fleet has ({dp} replicas of {tp * pp} fit)",
                                     "dist/data-parallel-size", ("dist/data-parallel-size",), where))
        else:
            dp = spec.data_parallel_size
    if dp > 1:
        why.append(f"{dp} data-parallel replica(s) of {tp * pp} accelerator(s): the model fits in fewer ranks than "
                   f"the fleet's {g * n}")
    used = dp * tp * pp if not pd else n * tp
    if used < g * n and not pd:
        why.append(f"{g * n - used} accelerator(s) left idle")
    ep = 1
    if m.experts and tp * (dp if eng == "vllm" else 1) > 1 and m.experts >= tp:
        ep = tp * dp if eng == "vllm" else tp
        why.append(f"{m.experts} experts: expert parallel {ep} (experts spread over the ranks instead of "
                   "sliced by tensor parallel)")
    _check_sizes(spec, tp, pp, f"the planned tensor {tp} x pipeline {pp}", problems, where)
    if pp > m.layers:
        problems.append(_problem("dist/too-few-layers", f"{m.layers} layers cannot fill {pp} pipeline stages",
                                 "model/layers", ("dist/model", "model/layers"), where))
    counts = partition_layers(m.layers, [1] * pp)
    rng = spans(counts)
    share = -(-need_bytes // (tp * pp))
    fits = share <= budget and (span <= n)
    node_plans = []
    for i, x in enumerate(nodes):
        stage = (i % replica_nodes) if pp > 1 else 0
        first, end = rng[stage] if pp > 1 else (0, m.layers)
        node_plans.append(NodePlan(x.name, x.address, i, budget, x.port, first, end, share, fits,
                                   accelerators=x.accelerators, role=x.role, stage=stage, serve_port=x.serve_port))
    strategy = ("tensor-pipeline" if tp > 1 and pp > 1 else "pipeline" if pp > 1 else "tensor" if tp > 1
                else "data-parallel" if dp > 1 else "single-node")
    return Layout(strategy, tp, pp, tuple(node_plans), span <= n, dp=dp, ep=ep, accelerators=g)


def plan(spec: DistSpec, engine: str | None = None,
         where: Callable[[Sequence[str | int]], str | None] = _no_where) -> tuple[Plan | None, list[Problem]]:
    """A plan, or the problems that stop one. `engine` overrides `:dist/engine`."""
    eng = engine or spec.engine or "vllm"
    nodes, m = spec.nodes, spec.model
    problems: list[Problem] = []
    why: list[str] = []
    ev = link_evidence(nodes, spec.links or ())
    why.append(f"evidence {ev['evidence']}: {len(ev['observed'])} of {len(ev['expected'])} boundaries "
               f"carry a receiver-verified transfer")
    for b in ev["failed"]:
        why.append(f"boundary {b[0]}-{b[1]}: only failed transfers, no speed")
    if nodes[0].accelerators is not None and eng != "llamacpp":
        lay = _accelerator_layout(spec, eng, ev["link_mbps"], why, problems, where)
    else:
        if nodes[0].accelerators is not None:
            why.append("llama.cpp: each node offloads every layer to its own accelerators (-ngl 999); across "
                       "nodes the RPC split applies")
        lay = _node_layout(spec, eng, ev["link_mbps"], why, problems, where)
    if not spec.kv_cache_bytes:
        why.append("KV cache not budgeted (no :dist/kv-cache-bytes)")
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
    disaggregated = any(x.role for x in nodes)
    if disaggregated and eng == "llamacpp":
        problems.append(_problem("dist/engine-unsupported", "llama.cpp has no prefill/decode disaggregation",
                                 "node/role", ("dist/nodes",), where))
    sp = spec.speculative
    if sp is not None:
        if eng == "llamacpp" and sp.method == "eagle":
            problems.append(_problem("dist/engine-unsupported", "llama.cpp's --spec-type has draft-eagle3, not "
                                     "EAGLE-1: use :eagle3", "speculative/method",
                                     ("dist/speculative", "speculative/method"), where))
        why.append(f"speculative decoding: {sp.method}" + (f" with draft {sp.draft_model}" if sp.draft_model else "")
                   + (f", {sp.tokens} tokens a step" if sp.tokens else ""))
    if spec.context_length is not None:
        why.append(f"context {spec.context_length} tokens a request" + (
            f" x {spec.slots} slots = -c {spec.context_length * spec.slots}" if eng == "llamacpp" and spec.slots
            else ""))
    if any(p.is_error for p in problems):
        return None, problems
    result = Plan(
        engine=eng, strategy=lay.strategy, tensor_parallel_size=lay.tp, pipeline_parallel_size=lay.pp,
        evidence=ev["evidence"], link_mbps=ev["link_mbps"], expected_boundaries=ev["expected"],
        observed_boundaries=ev["observed"], failed_boundaries=ev["failed"], slowest=ev["slowest"],
        nodes=lay.nodes, fits=all(x.fits for x in lay.nodes) and lay.fits_all, paged_kv_cache=paged,
        port=spec.port or DEFAULT_PORTS[eng], model_id=m.id,
        model_ref=m.path or m.repo or m.id,
        layers=m.layers, why=tuple(why), data_parallel_size=lay.dp, expert_parallel_size=lay.ep,
        accelerators_per_node=lay.accelerators, context_length=spec.context_length, slots=spec.slots,
        memory_fraction=spec.memory_fraction,
        kv_cache_bytes=spec.kv_cache_bytes, speculative=sp, disaggregated=disaggregated)
    return result, problems
