"""Bench workloads: prompts from flags or an EDN file, long prompts, cache-busting nonces (pure)."""

from __future__ import annotations

import attrs

from .._edn import Form, read_file
from .._errors import PromptError
from .._model import ChatRequest, CompletionRequest, GenerateRequest, Message, Sampling
from .._requests import request_from_edn

BenchRequest = ChatRequest | CompletionRequest | GenerateRequest

# Varied words so a long prompt is not one repeated token (which some engines compress or cache).
_WORDS = ("river stone lantern orchard copper meadow harbor thistle glacier saffron "
          "cobalt willow ember falcon quarry juniper marble tundra velvet canyon").split()


def chat(text: str) -> ChatRequest:
    return ChatRequest(messages=(Message(role="user", content=text),))


def long_text(words: int) -> str:
    return " ".join(_WORDS[(i * 7 + i // len(_WORDS)) % len(_WORDS)] for i in range(max(words, 1)))


def load_prompts(path: str) -> list[BenchRequest]:
    """An EDN file of strings (user messages) and/or `:vllm/*` request maps (chat, completion,
    generate), top-level or in one vector."""
    forms = read_file(path)
    items: list[Form] = []
    for f in forms:
        if isinstance(f.value, (list, tuple)) and len(forms) == 1:
            items.extend(f.nested(v) for v in f.value)
        else:
            items.append(f)
    out: list[BenchRequest] = []
    for f in items:
        if isinstance(f.value, str):
            out.append(chat(f.value))
            continue
        req, problems = request_from_edn(f.value, f)
        errors = [p for p in problems if p.is_error]
        if req is None or errors:
            raise PromptError(f"{f.where}: " + "; ".join(str(p) for p in errors or problems))
        if not isinstance(req, (ChatRequest, CompletionRequest, GenerateRequest)):
            raise PromptError(f"{f.where}: bench sends chat, completion or generate requests, not {req.endpoint}")
        out.append(req)
    if not out:
        raise PromptError(f"{path}: no prompts")
    return out


def with_nonce(req: BenchRequest, nonce: str) -> BenchRequest:
    """Put a unique tag at the very start so no prefix cache can serve this prompt's prefill."""
    if isinstance(req, ChatRequest):
        msgs = list(req.messages)
        for i, m in enumerate(msgs):
            if isinstance(m.content, str):
                msgs[i] = attrs.evolve(m, content=f"[{nonce}] {m.content}")
                break
        return attrs.evolve(req, messages=tuple(msgs))
    if isinstance(req.prompt, str):
        return attrs.evolve(req, prompt=f"[{nonce}] {req.prompt}")
    return req


def prepared(req: BenchRequest, *, base_url: str | None, max_tokens: int | None, model: str | None,
             nonce: str | None) -> BenchRequest:
    """The request as bench sends it: streamed, to one target, with --max-tokens unless the
    request sets its own."""
    sampling = req.sampling or Sampling()
    if sampling.max_tokens is None and max_tokens is not None:
        sampling = attrs.evolve(sampling, max_tokens=max_tokens)
    # --model names what this run sends, over the file's own
    out = attrs.evolve(req, stream=True, base_url=base_url, sampling=sampling,
                       model=model if model is not None else req.model)
    return with_nonce(out, nonce) if nonce else out

