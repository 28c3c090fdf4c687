"""OpenAI / vLLM batch JSONL, read and written.

Input line (what `vllm run-batch` and the OpenAI Batch API take):
    {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}
The body's wire fields map back onto the EDN model (`max_tokens` -> `:vllm/max-tokens`,
`messages` -> `:vllm/messages`, ...). A body field with no EDN meaning is a validation
problem naming the line and the field, never dropped. The urls are run-batch's (vLLM 0.32.0 and
0.33.0 `launchers/run_batch.py`: chat, embeddings, and `/score`, `/rerank` matched by their ending),
plus OpenAI's `/v1/completions`; run-batch takes no `/classify` or `/pooling` (write those in EDN).

Output line (the shape of vLLM's `BatchRequestOutput`):
    {"id": "batch-..", "custom_id": "r1",
     "response": {"status_code": 200, "request_id": "..", "body": <OpenAI response object>},
     "error": null | {"code": "<error kind>", "message": ".."}}
plus a `"kotoba"` object (extra fields are allowed there) that says which endpoint and engine dialect
answered, the request's input position and, for failures, the typed error as JSON and, when the server
named the field it refused, that body key's line and column (`field_where`).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import IO, Iterator, cast

import attrs

from .._codec import edn_to_json
from .._edn import MAX_DEPTH, Edn, Keyword, kw
from .._json import JsonObject, JsonValue
from .._errors import InternalError, KotobaError, ServerError
from .._model import EmbeddingResponse, RerankResponse, Response, ScoreResponse, Usage, to_edn
from .._openai_messages import message_to_edn
from .._problems import Problem
from .._requests import request_from_edn
from .._sampling import SAMPLING_TABLE
from ._entry import BatchEntry

URL_ENDPOINTS: dict[str, str] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/embeddings": "embedding",
    "/v1/rerank": "rerank", "/v2/rerank": "rerank", "/rerank": "rerank",
    "/v1/score": "score", "/score": "score",
}
ENDPOINT_URLS = {v: k for k, v in reversed(URL_ENDPOINTS.items())}  # each endpoint's first url

# wire name -> EDN sampling key; the table is the single source, plus OpenAI's aliases.
_SAMPLING_WIRE: dict[str, str] = {k.wire: k.key for k in SAMPLING_TABLE}
_SAMPLING_WIRE["max_completion_tokens"] = "vllm/max-tokens"
_TOP: dict[str, dict[str, str]] = {
    "chat": {"model": "vllm/model", "stream": "vllm/stream", "tools": "vllm/tools", "tool_choice": "vllm/tool-choice"},
    "completion": {"model": "vllm/model", "stream": "vllm/stream", "prompt": "vllm/prompt"},
    "embedding": {"model": "vllm/model", "input": "vllm/input"},
    "rerank": {"model": "vllm/model", "query": "vllm/query", "documents": "vllm/documents", "top_n": "vllm/top-n"},
    # vLLM's ScoreRequest forms: text_1/text_2, queries/documents, queries/items, data_1/data_2 (one pair each)
    "score": {"model": "vllm/model", "text_1": "vllm/text-1", "text_2": "vllm/text-2", "queries": "vllm/text-1",
              "documents": "vllm/text-2", "items": "vllm/text-2", "data_1": "vllm/text-1", "data_2": "vllm/text-2"},
}
K_SAMPLING = kw("vllm/sampling")
_NO_SAMPLING = frozenset({"embedding", "rerank", "score"})
# Wire fields that carry nothing to send; accepted and dropped on purpose.
_IGNORED = {"stream_options", "user"}


def _problem(code: str, msg: str, where: str, field: str | None = None) -> Problem:
    return Problem("error", code, msg, field=field, where=where)


def _message(m: JsonValue, i: int, where: str, problems: list[Problem]) -> Edn:
    if not isinstance(m, dict):
        return m  # the request reader reports the type
    out, unknown = message_to_edn(m)
    for k in unknown:
        problems.append(_problem("batch/unknown-field", f"messages[{i}] field {k!r} has no EDN equivalent",
                                 where, field=f"body/{k}"))
    return out


def body_to_edn(body: JsonObject, endpoint: str, where: str) -> tuple[dict[Keyword, Edn], list[Problem]]:
    """An OpenAI request body -> an EDN request map, and the fields that have no EDN meaning."""
    problems: list[Problem] = []
    m: dict[Keyword, Edn] = {kw("vllm/endpoint"): kw(endpoint)}
    sampling: dict[Keyword, Edn] = {}
    top = _TOP[endpoint]
    logprobs: JsonValue = None
    top_logprobs: JsonValue = None
    for k, v in body.items():
        if k in top:
            if kw(top[k]) in m:
                problems.append(_problem("batch/conflict", f"body field {k!r} sets :{top[k]} a second time",
                                         where, field=f"body/{k}"))
            m[kw(top[k])] = v
        elif k == "messages" and endpoint == "chat":
            m[kw("vllm/messages")] = [_message(x, i, where, problems) for i, x in enumerate(v)] \
                if isinstance(v, list) else v
        elif k in _IGNORED:
            continue
        elif endpoint in _NO_SAMPLING:
            problems.append(_problem("batch/unknown-field", f"body field {k!r} has no EDN equivalent "
                                     f"for {ENDPOINT_URLS[endpoint]}", where, field=f"body/{k}"))
        elif k == "logprobs":
            logprobs = v
        elif k == "top_logprobs":
            top_logprobs = v
        elif k == "response_format" and isinstance(v, dict) and v.get("type") == "json_schema":
            schema = cast(JsonObject, v.get("json_schema") or {}).get("schema")
            sampling[kw("vllm/guided-json")] = schema
        elif k == "structured_outputs" and isinstance(v, dict):
            for sk, key in (("json", "vllm/guided-json"), ("regex", "vllm/guided-regex"),
                            ("choice", "vllm/guided-choice")):
                if sk in v:
                    sampling[kw(key)] = v[sk]
        elif k in _SAMPLING_WIRE:
            sampling[kw(_SAMPLING_WIRE[k])] = v
        else:
            problems.append(_problem("batch/unknown-field", f"body field {k!r} has no EDN equivalent",
                                     where, field=f"body/{k}"))
    if logprobs is not None or top_logprobs is not None:
        # chat: logprobs is a flag and top_logprobs the count; EDN keeps one value.
        sampling[kw("vllm/logprobs")] = top_logprobs if top_logprobs is not None and logprobs is not False \
            else logprobs
    if sampling:
        m[K_SAMPLING] = sampling
    return m, problems


_TOO_DEEP = object()


def _depth(obj: object) -> int:
    """How deeply `obj`'s lists and maps nest (iteratively: no recursion limit of its own)."""
    deepest, todo = 0, [(obj, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list):
            deepest = max(deepest, d)
            todo.extend((x, d + 1) for x in v if isinstance(x, (list, dict)))
    return deepest


def line_to_entry(index: int, line: str, source: str, lineno: int) -> BatchEntry:
    where = f"{source}:{lineno}:1"
    try:
        obj = json.loads(line)
    except RecursionError:
        obj = _TOO_DEEP
    except ValueError as e:
        return BatchEntry(index, where, None, (_problem("batch/json", f"not JSON: {e}", where),))
    # the EDN reader's bound, and its words (a count of brackets first: most lines hold a handful)
    if obj is _TOO_DEEP or (line.count("[") + line.count("{") > MAX_DEPTH and _depth(obj) > MAX_DEPTH):
        return BatchEntry(index, where, None, (_problem("batch/json", f"nested deeper than {MAX_DEPTH} levels",
                                                        where),))
    if not isinstance(obj, dict):
        return BatchEntry(index, where, None, (_problem("batch/line", "a batch line must be a JSON object", where),))
    custom_id = obj.get("custom_id")
    cid = custom_id if isinstance(custom_id, str) else None
    problems: list[Problem] = []
    for k in obj:
        if k not in ("custom_id", "method", "url", "body"):
            problems.append(_problem("batch/unknown-field", f"line field {k!r} is not part of a batch line",
                                     where, field=f"batch/{k}"))
    if cid is None:
        problems.append(_problem("batch/custom-id", "custom_id must be a string", where, field="batch/custom_id"))
    if obj.get("method", "POST") != "POST":
        problems.append(_problem("batch/method", f"method must be POST, got {obj.get('method')!r}", where,
                                 field="batch/method"))
    base_url, url = _split_url(obj.get("url"))
    endpoint = URL_ENDPOINTS.get(url) if isinstance(url, str) else None
    if endpoint is None:
        msg = f"url {url!r} is not one of {', '.join(URL_ENDPOINTS)}"
        if isinstance(url, str) and url.rstrip("/").rsplit("/", 1)[-1] in ("classify", "pooling"):
            ep = url.rstrip("/").rsplit("/", 1)[-1]
            msg += f" (vLLM's run-batch takes no /{ep}; write it in EDN: {{:vllm/endpoint :{ep} ..}})"
        problems.append(_problem("batch/url", msg, where, field="batch/url"))
    body = obj.get("body")
    if not isinstance(body, dict):
        problems.append(_problem("batch/body", "body must be a JSON object", where, field="batch/body"))
    if endpoint is None or not isinstance(body, dict):
        return BatchEntry(index, where, None, tuple(problems), cid)
    m, body_problems = body_to_edn(body, endpoint, where)
    problems.extend(body_problems)
    if cid is not None:
        m[kw("vllm/request-id")] = cid
    if base_url is not None:  # an absolute url names its server, like :vllm/base-url (sent without the key)
        m[kw("vllm/base-url")] = base_url
    req, req_problems = request_from_edn(m)
    problems.extend(attrs_where(p, where) for p in req_problems)
    return BatchEntry(index, where, req, tuple(problems), cid, jsonl_line=line)


def _split_url(url: object) -> tuple[str | None, object]:
    """An absolute `url` ("http://host:port/v1/chat/completions") -> (its server, the route)."""
    if isinstance(url, str) and "://" in url:
        for route in sorted(URL_ENDPOINTS, key=len, reverse=True):  # "/v1/rerank" before "/rerank"
            if url.endswith(route) and len(url) > len(route):
                return url[:-len(route)], route
    return None, url


def attrs_where(p: Problem, where: str) -> Problem:
    return p if p.where else attrs.evolve(p, where=where)


def iter_jsonl_entries(fh: IO[str], source: str) -> Iterator[BatchEntry]:
    """One entry per non-blank line (blank lines are skipped, as vLLM's reader does)."""
    index = 0
    for lineno, line in enumerate(fh, 1):
        if not line.strip():
            continue
        try:
            entry = line_to_entry(index, line, source, lineno)
        except Exception as exc:  # a reader bug costs this line its request, never the run its records
            where = f"{source}:{lineno}:1"
            msg = InternalError.from_exception(exc, during="while reading this line").message
            entry = BatchEntry(index, where, None, (_problem("batch/internal", msg, where),))
        yield entry
        index += 1


def field_where(entry: BatchEntry, field: str) -> str | None:
    """`file:line:column` of the body key in a JSONL entry's line that became the EDN key `field` (a field the
    server refused), or None. Each body key is read alone by `body_to_edn`, the rule the line was read by."""
    line, req = entry.jsonl_line, entry.request
    body = json.loads(line).get("body") if line is not None and req is not None else None
    if not isinstance(body, dict) or req is None or req.endpoint not in _TOP:
        return None
    target = kw(field)
    for k, v in body.items():
        m, _ = body_to_edn({k: v}, req.endpoint, entry.where)
        sampling = m.get(K_SAMPLING)
        if target in m or (isinstance(sampling, dict) and target in sampling):
            column = key_column(cast(str, line), ("body", k))
            return None if column is None else f"{entry.where.rsplit(':', 1)[0]}:{column}"
    return None


def key_column(text: str, path: tuple[str, ...]) -> int | None:
    """The 1-based column, in one line of JSON, of the object key that `path` names from the top
    (`("body", "max_tokens")`), or None. `text` is known to be JSON: strings are only skipped over."""
    keys: list[str | None] = []  # per open container: the key its current value stands under (None in an array)
    in_object: list[bool] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            end = i + 1
            while end < n and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            after = end + 1
            while after < n and text[after] in " \t\r\n":
                after += 1
            if in_object and in_object[-1] and after < n and text[after] == ":":  # a key, not a value
                keys[-1] = json.loads(text[i:end + 1])
                if len(keys) == len(path) and tuple(keys) == path:
                    return i + 1
            i = end + 1
            continue
        if c == "{" or c == "[":
            in_object.append(c == "{")
            keys.append(None)
        elif (c == "}" or c == "]") and keys:
            in_object.pop()
            keys.pop()
        i += 1
    return None


# ------------------------------------------------------------------ output

def _usage(u: Usage | None) -> dict[str, object] | None:
    if u is None:
        return None
    out: dict[str, object] = {"prompt_tokens": u.prompt_tokens or 0, "completion_tokens": u.completion_tokens or 0,
           "total_tokens": u.total_tokens if u.total_tokens is not None
           else (u.prompt_tokens or 0) + (u.completion_tokens or 0)}
    if u.cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": u.cached_tokens}
    return out


def response_body(resp: object, endpoint: str) -> dict[str, object]:
    """Our normalized response as the OpenAI object the endpoint returns."""
    if isinstance(resp, EmbeddingResponse):
        return {"object": "list", "model": resp.model or "",
                "data": [{"object": "embedding", "index": i, "embedding": list(e)}
                         for i, e in enumerate(resp.embeddings)],
                "usage": _usage(resp.usage) or {"prompt_tokens": 0, "total_tokens": 0}}
    if isinstance(resp, RerankResponse):  # vLLM's RerankResponse (pooling/scoring/protocol.py)
        u = _usage(resp.usage) or {}
        return {"id": resp.id or f"score-{uuid.uuid4().hex}", "model": resp.model or "",
                "usage": {"prompt_tokens": u.get("prompt_tokens", 0), "total_tokens": u.get("total_tokens", 0)},
                "results": [{"index": r.index, "document": {"text": r.document}, "relevance_score": r.score}
                            for r in resp.results]}
    if isinstance(resp, ScoreResponse):  # vLLM's ScoreResponse
        return {"id": resp.id or f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                "model": resp.model or "",
                "data": [{"index": i, "object": "score", "score": x} for i, x in enumerate(resp.scores)],
                "usage": _usage(resp.usage) or {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}
    assert isinstance(resp, Response)
    chat = endpoint == "chat"
    choices = []
    for c in resp.choices:
        choice: dict[str, object] = {"index": c.index, "finish_reason": c.finish_reason,
                                  "logprobs": edn_to_json(c.logprobs) if c.logprobs is not None else None}
        if chat:
            msg: dict[str, object] = {"role": "assistant", "content": c.text}
            if c.tool_calls:
                msg["tool_calls"] = [{"id": t.id, "type": t.type or "function",
                                      "function": {"name": t.name, "arguments": t.arguments or ""}}
                                     for t in c.tool_calls]
            if c.reasoning is not None:
                msg["reasoning_content"] = c.reasoning
            choice["message"] = msg
        else:
            choice["text"] = c.text or ""
        choices.append(choice)
    body: dict[str, object] = {
        "id": resp.id or f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": "chat.completion" if chat else "text_completion",
        "created": resp.created if resp.created is not None else int(time.time()),
        "model": resp.model or "",
        "choices": choices,
        "usage": _usage(resp.usage) or {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }
    if resp.system_fingerprint is not None:
        body["system_fingerprint"] = resp.system_fingerprint
    return body


def _custom_id(entry: BatchEntry) -> str:
    if entry.custom_id is not None:
        return entry.custom_id
    rid = entry.request_id
    return str(rid) if rid is not None else f"request-{entry.index}"


def output_line(entry: BatchEntry, result: object = None, error: KotobaError | None = None,
                problems: tuple[Problem, ...] | None = None, attempts: list[dict[Keyword, Edn]] | None = None) -> str:
    """One output line: a response, a typed error, or validation problems (nothing sent); `attempts`: every
    attempt of a request rejected at admission and sent again (`kotoba.attempts`)."""
    kotoba: dict[str, object] = {"request_index": entry.index, "where": entry.where}
    if attempts is not None:
        kotoba["attempts"] = edn_to_json(attempts)
    response: dict[str, object] | None = None
    err: dict[str, object] | None = None
    # both request ids: ours (sent to the engine) and the one the server answered with (its x-request-id)
    ours = entry.request_id
    server_id = getattr(error if error is not None else result, "server_request_id", None)
    if ours is not None:
        kotoba["request_id"] = ours
    if server_id is not None:
        kotoba["server_request_id"] = server_id
    answer_id = server_id or (str(ours) if ours is not None else None)
    if problems is not None:
        err = {"code": "validation", "message": "; ".join(str(p) for p in problems if p.is_error)}
        kotoba["error"] = edn_to_json({kw("vllm/error"): kw("validation"),
                                       kw("vllm/problems"): [p.to_edn() for p in problems]})
    elif error is not None:
        err = {"code": error.kind, "message": error.message}
        kotoba["error"] = edn_to_json(error.to_edn())
        if error.backend is not None:  # the engine dialect that sent it, as on an answered line
            kotoba["backend"] = error.backend
        refused = error.field if isinstance(error, ServerError) else None
        at = field_where(entry, refused) if refused is not None else None
        if at is not None:  # the refused field's own key in the line, as `:vllm/field-where` in an EDN record
            kotoba["field_where"] = at
        if isinstance(error, ServerError) and error.status is not None:
            response = {"status_code": error.status, "request_id": answer_id or f"batch-{uuid.uuid4().hex}",
                        "body": None}
    else:
        endpoint = entry.request.endpoint if entry.request is not None else "chat"
        response = {"status_code": 200, "request_id": answer_id or f"batch-{uuid.uuid4().hex}",
                    "body": response_body(result, endpoint)}
        kotoba["backend"] = getattr(result, "backend", None)
        kotoba["endpoint_url"] = getattr(result, "endpoint_url", None)
        timings = getattr(result, "timings", None)
        if timings is not None:
            kotoba["timings"] = edn_to_json(to_edn(timings))
    line = {"id": f"batch-{uuid.uuid4().hex}", "custom_id": _custom_id(entry), "response": response,
            "error": err, "kotoba": kotoba}
    return json.dumps(line, ensure_ascii=False, allow_nan=False, default=str)


def line_index(line: str) -> int | None:
    """The input position an output line answers (None when it does not say or does not parse)."""
    try:
        obj = json.loads(line)
        idx = obj["kotoba"]["request_index"]
    except (ValueError, KeyError, TypeError):
        return None
    return idx if isinstance(idx, int) else None
