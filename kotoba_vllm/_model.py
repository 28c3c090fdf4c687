"""The typed data model: frozen attrs classes whose EDN shape is DESIGN §3.

Every class is registered on `edn_converter`: `to_edn(x)` / `from_edn(m, Cls)`.
`None` means absent (EDN nil and a missing key read the same).
"""

from __future__ import annotations

from typing import TypeVar, Union

import attrs

from ._codec import (BOOL, INT, INT_OR_BOOL, JSON, KW, MANY, NESTED, NUM, ONE_OF, STR, TEXT_OR_NIL, WORD,
                     edn_converter, edn_field, extras_field, register, share_structured)
from ._edn import Edn, Keyword, plain_edn
from ._fields import SHARED_KEYS

ROLES = ("system", "user", "assistant", "tool", "developer")
PART_TYPES = ("text", "image-url", "audio-url", "video-url", "input-audio", "input-video", "image-embeds")
ENDPOINTS = ("chat", "completion", "generate", "embedding", "tokenize", "detokenize",
             # pooling-model endpoints, then server control (see _endpoint_calls.py and dialects/_endpoints.py)
             "rerank", "score", "classify", "pooling",
             "lora-list", "lora-load", "lora-unload", "lora-scale", "cache-reset", "slot")
BACKENDS = ("vllm", "sglang", "llamacpp", "openai")
# server-reported: every number is the server's own, as it sent it; computed: worked out here from the
# server's numbers named in `computed_from`; client-measured: this client's clock; unavailable: nil numbers.
PROVENANCES = ("server-reported", "computed", "client-measured", "unavailable")
# Where a request's engine fields live (`_fields.FIELDS`): the shared `:vllm/*` ones the table names,
# vLLM-only `:vllm.engine/*`, and the engines' own namespaces.
ENGINE_NAMESPACES = ("vllm", "vllm.engine", "llamacpp", "sglang")
REQUIRED = attrs.NOTHING  # a key the EDN map must carry (and the constructor must get)


@register
@attrs.frozen
class ToolCall:
    name: str = edn_field("vllm/name", STR, default=REQUIRED)
    arguments: str | None = edn_field("vllm/arguments", STR)
    id: str | None = edn_field("vllm/id", STR)
    type: str | None = edn_field("vllm/type", KW())
    index: int | None = edn_field("vllm/index", INT)


@register
@attrs.frozen
class ContentPart:
    """One part of multi-part content: `{:vllm/type :text :vllm/text ".."}`, `{:vllm/type :image-url :vllm/url ".."}`,
    `{:vllm/type :input-audio :vllm/data "<base64>" :vllm/format :wav}`, `{:vllm/type :input-video :vllm/url ..}`
    (llama.cpp), `{:vllm/type :image-embeds :vllm/data "<base64 tensor>"}` (vLLM). Which types an engine takes:
    each dialect's `part_types`."""

    type: str = edn_field("vllm/type", KW(*PART_TYPES), default=REQUIRED)
    text: str | None = edn_field("vllm/text", STR)
    url: str | None = edn_field("vllm/url", STR)
    detail: str | None = edn_field("vllm/detail", STR)
    data: str | None = edn_field("vllm/data", STR)
    format: str | None = edn_field("vllm/format", WORD)
    path: str | None = edn_field("vllm/path", STR)  # a local file, read into the part before sending (`_media`)


@register
@attrs.frozen
class Message:
    role: str = edn_field("vllm/role", KW(*ROLES), default=REQUIRED)
    content: str | tuple[ContentPart, ...] | None = edn_field("vllm/content", ONE_OF(STR, MANY(NESTED(ContentPart))))
    name: str | None = edn_field("vllm/name", STR)
    tool_call_id: str | None = edn_field("vllm/tool-call-id", STR)
    tool_calls: tuple[ToolCall, ...] | None = edn_field("vllm/tool-calls", MANY(NESTED(ToolCall)))
    reasoning: str | None = edn_field("vllm/reasoning-content", STR)


@share_structured
@register
@attrs.frozen
class Sampling:
    """Sampling knobs; the table in `_sampling.py` gives wire names and bounds."""

    temperature: float | None = edn_field("vllm/temperature", NUM)
    top_p: float | None = edn_field("vllm/top-p", NUM)
    top_k: int | None = edn_field("vllm/top-k", INT)
    min_p: float | None = edn_field("vllm/min-p", NUM)
    max_tokens: int | None = edn_field("vllm/max-tokens", INT)
    n: int | None = edn_field("vllm/n", INT)
    best_of: int | None = edn_field("vllm/best-of", INT)
    presence_penalty: float | None = edn_field("vllm/presence-penalty", NUM)
    frequency_penalty: float | None = edn_field("vllm/frequency-penalty", NUM)
    repetition_penalty: float | None = edn_field("vllm/repetition-penalty", NUM)
    stop: str | tuple[str, ...] | None = edn_field("vllm/stop", ONE_OF(STR, MANY(STR)))
    seed: int | None = edn_field("vllm/seed", INT)
    logprobs: int | bool | None = edn_field("vllm/logprobs", INT_OR_BOOL)
    guided_json: Edn = edn_field("vllm/guided-json", ONE_OF(STR, JSON))
    guided_regex: str | None = edn_field("vllm/guided-regex", STR)
    guided_choice: tuple[str, ...] | None = edn_field("vllm/guided-choice", MANY(STR))




@register
@attrs.frozen
class ChatRequest:
    messages: tuple[Message, ...] = edn_field("vllm/messages", MANY(NESTED(Message)), default=REQUIRED)
    model: str | None = edn_field("vllm/model", STR)
    sampling: Sampling | None = edn_field("vllm/sampling", NESTED(Sampling))
    stream: bool | None = edn_field("vllm/stream", BOOL)
    tools: Edn = edn_field("vllm/tools", JSON)
    tool_choice: Edn = edn_field("vllm/tool-choice", JSON)
    base_url: str | None = edn_field("vllm/base-url", STR)
    deadline_s: float | None = edn_field("vllm/deadline-s", NUM)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    extras: dict[str, Edn] = extras_field(ENGINE_NAMESPACES, SHARED_KEYS)
    endpoint = "chat"


@register
@attrs.frozen
class CompletionRequest:
    """OpenAI-style text completion (`/v1/completions`)."""

    prompt: str | tuple[int, ...] = edn_field("vllm/prompt", ONE_OF(STR, MANY(INT)), default=REQUIRED)
    model: str | None = edn_field("vllm/model", STR)
    sampling: Sampling | None = edn_field("vllm/sampling", NESTED(Sampling))
    stream: bool | None = edn_field("vllm/stream", BOOL)
    base_url: str | None = edn_field("vllm/base-url", STR)
    deadline_s: float | None = edn_field("vllm/deadline-s", NUM)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    extras: dict[str, Edn] = extras_field(ENGINE_NAMESPACES, SHARED_KEYS)
    endpoint = "completion"


@register
@attrs.frozen
class GenerateRequest:
    """The engine's native generation route: llama.cpp `/completion`, SGLang `/generate`."""

    prompt: str | tuple[int, ...] = edn_field("vllm/prompt", ONE_OF(STR, MANY(INT)), default=REQUIRED)
    model: str | None = edn_field("vllm/model", STR)
    sampling: Sampling | None = edn_field("vllm/sampling", NESTED(Sampling))
    stream: bool | None = edn_field("vllm/stream", BOOL)
    base_url: str | None = edn_field("vllm/base-url", STR)
    deadline_s: float | None = edn_field("vllm/deadline-s", NUM)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    extras: dict[str, Edn] = extras_field(ENGINE_NAMESPACES, SHARED_KEYS)
    endpoint = "generate"


@register
@attrs.frozen
class EmbeddingRequest:
    input: str | tuple[str, ...] = edn_field("vllm/input", ONE_OF(STR, MANY(STR)), default=REQUIRED)
    model: str | None = edn_field("vllm/model", STR)
    dimensions: int | None = edn_field("vllm/dimensions", INT)  # a Matryoshka model's shorter vector
    # :base64 answers are decoded to floats here: the typed answer is the same either way
    encoding_format: str | None = edn_field("vllm/encoding-format", KW("float", "base64"))
    base_url: str | None = edn_field("vllm/base-url", STR)
    deadline_s: float | None = edn_field("vllm/deadline-s", NUM)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    extras: dict[str, Edn] = extras_field(ENGINE_NAMESPACES, SHARED_KEYS)
    stream = None
    sampling = None
    endpoint = "embedding"


@register
@attrs.frozen
class TokenizeRequest:
    text: str = edn_field("vllm/text", STR, default=REQUIRED)
    model: str | None = edn_field("vllm/model", STR)
    add_special: bool | None = edn_field("vllm/add-special", BOOL)
    base_url: str | None = edn_field("vllm/base-url", STR)
    deadline_s: float | None = edn_field("vllm/deadline-s", NUM)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    extras: dict[str, Edn] = extras_field(ENGINE_NAMESPACES, SHARED_KEYS)
    stream = None
    sampling = None
    endpoint = "tokenize"


@register
@attrs.frozen
class DetokenizeRequest:
    tokens: tuple[int, ...] = edn_field("vllm/tokens", MANY(INT), default=REQUIRED)
    model: str | None = edn_field("vllm/model", STR)
    base_url: str | None = edn_field("vllm/base-url", STR)
    deadline_s: float | None = edn_field("vllm/deadline-s", NUM)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    extras: dict[str, Edn] = extras_field(ENGINE_NAMESPACES, SHARED_KEYS)
    stream = None
    sampling = None
    endpoint = "detokenize"


# ------------------------------------------------------------------ pooling-model endpoints


class _NotStreamed:
    """A request answered whole, with no sampling."""

    stream = None
    sampling = None


class _ControlCall(_NotStreamed):
    """A server-control request: it names no model."""

    model = None


@register
@attrs.frozen
class RerankRequest(_NotStreamed):
    """Documents ranked against a query (`/v1/rerank`: vLLM, SGLang, llama.cpp started with `--rerank`)."""

    query: str = edn_field("vllm/query", STR, default=REQUIRED)
    documents: tuple[str, ...] = edn_field("vllm/documents", MANY(STR), default=REQUIRED)
    top_n: int | None = edn_field("vllm/top-n", INT)
    model: str | None = edn_field("vllm/model", STR)
    base_url: str | None = edn_field("vllm/base-url", STR)
    deadline_s: float | None = edn_field("vllm/deadline-s", NUM)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    extras: dict[str, Edn] = extras_field(ENGINE_NAMESPACES)
    endpoint = "rerank"


@register
@attrs.frozen
class ScoreRequest(_NotStreamed):
    """Pairwise scores of `text_1` against `text_2` (vLLM `/score`; one text against many, or pairwise)."""

    text_1: str | tuple[str, ...] = edn_field("vllm/text-1", ONE_OF(STR, MANY(STR)), default=REQUIRED)
    text_2: str | tuple[str, ...] = edn_field("vllm/text-2", ONE_OF(STR, MANY(STR)), default=REQUIRED)
    model: str | None = edn_field("vllm/model", STR)
    base_url: str | None = edn_field("vllm/base-url", STR)
    deadline_s: float | None = edn_field("vllm/deadline-s", NUM)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    extras: dict[str, Edn] = extras_field(ENGINE_NAMESPACES)
    endpoint = "score"


@register
@attrs.frozen
class ClassifyRequest(_NotStreamed):
    """Class probabilities per input (vLLM `/classify`, a sequence-classification model)."""

    input: str | tuple[str, ...] = edn_field("vllm/input", ONE_OF(STR, MANY(STR)), default=REQUIRED)
    model: str | None = edn_field("vllm/model", STR)
    base_url: str | None = edn_field("vllm/base-url", STR)
    deadline_s: float | None = edn_field("vllm/deadline-s", NUM)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    extras: dict[str, Edn] = extras_field(ENGINE_NAMESPACES)
    endpoint = "classify"


POOLING_TASKS = ("embed", "classify", "score", "token-embed", "token-classify")


@register
@attrs.frozen
class PoolingRequest(_NotStreamed):
    """The pooler's raw output per input (vLLM `/pooling`); `task` picks the pooler where a model has several."""

    input: str | tuple[str, ...] = edn_field("vllm/input", ONE_OF(STR, MANY(STR)), default=REQUIRED)
    task: str | None = edn_field("vllm/task", KW(*POOLING_TASKS))
    model: str | None = edn_field("vllm/model", STR)
    base_url: str | None = edn_field("vllm/base-url", STR)
    deadline_s: float | None = edn_field("vllm/deadline-s", NUM)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    extras: dict[str, Edn] = extras_field(ENGINE_NAMESPACES)
    endpoint = "pooling"


# ------------------------------------------------------------------ server control (LoRA adapters, caches)


@register
@attrs.frozen
class LoraListRequest(_ControlCall):
    """The LoRA adapters the server holds (vLLM and SGLang: `/v1/models` entries with a parent; llama.cpp `GET /lora-adapters`)."""

    base_url: str | None = edn_field("vllm/base-url", STR)
    deadline_s: float | None = edn_field("vllm/deadline-s", NUM)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    extras: dict[str, Edn] = extras_field(ENGINE_NAMESPACES)
    endpoint = "lora-list"


@register
@attrs.frozen
class LoraLoadRequest(_ControlCall):
    """Load an adapter at run time (vLLM `/v1/load_lora_adapter`, SGLang `/load_lora_adapter`)."""

    lora_name: str = edn_field("vllm/lora-name", STR, default=REQUIRED)
    lora_path: str = edn_field("vllm/lora-path", STR, default=REQUIRED)
    base_url: str | None = edn_field("vllm/base-url", STR)
    deadline_s: float | None = edn_field("vllm/deadline-s", NUM)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    extras: dict[str, Edn] = extras_field(ENGINE_NAMESPACES)
    endpoint = "lora-load"


@register
@attrs.frozen
class LoraUnloadRequest(_ControlCall):
    lora_name: str = edn_field("vllm/lora-name", STR, default=REQUIRED)
    base_url: str | None = edn_field("vllm/base-url", STR)
    deadline_s: float | None = edn_field("vllm/deadline-s", NUM)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    extras: dict[str, Edn] = extras_field(ENGINE_NAMESPACES)
    endpoint = "lora-unload"


@register
@attrs.frozen
class LoraScale:
    id: int = edn_field("vllm/id", INT, default=REQUIRED)
    scale: float = edn_field("vllm/scale", NUM, default=REQUIRED)


@register
@attrs.frozen
class LoraScaleRequest(_ControlCall):
    """Set the global scale of adapters loaded at start (llama.cpp `POST /lora-adapters`; 0 switches one off)."""

    adapters: tuple[LoraScale, ...] = edn_field("vllm/adapters", MANY(NESTED(LoraScale)), default=REQUIRED)
    base_url: str | None = edn_field("vllm/base-url", STR)
    deadline_s: float | None = edn_field("vllm/deadline-s", NUM)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    extras: dict[str, Edn] = extras_field(ENGINE_NAMESPACES)
    endpoint = "lora-scale"


@register
@attrs.frozen
class CacheResetRequest(_ControlCall):
    """Drop the whole prefix cache (vLLM `/reset_prefix_cache`, SGLang `/flush_cache`)."""

    base_url: str | None = edn_field("vllm/base-url", STR)
    deadline_s: float | None = edn_field("vllm/deadline-s", NUM)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    extras: dict[str, Edn] = extras_field(ENGINE_NAMESPACES)
    endpoint = "cache-reset"


SLOT_ACTIONS = ("save", "restore", "erase")


@register
@attrs.frozen
class SlotRequest(_ControlCall):
    """Save, restore or erase one slot's cache (llama.cpp `/slots/{id}?action=..`, needs `--slot-save-path`).
    `filename` (save, restore) is a bare name inside the server's slot-save directory."""

    action: str = edn_field("vllm/action", KW(*SLOT_ACTIONS), default=REQUIRED)
    slot_id: int = edn_field("vllm/slot-id", INT, default=REQUIRED)
    filename: str | None = edn_field("vllm/filename", STR)
    base_url: str | None = edn_field("vllm/base-url", STR)
    deadline_s: float | None = edn_field("vllm/deadline-s", NUM)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    extras: dict[str, Edn] = extras_field(ENGINE_NAMESPACES)
    endpoint = "slot"


TextRequest = Union[ChatRequest, CompletionRequest, GenerateRequest]
"""The requests answered with generated text (a `Response`); the ones that can stream."""
Request = Union[ChatRequest, CompletionRequest, GenerateRequest, EmbeddingRequest, TokenizeRequest,
                DetokenizeRequest, RerankRequest, ScoreRequest, ClassifyRequest, PoolingRequest, LoraListRequest,
                LoraLoadRequest, LoraUnloadRequest, LoraScaleRequest, CacheResetRequest, SlotRequest]
TEXT_REQUESTS = (ChatRequest, CompletionRequest, GenerateRequest)
CONTROL_REQUESTS = (LoraListRequest, LoraLoadRequest, LoraUnloadRequest, LoraScaleRequest, CacheResetRequest,
                    SlotRequest)
REQUEST_TYPES = (ChatRequest, CompletionRequest, GenerateRequest, EmbeddingRequest, TokenizeRequest, DetokenizeRequest,
                 RerankRequest, ScoreRequest, ClassifyRequest, PoolingRequest, LoraListRequest, LoraLoadRequest,
                 LoraUnloadRequest, LoraScaleRequest, CacheResetRequest, SlotRequest)
REQUEST_CLASSES: dict[str, type[Request]] = {c.endpoint: c for c in REQUEST_TYPES}


# ------------------------------------------------------------------ responses


@register
@attrs.frozen
class Usage:
    prompt_tokens: int | None = edn_field("vllm/prompt-tokens", INT)
    completion_tokens: int | None = edn_field("vllm/completion-tokens", INT)
    total_tokens: int | None = edn_field("vllm/total-tokens", INT)
    cached_tokens: int | None = edn_field("vllm/cached-tokens", INT)
    reasoning_tokens: int | None = edn_field("vllm/reasoning-tokens", INT)


@register
@attrs.frozen
class Figure:
    """One measured figure and where it came from. Unmeasured: every number nil, provenance :unavailable."""

    provenance: str = edn_field("vllm/provenance", KW(*PROVENANCES), default="unavailable")
    tokens: int | None = edn_field("vllm/tokens", INT)
    ms: float | None = edn_field("vllm/ms", NUM)
    tokens_per_s: float | None = edn_field("vllm/tokens-per-s", NUM)
    gaps_ms: tuple[float, ...] | None = edn_field("vllm/gaps-ms", MANY(NUM))
    # provenance :computed: the server's fields the numbers were worked out from (e.g. "usage.prompt_tokens")
    computed_from: tuple[str, ...] | None = edn_field("vllm/computed-from", MANY(STR))


UNAVAILABLE = Figure()


@register
@attrs.frozen
class Timings:
    """DESIGN §5: prefill and decode apart, cached prompt tokens, client-side TTFT, gaps and end-to-end."""

    prefill: Figure = edn_field("vllm/prefill", NESTED(Figure), default=UNAVAILABLE)
    decode: Figure = edn_field("vllm/decode", NESTED(Figure), default=UNAVAILABLE)
    cached: Figure = edn_field("vllm/cached", NESTED(Figure), default=UNAVAILABLE)
    ttft: Figure = edn_field("vllm/ttft", NESTED(Figure), default=UNAVAILABLE)
    inter_token: Figure = edn_field("vllm/inter-token", NESTED(Figure), default=UNAVAILABLE)
    end_to_end: Figure = edn_field("vllm/end-to-end", NESTED(Figure), default=UNAVAILABLE)
    queue: Figure = edn_field("vllm/queue", NESTED(Figure), default=UNAVAILABLE)  # waiting in the server's queue


@register
@attrs.frozen
class Choice:
    index: int = edn_field("vllm/index", INT, default=0)
    text: str | None = edn_field("vllm/text", STR)
    # the server's spelling ("tool_calls"); EDN :tool_calls, or a string when it is no keyword
    finish_reason: str | None = edn_field("vllm/finish-reason", WORD)
    tool_calls: tuple[ToolCall, ...] | None = edn_field("vllm/tool-calls", MANY(NESTED(ToolCall)))
    reasoning: str | None = edn_field("vllm/reasoning-content", STR)
    logprobs: Edn = edn_field("vllm/logprobs", JSON)


RESPONSE_EXTRA_NS = ("llamacpp", "sglang", "vllm-server", "openai", "capacity", "pool", "kotoba")


@register
@attrs.frozen
class Response:
    """A normalized completion/chat/generate answer, plus which server answered and timings."""

    text: str | None = edn_field("vllm/text", STR)
    choices: tuple[Choice, ...] = edn_field("vllm/choices", MANY(NESTED(Choice)), default=())
    id: str | None = edn_field("vllm/id", STR)
    model: str | None = edn_field("vllm/model", STR)
    usage: Usage | None = edn_field("vllm/usage", NESTED(Usage))
    backend: str | None = edn_field("vllm/backend", KW(*BACKENDS))
    endpoint: str | None = edn_field("vllm/endpoint", KW(*ENDPOINTS))
    endpoint_url: str | None = edn_field("vllm/endpoint-url", STR)
    timings: Timings | None = edn_field("vllm/timings", NESTED(Timings))
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    server_request_id: str | None = edn_field("vllm/server-request-id", STR)  # the server's x-request-id
    sends: int | None = edn_field("vllm/sends", INT)  # set when the request went out more than once
    created: int | None = edn_field("vllm/created", INT)
    system_fingerprint: str | None = edn_field("vllm/system-fingerprint", STR)
    extras: dict[str, Edn] = extras_field(RESPONSE_EXTRA_NS)

    @property
    def finish_reason(self) -> str | None:
        return self.choices[0].finish_reason if self.choices else None

    @property
    def reasoning(self) -> str | None:
        """The first choice's reasoning (a reasoning parser's `reasoning` / `reasoning_content`), if any.
        An answer that is all reasoning (the parser found no end of thinking, e.g. vLLM's qwen3 parser
        without `</think>`) has `text == ""` and its whole output here."""
        return self.choices[0].reasoning if self.choices else None


@register
@attrs.frozen
class StreamDelta:
    """`{:vllm/delta "He" :vllm/finish-reason nil}`: one increment of streamed text.

    Both keys are always written, as the Clojure library writes them; a delta with no text
    (the last one, carrying only the finish reason) is `:vllm/delta nil` in EDN and "" here.
    """

    delta: str = edn_field("vllm/delta", TEXT_OR_NIL, default="", always=True)
    finish_reason: str | None = edn_field("vllm/finish-reason", WORD, always=True)
    index: int | None = edn_field("vllm/index", INT)
    reasoning: str | None = edn_field("vllm/reasoning-delta", STR)
    tool_calls: Edn = edn_field("vllm/tool-call-deltas", JSON)
    logprobs: Edn = edn_field("vllm/logprobs", JSON)  # this chunk's logprobs, in the server's shape


# A stream makes one StreamDelta per chunk: attrs' frozen __init__ sets each slot through a guarded
# `object.__setattr__` (the largest part of assembling a chunk); the slots' own setters do the same work.
_NEW_DELTA = object.__new__
_SET_DELTA, _SET_FINISH, _SET_INDEX, _SET_REASONING, _SET_TOOLS, _SET_LOGPROBS = (  # a new field fails here
    StreamDelta.__dict__[f.name].__set__ for f in attrs.fields(StreamDelta))


def stream_delta(delta: str, finish_reason: str | None, index: int | None, reasoning: str | None = None,
                 tool_calls: Edn = None, logprobs: Edn = None) -> StreamDelta:
    """`StreamDelta(...)` (equal, same class), built at the cost of a plain object: the assemblers' hot path."""
    d = _NEW_DELTA(StreamDelta)
    _SET_DELTA(d, delta)
    _SET_FINISH(d, finish_reason)
    _SET_INDEX(d, index)
    _SET_REASONING(d, reasoning)
    _SET_TOOLS(d, tool_calls)
    _SET_LOGPROBS(d, logprobs)
    return d


@register
@attrs.frozen
class EmbeddingResponse:
    embeddings: tuple[tuple[float, ...], ...] = edn_field("vllm/embeddings", MANY(MANY(NUM)), default=REQUIRED)
    model: str | None = edn_field("vllm/model", STR)
    usage: Usage | None = edn_field("vllm/usage", NESTED(Usage))
    backend: str | None = edn_field("vllm/backend", KW(*BACKENDS))
    endpoint_url: str | None = edn_field("vllm/endpoint-url", STR)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    id: str | None = edn_field("vllm/id", STR)  # vLLM: "embd-" and the request id it used
    server_request_id: str | None = edn_field("vllm/server-request-id", STR)
    sends: int | None = edn_field("vllm/sends", INT)


@register
@attrs.frozen
class TokenizeResponse:
    tokens: tuple[int, ...] = edn_field("vllm/tokens", MANY(INT), default=REQUIRED)
    backend: str | None = edn_field("vllm/backend", KW(*BACKENDS))
    endpoint_url: str | None = edn_field("vllm/endpoint-url", STR)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))


@register
@attrs.frozen
class DetokenizeResponse:
    text: str = edn_field("vllm/text", STR, default=REQUIRED)
    backend: str | None = edn_field("vllm/backend", KW(*BACKENDS))
    endpoint_url: str | None = edn_field("vllm/endpoint-url", STR)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))


@register
@attrs.frozen
class ModelInfo:
    id: str = edn_field("vllm/id", STR, default=REQUIRED)
    owned_by: str | None = edn_field("vllm/owned-by", STR)
    max_model_len: int | None = edn_field("vllm/max-model-len", INT)


@register
@attrs.frozen
class ModelsResponse:
    models: tuple[ModelInfo, ...] = edn_field("vllm/models", MANY(NESTED(ModelInfo)), default=())
    backend: str | None = edn_field("vllm/backend", KW(*BACKENDS))
    endpoint_url: str | None = edn_field("vllm/endpoint-url", STR)


@register
@attrs.frozen
class Health:
    ok: bool = edn_field("vllm/ok", BOOL, default=REQUIRED)
    status: int | None = edn_field("vllm/status", INT)
    backend: str | None = edn_field("vllm/backend", KW(*BACKENDS))
    endpoint_url: str | None = edn_field("vllm/endpoint-url", STR)
    detail: str | None = edn_field("vllm/detail", STR)


@register
@attrs.frozen
class RerankResult:
    index: int = edn_field("vllm/index", INT, default=REQUIRED)  # the document's position in the request
    score: float = edn_field("vllm/score", NUM, default=REQUIRED)  # the server's relevance score
    document: str | None = edn_field("vllm/document", STR)


@register
@attrs.frozen
class RerankResponse:
    """Best first, as every engine answers; `results[i].index` is the document's position in the request."""

    results: tuple[RerankResult, ...] = edn_field("vllm/results", MANY(NESTED(RerankResult)), default=())
    id: str | None = edn_field("vllm/id", STR)
    model: str | None = edn_field("vllm/model", STR)
    usage: Usage | None = edn_field("vllm/usage", NESTED(Usage))
    backend: str | None = edn_field("vllm/backend", KW(*BACKENDS))
    endpoint_url: str | None = edn_field("vllm/endpoint-url", STR)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    server_request_id: str | None = edn_field("vllm/server-request-id", STR)  # the server's x-request-id
    sends: int | None = edn_field("vllm/sends", INT)


@register
@attrs.frozen
class ScoreResponse:
    scores: tuple[float, ...] = edn_field("vllm/scores", MANY(NUM), default=())  # in pair order
    id: str | None = edn_field("vllm/id", STR)
    model: str | None = edn_field("vllm/model", STR)
    usage: Usage | None = edn_field("vllm/usage", NESTED(Usage))
    backend: str | None = edn_field("vllm/backend", KW(*BACKENDS))
    endpoint_url: str | None = edn_field("vllm/endpoint-url", STR)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    server_request_id: str | None = edn_field("vllm/server-request-id", STR)  # the server's x-request-id
    sends: int | None = edn_field("vllm/sends", INT)


@register
@attrs.frozen
class ClassifyResult:
    index: int = edn_field("vllm/index", INT, default=REQUIRED)
    label: str | None = edn_field("vllm/label", STR)
    probs: tuple[float, ...] = edn_field("vllm/probs", MANY(NUM), default=())
    num_classes: int | None = edn_field("vllm/num-classes", INT)


@register
@attrs.frozen
class ClassifyResponse:
    results: tuple[ClassifyResult, ...] = edn_field("vllm/results", MANY(NESTED(ClassifyResult)), default=())
    id: str | None = edn_field("vllm/id", STR)
    model: str | None = edn_field("vllm/model", STR)
    usage: Usage | None = edn_field("vllm/usage", NESTED(Usage))
    backend: str | None = edn_field("vllm/backend", KW(*BACKENDS))
    endpoint_url: str | None = edn_field("vllm/endpoint-url", STR)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    server_request_id: str | None = edn_field("vllm/server-request-id", STR)  # the server's x-request-id
    sends: int | None = edn_field("vllm/sends", INT)


@register
@attrs.frozen
class PoolingResponse:
    """One pooler output per input, in input order, as the server shaped it (a vector, or one per token)."""

    data: tuple[Edn, ...] = edn_field("vllm/data", MANY(JSON), default=())
    id: str | None = edn_field("vllm/id", STR)
    model: str | None = edn_field("vllm/model", STR)
    usage: Usage | None = edn_field("vllm/usage", NESTED(Usage))
    backend: str | None = edn_field("vllm/backend", KW(*BACKENDS))
    endpoint_url: str | None = edn_field("vllm/endpoint-url", STR)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))
    server_request_id: str | None = edn_field("vllm/server-request-id", STR)  # the server's x-request-id
    sends: int | None = edn_field("vllm/sends", INT)


@register
@attrs.frozen
class LoraAdapter:
    name: str | None = edn_field("vllm/name", STR)  # vLLM, SGLang: the name requests use as model
    path: str | None = edn_field("vllm/path", STR)
    id: int | None = edn_field("vllm/id", INT)  # llama.cpp: the index requests and scales use
    scale: float | None = edn_field("vllm/scale", NUM)


@register
@attrs.frozen
class LoraAdaptersResponse:
    adapters: tuple[LoraAdapter, ...] = edn_field("vllm/adapters", MANY(NESTED(LoraAdapter)), default=())
    backend: str | None = edn_field("vllm/backend", KW(*BACKENDS))
    endpoint_url: str | None = edn_field("vllm/endpoint-url", STR)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))


@register
@attrs.frozen
class ControlResponse:
    """What a control call (LoRA load/unload/scale, cache reset, slot action) answered: `ok`, the server's
    own words (`message`: its text answer or error message) and its JSON answer whole (`detail`)."""

    endpoint: str = edn_field("vllm/endpoint", KW(*ENDPOINTS), default=REQUIRED)
    ok: bool = edn_field("vllm/ok", BOOL, default=REQUIRED)
    message: str | None = edn_field("vllm/message", STR)
    detail: Edn = edn_field("vllm/detail", JSON)
    backend: str | None = edn_field("vllm/backend", KW(*BACKENDS))
    endpoint_url: str | None = edn_field("vllm/endpoint-url", STR)
    request_id: str | int | None = edn_field("vllm/request-id", ONE_OF(STR, INT))


AnyResponse = Union[Response, EmbeddingResponse, TokenizeResponse, DetokenizeResponse, RerankResponse, ScoreResponse,
                    ClassifyResponse, PoolingResponse, LoraAdaptersResponse, ControlResponse]
# answers that carry the server's own request id (its x-request-id) and how many times the request went out
SERVER_ID_ANSWERS = (Response, EmbeddingResponse, RerankResponse, ScoreResponse, ClassifyResponse, PoolingResponse)


T = TypeVar("T")


def to_edn(obj: attrs.AttrsInstance) -> dict[Keyword, Edn]:
    """Typed value -> EDN data (a dict with Keyword keys)."""
    out: dict[Keyword, Edn] = edn_converter.unstructure(obj)
    return out


def from_edn(m: object, cls: type[T]) -> T:
    """EDN data -> typed value; anything else, or EDN of the wrong shape, raises `StructureError`
    with located problems."""
    return edn_converter.structure(plain_edn(m), cls)


_ = Keyword  # re-exported for typing users
