"""The vLLM exchange sets, one per server configuration scripts/record-vllm starts.

- `default`: plain `vllm serve` (no parsers, no load tracking): chat and completion (plain,
  streamed, n=2, logprobs, stop strings, length), tokenize/detokenize, models, /version, health,
  the real 400s and 404, /load untracked, /metrics idle.
- `parsers`: `--enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3`.
- `busy`: `--max-num-queued-reqs 2 --max-num-queued-tokens N --enable-server-load-tracking` with two
  requests held in prefill: /load tracked, /metrics busy, the queue-full 503 (plain and streamed).
- `backlog`: the same server with one held request: the prefill-backlog 503.
- `engine-death`: the engine core dies mid-stream; what the server says during and after.

The recording model's fake engine answers a chat with its last user turn and a completion with its
prompt (tests/recording/vllm_fake_engine.py), so the text each exchange asks for is the text of
its request: tool-call markup, `<think>` spans and stop strings come from vLLM's own parsers.
"""

from __future__ import annotations


from .._edn import Edn, Keyword, kw
from ._recorder import OVERFLOW_PROMPT, Exchange
from ._recorder import edn_request as _edn
from ._recorder import user_chat as _chat
from ._recorder import vllm_map as _m

SETS = ("default", "parsers", "busy", "backlog", "engine-death")
GREETING = "Hello there, world."
COUNTING = "one, two, three, four, five"
TOOLS: list[dict[Keyword, Edn]] = [
    {kw("type"): "function",
     kw("function"): {kw("name"): "get_weather", kw("description"): "Current weather for a city",
                      kw("parameters"): {kw("type"): "object", kw("properties"): {kw("city"): {kw("type"): "string"}},
                                         kw("required"): ["city"]}}}]
TOOL_CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call>'


def _greedy(max_tokens: int = 16, **more: Edn) -> dict[Keyword, Edn]:
    return _m(temperature=0.0, max_tokens=max_tokens, **more)


def _sampled(max_tokens: int = 16, **more: Edn) -> dict[Keyword, Edn]:
    return _m(temperature=0.7, seed=42, max_tokens=max_tokens, **more)


def _pair(name: str, req: dict[Keyword, Edn]) -> list[Exchange]:
    """The exchange plain and streamed."""
    return [Exchange(name, "send", req), Exchange(name + "-stream", "send", {**req, kw("vllm/stream"): True})]


# The stop strings of chat-stop and completion-stop: text the fake engine echoes back. A real engine with
# random weights writes other text: scripts/record-vllm --real passes strings from its own greedy answers.
STOPS = (", world", ", three")


def default_set(model: str, stops: tuple[str, str] = STOPS) -> list[Exchange]:
    chat = _edn("chat", messages=_chat(GREETING), model=model, sampling=_greedy())
    comp = _edn("completion", prompt=COUNTING, model=model, sampling=_greedy())
    out = [
        Exchange("health", "health", method="GET", path="/health"),
        Exchange("models", "models", method="GET", path="/v1/models"),
        Exchange("version", "probe", method="GET", path="/version"),
        Exchange("tokenize", "send", _edn("tokenize", text="Hello, world", model=model)),
        Exchange("detokenize", "send", _edn("detokenize", tokens=[412, 14, 441], model=model)),
        *_pair("chat", chat),
        *_pair("chat-n2", {**chat, kw("vllm/sampling"): _sampled(n=2)}),
        *_pair("chat-logprobs", {**chat, kw("vllm/sampling"): _greedy(logprobs=2)}),
        *_pair("chat-stop", {**chat, kw("vllm/sampling"): _greedy(stop=[stops[0]])}),
        *_pair("chat-length", {**chat, kw("vllm/sampling"): _greedy(3)}),
        *_pair("completion", comp),
        *_pair("completion-n2", {**comp, kw("vllm/sampling"): _sampled(n=2)}),
        *_pair("completion-logprobs", {**comp, kw("vllm/sampling"): _greedy(logprobs=2)}),
        *_pair("completion-stop", {**comp, kw("vllm/sampling"): _greedy(stop=[stops[1]])}),
        # The real 400s and 404 (the SDK's own validation is bypassed: the recorder renders directly).
        *_pair("error-context-length", {**chat, kw("vllm/sampling"): _greedy(10_000_000)}),
        *_pair("error-prompt-too-long", _edn("chat", messages=_chat(" ".join([OVERFLOW_PROMPT] * 3)),
                                             model=model, sampling=_greedy())),
        *_pair("error-greedy-n2", {**chat, kw("vllm/sampling"): _greedy(n=2)}),
        *_pair("error-model-not-found", _edn("chat", messages=_chat("hi"), model="no-such-model")),
        Exchange("error-invalid-json", "raw", method="POST", path="/v1/chat/completions", body=b'{"messages": [ '),
        Exchange("load-untracked", "probe", method="GET", path="/load"),
        Exchange("metrics", "probe", method="GET", path="/metrics"),
    ]
    return out


def parsers_set(model: str) -> list[Exchange]:
    def chat(text: str, **kv: Edn) -> dict[Keyword, Edn]:
        return _edn("chat", messages=_chat(text), model=model, sampling=_greedy(64), **kv)
    return [
        *_pair("chat-tool-calls", chat(TOOL_CALL_TEXT, tools=TOOLS)),
        *_pair("chat-reasoning", chat("<think>The user wants a greeting.</think>Hello!")),
        # No `</think>`: the qwen3 parser puts the whole answer in `reasoning`, content null.
        *_pair("chat-reasoning-only", chat("The user wants a greeting.")),
    ]


def busy_set(model: str) -> list[Exchange]:
    chat = _edn("chat", messages=_chat("hi"), model=model, sampling=_greedy())
    return [
        Exchange("load-tracked", "probe", method="GET", path="/load"),
        Exchange("metrics-busy", "probe", method="GET", path="/metrics"),
        *_pair("error-engine-busy", chat),
    ]


def backlog_set(model: str) -> list[Exchange]:
    return _pair("error-prefill-backlog", _edn("chat", messages=_chat("hi"), model=model, sampling=_greedy()))


def engine_death_set(model: str) -> list[Exchange]:
    return [
        Exchange("error-in-stream", "send", _edn("chat", messages=_chat(GREETING), model=model,
                                                 sampling=_greedy(), stream=True)),
        Exchange("error-engine-dead", "send", _edn("chat", messages=_chat("hi"), model=model, sampling=_greedy())),
        Exchange("health-engine-dead", "health", method="GET", path="/health"),
    ]


def vllm_exchanges(model: str, which: str = "default") -> list[Exchange]:
    return {"default": default_set, "parsers": parsers_set, "busy": busy_set, "backlog": backlog_set,
            "engine-death": engine_death_set}[which](model)
