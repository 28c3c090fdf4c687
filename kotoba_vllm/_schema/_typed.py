"""Shapes read from key tables the code already holds: attrs field metadata.

Two tables exist: `_codec` classes (`{"edn": key, "codec": Codec}`, used by `_model`,
`capacity`, `pool`) and the distributed spec (`{"edn": key, "kind": ..., "required": ...}`).
"""

from __future__ import annotations

from typing import Iterable, Mapping

import attrs

from .._codec import class_spec
from .._edn import Edn, Keyword, kw
from ..distributed._spec import SpecKey


def codec_shapes(classes: Iterable[type]) -> dict[Keyword, Edn]:
    """`:shape/<Class>` -> its keys, each with the codec's type text and whether it is required."""
    out: dict[Keyword, Edn] = {}
    for cls in classes:
        spec = class_spec(cls)
        fields: dict[Keyword, Edn] = {}
        for name, key, codec in spec.fields:
            a = attrs.fields_dict(cls)[name]
            fields[key] = {kw("schema/type"): codec.name, kw("schema/required?"): a.default is attrs.NOTHING}
        entry: dict[Keyword, Edn] = {kw("schema/keys"): fields}
        if spec.extras_attr:
            entry[kw("schema/extra-namespaces")] = [kw(ns) for ns in spec.extras_ns]
        endpoint = getattr(cls, "endpoint", None)
        if isinstance(endpoint, str):
            entry[kw("schema/endpoint")] = kw(endpoint)
        out[kw("shape/" + cls.__name__)] = entry
    return out


def kind_shapes(tables: Mapping[type, Mapping[str, SpecKey]], kind_text: Mapping[str, str]) -> dict[Keyword, Edn]:
    """The distributed spec's tables: {class: {"ns/key": SpecKey(attr, kind, required)}}."""
    return {kw("shape/" + cls.__name__): {kw("schema/keys"): {
        kw(key): {kw("schema/type"): kind_text[k.kind], kw("schema/required?"): k.required}
        for key, k in table.items()}} for cls, table in tables.items()}
