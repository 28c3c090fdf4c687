"""Shapes observed from what a hand-written `to_edn` emits for sample values.

Some shapes (the plan, cassettes, batch and bench summaries) have no key table: their
converter writes the keys inline. The schema is then what that converter emits for a few
samples: a key is required when every sample has it, and its types are those seen.
"""

from __future__ import annotations

import datetime as _dt
from decimal import Decimal
from typing import Iterable, Mapping

from .._edn import Edn, Keyword, kw


def kind(v: object) -> str:
    if v is None:
        return "nil"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, (float, Decimal)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, Keyword):
        return "keyword"
    if isinstance(v, _dt.datetime):
        return "inst"
    if isinstance(v, dict):
        return "map"
    if isinstance(v, (list, tuple)):
        return "vector"
    return type(v).__name__


def _namespaced(m: object) -> bool:
    return isinstance(m, dict) and bool(m) and all(isinstance(k, Keyword) and "/" in k.name for k in m)


def observe(samples: Iterable[object], refs: Mapping[str, str] | None = None) -> dict[Keyword, Edn]:
    """Describe the maps in `samples` (all one shape). `refs`: keys described elsewhere ({key: where})."""
    refs = refs or {}
    maps = [s for s in samples if isinstance(s, dict)]
    keys: dict[object, Edn] = {}
    for k in sorted({k for m in maps for k in m}, key=str):
        values = [m[k] for m in maps if k in m]
        entry: dict[Keyword, Edn] = {kw("schema/types"): sorted({kind(v) for v in values}),
                                 kw("schema/required?"): len(values) == len(maps)}
        name = k.name if isinstance(k, Keyword) else str(k)
        if name in refs:
            entry[kw("schema/see")] = refs[name]
        else:
            nested = [v for v in values if _namespaced(v)]
            items = [x for v in values if isinstance(v, (list, tuple)) for x in v]
            if nested:
                entry[kw("schema/keys")] = observe(nested, refs)[kw("schema/keys")]
            elif items and all(_namespaced(x) for x in items):
                entry[kw("schema/items")] = observe(items, refs)
            elif items:
                entry[kw("schema/item-types")] = sorted({kind(x) for x in items})
        keys[k] = entry
    return {kw("schema/keys"): keys}
