"""What a replay of a pooling-model or control exchange must find, read from the raw answer without the
SDK's parsers (the recorder and replay use it as `_expect` does for the text endpoints)."""

from __future__ import annotations

import base64
from typing import Sized, cast
from .._edn import Edn, Keyword, kw
from .._json import JsonObject

POOLING = ("rerank", "score", "classify", "pooling")
CONTROL = ("lora-list", "lora-load", "lora-unload", "lora-scale", "cache-reset", "slot")


def _rows(obj: object, key: str) -> list[JsonObject]:
    rows = obj if isinstance(obj, list) else obj.get(key) if isinstance(obj, dict) else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def endpoint_expect(endpoint: str, obj: object, raw: bytes) -> dict[Keyword, Edn]:
    if endpoint == "rerank":  # best first, as the server sent them
        rows = _rows(obj, "results")
        return {kw("expect/ranking"): [r.get("index") for r in rows],
                kw("expect/scores"): [r.get("relevance_score", r.get("score")) for r in rows]}
    if endpoint in ("score", "classify", "pooling"):
        rows = sorted(_rows(obj, "data"), key=lambda r: cast(int, r.get("index", 0)))  # a server's row index
        if endpoint == "score":
            return {kw("expect/scores"): [r.get("score") for r in rows]}
        if endpoint == "classify":
            return {kw("expect/probs"): [r.get("probs", r.get("probabilities")) for r in rows]}
        return {kw("expect/pooled"): len(rows)}
    if endpoint == "lora-list":
        if isinstance(obj, list):
            return {kw("expect/adapters"): [a.get("path") for a in obj if isinstance(a, dict)],
                    kw("expect/scales"): [a.get("scale") for a in obj if isinstance(a, dict)]}
        models = _rows(obj, "data")
        return {kw("expect/adapters"): [m.get("root") for m in models if m.get("parent")]}
    # a control call: text (or nothing) means done; JSON says so itself when it can fail (SGLang's success)
    ok = not (isinstance(obj, dict) and obj.get("success") is False)
    out: dict[Keyword, Edn] = {kw("expect/ok"): ok}
    if obj is None and raw.strip():
        out[kw("expect/message")] = raw.decode("utf-8", "replace").strip()
    return out


def embedding_dims(item: JsonObject) -> int:
    """An embedding's length: a JSON list, or base64 of float32s (4 bytes each)."""
    v = item.get("embedding")
    if isinstance(v, str):
        return len(base64.b64decode(v)) // 4
    return len(cast(Sized, v or []))  # a JSON list
