"""Write the DERIVED cassettes: SGLang and a router in front of an engine.

(vLLM's are recorded from vLLM 0.33.0's own serving layer by scripts/record-vllm.)
No SGLang server runs here yet, so these exchanges are written
by hand from the engines' own protocol definitions (read, not copied; the files and commits
are named in each cassette's provenance). The request side is what the SDK renders, exactly
as the recorder does; the expectations are read from the written bytes by the same plain
reader the recorder uses. Every cassette here says `:cassette/how :derived`.

    .venv/bin/python tests/cassettes/derive.py        # rewrites tests/cassettes/{sglang,router}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import attrs

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from kotoba_vllm.cassettes._expect import expect_for  # noqa: E402
from kotoba_vllm.cassettes._recorder import Exchange, _edn, _m, _wire  # noqa: E402
from kotoba_vllm._edn import Keyword, kw  # noqa: E402
from kotoba_vllm.cassettes import Cassette, write_cassette  # noqa: E402

DATE = "2026-11-30"
VLLM_MODEL = "Qwen/Qwen3-8B"
SGL_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CREATED = 1796000000

SGL_PROV = {
    kw("cassette/how"): kw("derived"),
    kw("cassette/engine-version"): "sglang main (protocol.py @004c82e0); 503 queue-full per SGLang 0.5.23 (DESIGN §4)",
    kw("cassette/date"): DATE,
    kw("cassette/source"): (
        "sgl-project/sglang read with the code index: python/sglang/srt/entrypoints/openai/protocol.py @004c82e0 "
        "(ErrorResponse{object:error,message,type,param,code}, UsageInfo with reasoning_tokens, ChatMessage."
        "reasoning_content, matched_stop, ModelCard owned_by sglang), serving_base.py, tokenizer_manager meta_info "
        "(id, finish_reason {type,..}, prompt_tokens, weight_version, total_retractions, completion_tokens, "
        "cached_tokens), scheduler _abort_on_queued_limit (finish_reason abort, status_code 503, 'The request queue "
        "is full.'), metrics collector (sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage); "
        "/generate streams cumulative text by default (DESIGN §7)"),
}
ROUTER_PROV = {
    kw("cassette/how"): kw("derived"),
    kw("cassette/engine-version"): "generic OpenAI-compatible router (no specific product)",
    kw("cassette/date"): DATE,
    kw("cassette/source"): ("written from the OpenAI-style error object and RFC 9110 §10.2.3 Retry-After "
                            "(delta-seconds and HTTP-date); a 429 answered by a router before any engine sees the "
                            "request"),
}

SSE = {"content-type": "text/event-stream; charset=utf-8"}
JSON_CT = {"content-type": "application/json"}


def j(obj: Any) -> bytes:
    """Compact JSON, as pydantic's model_dump_json / orjson / starlette's JSONResponse write it."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def sse(*objs: Any, done: bool = True) -> tuple[bytes, ...]:
    out = [b"data: " + (o if isinstance(o, bytes) else j(o)) + b"\n\n" for o in objs]
    if done:
        out.append(b"data: [DONE]\n\n")
    return tuple(out)


def chat(text: str, **kv: Any) -> dict[Keyword, Any]:
    return _edn("chat", messages=[_m(role=kw("user"), content=text)], **kv)


def make(engine: str, backend: str, prov: dict[Keyword, Any], ex: Exchange, status: int, headers: dict[str, str],
         body: bytes | None = None, chunks: tuple[bytes, ...] | None = None) -> Cassette:
    method, path, req_body, endpoint, sent_headers = _wire(ex, backend)
    raw = b"".join(chunks) if chunks is not None else (body or b"")
    call: dict[Keyword, Any] = {kw("call/op"): kw(ex.op)}
    if ex.request is not None:
        call[kw("call/request")] = ex.request
    expect = expect_for(ex.op, endpoint, backend, status, headers, raw, chunks is not None, path)
    return Cassette(name=ex.name, engine=engine, backend=backend, provenance=prov, call=call, method=method,
                    path=path, request_body=req_body, status=status, headers=headers, body=body, chunks=chunks,
                    expect=expect, request_headers=sent_headers)


SAMPLING = _m(temperature=0.7, max_tokens=16)
WEATHER_TOOL = [{kw("type"): "function", kw("function"): {
    kw("name"): "get_weather", kw("description"): "Current weather for a city",
    kw("parameters"): {kw("type"): "object", kw("properties"): {kw("city"): {kw("type"): "string"}},
                       kw("required"): ["city"]}}}]


# ------------------------------------------------------------------------------------------ vLLM


def sglang() -> list[Cassette]:
    P, M, E = SGL_PROV, SGL_MODEL, "sglang"
    cid = "0c5e2a8f4b1d4c7e9a3f6b2d8e0c4a1b"
    out = []

    def usage(p: int, c: int, reasoning: int = 0) -> dict[str, Any]:
        return {"prompt_tokens": p, "total_tokens": p + c, "completion_tokens": c, "prompt_tokens_details": None,
                "reasoning_tokens": reasoning}

    def body_chat(message: dict[str, Any], finish: str, matched: Any, u: dict[str, Any], lp: Any = None) -> bytes:
        msg = {"role": "assistant", "content": None, "reasoning_content": None, "tool_calls": None}
        msg.update(message)
        return j({"id": cid, "object": "chat.completion", "created": CREATED, "model": M,
                  "choices": [{"index": 0, "message": msg, "logprobs": lp, "finish_reason": finish,
                               "matched_stop": matched}], "usage": u, "metadata": None})

    def chunk(delta: dict[str, Any], finish: str | None = None, matched: Any = None) -> dict[str, Any]:
        d = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None}
        d.update(delta)
        return {"id": cid, "object": "chat.completion.chunk", "created": CREATED, "model": M,
                "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": finish,
                             "matched_stop": matched}], "usage": None}

    def usage_chunk(p: int, c: int) -> dict[str, Any]:
        return {"id": cid, "object": "chat.completion.chunk", "created": CREATED, "model": M, "choices": [],
                "usage": usage(p, c)}

    out.append(make(E, E, P, Exchange("chat", "send", chat("Say hello.", model=M, sampling=SAMPLING)), 200, JSON_CT,
                    body_chat({"content": "Hello! How can I help you today?"}, "stop", 128009, usage(38, 10))))
    out.append(make(E, E, P, Exchange("chat-stream", "send", chat("Say hello.", model=M, sampling=SAMPLING,
                                                                   stream=True)),
                    200, SSE, chunks=sse(chunk({"role": "assistant", "content": "Hello"}), chunk({"content": "!"}),
                                         chunk({"content": " How can I help?"}),
                                         chunk({}, "stop", 128009), usage_chunk(38, 7))))
    out.append(make(E, E, P, Exchange("completion", "send", _edn("completion", prompt="The capital of France is",
                                                                   model=M, sampling=SAMPLING)),
                    200, JSON_CT, j({"id": cid, "object": "text_completion", "created": CREATED, "model": M,
                                     "choices": [{"index": 0, "text": " Paris. It is known for the Eiffel Tower.",
                                                  "logprobs": None, "finish_reason": "length", "matched_stop": None}],
                                     "usage": usage(6, 16), "metadata": None})))

    def cchunk(text: str, finish: str | None = None) -> dict[str, Any]:
        return {"id": cid, "object": "text_completion", "created": CREATED, "model": M,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                             "matched_stop": None}], "usage": None}
    out.append(make(E, E, P, Exchange("completion-stream", "send",
                                      _edn("completion", prompt="The capital of France is", model=M,
                                           sampling=SAMPLING, stream=True)),
                    200, SSE, chunks=sse(cchunk(" Paris"), cchunk("."), cchunk(" It", "length"),
                                         {"id": cid, "object": "text_completion", "created": CREATED, "model": M,
                                          "choices": [], "usage": usage(6, 3)})))
    tool_req = chat("What is the weather in Paris?", model=M, sampling=SAMPLING, tools=WEATHER_TOOL)
    out.append(make(E, E, P, Exchange("chat-tool-calls", "send", tool_req), 200, JSON_CT, body_chat(
        {"content": None, "tool_calls": [{"id": "call_4f2a8c1e6b3d4e0a9c7b5d1f", "index": 0, "type": "function",
                                          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        "tool_calls", None, usage(210, 18))))
    out.append(make(E, E, P, Exchange("chat-reasoning", "send", chat("What is 2+2?", model=M, sampling=SAMPLING)),
                    200, JSON_CT, body_chat({"content": "4", "reasoning_content": "Adding 2 and 2 gives 4."}, "stop",
                                            151645, usage(15, 21, reasoning=12))))
    out.append(make(E, E, P, Exchange("chat-reasoning-stream", "send",
                                      chat("What is 2+2?", model=M, sampling=SAMPLING, stream=True)),
                    200, SSE, chunks=sse(chunk({"role": "assistant", "content": ""}),
                                         chunk({"reasoning_content": "Adding 2 and 2"}),
                                         chunk({"reasoning_content": " gives 4."}),
                                         chunk({"content": "4"}), chunk({}, "stop", 151645), usage_chunk(15, 21))))
    lp = {"content": [{"token": "Hi", "bytes": [72, 105], "logprob": -0.0841,
                       "top_logprobs": [{"token": "Hi", "bytes": [72, 105], "logprob": -0.0841}]}]}
    out.append(make(E, E, P, Exchange("chat-logprobs", "send",
                                      chat("Greet me.", model=M, sampling=_m(max_tokens=1, logprobs=1))),
                    200, JSON_CT, body_chat({"content": "Hi"}, "length", None, usage(12, 1), lp=lp)))

    # Native /generate: text plus meta_info; finish_reason is an object.
    rid = "b8e4f1a27c3d4e5f9a0b1c2d3e4f5a6b"

    def meta(p: int, c: int, finish: Any) -> dict[str, Any]:
        return {"id": rid, "finish_reason": finish, "prompt_tokens": p, "weight_version": "default",
                "total_retractions": 0, "completion_tokens": c, "cached_tokens": 0, "e2e_latency": 0.1873}
    gen = _edn("generate", prompt="The capital of France is", model=M, sampling=_m(temperature=0.0, max_tokens=8))
    out.append(make(E, E, P, Exchange("generate", "send", gen), 200, JSON_CT, j(
        {"text": " Paris. It is the largest city", "output_ids": [12366, 13, 1102, 374, 279, 7928, 3363, 304],
         "meta_info": meta(6, 8, {"type": "length", "length": 8})})))
    # Cumulative streaming (SGLang's default): each chunk holds the whole text so far.
    steps = [" Paris", " Paris.", " Paris. It", " Paris. It is"]
    gchunks = [{"text": t, "output_ids": [12366, 13, 1102, 374][:i + 1],
                "meta_info": meta(6, i + 1, None if i < 3 else {"type": "length", "length": 4})}
               for i, t in enumerate(steps)]
    out.append(make(E, E, P, Exchange("generate-stream", "send", {**gen, kw("vllm/stream"): True}), 200, SSE,
                    chunks=sse(*gchunks)))
    # --incremental-streaming-output: disjoint segments; the SDK detects that a chunk does not extend the text.
    inc = [" Paris", ".", " It", " is"]
    ichunks = [{"text": t, "output_ids": [[12366, 13, 1102, 374][i]],
                "meta_info": meta(6, i + 1, None if i < 3 else {"type": "length", "length": 4})}
               for i, t in enumerate(inc)]
    out.append(make(E, E, P, Exchange("generate-stream-incremental", "send", {**gen, kw("vllm/stream"): True}), 200,
                    SSE, chunks=sse(*ichunks)))
    out.append(make(E, E, P, Exchange("models", "models", method="GET", path="/v1/models"), 200, JSON_CT, j(
        {"object": "list", "data": [{"id": M, "object": "model", "created": CREATED, "owned_by": "sglang",
                                     "root": M, "parent": None, "max_model_len": 131072}]})))
    out.append(make(E, E, P, Exchange("health", "health", method="GET", path="/health"), 200, {}, b""))
    out.append(make(E, E, P, Exchange("tokenize", "send", _edn("tokenize", text="Hello, world", model=M)),
                    200, JSON_CT, j({"tokens": [9906, 11, 1917], "count": 3, "max_model_len": 131072})))
    out.append(make(E, E, P, Exchange("detokenize", "send", _edn("detokenize", tokens=[9906, 11, 1917], model=M)),
                    200, JSON_CT, j({"text": "Hello, world"})))
    out.append(make(E, E, P, Exchange("error-context-length", "send",
                                      chat("Summarise this.", model=M, sampling=_m(max_tokens=200000))),
                    400, JSON_CT, j({"object": "error", "message": "Requested token count exceeds the model's "
                                     "maximum context length of 131072 tokens. You requested a total of 200016 "
                                     "tokens: 16 tokens from the input messages and 200000 tokens for the "
                                     "completion. Please reduce the number of tokens in the input messages or the "
                                     "completion to fit within the limit.", "type": "BadRequestError",
                                     "param": None, "code": 400})))
    # The scheduler aborts with finish_reason {"type": "abort", "status_code": 503, "message": ...}; the OpenAI
    # layer turns that into ErrorResponse with the status name as its type: the body of a 503, and inside a
    # stream (HTTP 200) the same object wrapped by create_streaming_error_response as {"error": {...}}.
    queue_full = {"object": "error", "message": "The request queue is full.", "type": "SERVICE_UNAVAILABLE",
                  "param": None, "code": 503}
    out.append(make(E, E, P, Exchange("queue-full", "send", chat("hi", model=M, sampling=SAMPLING)),
                    503, JSON_CT, j(queue_full)))
    out.append(make(E, E, P, Exchange("queue-full-stream", "send", chat("hi", model=M, sampling=SAMPLING,
                                                                         stream=True)),
                    200, SSE, chunks=sse({"error": queue_full})))
    out.append(make(E, E, P, Exchange("generate-queue-full-stream", "send", {**gen, kw("vllm/stream"): True}), 200,
                    SSE, chunks=sse({"error": {"message": "The request queue is full.", "code": 503}},
                                    done=False)))
    out.append(make(E, E, P, Exchange("generate-error", "send",
                                      _edn("generate", prompt="hi", model=M, sampling=_m(max_tokens=200000))),
                    400, JSON_CT, j({"error": {"message": "The input (2 tokens) is longer than the model's context "
                                               "length (131072 tokens)."}})))
    out.append(make(E, E, P, Exchange("metrics", "probe", method="GET", path="/metrics"), 200,
                    {"content-type": "text/plain; version=0.0.4; charset=utf-8"}, SGL_METRICS.encode()))
    # Everything else is recorded from SGLang 0.5.23's real serving layer (scripts/record-sglang); these
    # depend on a model's output and parsers, which the fake scheduler does not have.
    note = {kw("cassette/note"): SGL_STILL_DERIVED_NOTE}
    return [attrs.evolve(c, provenance={**c.provenance, **note}) for c in out if c.name in SGL_STILL_DERIVED]


SGL_STILL_DERIVED = ("chat-logprobs", "chat-reasoning", "chat-reasoning-stream", "chat-tool-calls")
SGL_STILL_DERIVED_NOTE = (
    "still derived: recording tried with scripts/record-sglang (SGLang 0.5.23's real serving layer, scheduler "
    "faked); logprobs, reasoning and tool calls come from a real model's output, its logprob computation and a "
    "--reasoning-parser / --tool-call-parser matched to that model, which the fake scheduler (a fixed token "
    "pattern, no logits) cannot honestly produce")


SGL_METRICS = f"""# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{model_name="{SGL_MODEL}"}} 12.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{model_name="{SGL_MODEL}"}} 4.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{model_name="{SGL_MODEL}"}} 0.62
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{{model_name="{SGL_MODEL}"}} 812.4
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{{model_name="{SGL_MODEL}"}} 0.31
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{model_name="{SGL_MODEL}"}} 48211.0
"""


# ------------------------------------------------------------------------------------------ router


ROUTER_NOTE = (
    "still derived: recording tried with scripts/record-sglang --router; sglang-router 0.3.2 (the router package "
    "that installs from the index) is recorded as router/429-sglang-router-*: its 429 has an empty body and no "
    "Retry-After. These keep what a generic router may send (a JSON or text body, Retry-After as delta-seconds or an "
    "HTTP-date); no vLLM serving layer ran behind a router here")


def router() -> list[Cassette]:
    P = {**ROUTER_PROV, kw("cassette/note"): ROUTER_NOTE}
    body = j({"error": {"message": "Too many requests: every backend is at its concurrency limit.",
                        "type": "rate_limit_exceeded", "code": 429}})
    return [
        make("router", "vllm", P, Exchange("429-vllm-chat", "send", chat("hi", model=VLLM_MODEL, sampling=SAMPLING)),
             429, {**JSON_CT, "retry-after": "2"}, body),
        make("router", "sglang", P, Exchange("429-sglang-stream", "send",
                                             chat("hi", model=SGL_MODEL, sampling=SAMPLING, stream=True)),
             429, {**JSON_CT, "retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, body),
        make("router", "sglang", P, Exchange("429-sglang-generate-plain", "send",
                                             _edn("generate", prompt="hi", model=SGL_MODEL)),
             429, {"content-type": "text/plain; charset=utf-8", "retry-after": "1"}, b"Too Many Requests"),
    ]


def main() -> None:
    # vLLM's cassettes are recorded from its real serving layer: scripts/record-vllm.
    for engine, cassettes in (("sglang", sglang()), ("router", router())):
        d = HERE / engine
        for old in d.glob("*.edn") if d.is_dir() else ():
            if "\n :cassette/provenance {:cassette/how :derived" in old.read_text(encoding="utf-8"):
                old.unlink()  # recorded cassettes (scripts/record-*) stay
        for c in cassettes:
            write_cassette(c, d)
        print(f"{len(cassettes)} derived cassettes written to {d}", file=sys.stderr)


if __name__ == "__main__":
    main()
