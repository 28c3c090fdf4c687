"""Every request field the engines accept beyond the sampling table, as data: one row per field.

A row says the EDN key, its type and bounds, and for each engine the routes that take it
(and the wire name where it differs). Everything else reads these rows: the EDN reader
(which `:vllm/*` keys a request may hold), keyword arguments (named as the engines name
the fields), validation (type, range, the engines' own cross-field rules), each dialect's
rendering and refusals, schemas/engines/*.edn and docs/engines/*.md.

Namespaces (schemas/README.md): a field several engines accept is `:vllm/<name>`, checked per
engine; a field one engine has is `:vllm.engine/<name>` (vLLM), `:sglang/<name>` or
`:llamacpp/<name>`. The key's name is the engines' field name with `-` for `_`, and the
keyword argument is the engines' own name.

`ENGINE_OWN` is what the client renders from its own keys (the sampling table, messages,
the request id); `UNSUPPORTED` the fields left out on purpose, each with its reason.
tests/test_engine_fields.py holds these against the tables read from the engines' code
(schemas/engine-fields/).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, NamedTuple, TypeGuard, TypeVar

from ._codec import describe, edn_to_json, json_problem
from ._edn import Edn, Keyword, kw, read_file
from ._errors import ValidationError
from ._problems import Problem

if TYPE_CHECKING:
    from ._model import ChatRequest

CHAT, COMPLETION, GENERATE, EMBEDDING = "chat", "completion", "generate", "embedding"
C = frozenset({CHAT})
P = frozenset({COMPLETION})
CP = frozenset({CHAT, COMPLETION})
CPG = frozenset({CHAT, COMPLETION, GENERATE})
G = frozenset({GENERATE})
ENGINES = ("vllm", "sglang", "llamacpp", "openai")
_T = TypeVar("_T")


class Kind(NamedTuple):
    """A field's type: what it must hold (`problem` says why not, None when it fits) and its JSON."""

    name: str
    problem: Callable[[Edn], "str | None"]
    to_json: Callable[[Any], object] = edn_to_json  # takes what `problem` passed


def _is_int(v: object) -> TypeGuard[int]:
    return type(v) is int


def _is_num(v: object) -> TypeGuard[int | float | Decimal]:
    return type(v) in (int, float) or isinstance(v, Decimal)


def _check(name: str, test: Callable[[Edn], bool]) -> Callable[[Edn], "str | None"]:
    return lambda v: None if test(v) else f"expected {name}, got {describe(v)}"


def _map_problem(v: Edn) -> str | None:
    if not isinstance(v, dict):
        return f"expected a map, got {describe(v)}"
    return json_problem(v)


def _ints(v: Edn) -> bool:
    return isinstance(v, (list, tuple)) and all(type(x) is int for x in v)


def _strs(v: Edn) -> bool:
    return isinstance(v, (list, tuple)) and all(type(x) is str for x in v)


def _token(k: object) -> bool:
    return type(k) is int or type(k) is str and k.isdigit()


def _bias_problem(v: Edn) -> str | None:
    if not isinstance(v, dict):
        return f"expected a map of token id to bias, got {describe(v)}"
    for k, x in v.items():
        if not _token(k):
            return f"a token id must be an integer, got {describe(k)}"
        if not _is_num(x) or not math.isfinite(x):
            return f"token {k}: a bias must be a finite number, got {describe(x)}"
    return None


def _name_text(v: _T) -> _T | str:
    return v.name if isinstance(v, Keyword) else v


BOOL = Kind("true or false", _check("true or false", lambda v: type(v) is bool))
INT = Kind("an integer", _check("an integer", _is_int))
NUM = Kind("a number", _check("a number", lambda v: _is_num(v) and math.isfinite(v)))
STR = Kind("a string", _check("a string", lambda v: type(v) is str))
WORD = Kind("a keyword or a string", _check("a keyword or a string", lambda v: type(v) is str or isinstance(v, Keyword)),
            _name_text)
BOOL_OR_WORD = Kind("true, false or a keyword", _check("true, false or a keyword", lambda v: type(v) in (bool, str)
                                                     or isinstance(v, Keyword)), _name_text)
STR_OR_NUM = Kind("a string or a number", _check("a string or a number", lambda v: type(v) is str or _is_num(v)))
MAP = Kind("a map", _map_problem)
JSON = Kind("JSON-like data", json_problem)
INTS = Kind("a vector of integers", _check("a vector of integers", _ints), list)
STRS = Kind("a vector of strings", _check("a vector of strings", _strs), list)
STR_OR_STRS = Kind("a string or a vector of strings",
                   _check("a string or a vector of strings", lambda v: type(v) is str or _strs(v)),
                   lambda v: v if isinstance(v, str) else list(v))
BIAS = Kind("a map of token id to bias", _bias_problem, lambda v: {str(k): edn_to_json(x) for k, x in v.items()})
MAPS = Kind("a vector of maps", lambda v: (None if isinstance(v, (list, tuple)) and all(isinstance(x, dict) for x in v)
                                           else f"expected a vector of maps, got {describe(v)}") or json_problem(v))


class On(NamedTuple):
    """Where one engine takes a field: its routes, the wire name, and whether on SGLang's `/generate`
    it belongs inside `sampling_params` (there under `native`, when that name differs)."""

    routes: frozenset[str]
    wire: str
    sampling: bool = False
    native: str | None = None


class Field(NamedTuple):
    key: str  # EDN key, "vllm/min-tokens"
    kwarg: str  # keyword argument: the engines' own name, "min_tokens"
    kind: Kind
    lo: float | None
    hi: float | None
    engines: Mapping[str, On]
    doc: str

    @property
    def edn(self) -> str:
        return ":" + self.key


def field(key: str, kind: Kind, doc: str, *, lo: float | None = None, hi: float | None = None,
          wire: str | None = None, sampling: bool = False, native: str | None = None,
          **engines: frozenset[str]) -> Field:
    """One row. `engines`: engine name -> the routes it takes the field on (`vllm=CP`)."""
    name = key.rsplit("/", 1)[1].replace("-", "_")
    w = wire or name
    return Field(key, name, kind, lo, hi,
                 {e: On(routes, w, sampling and e == "sglang", native if e == "sglang" else None)
                  for e, routes in engines.items() if routes}, doc)


I64 = 2**63 - 1

FIELDS: tuple[Field, ...] = (
    # ---- fields several engines accept: :vllm/*
    field("vllm/chat-template-kwargs", MAP, "keyword arguments for the chat template (`{:enable_thinking false}`)",
          vllm=C, sglang=C, llamacpp=C),
    field("vllm/priority", INT, "scheduling priority (vLLM: lower is earlier; needs --scheduling-policy priority)",
          lo=-I64 - 1, hi=I64, vllm=CP, sglang=CPG),
    field("vllm/min-tokens", INT, "generate at least this many tokens before a stop may end the answer", lo=0,
          sampling=True, native="min_new_tokens", vllm=CP, sglang=CPG),
    field("vllm/ignore-eos", BOOL, "keep generating past the end-of-sequence token", sampling=True,
          vllm=CP, sglang=CPG, llamacpp=CPG),
    field("vllm/skip-special-tokens", BOOL, "leave special tokens out of the text", sampling=True,
          vllm=CP, sglang=CPG),
    field("vllm/spaces-between-special-tokens", BOOL, "put spaces between special tokens in the text",
          sampling=True, vllm=CP, sglang=G),
    field("vllm/logit-bias", BIAS, "token id -> bias added to its logit (-100 bans it, +100 forces it)",
          lo=-100.0, hi=100.0, sampling=True, vllm=CP, sglang=CPG, llamacpp=CPG, openai=CP),
    field("vllm/stop-token-ids", INTS, "token ids that end the answer", sampling=True, vllm=CP, sglang=CPG),
    field("vllm/parallel-tool-calls", BOOL, "whether the model may call several tools in one turn",
          vllm=C, sglang=C, llamacpp=C, openai=C),
    field("vllm/continuous-usage-stats", BOOL, "usage in every stream chunk (streaming only)",
          wire="stream_options.continuous_usage_stats", vllm=CP, sglang=CP),
    field("vllm/cache-salt", STR, "salt for the prefix cache: requests with different salts share no cached prefix",
          vllm=CP, sglang=CPG),
    field("vllm/mm-processor-kwargs", MAP, "keyword arguments for the model's multimodal processor",
          vllm=C, sglang=CPG),
    field("vllm/session-id", STR, "a session identity shared by related requests", vllm=CP, sglang=CPG),
    field("vllm/return-token-ids", BOOL, "include token ids in the answer", vllm=CP, sglang=CP),
    field("vllm/continue-final-message", BOOL, "continue the last (assistant) message instead of starting a new one",
          vllm=C, sglang=C, llamacpp=C),
    field("vllm/add-generation-prompt", BOOL, "add the template's generation prompt", vllm=C, llamacpp=C),
    field("vllm/echo", BOOL, "prepend the prompt (or last message) to the answer", vllm=CP, sglang=P, llamacpp=C),
    field("vllm/reasoning-effort", STR_OR_NUM, "reasoning effort for reasoning models (:low .. :high, or a number "
          "on SGLang)", vllm=C, sglang=C, llamacpp=C, openai=C),
    field("vllm/suffix", STR, "text after the completion (fill in the middle)", vllm=P, sglang=P),
    field("vllm/user", STR, "an end-user id, passed along", vllm=CP, sglang=CP, openai=CP),
    field("vllm/stream-interval", INT, "tokens per streamed chunk", lo=1, sampling=True, vllm=CP, sglang=G),
    # ---- vLLM only: :vllm.engine/*
    field("vllm.engine/bad-words", STRS, "words the answer must not contain", vllm=CP),
    field("vllm.engine/allowed-token-ids", INTS, "the only token ids the answer may use", vllm=CP),
    field("vllm.engine/prompt-logprobs", INT, "logprobs of the prompt tokens (-1: all)", lo=-1, vllm=CP),
    field("vllm.engine/logprob-token-ids", INTS, "token ids to return logprobs for (needs :vllm/logprobs)", vllm=CP),
    field("vllm.engine/truncate-prompt-tokens", INT, "keep only this many prompt tokens (-1: the model's limit)",
          lo=-1, hi=I64, vllm=CP),
    field("vllm.engine/truncation-side", WORD, "which side :vllm.engine/truncate-prompt-tokens cuts (:left, :right)",
          vllm=CP),
    field("vllm.engine/return-tokens-as-token-ids", BOOL, "logprob tokens as `token_id:N`", vllm=CP),
    field("vllm.engine/use-beam-search", BOOL, "beam search instead of sampling", vllm=CP),
    field("vllm.engine/length-penalty", NUM, "beam search length penalty", vllm=CP),
    field("vllm.engine/include-stop-str-in-output", BOOL, "keep the stop string in the text", vllm=CP),
    field("vllm.engine/include-reasoning", BOOL, "include the reasoning in the answer", vllm=C),
    field("vllm.engine/thinking-token-budget", INT, "most tokens the model may think for", lo=0, vllm=CP),
    field("vllm.engine/add-special-tokens", BOOL, "add special tokens (BOS) beyond the chat template's", vllm=CP),
    field("vllm.engine/documents", MAPS, "documents for a RAG chat template", vllm=C),
    field("vllm.engine/chat-template", STR, "a Jinja chat template for this request", vllm=C),
    field("vllm.engine/media-io-kwargs", MAP, "keyword arguments for media loading, by modality", vllm=C),
    field("vllm.engine/watermarking", BOOL, "watermark the answer", vllm=CP),
    field("vllm.engine/return-weight-versions", BOOL, "which weight version sampled each token range (0.33)",
          vllm=CP),
    field("vllm.engine/return-token-offsets", BOOL, "char offsets per token (render endpoints only)", vllm=CP),
    field("vllm.engine/return-prompt-text", BOOL, "include the templated prompt text", vllm=C),
    field("vllm.engine/mm-payload", WORD, "what render answers carry for multimodal items (:tensors, :none)",
          vllm=CP),
    field("vllm.engine/routed-experts-prompt-start", INT, "skip this many prompt tokens of routed-expert data", lo=0,
          vllm=CP),
    field("vllm.engine/vllm-xargs", MAP, "extra arguments for custom extensions", vllm=CP),
    field("vllm.engine/repetition-detection", MAP, "end generation early on repeated n-grams", vllm=CP),
    # ---- SGLang only: :sglang/*
    field("sglang/rid", STR, "SGLang's request id (the same as :vllm/request-id, which sets it)", sglang=CPG),
    field("sglang/lora-path", STR_OR_STRS, "the LoRA adapter to use", sglang=CPG),
    field("sglang/return-text-in-logprobs", BOOL, "token text beside logprobs", sglang=G),
    field("sglang/separate-reasoning", BOOL, "reasoning apart from the answer", sglang=C),
    field("sglang/stream-reasoning", BOOL, "stream the reasoning", sglang=C),
    field("sglang/ebnf", STR, "an EBNF grammar the answer must match", sampling=True, sglang=CPG),
    field("sglang/stop-regex", STR_OR_STRS, "regular expressions that end the answer", sampling=True, sglang=CPG),
    field("sglang/no-stop-trim", BOOL, "keep the stop string in the text", sampling=True, sglang=CPG),
    field("sglang/return-hidden-states", BOOL_OR_WORD, "return hidden states (true, or :last)", sglang=CPG),
    field("sglang/session-params", MAP, "session continuation (`{:id .. :rid ..}`)", sglang=CPG),
    field("sglang/return-routed-experts", BOOL, "return routed-expert data", sglang=CPG),
    field("sglang/routed-experts-start-len", INT, "skip this many tokens of routed-expert data", lo=0, sglang=CPG),
    field("sglang/return-cached-tokens-details", BOOL, "cached-token details in usage", sglang=CP),
    field("sglang/return-spec-tokens-details", BOOL, "speculative-decoding token details in usage", sglang=CP),
    field("sglang/return-prompt-token-ids", BOOL, "include the prompt's token ids", sglang=C | G),
    field("sglang/return-meta-info", BOOL, "include SGLang's meta_info per choice", sglang=C),
    field("sglang/return-input-ids-in-sglext", BOOL, "input ids in the sglext answer field", sglang=C),
    field("sglang/return-output-ids-in-sglext", BOOL, "output ids in the sglext answer field", sglang=C),
    field("sglang/return-sampling-mask", BOOL, "return the sampling mask", sglang=C | G),
    field("sglang/sampling-logprobs-mode", WORD, "logprobs of the selected token or the support (:selected, :support)",
          sglang=C | G),
    field("sglang/return-flat-raw-output-top-logprobs", BOOL, "flat top logprobs in meta_info", sglang=C | G),
    field("sglang/return-flat-raw-top-logprobs-b64", BOOL, "flat top logprobs as base64", sglang=C | G),
    field("sglang/thinking", JSON, "thinking config for templates that define one (`{:type \"adaptive\"}`)",
          sglang=C),
    field("sglang/task", WORD, "a DeepSeek-V4 quick-instruction task", sglang=C),
    field("sglang/input-ids", INTS, "the prompt as token ids", sglang=C),
    field("sglang/max-dynamic-patch", INT, "most image patches", lo=1, sglang=C | G),
    field("sglang/min-dynamic-patch", INT, "fewest image patches", lo=1, sglang=C | G),
    field("sglang/use-audio-in-video", BOOL, "use a video's audio track", sglang=C | G),
    field("sglang/images-config", MAP, "image processing options", sglang=CPG),
    field("sglang/video-config", MAP, "video processing options", sglang=C | G),
    field("sglang/custom-logit-processor", STR, "a serialized custom logit processor "
          "(needs --enable-custom-logit-processor)", sglang=CPG),
    field("sglang/custom-params", MAP, "parameters for the custom logit processor", sampling=True, sglang=CPG),
    field("sglang/watermark", MAP, "watermark configuration", sampling=True, sglang=CPG),
    field("sglang/extra-key", STR, "an extra key isolating this request's prefix cache", sglang=CPG),
    field("sglang/custom-labels", MAP, "labels for SGLang's per-request metrics", sglang=P | G),
    field("sglang/json-schema", STR, "a JSON schema as a string (prefer :vllm/guided-json)", sampling=True,
          sglang=P),
    field("sglang/return-logprob", BOOL, "return logprobs (/generate; :vllm/logprobs sets it too)", sglang=G),
    field("sglang/logprob-start-len", INT, "first prompt position to return logprobs for (-1: none)", lo=-1,
          sglang=G),
    field("sglang/token-ids-logprob", INTS, "token ids to return logprobs for", sglang=G),
    field("sglang/return-entropy", BOOL, "return the entropy per token", sglang=G),
    field("sglang/return-bytes", BOOL, "return token bytes", sglang=G),
    field("sglang/log-metrics", BOOL, "count this request in SGLang's metrics", sglang=G),
    field("sglang/modalities", STRS, "the modality of each multimodal item", sglang=G),
    field("sglang/lora-id", STR, "the LoRA adapter by id", sglang=G),
    field("sglang/max-thinking-tokens", INT, "most tokens the model may think for", lo=0, sglang=G),
    field("sglang/require-reasoning", BOOL, "the answer must reason first", sglang=G),
    field("sglang/no-logs", BOOL, "keep this request out of SGLang's request log", sglang=G),
    field("sglang/return-indexer-topk", BOOL, "return the indexer's top-k", sglang=G),
    field("sglang/image-max-dynamic-patch", INT, "most patches per image", lo=1, sglang=G),
    field("sglang/video-max-dynamic-patch", INT, "most patches per video frame", lo=1, sglang=G),
    field("sglang/routing-key", STR, "a key a router may use to place the request", sglang=G),
    field("sglang/conversation-id", STR, "a conversation identity", sglang=G),
    field("sglang/background", BOOL, "run in the background", sglang=G),
    field("sglang/return-flat-raw-top-logprobs", BOOL, "flat top logprobs", sglang=G),
    field("sglang/token-indices-to-pool", INTS, "token positions to pool", sglang=G),
    # ---- llama.cpp only: :llamacpp/*
    field("llamacpp/cache-prompt", BOOL, "reuse the KV cache of an earlier request", llamacpp=CPG),
    field("llamacpp/id-slot", INT, "the slot to run in (-1: any idle one)", lo=-1, llamacpp=CPG),
    field("llamacpp/grammar", STR, "a GBNF grammar the answer must match", llamacpp=CPG),
    field("llamacpp/grammar-lazy", BOOL, "apply the grammar only after a trigger", llamacpp=CPG),
    field("llamacpp/n-keep", INT, "prompt tokens kept when the context shifts (-1: all)", lo=-1, llamacpp=CPG),
    field("llamacpp/n-discard", INT, "tokens discarded when the context shifts (0: half)", lo=0, llamacpp=CPG),
    field("llamacpp/n-indent", INT, "minimum indentation of the answer", lo=0, llamacpp=CPG),
    field("llamacpp/n-probs", INT, "top probabilities per token", lo=0, llamacpp=G),
    field("llamacpp/n-cmpl", INT, "completions to generate (at most the server's --parallel)", lo=1, llamacpp=CPG),
    field("llamacpp/n-cache-reuse", INT, "min chunk to reuse from the cache by shifting", lo=0, llamacpp=CPG),
    field("llamacpp/t-max-predict-ms", INT, "time limit for generation, in ms (-1: none)", lo=-1, llamacpp=CPG),
    field("llamacpp/return-tokens", BOOL, "return the generated token ids", llamacpp=G),
    field("llamacpp/return-progress", BOOL, "prompt progress events in a stream", llamacpp=CPG),
    field("llamacpp/timings-per-token", BOOL, "timings in every chunk", llamacpp=CPG),
    field("llamacpp/response-fields", STRS, "only these answer fields", llamacpp=CPG),
    field("llamacpp/typical-p", NUM, "locally typical sampling (1.0: off)", llamacpp=CPG),
    field("llamacpp/top-n-sigma", NUM, "top-n-sigma sampling (-1: off)", llamacpp=CPG),
    field("llamacpp/xtc-probability", NUM, "XTC: chance of removing top tokens", lo=0.0, hi=1.0, llamacpp=CPG),
    field("llamacpp/xtc-threshold", NUM, "XTC: probability above which tokens may be removed", lo=0.0, hi=1.0,
          llamacpp=CPG),
    field("llamacpp/dynatemp-range", NUM, "dynamic temperature range", llamacpp=CPG),
    field("llamacpp/dynatemp-exponent", NUM, "dynamic temperature exponent", llamacpp=CPG),
    field("llamacpp/repeat-last-n", INT, "tokens the repeat penalty looks back over", lo=0, llamacpp=CPG),
    field("llamacpp/dry-multiplier", NUM, "DRY repetition penalty multiplier (0: off)", lo=0.0, llamacpp=CPG),
    field("llamacpp/dry-base", NUM, "DRY penalty base (below 1: the server's default)", llamacpp=CPG),
    field("llamacpp/dry-allowed-length", INT, "DRY: repeats up to this length are free", lo=0, llamacpp=CPG),
    field("llamacpp/dry-penalty-last-n", INT, "DRY: tokens looked back over", lo=0, llamacpp=CPG),
    field("llamacpp/dry-sequence-breakers", STRS, "DRY: strings that break a repeat", llamacpp=CPG),
    field("llamacpp/mirostat", INT, "Mirostat sampling (0 off, 1, 2)", lo=0, hi=2, llamacpp=CPG),
    field("llamacpp/mirostat-tau", NUM, "Mirostat target entropy", llamacpp=CPG),
    field("llamacpp/mirostat-eta", NUM, "Mirostat learning rate", llamacpp=CPG),
    field("llamacpp/adaptive-target", NUM, "adaptive-p sampling target", hi=1.0, llamacpp=CPG),
    field("llamacpp/adaptive-decay", NUM, "adaptive-p sampling decay", lo=0.0, hi=0.99, llamacpp=CPG),
    field("llamacpp/min-keep", INT, "fewest tokens every sampler keeps", lo=0, llamacpp=CPG),
    field("llamacpp/samplers", STRS, "the sampler chain, in order", llamacpp=CPG),
    field("llamacpp/backend-sampling", BOOL, "sample on the compute backend", llamacpp=CPG),
    field("llamacpp/post-sampling-probs", BOOL, "probabilities after sampling", llamacpp=CPG),
    field("llamacpp/lora", MAPS, "per-request LoRA scales (`[{:id 0 :scale 0.5}]`)", llamacpp=CPG),
    field("llamacpp/sse-ping-interval", INT, "seconds between SSE pings while silent (-1: none)", lo=-1,
          llamacpp=CPG),
    field("llamacpp/reasoning-format", STR, "how reasoning is returned (none, deepseek, ...)", llamacpp=CPG),
    field("llamacpp/reasoning-budget-tokens", INT, "most tokens the model may reason for (-1: no limit)", lo=-1,
          llamacpp=C),
    field("llamacpp/thinking-budget-tokens", INT, "most tokens the model may think for", lo=-1, llamacpp=C),
    field("llamacpp/parse-tool-calls", BOOL, "parse tool calls out of the text", llamacpp=CPG),
    field("llamacpp/preserved-tokens", STRS, "tokens kept whole by the grammar", llamacpp=CPG),
    field("llamacpp/grammar-triggers", MAPS, "what starts a lazy grammar", llamacpp=CPG),
    field("llamacpp/verbose", BOOL, "debug information in the answer", llamacpp=CPG),
    field("llamacpp/reasoning-control", BOOL, "let the reasoning budget control thinking", llamacpp=CPG),
)

# The pass-through and the headers: merged into what the dialect renders, never over it.
EXTRA_BODY = "vllm/extra-body"
EXTRA_HEADERS = "vllm/extra-headers"
PASS_THROUGH = (EXTRA_BODY, EXTRA_HEADERS)
# Never through the pass-through: the key goes only where the client sends it, the URL is :vllm/base-url.
REFUSED_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie", "host",
                             "content-length", "content-type", "transfer-encoding", "connection"})
REFUSED_BODY_KEYS = frozenset({"api_key", "base_url", "url", "authorization"})

BY_KEY: dict[str, Field] = {f.key: f for f in FIELDS if f.engines}
BY_KWARG: dict[str, Field] = {f.kwarg: f for f in FIELDS if f.engines}
# (engine, the name it reads) -> our key: a pass-through key the SDK could have checked
WIRE_KEYS: dict[tuple[str, str], str] = {(e, on.wire): f.key for f in FIELDS for e, on in f.engines.items()}
assert len(BY_KWARG) == len(BY_KEY), "two fields share a keyword argument"
SHARED_KEYS = frozenset(k for k in BY_KEY if k.startswith("vllm/")) | frozenset(PASS_THROUGH)
KWARG_KEYS: dict[str, str] = {**{f.kwarg: f.key for f in BY_KEY.values()},
                              "extra_body": EXTRA_BODY, "extra_headers": EXTRA_HEADERS}


def fields_on(engine: str) -> dict[str, tuple[Field, On]]:
    """The fields `engine` takes: EDN key -> (row, where)."""
    return {f.key: (f, f.engines[engine]) for f in BY_KEY.values() if engine in f.engines}


# ------------------------------------------------------------------ checks


def _problem(code: str, f: str, msg: str, engine: str | None = None) -> Problem:
    return Problem("error", code, msg, field=f, engine=engine)


def value_problems(extras: Mapping[str, Edn], stream: bool | None = None,
                   max_tokens: int | None = None) -> list[Problem]:
    """Type, bounds and the cross-field rules every engine taking these fields applies."""
    out: list[Problem] = []
    for key, v in extras.items():
        f = BY_KEY.get(key)
        if f is None:
            if key in PASS_THROUGH:
                out.extend(_pass_through_problems(key, v))
            elif not key.startswith(("vllm/",)):  # an engine namespace: the engines' tables name every field
                out.append(_problem("request/unknown-key", key, f"unknown key :{key}: no engine has this field"))
            continue
        why = f.kind.problem(v)
        if why is not None:
            out.append(_problem("request/type", key, f":{key}: {why}"))
            continue
        values: Iterable[int | float | Decimal] = v.values() if isinstance(v, dict) and f.kind is BIAS else (v,) if _is_num(v) else ()
        for x in values:
            if (f.lo is not None and not x >= f.lo) or (f.hi is not None and not x <= f.hi):
                lo = "-inf" if f.lo is None else f.lo
                hi = "inf" if f.hi is None else f.hi
                out.append(_problem("sampling/range", key, f":{key} = {x} is out of range [{lo}, {hi}]"))
                break
    mt = extras.get("vllm/min-tokens")
    if type(mt) is int and max_tokens is not None and mt > max_tokens:
        out.append(_problem("sampling/min-tokens", "vllm/min-tokens",
                            f":vllm/min-tokens {mt} must be <= :vllm/max-tokens {max_tokens}"))
    if "vllm/continuous-usage-stats" in extras and not stream:
        out.append(_problem("request/stream", "vllm/continuous-usage-stats",
                            ":vllm/continuous-usage-stats needs :vllm/stream true (stream options exist only "
                            "for streams)"))
    return out


def _pass_through_problems(key: str, v: Edn) -> list[Problem]:
    if not isinstance(v, dict) or not all(isinstance(k, (str, Keyword)) for k in v):
        return [_problem("request/type", key, f":{key}: expected a map with string keys, got {describe(v)}")]
    out = []
    names = [_name_text(k) for k in v]
    if key == EXTRA_HEADERS:
        for n, x in zip(names, v.values()):
            if n.lower() in REFUSED_HEADERS:
                out.append(_problem("request/pass-through", key, f":{key} may not set {n!r}: the API key and the "
                                    "connection are the client's"))
            elif type(x) is not str:
                out.append(_problem("request/type", key, f":{key} {n!r}: a header value must be a string, got "
                                    f"{describe(x)}"))
    else:
        why = json_problem(v)
        if why is not None:
            out.append(_problem("request/type", key, f":{key}: {why}"))
        for n in names:
            if n.lower() in REFUSED_BODY_KEYS:
                out.append(_problem("request/pass-through", key, f":{key} may not set {n!r}: the API key and the "
                                    "server's URL never go through the pass-through"))
    return out


def _unchecked_why(engine: str, wire: str) -> str:
    """Why a pass-through key goes unchecked: unknown to the SDK, or known under a key that would check it."""
    known = WIRE_KEYS.get((engine, wire))
    return (f"the SDK checks it as :{known} ({wire}=) - pass it that way to have it validated" if known
            else "the SDK does not know this field")


def engine_problems(engine: str, route: str, extras: Mapping[str, Edn]) -> list[Problem]:
    """What `engine` would ignore or refuse on `route`, and its own rules on the values."""
    out: list[Problem] = []
    for key, v in extras.items():
        f = BY_KEY.get(key)
        if f is None:
            if key in PASS_THROUGH:
                out.extend(Problem("warn", "request/unchecked", f":{key} {_name_text(k)!r} goes to {engine} "
                                   f"unchecked: {_unchecked_why(engine, str(_name_text(k)))}", field=key,
                                   engine=engine)
                           for k in v) if isinstance(v, dict) else ()
            continue
        where = f.engines.get(engine)
        if where is None or route not in where.routes:
            takes = ", ".join(f"{e} ({' '.join(sorted(o.routes))})" for e, o in f.engines.items())
            out.append(_problem("engine/unsupported", key, f":{key} is not a {engine} field on the {route} route "
                                f"(taken by: {takes}); it would be ignored or rejected", engine))
    if engine == "vllm":
        if extras.get("vllm/priority") not in (None, 0):
            # vLLM 0.32.0/0.33.0 refuse nothing here (their field text says they would): under the default
            # fcfs policy the priority is accepted and has no effect
            out.append(Problem("warn", "engine/ignored", ":vllm/priority orders requests only on a vLLM started "
                               "with --scheduling-policy priority; under the default fcfs it is accepted and "
                               "ignored", field="vllm/priority", engine=engine))
        salt = extras.get("vllm/cache-salt")
        if type(salt) is str and (not salt or len(salt) > 128 or any(c in salt for c in "@/\\\0")):
            out.append(_problem("engine/value", "vllm/cache-salt", "vLLM takes a :vllm/cache-salt of 1 to 128 "
                                "characters without '@', '/', '\\' or NUL", engine))
        if "vllm.engine/logprob-token-ids" in extras and "vllm.engine/use-beam-search" in extras:
            out.append(_problem("engine/conflict", "vllm.engine/logprob-token-ids",
                                "vLLM refuses :vllm.engine/logprob-token-ids with beam search", engine))
        if extras.get("vllm.engine/allowed-token-ids") == []:
            out.append(_problem("engine/value", "vllm.engine/allowed-token-ids",
                                "vLLM refuses an empty :vllm.engine/allowed-token-ids", engine))
    if engine == "sglang" and "sglang/ebnf" in extras and "sglang/json-schema" in extras:
        out.append(_problem("sampling/conflict", "sglang/ebnf", "SGLang takes one of regex, json_schema and ebnf",
                            engine))
    return out


# what each part type must carry ("a|b": either)
PART_NEEDS: dict[str, tuple[str, ...]] = {
    "image-url": ("url",), "audio-url": ("url",), "video-url": ("url",), "input-audio": ("data", "format"),
    "input-video": ("url|data",), "image-embeds": ("data",), "text": ("text",)}


def part_problems(req: ChatRequest, engine: str, part_types: frozenset[str]) -> list[Problem]:
    """Content parts of a chat request the engine does not take, or that lack what their type needs."""
    out: list[Problem] = []
    for i, m in enumerate(req.messages):
        if type(m.content) is not tuple:  # text (or none): the common message, nothing to check
            continue
        for j, p in enumerate(m.content):
            if p.type not in part_types:
                takes = " ".join(":" + t for t in sorted(part_types))
                out.append(_problem("engine/unsupported", "vllm/type", f"message {i} part {j}: {engine} takes no "
                                    f":{p.type} part (it takes {takes})", engine))
            if p.path is not None:
                out.append(_problem("message/media", "vllm/path", f"message {i} part {j}: :vllm/path {p.path!r} is "
                                    "read into the request before it is sent (`run` does; from Python, "
                                    "kotoba_vllm.inline_local_media)"))
                continue
            for need in PART_NEEDS.get(p.type, ()):
                if all(getattr(p, n) is None for n in need.split("|")):
                    key = " or ".join(f":vllm/{n}" for n in need.split("|"))
                    out.append(_problem("message/part", f"vllm/{need.split('|')[0]}",
                                        f"message {i} part {j}: a :{p.type} part needs {key}"))
    return out


def stream_problems(extras: Mapping[str, Edn], stream: bool | None) -> list[Problem]:
    if stream and extras.get("vllm.engine/prompt-logprobs") not in (None, 0):
        return [_problem("request/stream", "vllm.engine/prompt-logprobs",
                         "vLLM gives no :vllm.engine/prompt-logprobs when streaming")]
    return []


_TABLES = Path(__file__).resolve().parent.parent / "schemas" / "engine-fields"
_VERSION_FIELDS: dict[tuple[str, str], frozenset[str] | None] = {}


def version_fields(engine: str, version: str) -> frozenset[str] | None:
    """Every field name the table read from `engine` `version`'s code holds (None: no table for it)."""
    key = (engine, version)
    if key not in _VERSION_FIELDS:
        path = _TABLES / f"{engine}-{version}.edn"
        names: set[str] = set()
        if path.exists():
            value = read_file(str(path))[0].value
            sections = list(value[kw("fields/requests")].values()) if isinstance(value, dict) else []
            if isinstance(value, dict) and kw("fields/sampling-params") in value:
                sections.append(value[kw("fields/sampling-params")])
            for section in sections:
                names |= {f[kw("field/name")] for f in section[kw("fields/fields")]}
        _VERSION_FIELDS[key] = frozenset(names) if names else None
    return _VERSION_FIELDS[key]


def version_problems(engine: str, version: str, extras: Mapping[str, Edn]) -> list[Problem]:
    """Fields this engine version's own code does not have (vLLM would only log and ignore them)."""
    names = version_fields(engine, version)
    if names is None:
        return []
    out = []
    for key in extras:
        where = BY_KEY[key].engines.get(engine) if key in BY_KEY else None
        if where is not None and where.wire.split(".")[0] not in names and (where.native or "") not in names:
            out.append(_problem("engine/version", key, f"{engine} {version} has no {where.wire} field (:{key}); it "
                                "would be ignored", engine))
    return out


# ------------------------------------------------------------------ rendering


def put(body: dict[str, object], wire: str, value: object) -> None:
    """`body[wire] = value`; a dotted wire name (`stream_options.continuous_usage_stats`) nests."""
    if "." in wire:
        outer, inner = wire.split(".", 1)
        nested = body.get(outer)
        nested = dict(nested) if isinstance(nested, dict) else {}
        nested[inner] = value
        body[outer] = nested
    else:
        body[wire] = value


def render_fields(engine: str, route: str, extras: Mapping[str, Edn], body: dict[str, object],
           sampling_params: dict[str, object] | None = None) -> None:
    """The table fields of `extras` into `body` (SGLang `/generate`: its sampling ones into `sampling_params`)."""
    for key, v in extras.items():
        f = BY_KEY.get(key)
        if f is None:
            continue  # the pass-through is merged last (`merge_extra_body`)
        where = f.engines.get(engine)
        if where is None or route not in where.routes:  # rendered without validating first: still never dropped
            raise ValidationError(engine_problems(engine, route, {key: v}))
        value = f.kind.to_json(v)
        if sampling_params is not None and where.sampling:
            put(sampling_params, where.native or where.wire, value)
        else:
            put(body, where.wire, value)


def merge_extra_body(extras: Mapping[str, Edn], body: dict[str, object], sampling_params: dict[str, object] | None = None,
                     sampling_names: frozenset[str] = frozenset()) -> list[str]:
    """`:vllm/extra-body` into the rendered body, verbatim; the keys already there (a collision) are returned,
    nothing overwritten. On SGLang `/generate` a key `sampling_names` holds goes into `sampling_params`."""
    extra = extras.get(EXTRA_BODY)
    if not isinstance(extra, dict):
        return []
    clashes = []
    for k, v in extra.items():
        name = _name_text(k)
        target = sampling_params if sampling_params is not None and name in sampling_names else body
        if name in target:
            clashes.append(name)
            continue
        target[name] = edn_to_json(v)
    return clashes


def extra_headers(extras: Mapping[str, Edn]) -> dict[str, str]:
    h = extras.get(EXTRA_HEADERS)
    return {str(_name_text(k)).lower(): str(v) for k, v in h.items()} if isinstance(h, dict) else {}


# ------------------------------------------------------------------ what the client renders itself, and what not

# engine -> wire field -> the EDN key that renders it (or how it is reached)
ENGINE_OWN: dict[str, dict[str, str]] = {
    "common": {
        "messages": ":vllm/messages", "model": ":vllm/model", "prompt": ":vllm/prompt", "stream": ":vllm/stream",
        "stream_options": ":vllm/stream (include_usage), :vllm/continuous-usage-stats",
        "temperature": ":vllm/temperature", "top_p": ":vllm/top-p", "top_k": ":vllm/top-k", "min_p": ":vllm/min-p",
        "max_tokens": ":vllm/max-tokens", "max_completion_tokens": ":vllm/max-tokens (sent as max_tokens)",
        "n": ":vllm/n", "presence_penalty": ":vllm/presence-penalty", "frequency_penalty": ":vllm/frequency-penalty",
        "repetition_penalty": ":vllm/repetition-penalty", "stop": ":vllm/stop", "seed": ":vllm/seed",
        "logprobs": ":vllm/logprobs", "top_logprobs": ":vllm/logprobs N (chat: logprobs true, top_logprobs N)",
        "response_format": ":vllm/guided-json", "tools": ":vllm/tools", "tool_choice": ":vllm/tool-choice",
        "input": ":vllm/input", "tokens": ":vllm/tokens",
    },
    "vllm": {"structured_outputs": ":vllm/guided-json, :vllm/guided-regex, :vllm/guided-choice",
             "request_id": ":vllm/request-id (also the X-Request-Id header)"},
    "sglang": {"regex": ":vllm/guided-regex, :vllm/guided-choice", "best_of": ":vllm/best-of",
               "rid": ":vllm/request-id", "text": ":vllm/prompt (a string)", "input_ids": ":vllm/prompt (token ids)",
               "sampling_params": ":vllm/sampling and the fields marked for it", "top_logprobs_num": ":vllm/logprobs N",
               "json_schema": ":vllm/guided-json (a JSON string in sampling_params)",
               "max_new_tokens": ":vllm/max-tokens", "min_new_tokens": ":vllm/min-tokens",
               "sampling_seed": ":vllm/seed"},
    "llamacpp": {"n_predict": ":vllm/max-tokens", "repeat_penalty": ":vllm/repetition-penalty",
                 "json_schema": ":vllm/guided-json", "n_probs": ":vllm/logprobs (or :llamacpp/n-probs)",
                 "chat_template_kwargs": ":vllm/chat-template-kwargs", "ignore_eos": ":vllm/ignore-eos",
                 "logit_bias": ":vllm/logit-bias", "content": ":vllm/text (tokenize)",
                 "add_special": ":vllm/add-special"},
}

_FROM_WIRE: dict[str, dict[str, str]] = {}
_KEY_NAMED = re.compile(r":([\w.-]+/[\w-]+)")  # an EDN key named in ENGINE_OWN's text


def _wire_to_key(engine: str) -> dict[str, str]:
    """Wire field -> the one EDN key that renders it on `engine` (a field two keys render is left out)."""
    table = _FROM_WIRE.get(engine)
    if table is None:
        table = {}
        for wire, how in {**ENGINE_OWN["common"], **ENGINE_OWN.get(engine, {})}.items():
            keys = set(_KEY_NAMED.findall(how))
            if len(keys) == 1:
                table[wire] = keys.pop()
        table.update({on.wire: f.key for f in BY_KEY.values() for e, on in f.engines.items() if e == engine})
        _FROM_WIRE[engine] = table
    return table


def key_of_param(engine: str, param: str, extra_body: Mapping[object, object] | None = None) -> str | None:
    """The EDN key a JSON field of the request body came from, for the field an engine names when it refuses
    one (vLLM's `param`: `max_tokens`, or a pydantic location such as `body.messages.0.content`): the
    pass-through when it sent that field, else the key that renders it; None when no key does."""
    parts = param.split(".")
    name = parts[1] if parts[0] == "body" and len(parts) > 1 else parts[0]
    if extra_body and any(_name_text(k) == name for k in extra_body):
        return EXTRA_BODY
    return _wire_to_key(engine).get(name)


DEPRECATED, INTERNAL, UNREPRESENTABLE = "deprecated", "engine-internal", "not representable as EDN data"
# engine -> wire field -> (reason, why)
UNSUPPORTED: dict[str, dict[str, tuple[str, str]]] = {
    "vllm": {
        "return_mm_kwargs": (DEPRECATED, "vLLM's deprecated alias of mm_payload (:vllm.engine/mm-payload)"),
        "kv_transfer_params": (INTERNAL, "set by vLLM's disaggregated-serving connector between prefill and decode"),
        "ec_transfer_params": (INTERNAL, "set by vLLM's encoder-cache disaggregation between instances"),
        "prompt_embeds": (UNREPRESENTABLE, "a base64-encoded serialized torch tensor, not data"),
    },
    "sglang": {
        "bootstrap_host": (INTERNAL, "PD disaggregation: a router injects it (PDRoutingFields)"),
        "bootstrap_port": (INTERNAL, "PD disaggregation: a router injects it (PDRoutingFields)"),
        "bootstrap_room": (INTERNAL, "PD disaggregation: a router injects it (PDRoutingFields)"),
        "bootstrap_pair_key": (INTERNAL, "PD disaggregation: a router injects it"),
        "routed_dp_rank": (INTERNAL, "DP routing: an external router picks the worker (PDRoutingFields)"),
        "disagg_prefill_dp_rank": (INTERNAL, "PD disaggregation hint from the router (PDRoutingFields)"),
        "data_parallel_rank": (INTERNAL, "DP routing: which worker, set by the router"),
        "decode_tp_size": (INTERNAL, "PD disaggregation: set by the router"),
        "http_worker_ipc": (INTERNAL, "set by SGLang's HTTP workers for the tokenizer manager"),
        "received_time": (INTERNAL, "stamped by SGLang's HTTP layer"),
        "need_wait_for_mm_inputs": (INTERNAL, "set by SGLang's encoder disaggregation"),
        "num_items_assigned": (INTERNAL, "set by SGLang's encoder disaggregation"),
        "encoder_urls": (INTERNAL, "set by SGLang's encoder disaggregation"),
        "external_trace_header": (INTERNAL, "filled from the request's trace headers by SGLang's HTTP layer"),
        "kv_hints": (INTERNAL, "KV placement hints from a router"),
        "multi_item_delimiter_indices": (INTERNAL, "set by SGLang's scoring path"),
        "positional_embed_overrides": (UNREPRESENTABLE, "tensors"),
        "input_embeds": (UNREPRESENTABLE, "embedding tensors as nested float lists, built by a model runner"),
        "image_data": (UNREPRESENTABLE, "images for /generate: send them as chat content parts"),
        "video_data": (UNREPRESENTABLE, "videos for /generate: send them as chat content parts"),
        "audio_data": (UNREPRESENTABLE, "audio for /generate: send it as chat content parts"),
        "mm_hashes": (INTERNAL, "hashes of preprocessed multimodal items, set by SGLang's processors"),
        "mm_content_hashes": (INTERNAL, "hashes of preprocessed multimodal items, set by SGLang's processors"),
    },
}
_LLAMA_CHAT = "filled by llama-server's own chat parser from the template when a chat request becomes a completion"
UNSUPPORTED["llamacpp"] = {
    "chat_format": (INTERNAL, _LLAMA_CHAT), "generation_prompt": (INTERNAL, _LLAMA_CHAT),
    "chat_parser": (INTERNAL, _LLAMA_CHAT), "reasoning_budget_start_tag": (INTERNAL, _LLAMA_CHAT),
    "reasoning_budget_end_tags": (INTERNAL, _LLAMA_CHAT), "reasoning_budget_message": (INTERNAL, _LLAMA_CHAT),
    "message_delimiters": (INTERNAL, _LLAMA_CHAT),
    "input_extra": (INTERNAL, "read by llama-server's /infill handler, not by the routes the SDK speaks"),
}
# SGLang /generate sampling_params fields SGLang fills itself
SGLANG_SAMPLING_INTERNAL = frozenset({"stop_strs", "stop_regex_strs", "stop_str_max_len", "stop_regex_max_len",
                                      "is_normalized", "ebnf_full_assistant"})


def own_name(engine: str, wire: str) -> str | None:
    """How the client renders the engine field `wire` from its own keys, if it does."""
    return ENGINE_OWN.get(engine, {}).get(wire) or ENGINE_OWN["common"].get(wire)


_ = Keyword
