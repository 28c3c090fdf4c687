"""Drift: which JSON fields of a replayed answer the SDK reads, ignores, or needs.

`MODELED` lists, per answer shape, the field paths the dialects read (`a.b[].c`; a trailing
`.*` means the whole subtree is kept, e.g. llama.cpp `timings` goes into extras whole).
A field outside it is *unmodeled*: listed in the test output, not a failure. `REQUIRED`
lists the fields the SDK relies on: if a re-recorded answer lacks one, replay fails.
Tables as data: keep them in step with `dialects/` when a parser starts reading a field.
"""

from __future__ import annotations

import json
from typing import Iterator

import attrs

from .._edn import kw
from ._format import Cassette, sse_payloads

_K_REQUEST = kw("call/request")
_K_ENDPOINT = kw("vllm/endpoint")

_TOOL = ("tool_calls[].id", "tool_calls[].type", "tool_calls[].index", "tool_calls[].function.name",
         "tool_calls[].function.arguments")
_USAGE = ("usage.prompt_tokens", "usage.completion_tokens", "usage.total_tokens",
          "usage.prompt_tokens_details.cached_tokens", "usage.completion_tokens_details.reasoning_tokens",
          "usage.reasoning_tokens")
_TOP = ("id", "model", "created", "system_fingerprint")
_LLAMA = ("timings.*", "id_slot", "tokens_cached", "truncated", "stop_type")

MODELED: dict[str, frozenset[str]] = {
    "openai-body": frozenset(_TOP + _USAGE + (
        "choices[].index", "choices[].text", "choices[].finish_reason", "choices[].logprobs.*",
        "choices[].message.content", "choices[].message.reasoning_content", "choices[].message.reasoning")
        + tuple("choices[].message." + t for t in _TOOL)),
    "openai-chunk": frozenset(_TOP + _USAGE + (
        "choices[].index", "choices[].text", "choices[].finish_reason", "choices[].logprobs.*",
        "choices[].delta.content", "choices[].delta.reasoning_content", "choices[].delta.reasoning",
        "choices[].delta.tool_calls.*")),
    "llamacpp-native": frozenset(_LLAMA + ("content", "stop", "tokens_evaluated", "tokens_predicted", "model")),
    "sglang-generate": frozenset(("text", "output_ids", "meta_info.*")),
    # SGLang's scheduler ending a request (queue full among others): an error, read from its finish reason
    "sglang-abort": frozenset(("text", "output_ids", "meta_info.*")),
    "embedding": frozenset(("data[].embedding", "data[].index", "data[].encoding_format", "model") + _USAGE),
    "tokenize": frozenset(("tokens", "tokens[].id")),
    "detokenize": frozenset(("prompt", "content", "text")),
    "models": frozenset(("data[].id", "data[].owned_by", "data[].max_model_len")),
    # vLLM and llama.cpp answer an object with results, SGLang a bare list
    "rerank": frozenset(("id", "model", "results[].index", "results[].relevance_score", "results[].document.text",
                         "results[].document", "results[].text") + _USAGE),
    "rerank-list": frozenset(("[].index", "[].score", "[].document")),
    "score": frozenset(("id", "model", "data[].index", "data[].score") + _USAGE),
    "classify": frozenset(("id", "model", "data[].index", "data[].label", "data[].probs", "data[].probabilities",
                           "data[].num_classes") + _USAGE),
    "pooling": frozenset(("id", "model", "data[].index", "data[].data.*") + _USAGE),
    "lora-list": frozenset(("[].id", "[].path", "[].scale", "[].task_name", "data[].id", "data[].root",
                            "data[].parent")),
    "control": frozenset(("*",)),  # kept whole, as :vllm/detail
    # classify_error keeps message and type, and every scalar field of the error object as details
    "error": frozenset(("error.*", "object", "message", "type", "code", "param", "detail")),
}
# Known and deliberately not read: the answer's role, the object tag.
IGNORED = frozenset(("object", "choices[].message.role", "choices[].delta.role", "data[].object", "index"))
ENGINE_EXTRA: dict[str, frozenset[str]] = {"llamacpp": frozenset(_LLAMA), "sglang": frozenset(("meta_info.*",))}

# Fields the SDK relies on: absent from a re-recorded answer means the parser is now wrong.
REQUIRED: dict[tuple[str, str], tuple[str, ...]] = {
    ("openai-body", "chat"): ("choices[].finish_reason", "choices[].message.content", "usage.prompt_tokens",
                              "usage.completion_tokens"),
    ("openai-body", "completion"): ("choices[].finish_reason", "choices[].text", "usage.prompt_tokens",
                                    "usage.completion_tokens"),
    ("openai-chunk", "chat"): ("choices[].finish_reason", "usage.prompt_tokens", "usage.completion_tokens"),
    ("openai-chunk", "completion"): ("choices[].finish_reason", "choices[].text", "usage.prompt_tokens",
                                     "usage.completion_tokens"),
    ("llamacpp-native", "generate"): ("content", "stop_type", "tokens_evaluated", "tokens_predicted"),
    ("sglang-generate", "generate"): ("text", "meta_info.finish_reason", "meta_info.prompt_tokens",
                                      "meta_info.completion_tokens"),
    ("embedding", "embedding"): ("data[].embedding",),
    ("tokenize", "tokenize"): ("tokens",),
    ("models", "models"): ("data[].id",),
    ("rerank", "rerank"): ("results[].index", "results[].relevance_score"),
    ("rerank-list", "rerank"): ("[].index", "[].score"),
    ("score", "score"): ("data[].score",),
    ("classify", "classify"): ("data[].probs",),
    ("pooling", "pooling"): ("data[].data",),
}
_CONTROL = frozenset(("lora-load", "lora-unload", "lora-scale", "cache-reset", "slot"))
# llama.cpp's own prefill/decode split (DESIGN §5) is relied on wherever it answers.
LLAMACPP_TIMINGS = ("timings.prompt_n", "timings.prompt_ms", "timings.predicted_n", "timings.predicted_ms")


@attrs.frozen
class DriftReport:
    cassette: str
    shape: str
    unmodeled: tuple[str, ...]
    missing: tuple[str, ...]


def field_paths(v: object, prefix: str = "") -> Iterator[str]:
    """Every field path in a JSON value: objects add `.key`, arrays add `[]`."""
    if isinstance(v, dict):
        for k, x in v.items():
            p = f"{prefix}.{k}" if prefix else str(k)
            yield p
            yield from field_paths(x, p)
    elif isinstance(v, list):
        for x in v:
            if isinstance(x, (dict, list)):
                yield from field_paths(x, prefix + "[]")


def _covered(path: str, modeled: frozenset[str]) -> bool:
    if path in modeled or path in IGNORED or "*" in modeled:
        return True
    for m in modeled:
        if m.endswith(".*"):
            base = m[:-2]
            if path == base or path.startswith(base + ".") or path.startswith(base + "["):
                return True
        if m.startswith(path) and m[len(path):len(path) + 1] in (".", "["):
            return True  # a container on the way to a modeled field
    return False


def _shape(c: Cassette, endpoint: str | None, obj: object) -> str:
    if c.status >= 400 or (isinstance(obj, dict) and ("error" in obj or obj.get("object") == "error")
                           and "choices" not in obj):
        return "error"
    if c.op == "models":
        return "models"
    if endpoint == "generate" and c.backend == "sglang" and isinstance(obj, dict):
        fr = (obj.get("meta_info") or {}).get("finish_reason")
        if isinstance(fr, dict) and fr.get("type") == "abort":
            return "sglang-abort"
    if endpoint == "generate":
        return "sglang-generate" if c.backend == "sglang" else "llamacpp-native"
    if endpoint == "rerank" and isinstance(obj, list):
        return "rerank-list"
    if endpoint in ("embedding", "tokenize", "detokenize", "rerank", "score", "classify", "pooling", "lora-list"):
        return endpoint
    if endpoint in _CONTROL:
        return "control"
    return "openai-chunk" if c.streaming else "openai-body"


def _objects(c: Cassette) -> list[object]:
    if c.streaming:
        out: list[object] = []
        for p in sse_payloads(c.raw):
            if p.strip() != "[DONE]":
                try:
                    out.append(json.loads(p))
                except ValueError:
                    pass
        return out
    try:
        return [json.loads(c.raw)]
    except (ValueError, UnicodeDecodeError):
        return []


def endpoint_of(c: Cassette) -> str | None:
    req = c.call.get(_K_REQUEST)
    if isinstance(req, dict):
        ep = req.get(_K_ENDPOINT)
        return getattr(ep, "name", None)
    return None


def drift(c: Cassette) -> DriftReport | None:
    """None for answers that are not JSON the SDK parses (metrics text, /props, /slots, health)."""
    if c.op in ("probe", "health"):
        return None
    endpoint = endpoint_of(c)
    objs = _objects(c)
    if not objs:
        return None
    shapes = {_shape(c, endpoint, o) for o in objs}
    shape = next((s for s in ("error", "sglang-abort") if s in shapes), None) or shapes.pop()
    modeled = MODELED[shape]
    seen: set[str] = set()
    for o in objs:
        oshape = _shape(c, endpoint, o)
        seen.update(p for p in field_paths(o) if oshape == shape or oshape in ("error", "sglang-abort"))
    if c.backend in ENGINE_EXTRA and shape != "error":
        modeled = modeled | ENGINE_EXTRA[c.backend]
    unmodeled = sorted(p for p in seen if not _covered(p, modeled))
    # list only the topmost unmodeled path of each subtree
    top = tuple(p for p in unmodeled if not any(p != q and (p.startswith(q + ".") or p.startswith(q + "["))
                                                for q in unmodeled))
    required = REQUIRED.get((shape, endpoint or c.op), ())
    if c.backend == "llamacpp" and shape in ("openai-body", "openai-chunk", "llamacpp-native"):
        required = required + LLAMACPP_TIMINGS
    missing = tuple(p for p in required if p not in seen)
    return DriftReport(c.id, shape, top, missing)
