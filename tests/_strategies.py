"""Hypothesis strategies for EDN values, `:vllm/*` request maps and typed responses.

Reusable by any test: `from tests._strategies import edn_values, request_maps, responses`
(or `from _strategies import ...` inside tests/). Generated EDN is canonical — no nil values
(nil means absent, so it cannot survive a round trip), no Decimals, no NaN — so
EDN -> typed -> EDN can be checked as identity.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kotoba_vllm._edn import Keyword, kw
from kotoba_vllm._model import (BACKENDS, ENDPOINTS, PROVENANCES, ROLES, Choice, Figure, Response, StreamDelta,
                                Timings, ToolCall, Usage)

# ------------------------------------------------------------------ plain EDN

_NAME = st.from_regex(r"[a-z][a-z0-9\-]{0,8}", fullmatch=True)
keywords: st.SearchStrategy[Keyword] = st.builds(
    lambda ns, name: kw(f"{ns}/{name}" if ns else name), st.none() | _NAME, _NAME)
texts = st.text(max_size=24)
finite_floats = st.floats(allow_nan=False, allow_infinity=False)
ints = st.integers(min_value=-(2**63), max_value=2**63)

# Map keys and set elements avoid mixing bool/int/float: Python equates 1, 1.0 and True,
# so `#{1 true}` cannot be held in a frozenset (the reader reports it as a duplicate).
_hashable_scalars = st.one_of(keywords, texts, ints)
edn_scalars = st.one_of(st.none(), st.booleans(), ints, finite_floats, texts, keywords)


def _colls(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=5),
        st.lists(children, max_size=5).map(tuple),
        st.dictionaries(_hashable_scalars, children, max_size=5),
        st.frozensets(_hashable_scalars, max_size=5),
    )


edn_values: st.SearchStrategy[Any] = st.recursive(edn_scalars, _colls, max_leaves=25)

# JSON-like EDN (tool schemas, guided JSON, engine extras): keyword or string keys, vectors.
_json_scalars = st.one_of(st.booleans(), st.integers(-10**6, 10**6), st.floats(-1e6, 1e6), texts)
json_like: st.SearchStrategy[Any] = st.recursive(
    _json_scalars,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.one_of(_NAME.map(kw), _NAME), c, max_size=4),
    max_leaves=12)

# ------------------------------------------------------------------ request maps


def K(name: str) -> Keyword:
    return kw(name)


def _opt(d: dict[Keyword, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[Keyword, Any]]:
    return st.fixed_dictionaries({}, optional=d)


sampling_maps: st.SearchStrategy[dict[Keyword, Any]] = _opt({
    K("vllm/temperature"): st.floats(0.0, 2.0),
    K("vllm/top-p"): st.floats(0.0, 1.0),
    K("vllm/top-k"): st.integers(-1, 200),
    K("vllm/min-p"): st.floats(0.0, 1.0),
    K("vllm/max-tokens"): st.integers(1, 4096),
    K("vllm/n"): st.integers(1, 4),
    K("vllm/best-of"): st.integers(4, 8),
    K("vllm/presence-penalty"): st.floats(-2.0, 2.0),
    K("vllm/frequency-penalty"): st.floats(-2.0, 2.0),
    K("vllm/repetition-penalty"): st.floats(0.0, 3.0),
    K("vllm/stop"): texts | st.lists(texts, max_size=3),
    K("vllm/seed"): st.integers(0, 2**31),
    K("vllm/logprobs"): st.integers(0, 5) | st.booleans(),
    K("vllm/guided-json"): texts | st.dictionaries(_NAME.map(kw), json_like, max_size=3),
    K("vllm/guided-regex"): texts,
    K("vllm/guided-choice"): st.lists(texts, min_size=1, max_size=3),
})

tool_call_maps = st.fixed_dictionaries(
    {K("vllm/name"): _NAME},
    optional={K("vllm/arguments"): texts, K("vllm/id"): texts, K("vllm/type"): st.just(kw("function")),
              K("vllm/index"): st.integers(0, 5)})

content_parts = st.one_of(
    st.fixed_dictionaries({K("vllm/type"): st.just(kw("text")), K("vllm/text"): texts}),
    st.fixed_dictionaries({K("vllm/type"): st.sampled_from([kw("image-url"), kw("audio-url"), kw("video-url")]),
                           K("vllm/url"): texts}, optional={K("vllm/detail"): st.sampled_from(["low", "high"])}),
)

message_maps = st.fixed_dictionaries(
    {K("vllm/role"): st.sampled_from([kw(r) for r in ROLES]),
     K("vllm/content"): texts | st.lists(content_parts, min_size=1, max_size=3)},
    optional={K("vllm/name"): _NAME, K("vllm/tool-call-id"): texts,
              K("vllm/tool-calls"): st.lists(tool_call_maps, min_size=1, max_size=2),
              K("vllm/reasoning-content"): texts})

_extra_keys = st.builds(lambda ns, n: kw(f"{ns}/{n}"), st.sampled_from(["llamacpp", "sglang"]), _NAME)
engine_extras = st.dictionaries(_extra_keys, json_like, max_size=3)

_common = {K("vllm/model"): texts, K("vllm/base-url"): st.just("http://localhost:8000"),
           K("vllm/request-id"): texts | st.integers(0, 10**6)}
_sampled = {**_common, K("vllm/sampling"): sampling_maps, K("vllm/stream"): st.booleans()}
_control = {K("vllm/base-url"): st.just("http://localhost:8000"), K("vllm/request-id"): texts | st.integers(0, 10**6)}


def _request(endpoint: str, required: dict[Keyword, st.SearchStrategy[Any]],
             optional: dict[Keyword, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[Keyword, Any]]:
    base = st.fixed_dictionaries({K("vllm/endpoint"): st.just(kw(endpoint)), **required}, optional=optional)
    return st.builds(lambda m, extras: {**m, **extras}, base, engine_extras)


request_maps_by_endpoint: dict[str, st.SearchStrategy[dict[Keyword, Any]]] = {
    "chat": _request("chat", {K("vllm/messages"): st.lists(message_maps, min_size=1, max_size=4)},
                     {**_sampled, K("vllm/tools"): st.lists(json_like, max_size=2),
                      K("vllm/tool-choice"): st.sampled_from(["auto", "none", "required"])}),
    "completion": _request("completion", {K("vllm/prompt"): texts | st.lists(st.integers(0, 50000), max_size=6)},
                           _sampled),
    "generate": _request("generate", {K("vllm/prompt"): texts | st.lists(st.integers(0, 50000), max_size=6)},
                         _sampled),
    "embedding": _request("embedding", {K("vllm/input"): texts | st.lists(texts, max_size=3)},
                          {**_common, K("vllm/dimensions"): st.integers(1, 4096),
                           K("vllm/encoding-format"): st.sampled_from(["float", "base64"]).map(kw)}),
    "tokenize": _request("tokenize", {K("vllm/text"): texts}, {**_common, K("vllm/add-special"): st.booleans()}),
    "detokenize": _request("detokenize", {K("vllm/tokens"): st.lists(st.integers(0, 50000), max_size=6)}, _common),
    "rerank": _request("rerank", {K("vllm/query"): texts, K("vllm/documents"): st.lists(texts, min_size=1, max_size=3)},
                       {**_common, K("vllm/top-n"): st.integers(1, 5)}),
    "score": _request("score", {K("vllm/text-1"): texts | st.lists(texts, max_size=3),
                                K("vllm/text-2"): texts | st.lists(texts, max_size=3)}, _common),
    "classify": _request("classify", {K("vllm/input"): texts | st.lists(texts, max_size=3)}, _common),
    "pooling": _request("pooling", {K("vllm/input"): texts | st.lists(texts, max_size=3)},
                        {**_common, K("vllm/task"): st.sampled_from(["embed", "classify", "token-embed"]).map(kw)}),
    "lora-list": _request("lora-list", {}, _control),
    "lora-load": _request("lora-load", {K("vllm/lora-name"): texts, K("vllm/lora-path"): texts}, _control),
    "lora-unload": _request("lora-unload", {K("vllm/lora-name"): texts}, _control),
    "lora-scale": _request("lora-scale", {K("vllm/adapters"): st.lists(st.fixed_dictionaries(
        {K("vllm/id"): st.integers(0, 8), K("vllm/scale"): st.floats(0.0, 2.0)}), min_size=1, max_size=3)},
        _control),
    "cache-reset": _request("cache-reset", {}, _control),
    "slot": _request("slot", {K("vllm/action"): st.sampled_from(["save", "restore", "erase"]).map(kw),
                              K("vllm/slot-id"): st.integers(0, 4)}, {**_control, K("vllm/filename"): texts}),
}
assert set(request_maps_by_endpoint) == set(ENDPOINTS)
request_maps = st.one_of(*request_maps_by_endpoint.values())

# ------------------------------------------------------------------ typed responses

_nonneg = st.integers(0, 10**6)
_ms = st.floats(0.0, 1e6, allow_nan=False)
usages = st.builds(Usage, prompt_tokens=st.none() | _nonneg, completion_tokens=st.none() | _nonneg,
                   total_tokens=st.none() | _nonneg, cached_tokens=st.none() | _nonneg,
                   reasoning_tokens=st.none() | _nonneg)
figures = st.builds(Figure, provenance=st.sampled_from(PROVENANCES), tokens=st.none() | _nonneg,
                    ms=st.none() | _ms, tokens_per_s=st.none() | _ms,
                    gaps_ms=st.none() | st.lists(_ms, max_size=4).map(tuple))
timings = st.builds(Timings, prefill=figures, decode=figures, cached=figures, ttft=figures, inter_token=figures,
                    end_to_end=figures)
tool_calls = st.builds(ToolCall, name=_NAME, arguments=st.none() | texts, id=st.none() | texts,
                       type=st.none() | st.just("function"), index=st.none() | st.integers(0, 5))
# finish reasons as servers spell them: keywords when they can be, strings otherwise
_reasons = st.none() | st.sampled_from(["stop", "length", "tool_calls", "content_filter", "abort", "stop sequence",
                                        "1st_stop"]) | texts
choices = st.builds(Choice, index=st.integers(0, 3), text=st.none() | texts, finish_reason=_reasons,
                    tool_calls=st.none() | st.lists(tool_calls, min_size=1, max_size=2).map(tuple),
                    reasoning=st.none() | texts, logprobs=st.none() | json_like)
_resp_extra_keys = st.builds(lambda ns, n: f"{ns}/{n}", st.sampled_from(["llamacpp", "sglang", "openai"]), _NAME)
responses = st.builds(
    Response, text=st.none() | texts, choices=st.lists(choices, max_size=3).map(tuple), id=st.none() | texts,
    model=st.none() | texts, usage=st.none() | usages, backend=st.none() | st.sampled_from(BACKENDS),
    endpoint=st.none() | st.sampled_from(["chat", "completion", "generate"]),
    endpoint_url=st.none() | st.just("http://127.0.0.1:8080/v1/chat/completions"),
    timings=st.none() | timings, request_id=st.none() | texts | st.integers(0, 100),
    created=st.none() | st.integers(0, 2**31), system_fingerprint=st.none() | texts,
    extras=st.dictionaries(_resp_extra_keys, json_like, max_size=3))
stream_deltas = st.builds(StreamDelta, delta=texts, finish_reason=_reasons, index=st.none() | st.integers(0, 3),
                          reasoning=st.none() | texts, tool_calls=st.none() | st.lists(json_like, max_size=2))

__all__ = ["choices", "content_parts", "edn_scalars", "edn_values", "engine_extras", "figures", "json_like",
           "keywords", "message_maps", "request_maps", "request_maps_by_endpoint", "responses", "sampling_maps",
           "stream_deltas", "timings", "tool_calls", "usages"]
