"""The `fields` exchange set: the request fields issue 31 added, sent to vLLM's and SGLang's own serving
layers (scripts/record-vllm --only fields, scripts/record-sglang --only fields) with the engine faked.

Each exchange carries its own request id, and the faked engine core / scheduler writes down what the
serving layer handed it (`:cassette/engine-received`): sampling params, priority, cache salt, request
id, prompt length. A replay test then shows the engine's own code read the wire shape the SDK sends.

- `chat-fields`, `completion-fields` (plain and streamed): min tokens, ignore EOS, logit bias, priority,
  cache salt and a request id together; SGLang also `/generate` (`generate-fields`).
- `chat-template-kwargs` and `chat-template-kwargs-absent`: the same messages with and without
  `{:enable_thinking false}` (both recording models' templates read it, as Qwen3's does).
- `extra-body`: `min_tokens` / `ignore_eos` through the unchecked pass-through.
"""

from __future__ import annotations

from .._edn import Edn, Keyword, kw
from ._recorder import Exchange, edn_request, user_chat, vllm_map

GREETING = "Hello there, world."
COUNTING = "one, two, three, four, five"
BIASED_TOKEN = 5  # a token id both recording vocabularies have
MAX_TOKENS = 8


def field_values(name: str) -> dict[Keyword, Edn]:
    """The new fields, one request's worth; the request id names the exchange."""
    return {kw("vllm/min-tokens"): 6, kw("vllm/ignore-eos"): True, kw("vllm/logit-bias"): {BIASED_TOKEN: 10},
            kw("vllm/priority"): 5, kw("vllm/cache-salt"): "salt-" + name, kw("vllm/request-id"): "kotoba-" + name}


def _greedy() -> dict[Keyword, Edn]:
    return vllm_map(temperature=0.0, max_tokens=MAX_TOKENS)


def _pair(name: str, req: dict[Keyword, Edn]) -> list[Exchange]:
    stream = {**req, kw("vllm/stream"): True, kw("vllm/request-id"): f"kotoba-{name}-stream"}
    if kw("vllm/cache-salt") in req:
        stream[kw("vllm/cache-salt")] = f"salt-{name}-stream"
    return [Exchange(name, "send", req), Exchange(name + "-stream", "send", stream)]


def field_exchanges(engine: str, model: str) -> list[Exchange]:
    def chat(name: str, **more: Edn) -> dict[Keyword, Edn]:
        return {**edn_request("chat", messages=user_chat(GREETING), model=model, sampling=_greedy()),
                kw("vllm/request-id"): "kotoba-" + name, **{kw("vllm/" + k.replace("_", "-")): v
                                                            for k, v in more.items()}}

    def with_fields(endpoint: str, name: str, **where: Edn) -> dict[Keyword, Edn]:
        return {**edn_request(endpoint, model=model, sampling=_greedy(), **where), **field_values(name)}

    out = [
        *_pair("chat-fields", with_fields("chat", "chat-fields", messages=user_chat(GREETING))),
        *_pair("completion-fields", with_fields("completion", "completion-fields", prompt=COUNTING)),
        Exchange("chat-template-kwargs", "send",
                 chat("chat-template-kwargs", chat_template_kwargs={kw("enable_thinking"): False})),
        Exchange("chat-template-kwargs-absent", "send", chat("chat-template-kwargs-absent")),
        Exchange("extra-body", "send", chat("extra-body", extra_body={"min_tokens": 5, "ignore_eos": True})),
    ]
    if engine == "sglang":
        out += _pair("generate-fields", with_fields("generate", "generate-fields", prompt=COUNTING))
    if engine == "vllm":  # a pass-through value vLLM's pydantic model refuses: its 400 names the field in `param`
        out.append(Exchange("extra-body-refused", "send",
                            chat("extra-body-refused", extra_body={"truncate_prompt_tokens": "many"})))
    return out
