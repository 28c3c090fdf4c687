"""A plan held against what the servers report (issue 32 part 2). Pure: a plan, its commands and
each server's `ServerConfig` in; one verdict per property and per endpoint out.

Each property the plan fixes is `:matches`, `:differs` (both values kept) or `:unverifiable` (the
engine does not report it, or its endpoint could not be read: the reason is kept). vLLM reports no
parallel sizes over HTTP, so a vLLM plan is mostly unverifiable; that is said, never passed.
"""

from __future__ import annotations

from typing import Sequence
from urllib.parse import urlsplit

import attrs

from .._edn import Edn, Keyword, kw
from ..server_config import ServerConfig
from ._emit import SGLANG_SPEC_ALGORITHMS, Command
from ._planner import Plan

MATCHES, DIFFERS, UNVERIFIABLE = "matches", "differs", "unverifiable"
SERVING_ROLES = ("server", "prefill-server", "decode-server", "sglang-node")


@attrs.frozen
class PropertyCheck:
    prop: str
    verdict: str
    planned: Edn = None
    reported: Edn = None
    source: str | None = None  # "GET /props default_generation_settings.n_ctx"
    reason: str | None = None  # unverifiable: why

    def to_edn(self) -> dict[Keyword, Edn]:
        out: dict[Keyword, Edn] = {kw("check/property"): kw(self.prop), kw("check/verdict"): kw(self.verdict),
                                   kw("check/planned"): _edn(self.planned)}
        if self.verdict != UNVERIFIABLE:
            out[kw("check/reported")] = _edn(self.reported)
        if self.source is not None:
            out[kw("check/source")] = self.source
        if self.reason is not None:
            out[kw("check/reason")] = self.reason
        return out


@attrs.frozen
class PlanCheck:
    """One endpoint against the plan's command for it."""

    endpoint: str
    node: str | None
    role: str | None
    properties: tuple[PropertyCheck, ...]
    note: str | None = None

    @property
    def verdict(self) -> str:
        kinds = {p.verdict for p in self.properties}
        return DIFFERS if DIFFERS in kinds else UNVERIFIABLE if UNVERIFIABLE in kinds or not kinds else MATCHES

    def differs(self) -> list[PropertyCheck]:
        return [p for p in self.properties if p.verdict == DIFFERS]

    def to_edn(self) -> dict[Keyword, Edn]:
        counts = {v: sum(p.verdict == v for p in self.properties) for v in (MATCHES, DIFFERS, UNVERIFIABLE)}
        out: dict[Keyword, Edn] = {kw("check/endpoint"): self.endpoint, kw("check/verdict"): kw(self.verdict),
                                   kw("check/counts"): {kw("check/" + k): v for k, v in counts.items()},
                                   kw("check/properties"): [p.to_edn() for p in self.properties]}
        if self.node is not None:
            out[kw("check/node")] = self.node
        if self.role is not None:
            out[kw("check/role")] = kw(self.role)
        if self.note is not None:
            out[kw("check/note")] = self.note
        return out


def _edn(v: Edn) -> Edn:
    if isinstance(v, tuple):
        return list(v)
    return v


# ---------------------------------------------------------------- which command a server is


def _listen(c: Command) -> tuple[str, int] | None:
    argv = list(c.argv)
    try:
        host = argv[argv.index("--host") + 1]
        port = int(argv[argv.index("--port") + 1])
    except (ValueError, IndexError):
        return None
    return host, port


def command_for(url: str, cmds: Sequence[Command]) -> tuple[Command | None, str | None]:
    """The serving command listening where `url` points; else the only serving command, said so."""
    serving = [c for c in cmds if c.role in SERVING_ROLES and _listen(c) is not None]
    parts = urlsplit(url)
    want = (parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
    for c in serving:
        if _listen(c) == want:
            return c, None
    heads = [c for c in serving if c.role != "sglang-node" or "--node-rank" not in c.argv
             or c.argv[list(c.argv).index("--node-rank") + 1] == "0"]
    if len(heads) == 1:
        host, port = _listen(heads[0]) or ("", 0)
        return heads[0], f"no planned server listens at {want[0]}:{want[1]}; held against the plan's only server " \
                         f"({host}:{port})"
    return None, f"no planned server listens at {want[0]}:{want[1]}"


def _argv_int(c: Command, *flags: str) -> int | None:
    argv = list(c.argv)
    for f in flags:
        if f in argv:
            try:
                return int(argv[argv.index(f) + 1])
            except (ValueError, IndexError):
                return None
    return None


# ---------------------------------------------------------------- what the plan fixes


def _norm_spec(v: Edn) -> Edn:
    """Speculative settings as a comparable set: llama.cpp's "ngram-cache,ngram-simple" in any order
    and spelling of `_`/`-`; "none" and nil both mean none."""
    if v is None:
        return None
    if isinstance(v, str):
        parts = frozenset(p.strip().lower().replace("_", "-") for p in v.split(",") if p.strip()) - {"none"}
        return parts or None
    return v


def _planned_speculative(plan: Plan) -> Edn:
    sp = plan.speculative
    if plan.engine == "sglang":
        return None if sp is None else SGLANG_SPEC_ALGORITHMS[sp.method]
    if plan.engine == "llamacpp":  # its slots say whether they speculate, not how
        return sp is not None
    return None if sp is None else sp.method


# property -> (the field each engine reports it in, or None where it does not)
FIELD_OF: dict[str, dict[str, str | None]] = {
    "served-name": {"llamacpp": "served-name", "sglang": "served-name", "vllm": "served-name"},
    "model-path": {"llamacpp": "model-path", "sglang": "model-path", "vllm": "model-path"},
    "context-length": {"llamacpp": "context-per-slot", "sglang": "context-length", "vllm": "context-length"},
    "context-total": {"llamacpp": "context-total"},
    "slots": {"llamacpp": "slots", "sglang": "max-running", "vllm": None},
    "tensor-parallel": {"sglang": "tensor-parallel"},
    "pipeline-parallel": {"sglang": "pipeline-parallel"},
    "data-parallel": {"sglang": "data-parallel"},
    "expert-parallel": {"sglang": "expert-parallel"},
    "nodes": {"sglang": "nodes"},
    "speculative": {"llamacpp": "speculative?", "sglang": "speculative-algorithm"},
    "disaggregation-mode": {"sglang": "disaggregation-mode"},
    "rpc-workers": {},
}


def planned_properties(plan: Plan, c: Command) -> dict[str, Edn]:
    """Each property the plan fixes for the server `c` starts, with its planned value."""
    out: dict[str, Edn] = {"served-name": plan.model_id, "model-path": plan.model_ref}
    if plan.context_length is not None:
        out["context-length"] = plan.context_length
        if plan.engine == "llamacpp":
            out["context-total"] = plan.context_length * (plan.slots or 1)
    if plan.slots is not None:
        out["slots"] = plan.slots
    if plan.engine != "llamacpp":
        out["tensor-parallel"] = plan.tensor_parallel_size
        out["pipeline-parallel"] = plan.pipeline_parallel_size
        out["data-parallel"] = _argv_int(c, "--dp-size", "--data-parallel-size") or 1
        out["expert-parallel"] = plan.expert_parallel_size
        out["nodes"] = _argv_int(c, "--nnodes") or 1
    out["speculative"] = _planned_speculative(plan)
    if plan.engine != "llamacpp":
        role = next((n.role for n in plan.nodes if n.name == c.node), None)
        out["disaggregation-mode"] = role or ("null" if plan.engine == "sglang" else None)
    if plan.engine == "llamacpp" and len(plan.nodes) > 1:
        out["rpc-workers"] = len(plan.nodes)
    return out


def _compare(prop: str, planned: Edn, cfg: ServerConfig) -> PropertyCheck:
    field = FIELD_OF.get(prop, {}).get(cfg.engine or "")
    if field is None:
        return PropertyCheck(prop, UNVERIFIABLE, planned, reason=f"{cfg.engine} does not report {prop}")
    f = cfg.get(field)
    if not f.reported:
        why = f.reason if f.status == "unmeasured" else f"{cfg.engine} does not report {prop} ({field})"
        return PropertyCheck(prop, UNVERIFIABLE, planned, reason=why)
    src = f.source or (f.derived_from[0] if f.derived_from else None)
    where = None if src is None else "GET " + src.text() + (f" ({f.how})" if f.how else "")
    reported = f.value
    return PropertyCheck(prop, MATCHES if _same(prop, planned, reported, cfg.engine) else DIFFERS, planned, reported,
                         where)


def _same(prop: str, planned: Edn, reported: Edn, engine: str | None) -> bool:
    if prop != "speculative":
        return bool(planned == reported)
    return bool(_norm_spec(planned) == _norm_spec(reported))


def check_config(plan: Plan, cmds: Sequence[Command], cfg: ServerConfig) -> PlanCheck:
    """One server's reported configuration against the plan's command for it."""
    c, note = command_for(cfg.endpoint, cmds)
    if c is None:
        return PlanCheck(cfg.endpoint, None, None, (), note)
    planned = planned_properties(plan, c)
    if not cfg.measured:
        why = f"configuration unmeasured: {cfg.reason}"
        props = [PropertyCheck("engine", UNVERIFIABLE, plan.engine, reason=why)]
        props += [PropertyCheck(p, UNVERIFIABLE, v, reason=why) for p, v in planned.items()]
        return PlanCheck(cfg.endpoint, c.node, c.role, tuple(props), note)
    props = [PropertyCheck("engine", MATCHES if cfg.engine == plan.engine else DIFFERS, plan.engine, cfg.engine,
                           "backend detection (the server's own endpoints)")]
    if cfg.engine == plan.engine:
        props += [_compare(p, v, cfg) for p, v in planned.items()]
    return PlanCheck(cfg.endpoint, c.node, c.role, tuple(props), note)


def check_plan(plan: Plan, cmds: Sequence[Command], configs: Sequence[ServerConfig]) -> list[PlanCheck]:
    return [check_config(plan, cmds, cfg) for cfg in configs]


def check_exit(checks: Sequence[PlanCheck], strict: bool = False) -> int:
    """0 when nothing differs; 1 when something differs, or (strict) when something is unverifiable
    or a server matches no planned command."""
    if any(ch.verdict == DIFFERS for ch in checks):
        return 1
    if strict and any(ch.verdict == UNVERIFIABLE for ch in checks):
        return 1
    return 0
