"""The JSON the engines answer, as the assemblers read it: the keys looked into are typed, every value
the code checks itself (a count, a name, a finish reason) is `object`. A decoded answer is given one of
these once it is known to be a JSON object; what a bad server puts under a key is still checked where
it is read (a wrong shape is a ProtocolError, never a crash)."""

from __future__ import annotations

from typing import TypedDict


class ChoiceChunkJson(TypedDict, total=False):
    """One choice of an OpenAI-style stream chunk (`chat.completion.chunk` / `text_completion`)."""

    index: object
    delta: object  # chat: {"content", "reasoning_content", "tool_calls"}; completion streams carry `text`
    text: object
    logprobs: object
    finish_reason: object


class ChunkJson(TypedDict, total=False):
    """An OpenAI-style stream chunk, and the header fields of a whole answer."""

    id: object
    model: object
    created: object
    system_fingerprint: object
    usage: object
    choices: list[ChoiceChunkJson]


class SglangMetaJson(TypedDict, total=False):
    """SGLang's `meta_info` (the counts and spans `_timings.sglang_server_timings` reads are checked there)."""

    id: object
    finish_reason: object  # {"type": "length" | "stop" | "abort", "message", "status_code"}
    prompt_tokens: object
    completion_tokens: object
    cached_tokens: object


class SglangGenerateJson(TypedDict, total=False):
    """SGLang `/generate`: one answer, or one chunk of its stream."""

    text: str
    output_ids: object
    meta_info: SglangMetaJson


class LlamacppCompletionJson(TypedDict, total=False):
    """llama.cpp `/completion`: one answer, or one chunk of its stream (the last with `stop` and `timings`)."""

    content: str
    stop: bool
    stop_type: str  # "eos" | "word" | "limit" | "none"
    model: object
    timings: object
    tokens_evaluated: object
    tokens_predicted: object
