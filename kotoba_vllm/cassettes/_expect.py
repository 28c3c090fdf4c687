"""What a replay must find, read from the raw answer *independently of the SDK's parsers*.

The recorder and the derived-cassette generator both call `expect_for`; replay then checks
that the SDK's typed answer agrees with this plain reading of the bytes. Error kinds follow
DESIGN §4 (429 anywhere and SGLang's queue-full are admission; 503 loading is not-ready).
"""

from __future__ import annotations

import json
from .._edn import Edn, Keyword, keyword_or_string, kw
from .._json import JsonObject
from ._endpoint_expect import CONTROL, POOLING, embedding_dims, endpoint_expect
from ._format import sse_payloads

STOP_TYPES = {"eos": "stop", "word": "stop", "limit": "length"}
# Gauges the capacity probes read from each engine's /metrics: a re-recording without one fails.
RELIED_METRICS = {
    "llamacpp": ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"),
    "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"),
}
QUEUE_FULL = "queue is full"
# 503 messages that are admission answers (DESIGN §4), read independently of dialects/_http.py.
ADMISSION_503 = {QUEUE_FULL: "queue-full", "engine is currently busy": "engine-busy",
                 "prefill token backlog": "prefill-backlog"}


def _fr(v: object) -> Keyword | str | None:
    """The server's spelling, a keyword when it can be one (as the SDK writes it)."""
    if isinstance(v, dict):
        v = v.get("type")
    return keyword_or_string(v) if isinstance(v, str) and v else None


def _err_obj(obj: object) -> JsonObject | None:
    if not isinstance(obj, dict):
        return None
    err = obj.get("error")
    if isinstance(err, dict):
        return err
    if isinstance(obj.get("error"), str):
        return {"message": obj["error"]}
    if obj.get("object") == "error":
        return obj
    if obj.get("success") is False and isinstance(obj.get("error_message"), str):  # SGLang's LoRA answers
        return {"message": obj["error_message"]}
    return None


def error_expect(status: int | None, obj: object, retry_after: str | None) -> dict[Keyword, Edn]:
    err = _err_obj(obj) or {}
    msg = str(err.get("message") or "")
    out: dict[Keyword, Edn] = {}
    named = next((r for m, r in ADMISSION_503.items() if m in msg.lower()), None)
    if status == 429 or named is not None:
        out[kw("vllm/error")] = kw("admission-rejected")
        out[kw("vllm/reason")] = kw(named) if named else None
        try:  # delta-seconds pin the value; an HTTP-date depends on the clock, so replay checks >= 0
            out[kw("vllm/retry-after-s")] = float(retry_after) if retry_after is not None else None
        except ValueError:
            pass
    elif status == 503 and ("loading" in msg.lower() or err.get("type") == "unavailable_error"):
        out[kw("vllm/error")] = kw("not-ready")
    elif status is not None and 400 <= status < 500:
        out[kw("vllm/error")] = kw("bad-request")
    else:
        out[kw("vllm/error")] = kw("server-failure")
    if status is not None:
        out[kw("vllm/status")] = status
    if isinstance(err.get("type"), str):
        out[kw("vllm/error-type")] = err["type"]
    if msg:
        out[kw("vllm/message")] = msg
    return {k: v for k, v in out.items() if v is not None}


def _usage(u: object) -> dict[Keyword, Edn] | None:
    if not isinstance(u, dict):
        return None
    out = {kw("vllm/" + k.replace("_", "-")): u[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")
           if isinstance(u.get(k), int)}
    return out or None


def _timings_expect(server_ms: bool, has_counts: bool, streamed_text: bool) -> dict[Keyword, Edn]:
    """Provenance of prefill/decode the SDK must claim: the server's split when it sent one; counts
    alone are server-reported counts; a stream without a server split is timed by the client."""
    if server_ms:
        prefill = decode = "server-reported"
    elif has_counts:
        prefill = "server-reported"
        decode = "client-measured" if streamed_text else "server-reported"
    else:
        prefill, decode = "unavailable", "client-measured" if streamed_text else "unavailable"
    out: dict[Keyword, Edn] = {kw("vllm/prefill"): kw(prefill), kw("vllm/decode"): kw(decode)}
    if streamed_text:
        out[kw("vllm/ttft")] = kw("client-measured")
    return out


def _sglang_timings(meta: object) -> dict[Keyword, Edn]:
    """Figures SGLang's `meta_info` reports itself (`--enable-metrics` adds all but `e2e_latency`), and the
    ones worked out here from its numbers: the prefill span from two stamps (or its tokens as prompt less
    cached), the decode span from its `decode_throughput`."""
    if not isinstance(meta, dict):
        return {}
    has = {k for k, v in meta.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    out: dict[Keyword, Edn] = {}
    for key, fig in (("decode_throughput", "vllm/decode"), ("first_token_latency", "vllm/ttft"),
                     ("queue_time", "vllm/queue"), ("e2e_latency", "vllm/end-to-end")):
        if key in has:
            out[kw(fig)] = kw("server-reported")
    if "decode_throughput" in has and meta["decode_throughput"] and isinstance(meta.get("completion_tokens"), int) \
            and meta["completion_tokens"] > 1:
        out[kw("vllm/decode")] = kw("computed")
    stamps = {"forward_entry_time", "prefill_finished_time"} <= has
    if (stamps and meta["forward_entry_time"] and meta["prefill_finished_time"] >= meta["forward_entry_time"]) or (
            "cached_tokens" in has and meta["cached_tokens"] > 0):
        out[kw("vllm/prefill")] = kw("computed")
    return out


def _payloads(raw: bytes) -> list[object]:
    out: list[object] = []
    for p in sse_payloads(raw):
        if p.strip() == "[DONE]":
            continue
        try:
            out.append(json.loads(p))
        except ValueError:
            out.append(None)
    return out


def logprob_tokens(lp: object) -> int | None:
    """How many tokens an OpenAI-style logprobs object covers (chat `content`, completion `tokens`)."""
    if not isinstance(lp, dict):
        return None
    for key in ("content", "tokens"):
        if isinstance(lp.get(key), list):
            return len(lp[key])
    return None


def stream_expect(endpoint: str, engine: str, raw: bytes) -> dict[Keyword, Edn]:
    """Join the text of a stream the plain way (cumulative for SGLang /generate)."""
    text, reasoning, fr, usage, server_ms, n = "", "", None, None, False, 0
    lp_tokens: int | None = None
    incremental = False
    reported: dict[Keyword, Edn] = {}
    tools: dict[int, dict[str, str]] = {}
    for obj in _payloads(raw):
        if not isinstance(obj, dict):
            continue
        err = _err_obj(obj)
        if err is not None and "choices" not in obj and "text" not in obj and "content" not in obj:
            code = err.get("code")
            e = error_expect(code if isinstance(code, int) else None, obj, None)
            e[kw("expect/partial-text")] = text
            return {kw("expect/error"): e}
        n += 1
        if isinstance(obj.get("timings"), dict) and "prompt_ms" in obj["timings"]:
            server_ms = True
        if endpoint == "generate" and engine == "sglang":
            meta = obj.get("meta_info") or {}
            abort = meta.get("finish_reason")
            if isinstance(abort, dict) and abort.get("type") == "abort":  # the scheduler ended the request
                code = abort.get("status_code")
                e = error_expect(code if isinstance(code, int) else None,
                                 {"error": {"message": abort.get("message"), "type": "abort"}}, None)
                e[kw("expect/partial-text")] = text
                return {kw("expect/error"): e}
            t = obj.get("text") or ""
            ids = obj.get("output_ids")
            # incremental (--incremental-streaming-output) when a chunk holds fewer ids than generated so far
            if isinstance(ids, list) and isinstance(meta.get("completion_tokens"), int):
                incremental = len(ids) < meta["completion_tokens"]
            text = text + t if incremental else t
            fr = _fr(meta.get("finish_reason")) or fr
            reported = _sglang_timings(meta)  # the final chunk says what the answer reports
            if isinstance(meta.get("prompt_tokens"), int):
                usage = {kw("vllm/prompt-tokens"): meta["prompt_tokens"],
                         kw("vllm/completion-tokens"): meta.get("completion_tokens")}
            continue
        if endpoint == "generate":  # llama.cpp native: disjoint pieces, last chunk stop: true
            text += obj.get("content") or ""
            if obj.get("stop"):
                fr = kw(STOP_TYPES[obj["stop_type"]]) if obj.get("stop_type") in STOP_TYPES else None
                usage = {kw("vllm/prompt-tokens"): obj.get("tokens_evaluated"),
                         kw("vllm/completion-tokens"): obj.get("tokens_predicted")}
            continue
        if obj.get("usage"):
            usage = _usage(obj["usage"])
        for c in obj.get("choices") or ():
            if (c.get("index") or 0) != 0:
                continue
            d = c.get("delta")
            if isinstance(d, dict):
                text += d.get("content") or ""
                reasoning += d.get("reasoning_content") or d.get("reasoning") or ""
                for t in d.get("tool_calls") or ():
                    slot = tools.setdefault(t.get("index") or 0, {"name": "", "arguments": ""})
                    fn = t.get("function") or {}
                    slot["name"] += fn.get("name") or ""
                    slot["arguments"] += fn.get("arguments") or ""
            else:
                text += c.get("text") or ""
            fr = _fr(c.get("finish_reason")) or fr
            if logprob_tokens(c.get("logprobs")) is not None:
                lp_tokens = (lp_tokens or 0) + (logprob_tokens(c.get("logprobs")) or 0)
    out: dict[Keyword, Edn] = {kw("expect/text"): text, kw("expect/finish-reason"): fr,
                               kw("expect/chunks"): n}
    if lp_tokens is not None:
        out[kw("expect/logprobs?")] = True
        out[kw("expect/logprob-tokens")] = lp_tokens
    if usage:
        out[kw("expect/usage")] = {k: v for k, v in usage.items() if v is not None}
    if reasoning:
        out[kw("expect/reasoning")] = reasoning
    if tools:
        out[kw("expect/tool-calls")] = [{kw("vllm/name"): t["name"], kw("vllm/arguments"): t["arguments"]}
                                        for _, t in sorted(tools.items())]
    out[kw("expect/timings")] = {**_timings_expect(server_ms, bool(usage), bool(text or reasoning)), **reported}
    return {k: v for k, v in out.items() if v is not None}


def body_expect(endpoint: str, engine: str, obj: object, raw: bytes = b"") -> dict[Keyword, Edn]:
    if endpoint in POOLING or endpoint in CONTROL:
        return endpoint_expect(endpoint, obj, raw)
    if not isinstance(obj, dict):
        return {}
    out: dict[Keyword, Edn] = {}
    if endpoint == "tokenize":
        return {kw("expect/tokens"): [t["id"] if isinstance(t, dict) else t for t in obj.get("tokens", [])]}
    if endpoint == "detokenize":
        for k in ("prompt", "content", "text"):
            if isinstance(obj.get(k), str):
                return {kw("expect/text"): obj[k]}
        return {}
    if endpoint == "embedding":
        data = obj.get("data") or []
        return {kw("expect/embeddings"): len(data),
                kw("expect/dims"): embedding_dims(data[0]) if data else 0}
    server_ms = isinstance(obj.get("timings"), dict) and "prompt_ms" in obj["timings"]
    reported: dict[Keyword, Edn] = {}
    if endpoint == "generate" and engine == "sglang":
        meta = obj.get("meta_info") or {}
        out[kw("expect/text")] = obj.get("text")
        out[kw("expect/finish-reason")] = _fr(meta.get("finish_reason"))
        out[kw("expect/usage")] = {kw("vllm/prompt-tokens"): meta.get("prompt_tokens"),
                                   kw("vllm/completion-tokens"): meta.get("completion_tokens")}
        has_counts = True
        reported = _sglang_timings(meta)
    elif endpoint == "generate":
        out[kw("expect/text")] = obj.get("content")
        st = obj.get("stop_type")
        out[kw("expect/finish-reason")] = kw(STOP_TYPES[st]) if st in STOP_TYPES else None
        out[kw("expect/usage")] = {kw("vllm/prompt-tokens"): obj.get("tokens_evaluated"),
                                   kw("vllm/completion-tokens"): obj.get("tokens_predicted")}
        has_counts = True
    else:
        choices = obj.get("choices") or [{}]
        c = choices[0]
        msg = c.get("message")
        if isinstance(msg, dict):
            out[kw("expect/text")] = msg.get("content")
            r = msg.get("reasoning_content") or msg.get("reasoning")
            if r:
                out[kw("expect/reasoning")] = r
                if msg.get("content") is None:
                    out[kw("expect/text")] = ""  # documented: a reasoning-only answer's text is ""
            if msg.get("tool_calls"):
                out[kw("expect/tool-calls")] = [
                    {kw("vllm/name"): t["function"]["name"], kw("vllm/arguments"): t["function"]["arguments"]}
                    for t in msg["tool_calls"]]
        else:
            out[kw("expect/text")] = c.get("text")
        out[kw("expect/finish-reason")] = _fr(c.get("finish_reason"))
        if c.get("logprobs") is not None:
            out[kw("expect/logprobs?")] = True
            out[kw("expect/logprob-tokens")] = logprob_tokens(c.get("logprobs"))
        out[kw("expect/choices")] = len(choices)
        out[kw("expect/usage")] = _usage(obj.get("usage"))
        has_counts = out[kw("expect/usage")] is not None
    out[kw("expect/timings")] = {**_timings_expect(server_ms, has_counts, False), **reported}
    return {k: v for k, v in out.items() if v is not None}


def expect_for(op: str, endpoint: str | None, engine: str, status: int, headers: dict[str, str], raw: bytes,
               streaming: bool, path: str = "") -> dict[Keyword, Edn]:
    """The expectation map for one exchange (`op` is the cassette's call op)."""
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        obj = None
    if op == "health":
        return {kw("expect/ok"): status == 200, kw("expect/status"): status}
    if op == "probe":
        out: dict[Keyword, Edn] = {kw("expect/parse"): kw("prometheus" if path.endswith("/metrics") else "json"),
               kw("expect/status"): status}
        if path.endswith("/metrics") and engine in RELIED_METRICS:
            out[kw("expect/metrics")] = list(RELIED_METRICS[engine])
        return out
    if status >= 400:
        return {kw("expect/error"): error_expect(status, obj, headers.get("retry-after"))}
    if op == "models":
        return {kw("expect/models"): [m.get("id") for m in (obj or {}).get("data", []) if isinstance(m, dict)]}
    if streaming:
        return stream_expect(endpoint or "", engine, raw)
    return body_expect(endpoint or "", engine, obj, raw)
