"""Distributed transformer specs as EDN, an evidence-gated planner, and the engines' own commands.

    spec, problems = load_spec("examples/distributed/two-node-llamacpp-rpc.edn")
    p, problems = plan(spec, where=...)          # pure
    cmds = emit(p)                               # argv per node, pure
    print(shell_lines(cmds))

`plan_file(path, engine)` does all three steps for one file and locates every problem.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import httpx

from .._edn import Edn, EdnError, read_file
from .._problems import Problem
from .._wire import SyncWire
from ..server_config import CONFIG_TIMEOUT, ServerConfig, server_configs
from ._check import (DIFFERS, MATCHES, UNVERIFIABLE, PlanCheck, PropertyCheck, check_config, check_exit, check_plan,
                     planned_properties)
from ._emit import Command, commands_to_edn, emit, flags_of, shell_lines, unknown_flags
from ._flags import CHECKED_ENGINES, EngineFlags, engine_flags
from ._planner import (FAST_LINK_MBPS, NodePlan, Plan, choose_strategy, link_evidence, partition_layers,
                       plan, spans, usable_bytes)
from ._spec import (DistSpec, LinkObservation, Locator, ModelSpec, NodeSpec, link_to_edn, spec_from_edn,
                    spec_to_edn, validate)

__all__ = [
    "CHECKED_ENGINES", "DIFFERS", "MATCHES", "PlanCheck", "PropertyCheck", "UNVERIFIABLE", "check_config", "check_exit",
    "check_plan", "check_servers", "planned_properties", "unknown_flags",
    "Command", "DistSpec", "EngineFlags", "FAST_LINK_MBPS", "LinkObservation", "Locator", "ModelSpec",
    "NodePlan", "NodeSpec", "Plan", "choose_strategy", "commands_to_edn", "emit", "engine_flags",
    "flags_of", "link_evidence", "link_to_edn", "load_spec", "partition_layers", "plan", "plan_file",
    "shell_lines", "spans", "spec_from_edn", "spec_to_edn", "usable_bytes", "validate",
]


def _read(path: str) -> tuple[Edn, Locator | None, list[Problem]]:
    try:
        forms = read_file(path)
    except (EdnError, OSError) as e:
        where = f"{e.source}:{e.line}:{e.column}" if isinstance(e, EdnError) else path
        return None, None, [Problem("error", "edn/syntax", getattr(e, "msg", str(e)), where=where)]
    if len(forms) != 1:
        return None, None, [Problem("error", "dist/shape", f"a spec file holds one map, found {len(forms)} forms",
                                    where=f"{path}:1:1")]
    return forms[0].value, Locator(forms[0].value, forms[0]), []


def load_spec(path: str) -> tuple[DistSpec | None, list[Problem]]:
    raw, loc, problems = _read(path)
    if loc is None:
        return None, problems
    return spec_from_edn(raw, loc.form)


def plan_file(path: str, engine: str | None = None) -> tuple[Plan | None, list[Problem]]:
    raw, loc, problems = _read(path)
    if loc is None:
        return None, problems
    spec, problems = spec_from_edn(raw, loc.form)
    if spec is None:
        return None, problems
    p, more = plan(spec, engine, where=loc)
    return p, problems + more


def check_servers(p: Plan, urls: Sequence[str], *, headers: Mapping[str, str] | None = None,
                  timeout: httpx.Timeout = CONFIG_TIMEOUT, http: httpx.Client | SyncWire | None = None,
                  configs: Sequence[ServerConfig] | None = None) -> list[PlanCheck]:
    """Ask each server what it runs and hold it against the plan's own commands (one check per URL)."""
    got = list(configs) if configs is not None else server_configs(urls, p.engine, headers=headers, timeout=timeout,
                                                                   http=http)
    return check_plan(p, emit(p), got)
