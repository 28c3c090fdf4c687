"""Write the DERIVED cassettes: vLLM, SGLang and a router in front of them.

No vLLM or SGLang server can run on these CPU-only machines, so these exchanges are written
by hand from the engines' own protocol definitions (read, not copied; the files and commits
are named in each cassette's provenance). The request side is what the SDK renders, exactly
as the recorder does; the expectations are read from the written bytes by the same plain
reader the recorder uses. Every cassette here says `:cassette/how :derived`.

    .venv/bin/python tests/cassettes/derive.py        # rewrites tests/cassettes/{vllm,sglang,router}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import attrs

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from kotoba_vllm._cassette.expect import expect_for  # noqa: E402
from kotoba_vllm._cassette.recorder import Exchange, _edn, _m, _wire  # noqa: E402
from kotoba_vllm._edn import Keyword, kw  # noqa: E402
from kotoba_vllm.cassettes import Cassette, write_cassette  # noqa: E402

DATE = "2026-11-30"
VLLM_MODEL = "Qwen/Qwen3-8B"
SGL_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CREATED = 1796000000

VLLM_PROV = {
    kw("cassette/how"): kw("derived"),
    kw("cassette/engine-version"): "vllm main (split entrypoints/openai layout, post-0.12)",
    kw("cassette/date"): DATE,
    kw("cassette/source"): (
        "vllm-project/vllm read with the code index: vllm/entrypoints/openai/chat_completion/protocol.py @002032ee "
        "(ChatMessage.reasoning, ChatCompletionResponse/StreamResponse, stop_reason, token_ids), "
        "vllm/entrypoints/openai/engine/protocol.py @040a2cc2 (ErrorResponse{error:{message,type,param,code}}, "
        "UsageInfo, ModelCard), chat serving stream loop (model_dump_json(exclude_unset=True); final usage chunk "
        "with choices [] and exclude_none), vllm/v1/metrics/loggers.py (vllm:num_requests_running, "
        "vllm:num_requests_waiting, vllm:kv_cache_usage_perc, labels engine/model_name)"),
}
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
    method, path, req_body, endpoint = _wire(ex, backend)
    raw = b"".join(chunks) if chunks is not None else (body or b"")
    call: dict[Keyword, Any] = {kw("call/op"): kw(ex.op)}
    if ex.request is not None:
        call[kw("call/request")] = ex.request
    expect = expect_for(ex.op, endpoint, backend, status, headers, raw, chunks is not None, path)
    return Cassette(name=ex.name, engine=engine, backend=backend, provenance=prov, call=call, method=method,
                    path=path, request_body=req_body, status=status, headers=headers, body=body, chunks=chunks,
                    expect=expect)


SAMPLING = _m(temperature=0.7, max_tokens=16)
WEATHER_TOOL = [{kw("type"): "function", kw("function"): {
    kw("name"): "get_weather", kw("description"): "Current weather for a city",
    kw("parameters"): {kw("type"): "object", kw("properties"): {kw("city"): {kw("type"): "string"}},
                       kw("required"): ["city"]}}}]


# ------------------------------------------------------------------------------------------ vLLM


def vllm() -> list[Cassette]:
    P, M, E = VLLM_PROV, VLLM_MODEL, "vllm"
    cid = "chatcmpl-5f0e3c1a9b7d4e2f8a6c0b1d3e5f7a9c"
    usage = {"prompt_tokens": 14, "total_tokens": 23, "completion_tokens": 9, "prompt_tokens_details": None}

    def body_chat(message: dict[str, Any], finish: str, u: dict[str, Any], logprobs: Any = None) -> bytes:
        msg = {"role": "assistant", "content": None, "refusal": None, "annotations": None, "audio": None,
               "function_call": None, "reasoning": None}
        msg.update(message)
        return j({"id": cid, "object": "chat.completion", "created": CREATED, "model": M,
                  "choices": [{"index": 0, "message": msg, "logprobs": logprobs, "finish_reason": finish,
                               "stop_reason": None, "token_ids": None}],
                  "service_tier": None, "system_fingerprint": None, "usage": u, "prompt_logprobs": None,
                  "prompt_token_ids": None, "kv_transfer_params": None})

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        c: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            c["stop_reason"] = None
        c.update(extra)
        return {"id": cid, "object": "chat.completion.chunk", "created": CREATED, "model": M, "choices": [c],
                "usage": None}

    def usage_chunk(p: int, c: int) -> dict[str, Any]:
        return {"id": cid, "object": "chat.completion.chunk", "created": CREATED, "model": M, "choices": [],
                "usage": {"prompt_tokens": p, "total_tokens": p + c, "completion_tokens": c}}

    out = []
    out.append(make(E, E, P, Exchange("chat", "send", chat("Say hello in Japanese.", model=M, sampling=SAMPLING)),
                    200, JSON_CT, body_chat({"content": "こんにちは！"}, "stop", usage)))
    # Streaming: role chunk, content pieces, finish chunk, usage chunk. The Japanese text is split across
    # TCP reads in the middle of a UTF-8 character (stored base64), as a real socket may deliver it.
    parts = sse(chunk({"role": "assistant", "content": ""}), chunk({"content": "こんに"}), chunk({"content": "ちは"}),
                chunk({"content": "！"}), chunk({"content": ""}, "stop"), usage_chunk(14, 4))
    joined = b"".join(parts)
    cut = joined.index("ちは".encode()) + 1  # inside the 3-byte encoding of ち
    split = (joined[:cut], joined[cut:cut + 200], joined[cut + 200:])
    out.append(make(E, E, P, Exchange("chat-stream", "send",
                                      chat("Say hello in Japanese.", model=M, sampling=SAMPLING, stream=True)),
                    200, SSE, chunks=split))
    cmpl = "cmpl-8d2b6f0e4a1c4b7e9f3a5d7c1e0b2a4f"
    out.append(make(E, E, P, Exchange("completion", "send", _edn("completion", prompt="The capital of France is",
                                                                   model=M, sampling=SAMPLING)),
                    200, JSON_CT, j({"id": cmpl, "object": "text_completion", "created": CREATED, "model": M,
                                     "choices": [{"index": 0, "text": " Paris, a city on the Seine.", "logprobs": None,
                                                  "finish_reason": "length", "stop_reason": None, "token_ids": None,
                                                  "prompt_logprobs": None, "prompt_token_ids": None}],
                                     "service_tier": None, "system_fingerprint": None,
                                     "usage": {"prompt_tokens": 6, "total_tokens": 22, "completion_tokens": 16,
                                               "prompt_tokens_details": None}, "kv_transfer_params": None})))

    def cchunk(text: str, finish: str | None = None) -> dict[str, Any]:
        c: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            c["stop_reason"] = None
        return {"id": cmpl, "object": "text_completion", "created": CREATED, "model": M, "choices": [c],
                "usage": None}
    out.append(make(E, E, P, Exchange("completion-stream", "send",
                                      _edn("completion", prompt="The capital of France is", model=M,
                                           sampling=SAMPLING, stream=True)),
                    200, SSE, chunks=sse(cchunk(" Paris"), cchunk(","), cchunk(" of"), cchunk(" course", "length"),
                                         {"id": cmpl, "object": "text_completion", "created": CREATED, "model": M,
                                          "choices": [], "usage": {"prompt_tokens": 6, "total_tokens": 10,
                                                                   "completion_tokens": 4}})))
    tool_id = "chatcmpl-tool-3b9f1d7e2c4a4e6b8d0f2a4c6e8b0d1f"
    tool_req = chat("What is the weather in Paris?", model=M, sampling=SAMPLING, tools=WEATHER_TOOL)
    out.append(make(E, E, P, Exchange("chat-tool-calls", "send", tool_req), 200, JSON_CT, body_chat(
        {"content": None, "tool_calls": [{"id": tool_id, "type": "function",
                                          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        "tool_calls", {"prompt_tokens": 181, "total_tokens": 201, "completion_tokens": 20,
                       "prompt_tokens_details": None})))
    out.append(make(E, E, P, Exchange("chat-tool-calls-stream", "send", {**tool_req, kw("vllm/stream"): True}),
                    200, SSE, chunks=sse(
                        chunk({"role": "assistant", "content": ""}),
                        chunk({"tool_calls": [{"id": tool_id, "type": "function", "index": 0,
                                               "function": {"name": "get_weather"}}]}),
                        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": "}}]}),
                        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}),
                        chunk({"content": ""}, "tool_calls"), usage_chunk(181, 20))))
    think = "The user wants 2+2. That is 4."
    out.append(make(E, E, P, Exchange("chat-reasoning", "send", chat("What is 2+2?", model=M, sampling=SAMPLING)),
                    200, JSON_CT, body_chat({"content": "2 + 2 = 4.", "reasoning": think}, "stop",
                                            {"prompt_tokens": 12, "total_tokens": 40, "completion_tokens": 28,
                                             "prompt_tokens_details": None})))
    out.append(make(E, E, P, Exchange("chat-reasoning-stream", "send",
                                      chat("What is 2+2?", model=M, sampling=SAMPLING, stream=True)),
                    200, SSE, chunks=sse(chunk({"role": "assistant", "content": ""}),
                                         chunk({"reasoning": "The user wants 2+2."}),
                                         chunk({"reasoning": " That is 4."}),
                                         chunk({"content": "2 + 2"}), chunk({"content": " = 4."}),
                                         chunk({"content": ""}, "stop"), usage_chunk(12, 28))))
    lp = {"content": [
        {"token": "Hi", "logprob": -0.0312, "bytes": [72, 105],
         "top_logprobs": [{"token": "Hi", "logprob": -0.0312, "bytes": [72, 105]},
                          {"token": "Hello", "logprob": -3.4843, "bytes": [72, 101, 108, 108, 111]}]},
        {"token": "!", "logprob": -0.2146, "bytes": [33],
         "top_logprobs": [{"token": "!", "logprob": -0.2146, "bytes": [33]},
                          {"token": ".", "logprob": -1.6521, "bytes": [46]}]}]}
    out.append(make(E, E, P, Exchange("chat-logprobs", "send",
                                      chat("Greet me.", model=M, sampling=_m(max_tokens=2, logprobs=2))),
                    200, JSON_CT, body_chat({"content": "Hi!"}, "length",
                                            {"prompt_tokens": 11, "total_tokens": 13, "completion_tokens": 2,
                                             "prompt_tokens_details": None}, logprobs=lp)))
    out.append(make(E, E, P, Exchange("completion-logprobs", "send",
                                      _edn("completion", prompt="1, 2, 3,", model=M, sampling=_m(max_tokens=2,
                                                                                                 logprobs=1))),
                    200, JSON_CT, j({"id": cmpl, "object": "text_completion", "created": CREATED, "model": M,
                                     "choices": [{"index": 0, "text": " 4,", "finish_reason": "length",
                                                  "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
                                                  "prompt_token_ids": None,
                                                  "logprobs": {"text_offset": [0, 2], "token_logprobs": [-0.0051,
                                                                                                        -0.0007],
                                                               "tokens": [" 4", ","],
                                                               "top_logprobs": [{" 4": -0.0051}, {",": -0.0007}]}}],
                                     "service_tier": None, "system_fingerprint": None,
                                     "usage": {"prompt_tokens": 7, "total_tokens": 9, "completion_tokens": 2,
                                               "prompt_tokens_details": None}, "kv_transfer_params": None})))
    out.append(make(E, E, P, Exchange("models", "models", method="GET", path="/v1/models"), 200, JSON_CT, j(
        {"object": "list", "data": [{"id": M, "object": "model", "created": CREATED, "owned_by": "vllm", "root": M,
                                     "parent": None, "max_model_len": 32768, "permission": [
                                         {"id": "modelperm-7c1e3a5b9d0f4b2c8e6a4c2e0b8d6f4a",
                                          "object": "model_permission", "created": CREATED,
                                          "allow_create_engine": False, "allow_sampling": True,
                                          "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                          "allow_fine_tuning": False, "organization": "*", "group": None,
                                          "is_blocking": False}]}]})))
    out.append(make(E, E, P, Exchange("health", "health", method="GET", path="/health"), 200, {}, b""))
    out.append(make(E, E, P, Exchange("tokenize", "send", _edn("tokenize", text="Hello, world", model=M)),
                    200, JSON_CT, j({"count": 3, "max_model_len": 32768, "tokens": [9707, 11, 1879],
                                     "token_strs": None})))
    out.append(make(E, E, P, Exchange("detokenize", "send", _edn("detokenize", tokens=[9707, 11, 1879], model=M)),
                    200, JSON_CT, j({"prompt": "Hello, world"})))
    out.append(make(E, E, P, Exchange("error-context-length", "send",
                                      chat("Summarise this.", model=M, sampling=_m(max_tokens=40000))),
                    400, JSON_CT, j({"error": {
                        "message": "This model's maximum context length is 32768 tokens. However, you requested "
                                   "40012 tokens (12 in the messages, 40000 in the completion). Please reduce the "
                                   "length of the messages or completion.",
                        "type": "BadRequestError", "param": None, "code": 400}})))
    out.append(make(E, E, P, Exchange("error-model-not-found", "send", chat("hi", model="no-such-model")),
                    404, JSON_CT, j({"error": {"message": "The model `no-such-model` does not exist.",
                                               "type": "NotFoundError", "param": "model", "code": 404}})))
    out.append(make(E, E, P, Exchange("error-in-stream", "send",
                                      chat("hi", model=M, sampling=SAMPLING, stream=True)),
                    200, SSE, chunks=sse(chunk({"role": "assistant", "content": ""}), chunk({"content": "Hel"}),
                                         {"error": {"message": "EngineCore encountered an issue. See stack trace "
                                                               "(above) for the root cause.",
                                                    "type": "InternalServerError", "param": None, "code": 500}})))
    out.append(make(E, E, P, Exchange("metrics", "probe", method="GET", path="/metrics"), 200,
                    {"content-type": "text/plain; version=0.0.4; charset=utf-8"}, VLLM_METRICS.encode()))
    return out


VLLM_METRICS = f"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{VLLM_MODEL}"}} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{VLLM_MODEL}"}} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="{VLLM_MODEL}"}} 0.4127
# HELP vllm:num_preemptions_total Cumulative number of preemptions from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="{VLLM_MODEL}"}} 0.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="{VLLM_MODEL}"}} 18231.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="{VLLM_MODEL}"}} 6411.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="{VLLM_MODEL}"}} 9.81
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="{VLLM_MODEL}"}} 88.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.5",model_name="{VLLM_MODEL}"}} 121.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="{VLLM_MODEL}"}} 130.0
vllm:time_to_first_token_seconds_count{{engine="0",model_name="{VLLM_MODEL}"}} 130.0
"""


# ------------------------------------------------------------------------------------------ SGLang


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
    for engine, cassettes in (("vllm", vllm()), ("sglang", sglang()), ("router", router())):
        d = HERE / engine
        for old in d.glob("*.edn") if d.is_dir() else ():
            if "\n :cassette/provenance {:cassette/how :derived" in old.read_text(encoding="utf-8"):
                old.unlink()  # recorded cassettes (scripts/record-*) stay
        for c in cassettes:
            write_cassette(c, d)
        print(f"{len(cassettes)} derived cassettes written to {d}", file=sys.stderr)


if __name__ == "__main__":
    main()
