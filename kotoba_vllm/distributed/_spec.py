"""The distributed deployment spec: typed model, key table, validation, EDN <-> typed.

Pure: no I/O. Validation walks the raw EDN with the key tables below and returns
`Problem`s located at `file:line:column` when a `Form` is given; only a spec
without errors is structured (by one cattrs converter) into `DistSpec`.

    {:dist/model {:model/id "m" :model/path "/m.gguf" :model/layers 32
                  :model/weight-bytes 4000000000 :model/kv-heads 8}
     :dist/nodes [{:node/name "a" :node/address "10.0.0.1" :node/memory-bytes 8000000000}
                  {:node/name "b" :node/address "10.0.0.2" :node/memory-bytes 8000000000}]
     :dist/engine :llamacpp
     :dist/links [{:link/from "a" :link/to "b" :link/method :receiver-verified
                   :link/mbps 933.0 :link/bytes 67108864 :link/ms 575.0}]}
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Callable, Mapping, NamedTuple, NewType, Optional, Sequence, TypeGuard, cast

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from .._edn import Edn, Form, Keyword, dumps, kw, plain_edn
from .._problems import Problem

Kw = NewType("Kw", str)  # a keyword in EDN, its name in Python ("vllm" for :vllm)

ENGINES = ("vllm", "sglang", "llamacpp")
STRATEGIES = ("auto", "tensor", "pipeline", "expert")
ROLES = ("prefill", "decode")  # a node's part in a prefill/decode-disaggregated layout
# Speculative decoding: n-gram lookup (no second model), a draft model, or a trained head.
SPEC_METHODS = ("ngram", "draft", "eagle", "eagle3", "mtp")
NEEDS_DRAFT = ("draft", "eagle", "eagle3")  # mtp uses the model's own prediction heads
# How a link number was obtained; only the first is evidence (seed: a claim is not a measurement).
LINK_METHODS = ("receiver-verified", "unverified-transfer", "instrument-limited", "nominal")

Path = tuple[str | int, ...]  # ("dist/nodes", 1, "node/memory-bytes"): where in the spec a problem is


def _f(key: str, kind: str, required: bool = False, default: object = None) -> Any:
    """An attrs field carrying its EDN key and value kind (the key table is the class). Any: like
    `attrs.field`, it stands in for the attribute's own type at the class body."""
    meta = {"edn": key, "kind": kind, "required": required}
    if required:
        return attrs.field(metadata=meta)
    return attrs.field(default=default, metadata=meta)


@attrs.frozen
class ModelSpec:
    id: str = _f("model/id", "str", True)
    layers: int = _f("model/layers", "pos-int", True)
    weight_bytes: int = _f("model/weight-bytes", "pos-int", True)
    path: Optional[str] = _f("model/path", "str")
    repo: Optional[str] = _f("model/repo", "str")
    kv_heads: Optional[int] = _f("model/kv-heads", "pos-int")
    experts: Optional[int] = _f("model/experts", "nat-int")


@attrs.frozen
class NodeSpec:
    name: str = _f("node/name", "str", True)
    address: str = _f("node/address", "str", True)
    memory_bytes: int = _f("node/memory-bytes", "pos-int", True)
    os_reserve_bytes: Optional[int] = _f("node/os-reserve-bytes", "nat-int")
    port: Optional[int] = _f("node/port", "port")  # the node's worker port (rpc-server, Ray)
    accelerators: Optional[int] = _f("node/accelerators", "pos-int")  # GPUs (or other accelerators) in the node
    accelerator_memory_bytes: Optional[int] = _f("node/accelerator-memory-bytes", "pos-int")  # each one's memory
    role: Optional[Kw] = _f("node/role", "role")  # :prefill | :decode (PD disaggregation)
    serve_port: Optional[int] = _f("node/serve-port", "port")  # this node's own HTTP port (DP / PD servers)


@attrs.frozen
class SpeculativeSpec:
    """Speculative decoding, as data: each engine's emitter spells it its own way."""

    method: Kw = _f("speculative/method", "spec-method", True)
    draft_model: Optional[str] = _f("speculative/draft-model", "str")  # :draft / :eagle*: the draft or head
    tokens: Optional[int] = _f("speculative/tokens", "pos-int")  # tokens proposed per step


@attrs.frozen
class LinkObservation:
    """One transfer across a boundary. A failed transfer keeps its failure and has no speed."""

    from_: str = _f("link/from", "str", True)
    to: str = _f("link/to", "str", True)
    method: Kw = _f("link/method", "link-method", True)
    mbps: Optional[float] = _f("link/mbps", "pos-num")
    bytes: Optional[int] = _f("link/bytes", "nat-int")
    expected_bytes: Optional[int] = _f("link/expected-bytes", "nat-int")
    ms: Optional[float] = _f("link/ms", "nat-num")
    failure: Optional[str] = _f("link/failure", "str")
    at: Optional[_dt.datetime] = _f("link/at", "inst")


@attrs.frozen
class DistSpec:
    model: ModelSpec = _f("dist/model", "model", True)
    nodes: tuple[NodeSpec, ...] = _f("dist/nodes", "nodes", True)
    engine: Optional[Kw] = _f("dist/engine", "engine")
    tensor_parallel_size: Optional[int] = _f("dist/tensor-parallel-size", "pos-int")
    pipeline_parallel_size: Optional[int] = _f("dist/pipeline-parallel-size", "pos-int")
    shard_strategy: Optional[Kw] = _f("dist/shard-strategy", "strategy")
    paged_kv_cache: Optional[bool] = _f("dist/paged-kv-cache?", "bool")
    kv_cache_bytes: Optional[int] = _f("dist/kv-cache-bytes", "nat-int")
    port: Optional[int] = _f("dist/port", "port")  # the head's HTTP port
    links: Optional[tuple[LinkObservation, ...]] = _f("dist/links", "links")
    data_parallel_size: Optional[int] = _f("dist/data-parallel-size", "pos-int")
    context_length: Optional[int] = _f("dist/context-length", "pos-int")  # tokens one request may hold
    slots: Optional[int] = _f("dist/slots", "pos-int")  # sequences at once (llama.cpp --parallel)
    memory_fraction: Optional[float] = _f("dist/memory-fraction", "fraction")  # of each accelerator's memory
    speculative: Optional[SpeculativeSpec] = _f("dist/speculative", "speculative")


# kotoba-lang/inference spells four keys in its own namespace; they mean the same.
KOTODAMA_ALIASES: dict[str, str] = {
    "kotodama/tensor-parallel-size": "dist/tensor-parallel-size",
    "kotodama/pipeline-parallel-size": "dist/pipeline-parallel-size",
    "kotodama/shard-strategy": "dist/shard-strategy",
    "kotodama/paged-kv-cache?": "dist/paged-kv-cache?",
}


class SpecKey(NamedTuple):
    """One row of a key table: the attribute, its value kind (a KIND_TEXT key), whether required."""

    attr: str
    kind: str
    required: bool


def _table(cls: type) -> dict[str, SpecKey]:
    return {a.metadata["edn"]: SpecKey(a.name, a.metadata["kind"], a.metadata["required"])
            for a in attrs.fields(cls)}


TABLES: dict[type, dict[str, SpecKey]] = {c: _table(c) for c in (ModelSpec, NodeSpec, LinkObservation, SpeculativeSpec,
                                                               DistSpec)}


# ---------------------------------------------------------------- locating


class Locator:
    """`file:line:column` of a key path inside a located form (None when unknown)."""

    def __init__(self, root: Edn, form: Form | None = None) -> None:
        self.root, self.form = root, form

    def __call__(self, path: Sequence[str | int]) -> str | None:
        if self.form is None:
            return None
        best = self.form.where
        node: Edn = self.root
        for step in path:
            if isinstance(node, dict) and isinstance(step, str):
                key = self._key(node, step)
                pos = self.form.locate(node, key) if key is not None else None
                if pos is not None:
                    best = f"{self.form.source}:{pos[0]}:{pos[1]}"
                node = node.get(key) if key is not None else None
            elif isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node):
                node = node[step]
            else:
                break
        return best

    @staticmethod
    def _key(m: Mapping[object, Edn], name: str) -> Keyword | None:
        k = kw(name)
        if k in m:
            return k
        for alias, canon in KOTODAMA_ALIASES.items():
            if canon == name and kw(alias) in m:
                return kw(alias)
        return None


def _no_where(path: Sequence[str | int]) -> str | None:
    return None


# ---------------------------------------------------------------- validation

KIND_TEXT = {
    "str": "a string", "pos-int": "a positive integer", "nat-int": "a non-negative integer",
    "port": "a port number 1-65535", "pos-num": "a positive number", "nat-num": "a non-negative number",
    "bool": "true or false", "inst": "an #inst", "engine": "one of " + ", ".join(":" + e for e in ENGINES),
    "strategy": "one of " + ", ".join(":" + s for s in STRATEGIES),
    "link-method": "one of " + ", ".join(":" + m for m in LINK_METHODS),
    "model": "a map of :model/* keys", "nodes": "a non-empty vector of :node/* maps",
    "links": "a vector of :link/* maps",
    "fraction": "a number above 0 and at most 1", "role": "one of " + ", ".join(":" + r for r in ROLES),
    "spec-method": "one of " + ", ".join(":" + m for m in SPEC_METHODS),
    "speculative": "a map of :speculative/* keys",
}


def _is_int(v: Edn) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Edn) -> TypeGuard[int | float]:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and v == v


_SCALAR_OK: dict[str, Callable[[Edn], bool]] = {
    "str": lambda v: isinstance(v, str) and v != "",
    "pos-int": lambda v: _is_int(v) and v > 0,
    "nat-int": lambda v: _is_int(v) and v >= 0,
    "port": lambda v: _is_int(v) and 0 < v < 65536,
    "pos-num": lambda v: _is_num(v) and v > 0,
    "nat-num": lambda v: _is_num(v) and v >= 0,
    "bool": lambda v: isinstance(v, bool),
    "inst": lambda v: isinstance(v, _dt.datetime),
    "engine": lambda v: isinstance(v, Keyword) and v.name in ENGINES,
    "strategy": lambda v: isinstance(v, Keyword) and v.name in STRATEGIES,
    "link-method": lambda v: isinstance(v, Keyword) and v.name in LINK_METHODS,
    "fraction": lambda v: _is_num(v) and 0 < v <= 1,
    "role": lambda v: isinstance(v, Keyword) and v.name in ROLES,
    "spec-method": lambda v: isinstance(v, Keyword) and v.name in SPEC_METHODS,
}


class _V:
    def __init__(self, where: Callable[[Sequence[str | int]], str | None]) -> None:
        self.where = where
        self.problems: list[Problem] = []

    def err(self, code: str, msg: str, field: str | None, path: Sequence[str | int], severity: str = "error") -> None:
        self.problems.append(Problem(severity, code, msg, field=field, where=self.where(path)))

    def map(self, m: Edn, cls: type, path: Path, label: str) -> None:
        if not isinstance(m, dict):
            self.err("dist/shape", f"{label} must be a map", None, path)
            return
        table = TABLES[cls]
        seen: dict[str, str] = {}
        for k, v in m.items():
            if not isinstance(k, Keyword):
                self.err("dist/key-type", f"{label}: key {dumps(k)} must be a keyword", None, path)
                continue
            name = KOTODAMA_ALIASES.get(k.name, k.name) if cls is DistSpec else k.name
            if name not in table:
                self.err("dist/unknown-key", f"{label}: unknown key :{k.name}", k.name, path + (k.name,))
                continue
            if name in seen:
                self.err("dist/duplicate-key", f":{k.name} and :{seen[name]} say the same thing; keep one",
                         k.name, path + (k.name,))
                continue
            seen[name] = k.name
            self.value(v, table[name].kind, path + (name,), name)
        for name, key in table.items():
            if key.required and name not in seen:
                self.err("dist/missing-key", f"{label}: :{name} is required ({KIND_TEXT[key.kind]})", name, path)

    def value(self, v: Edn, kind: str, path: Path, field: str) -> None:
        ok = _SCALAR_OK.get(kind)
        if ok is not None:
            if not ok(v):
                self.err("dist/type", f":{field} must be {KIND_TEXT[kind]}, got {dumps(v)}", field, path)
            return
        if kind == "model":
            self.map(v, ModelSpec, path, ":dist/model")
        elif kind == "speculative":
            self.map(v, SpeculativeSpec, path, ":dist/speculative")
        elif kind in ("nodes", "links"):
            cls = NodeSpec if kind == "nodes" else LinkObservation
            if not isinstance(v, list) or (kind == "nodes" and not v):
                self.err("dist/type", f":{field} must be {KIND_TEXT[kind]}", field, path)
                return
            for i, item in enumerate(v):
                self.map(item, cls, path + (i,), f":{field} item {i}")


def _cross_checks(raw: Mapping[object, Edn], v: _V) -> None:
    """Checks that need more than one key: unique names, links naming real nodes, speed xor failure."""
    nodes = raw.get(kw("dist/nodes"))
    names: list[str] = []
    if isinstance(nodes, list):
        for i, n in enumerate(nodes):
            if not isinstance(n, dict):
                continue
            name = n.get(kw("node/name"))
            if isinstance(name, str):
                if name in names:
                    v.err("dist/duplicate-node", f"node name {name!r} is used twice",
                          "node/name", ("dist/nodes", i, "node/name"))
                names.append(name)
            mem, res = n.get(kw("node/memory-bytes")), n.get(kw("node/os-reserve-bytes"))
            if _is_int(mem) and _is_int(res) and res >= mem:
                v.err("dist/node-too-small", f"node {name!r}: OS reserve {res} leaves nothing of {mem} bytes",
                      "node/os-reserve-bytes", ("dist/nodes", i, "node/os-reserve-bytes"))
    links = raw.get(kw("dist/links"))
    if isinstance(links, list):
        for i, ln in enumerate(links):
            if not isinstance(ln, dict):
                continue
            for end in ("link/from", "link/to"):
                nm = ln.get(kw(end))
                if isinstance(nm, str) and names and nm not in names:
                    v.err("dist/unknown-node", f"link {i}: {nm!r} is not a node of this spec", end,
                          ("dist/links", i, end))
            if ln.get(kw("link/from")) == ln.get(kw("link/to")) and ln.get(kw("link/from")) is not None:
                v.err("dist/self-link", f"link {i} joins a node to itself", "link/to", ("dist/links", i, "link/to"))
            has_speed, has_fail = kw("link/mbps") in ln, kw("link/failure") in ln
            if has_speed == has_fail:
                v.err("dist/link-result", f"link {i}: give exactly one of :link/mbps (a speed) or "
                      ":link/failure (why there is none)", "link/mbps", ("dist/links", i))
    if isinstance(nodes, list):
        maps = [n for n in nodes if isinstance(n, dict)]
        with_acc = [kw("node/accelerators") in n for n in maps]
        for i, n in enumerate(nodes):
            if isinstance(n, dict) and (kw("node/accelerators") in n) != (kw("node/accelerator-memory-bytes") in n):
                v.err("dist/accelerators", f"node {i}: give :node/accelerators and :node/accelerator-memory-bytes "
                      "together", "node/accelerators", ("dist/nodes", i))
        if any(with_acc) and not all(with_acc):
            v.err("dist/accelerators", "either every node names its accelerators or none does",
                  "node/accelerators", ("dist/nodes",))
        roles = {n.get(kw("node/role")) for n in maps}
        if roles - {None} and (None in roles or len(roles) != 2):
            v.err("dist/roles", "a disaggregated layout gives every node a :node/role, some :prefill and some "
                  ":decode", "node/role", ("dist/nodes",))
    spec = raw.get(kw("dist/speculative"))
    if isinstance(spec, dict):
        method = spec.get(kw("speculative/method"))
        if isinstance(method, Keyword) and method.name in NEEDS_DRAFT and kw("speculative/draft-model") not in spec:
            v.err("dist/missing-key", f":speculative/method :{method.name} needs :speculative/draft-model",
                  "speculative/draft-model", ("dist/speculative",))
    model = raw.get(kw("dist/model"))
    if isinstance(model, dict) and kw("model/path") not in model and kw("model/repo") not in model:
        v.err("dist/missing-key", ":dist/model needs :model/path or :model/repo", "model/path", ("dist/model",))


def validate(raw: Edn, where: Callable[[Sequence[str | int]], str | None] = _no_where) -> list[Problem]:
    """Every problem of a raw EDN spec (empty when it is well formed)."""
    v = _V(where)
    v.map(raw, DistSpec, (), "spec")
    if isinstance(raw, dict):
        _cross_checks(raw, v)
    return v.problems


# ---------------------------------------------------------------- EDN <-> typed


def _make_converter() -> cattrs.Converter:
    c = cattrs.Converter()
    c.register_structure_hook(Kw, lambda v, _: Kw(v.name if isinstance(v, Keyword) else v))
    c.register_unstructure_hook(Kw, lambda v: kw(v))
    c.register_structure_hook(_dt.datetime, lambda v, _: v)
    c.register_unstructure_hook(_dt.datetime, lambda v: v)
    for cls in TABLES:
        renames = {a.name: override(rename=a.metadata["edn"], omit_if_default=not a.metadata["required"])
                   for a in attrs.fields(cls)}
        # cattrs types **renames against its own flag arguments too; every key here is an attribute name.
        c.register_structure_hook(cls, make_dict_structure_fn(cls, c, **renames))  # type: ignore[arg-type]
        c.register_unstructure_hook(cls, make_dict_unstructure_fn(cls, c, **renames))  # type: ignore[arg-type]
    return c


CONVERTER = _make_converter()


def _keys_to_names(v: Edn) -> Edn:
    """EDN keys -> "ns/name" strings (kotodama aliases folded in), values untouched."""
    if isinstance(v, dict):
        return {KOTODAMA_ALIASES.get(k.name, k.name) if isinstance(k, Keyword) else k: _keys_to_names(x)
                for k, x in v.items()}
    if isinstance(v, list):
        return [_keys_to_names(x) for x in v]
    return v


def _names_to_keys(v: Edn) -> Edn:
    if isinstance(v, dict):
        return {kw(k): _names_to_keys(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_names_to_keys(x) for x in v]
    return v


def spec_from_edn(raw: Edn, form: Form | None = None) -> tuple[DistSpec | None, list[Problem]]:
    """Validate then structure. A spec with any `:error` problem gives no `DistSpec`."""
    raw = plain_edn(raw)
    problems = validate(raw, Locator(raw, form))
    if any(p.is_error for p in problems):
        return None, problems
    return CONVERTER.structure(_keys_to_names(raw), DistSpec), problems


def spec_to_edn(spec: DistSpec) -> dict[Keyword, Edn]:
    return cast("dict[Keyword, Edn]", _names_to_keys(CONVERTER.unstructure(spec)))  # a map unstructures to a map


def link_to_edn(obs: LinkObservation) -> dict[Keyword, Edn]:
    return cast("dict[Keyword, Edn]", _names_to_keys(CONVERTER.unstructure(obs)))  # a map unstructures to a map
