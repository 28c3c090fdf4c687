"""The EDN descriptions in `schemas/`, generated from the code so the two cannot drift.

`python -m kotoba_vllm._schema --write` rewrites them; `tests/test_schemas.py` fails when
a file differs from what the code says.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import attrs

from ._codec import _spec
from ._edn import kw, pretty
from ._model import (ChatRequest, Choice, CompletionRequest, ContentPart, DetokenizeRequest, EmbeddingRequest,
                     Figure, GenerateRequest, Message, Response, Sampling, StreamDelta, Timings, TokenizeRequest,
                     ToolCall, Usage)
from ._sampling import SAMPLING_TABLE
from .dialects import DIALECTS, Dialect

SHAPES = (ChatRequest, CompletionRequest, GenerateRequest, EmbeddingRequest, TokenizeRequest, DetokenizeRequest,
          Message, ContentPart, ToolCall, Sampling, Response, Choice, Usage, Timings, Figure, StreamDelta)
SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"


def shapes() -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for cls in SHAPES:
        spec = _spec(cls)
        fields: dict[Any, Any] = {}
        for name, key, codec in spec.fields:
            a = attrs.fields_dict(cls)[name]
            fields[key] = {kw("schema/type"): codec.name, kw("schema/required?"): a.default is attrs.NOTHING}
        entry: dict[Any, Any] = {kw("schema/keys"): fields}
        if spec.extras_attr:
            entry[kw("schema/extra-namespaces")] = [kw(ns) for ns in spec.extras_ns]
        endpoint = getattr(cls, "endpoint", None)
        if isinstance(endpoint, str):
            entry[kw("schema/endpoint")] = kw(endpoint)
        out[kw("shape/" + cls.__name__)] = entry
    out[kw("shape/sampling-table")] = [
        {kw("schema/key"): kw(k.key), kw("schema/wire"): k.wire, kw("schema/min"): k.lo, kw("schema/max"): k.hi}
        for k in SAMPLING_TABLE]
    return out


def engine(d: Dialect) -> dict[Any, Any]:
    from ._sampling import KNOBS_BY_ATTR

    return {
        kw("engine/name"): kw(d.name),
        kw("engine/routes"): {kw(ep): path for ep, path in d.routes.items()},
        kw("engine/models-path"): d.models_path,
        kw("engine/health-path"): d.health_path,
        kw("engine/sampling"): {kw(ep): sorted((kw(KNOBS_BY_ATTR[a].key) for a in attrs_),
                                               key=lambda k: k.name)
                                for ep, attrs_ in d.sampling_support.items()},
        kw("engine/wire-names"): {kw(ep): {kw(KNOBS_BY_ATTR[a].key): w for a, w in names.items()}
                                  for ep, names in d.wire_names.items()},
        kw("engine/extras"): {kw(k): {kw("engine/wire"): wire, kw("engine/routes"): [kw(r) for r in sorted(routes)]}
                              for k, (wire, routes) in d.extras.items()} if d.extras else {},
    }


def rendered() -> dict[str, str]:
    files = {"shapes.edn": ";; Generated from kotoba_vllm/_model.py by `python -m kotoba_vllm._schema --write`.\n"
                           + pretty(shapes()) + "\n"}
    for name, d in DIALECTS.items():
        files[f"engines/{name}.edn"] = (f";; What kotoba-vllm sends to {name}: routes, honoured sampling keys, wire "
                                        f"renames, engine extras.\n;; Generated from kotoba_vllm/dialects/"
                                        f"{name}.py by `python -m kotoba_vllm._schema --write`.\n"
                                        + pretty(engine(d)) + "\n")
    return files


def write(root: Path = SCHEMA_DIR) -> None:
    for rel, text in rendered().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    if "--write" in sys.argv:
        write()
    else:
        for rel, text in rendered().items():
            print(f";; ---- {rel}\n{text}")
