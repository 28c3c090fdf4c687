"""The pooling-model endpoints (rerank, score, classify, pooling) and the server-control calls (LoRA
adapters, prefix caches): their bodies, their answers, and the refusals naming who serves them.

Each dialect lists the routes its engine has (`Dialect.routes`); the rendering here is shared because
the engines agree on each body (read from vLLM's `pooling/*/protocol.py`, SGLang's
`V1RerankReqInput` and `LoadLoRAAdapterReqInput`, llama.cpp's `server-context.cpp` of the build we
ship). Answers are read by their shape, which is where the engines differ: SGLang's rerank answer is
a bare list, vLLM's and llama.cpp's an object with `results`; llama.cpp lists adapters as a bare list,
vLLM and SGLang as `/v1/models` entries whose `parent` is the base model.
"""

from __future__ import annotations

import base64
import json
import sys
from array import array
from typing import Callable, Iterable, Mapping

from .._codec import edn_to_json, json_to_edn
from .._errors import ProtocolError
from .._model import (AnyResponse, ClassifyRequest, ClassifyResponse, ClassifyResult, ControlResponse,
                      EmbeddingRequest, LoraAdapter, LoraAdaptersResponse, LoraLoadRequest, LoraScaleRequest,
                      LoraUnloadRequest, PoolingRequest, PoolingResponse, Request, RerankRequest, RerankResponse,
                      RerankResult, ScoreRequest, ScoreResponse, SlotRequest, Usage)
from .._problems import Problem
from ._http import HttpRequest

POOLING_ENDPOINTS = frozenset({"rerank", "score", "classify", "pooling"})
CONTROL_ENDPOINTS = frozenset({"lora-list", "lora-load", "lora-unload", "lora-scale", "cache-reset", "slot"})
ENDPOINTS_HERE = POOLING_ENDPOINTS | CONTROL_ENDPOINTS
GET_ENDPOINTS = frozenset({"lora-list"})

# endpoint -> engines whose dialect has a route for it; filled from the dialects' own tables (dialects/__init__)
SERVED_BY: dict[str, tuple[str, ...]] = {}

# What to use instead, where an engine does the same job another way.
INSTEAD = {
    ("llamacpp", "lora-load"): "llama.cpp loads adapters only at start (--lora FILE); switch one on or off "
                               "with :lora-scale",
    ("llamacpp", "lora-unload"): "llama.cpp loads adapters only at start; set its scale to 0 with :lora-scale",
    ("llamacpp", "cache-reset"): "llama.cpp erases one slot's cache: :vllm/endpoint :slot :vllm/action :erase",
    ("vllm", "slot"): "vLLM has no slots; drop its prefix cache with :cache-reset",
    ("sglang", "slot"): "SGLang has no slots; flush its cache with :cache-reset",
    ("vllm", "lora-scale"): "vLLM applies an adapter per request (its name as :vllm/model)",
    ("sglang", "lora-scale"): "SGLang applies an adapter per request (:sglang/lora-path)",
}


def register_served(routes_by_engine: dict[str, Iterable[str]]) -> None:
    """Note which engines serve each endpoint (called once, with every dialect's routes)."""
    served: dict[str, list[str]] = {}
    for engine, routes in routes_by_engine.items():
        for ep in routes:
            served.setdefault(ep, []).append(engine)
    SERVED_BY.clear()
    SERVED_BY.update({ep: tuple(engines) for ep, engines in served.items()})


def endpoint_refusal(engine: str, ep: str) -> Problem:
    """The problem for an endpoint `engine` has no route for, naming who has one and what to use instead."""
    served = [e for e in SERVED_BY.get(ep, ()) if e != engine]
    msg = f"{engine} has no {ep} endpoint"
    if served:
        msg += f" (served by {', '.join(served)})"
    hint = INSTEAD.get((engine, ep))
    if hint:
        msg += f"; {hint}"
    return Problem("error", "engine/endpoint", msg, field="vllm/endpoint", engine=engine)


# option attr -> (its EDN key, the endpoint that has it)
OPTIONS = {"dimensions": ("vllm/dimensions", "embedding"), "encoding_format": ("vllm/encoding-format", "embedding"),
           "top_n": ("vllm/top-n", "rerank")}


def option_problems(engine: str, req: Request, honoured: frozenset[str]) -> list[Problem]:
    """Engine-side checks of the new requests' options: an option the engine would ignore, a value it refuses."""
    out: list[Problem] = []
    for attr, (key, ep) in OPTIONS.items():
        value = getattr(req, attr, None) if req.endpoint == ep else None
        # float is every engine's default: asking for it is never ignored
        if value is not None and attr not in honoured and value != "float":
            out.append(Problem("error", "engine/unsupported", f"{engine} does not honour :{key} on the {ep} "
                               "route; it would be ignored", field=key, engine=engine))
    if isinstance(req, EmbeddingRequest):
        if req.dimensions is not None and req.dimensions < 1:
            out.append(Problem("error", "request/range", f":vllm/dimensions {req.dimensions} must be at least 1",
                               field="vllm/dimensions"))
    elif isinstance(req, RerankRequest):
        if not req.documents:
            out.append(Problem("error", "request/empty", "a rerank request needs at least one document",
                               field="vllm/documents"))
        if req.top_n is not None and req.top_n < 1:
            out.append(Problem("error", "request/range", f":vllm/top-n {req.top_n} must be at least 1",
                               field="vllm/top-n"))
    elif isinstance(req, SlotRequest):
        if req.action in ("save", "restore") and not req.filename:
            out.append(Problem("error", "request/missing-key", f"a slot {req.action} needs :vllm/filename",
                               field="vllm/filename"))
        if req.action == "erase" and req.filename is not None:
            out.append(Problem("error", "request/unused", "a slot erase takes no :vllm/filename",
                               field="vllm/filename"))
        if req.filename is not None and not _bare_name(req.filename):
            out.append(Problem("error", "request/filename", f":vllm/filename {req.filename!r} must be a bare file "
                               "name (the server keeps it inside its --slot-save-path)", field="vllm/filename"))
        if req.slot_id < 0:
            out.append(Problem("error", "request/range", f":vllm/slot-id {req.slot_id} must be 0 or more",
                               field="vllm/slot-id"))
    elif isinstance(req, LoraScaleRequest):
        if not req.adapters:
            out.append(Problem("error", "request/empty", ":vllm/adapters needs at least one {:vllm/id .. "
                               ":vllm/scale ..}", field="vllm/adapters"))
    elif isinstance(req, (ClassifyRequest, PoolingRequest, ScoreRequest)):
        for name in ("input", "text_1", "text_2"):
            if getattr(req, name, None) == ():
                key = "vllm/" + name.replace("_", "-")
                out.append(Problem("error", "request/empty", f":{key} needs at least one text", field=key))
    return out


def _bare_name(name: str) -> bool:
    # llama.cpp's fs_validate_filename refuses the same: separators, parent steps, control characters
    return bool(name) and name not in (".", "..") and not any(c in name for c in "/\\\0") and name.isprintable()


# ------------------------------------------------------------------ rendering


def _texts(v: str | tuple[str, ...]) -> str | list[str]:
    return v if isinstance(v, str) else list(v)


def render_endpoint(req: Request, routes: dict[str, str], extras: dict[str, tuple[str, frozenset[str]]],
                    request_id_field: str | None = None) -> HttpRequest:
    """The body and route of a pooling or control request (its endpoint is in `routes` and its extras in
    the dialect's `extras` table: `problems` checked both); the request id in `request_id_field` where the
    engine's request model has one (vLLM's pooling requests; SGLang's rerank has none: the header alone)."""
    ep = req.endpoint
    path = routes[ep]
    fields: dict[str, object] = {}
    body: dict[str, object] | list[object] = fields  # replaced whole by the LoRA and slot bodies
    model = getattr(req, "model", None)
    if model is not None:
        fields["model"] = model
    if isinstance(req, RerankRequest):
        fields["query"] = req.query
        fields["documents"] = list(req.documents)
        if req.top_n is not None:
            fields["top_n"] = req.top_n
    elif isinstance(req, ScoreRequest):
        fields["text_1"], fields["text_2"] = _texts(req.text_1), _texts(req.text_2)
    elif isinstance(req, ClassifyRequest):
        fields["input"] = _texts(req.input)
    elif isinstance(req, PoolingRequest):
        fields["input"] = _texts(req.input)
        if req.task is not None:
            fields["task"] = req.task.replace("-", "_")
    elif isinstance(req, LoraLoadRequest):
        body = {"lora_name": req.lora_name, "lora_path": req.lora_path}
    elif isinstance(req, LoraUnloadRequest):
        body = {"lora_name": req.lora_name}
    elif isinstance(req, LoraScaleRequest):
        body = [{"id": a.id, "scale": a.scale} for a in req.adapters]
    elif isinstance(req, SlotRequest):
        path = f"{path.replace('{slot_id}', str(req.slot_id))}?action={req.action}"
        body = {"filename": req.filename} if req.filename is not None else {}
    for key, value in req.extras.items():  # only keys the dialect's extras table allows (`problems`)
        if isinstance(body, dict):
            body[extras[key][0]] = edn_to_json(value)
    if request_id_field is not None and req.request_id is not None and isinstance(body, dict):
        body[request_id_field] = str(req.request_id)
    if ep in GET_ENDPOINTS:
        return HttpRequest("GET", path, None)
    return HttpRequest("POST", path, body)


# ------------------------------------------------------------------ parsing


def _usage(u: object) -> Usage | None:
    if not isinstance(u, dict):
        return None
    def count(k: str) -> int | None:
        v = u.get(k)
        return v if type(v) is int and v >= 0 else None
    return Usage(prompt_tokens=count("prompt_tokens"), completion_tokens=count("completion_tokens"),
                 total_tokens=count("total_tokens"))


def _str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _num(v: object, what: str, obj: object, url: str | None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ProtocolError(f"{what} is not a number", offending=json.dumps(obj)[:500], endpoint=url)
    return float(v)


def _index(v: object, fallback: int) -> int:
    return v if type(v) is int and v >= 0 else fallback


def _data_list(obj: object, what: str, url: str | None) -> tuple[Mapping[str, object], list[Mapping[str, object]]]:
    """The answer as an object, and its `data` rows (objects) in index order."""
    answer = obj if isinstance(obj, dict) else {}
    data = answer.get("data")
    if not isinstance(data, list):
        raise ProtocolError(f"{what} answer has no data list", offending=json.dumps(obj)[:500], endpoint=url)
    return answer, sorted((d for d in data if isinstance(d, dict)), key=lambda d: _index(d.get("index"), 0))


def _document(d: Mapping[str, object]) -> str | None:
    doc = d.get("document")
    if isinstance(doc, dict):  # vLLM: {"text": ..}
        doc = doc.get("text")
    return _str(doc if doc is not None else d.get("text"))  # llama.cpp's TEI form: "text"


def parse_rerank(obj: object, engine: str, req: Request, url: str | None) -> RerankResponse:
    # SGLang answers a bare list of {index, score, document}; vLLM and llama.cpp {results: [{index, relevance_score}]}
    rows = obj if isinstance(obj, list) else obj.get("results") if isinstance(obj, dict) else None
    if not isinstance(rows, list):
        raise ProtocolError("rerank answer has no results", offending=json.dumps(obj)[:500], endpoint=url)
    results = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise ProtocolError("rerank result is not an object", offending=json.dumps(obj)[:500], endpoint=url)
        score = r.get("relevance_score", r.get("score"))
        results.append(RerankResult(index=_index(r.get("index"), i), score=_num(score, "rerank score", obj, url),
                                    document=_document(r)))
    meta = obj if isinstance(obj, dict) else {}
    return RerankResponse(results=tuple(results), id=_str(meta.get("id")), model=_str(meta.get("model")),
                          usage=_usage(meta.get("usage")), backend=engine, endpoint_url=url,
                          request_id=req.request_id)


def parse_score(obj: object, engine: str, req: Request, url: str | None) -> ScoreResponse:
    answer, rows = _data_list(obj, "score", url)
    return ScoreResponse(scores=tuple(_num(d.get("score"), "score", obj, url) for d in rows), id=_str(answer.get("id")),
                         model=_str(answer.get("model")), usage=_usage(answer.get("usage")), backend=engine,
                         endpoint_url=url, request_id=req.request_id)


def parse_classify(obj: object, engine: str, req: Request, url: str | None) -> ClassifyResponse:
    answer, rows = _data_list(obj, "classify", url)
    results = []
    for i, d in enumerate(rows):
        probs = d.get("probs", d.get("probabilities"))
        if not isinstance(probs, list):
            raise ProtocolError("classify result has no probs", offending=json.dumps(obj)[:500], endpoint=url)
        n = d.get("num_classes")
        results.append(ClassifyResult(index=_index(d.get("index"), i), label=_str(d.get("label")),
                                      probs=tuple(_num(p, "class probability", obj, url) for p in probs),
                                      num_classes=n if type(n) is int else len(probs)))
    return ClassifyResponse(results=tuple(results), id=_str(answer.get("id")), model=_str(answer.get("model")),
                            usage=_usage(answer.get("usage")), backend=engine, endpoint_url=url,
                            request_id=req.request_id)


def parse_pooling(obj: object, engine: str, req: Request, url: str | None) -> PoolingResponse:
    answer, rows = _data_list(obj, "pooling", url)
    data = []
    for d in rows:
        v = d.get("data")
        data.append(json_to_edn(decode_base64_floats(v, obj, url) if isinstance(v, str) else v))
    return PoolingResponse(data=tuple(data), id=_str(answer.get("id")), model=_str(answer.get("model")),
                           usage=_usage(answer.get("usage")), backend=engine, endpoint_url=url,
                           request_id=req.request_id)


def parse_lora_list(obj: object, engine: str, req: Request, url: str | None) -> LoraAdaptersResponse:
    adapters: list[LoraAdapter] = []
    if isinstance(obj, list):  # llama.cpp: [{id, path, scale, ...}]
        for a in obj:
            if isinstance(a, dict):
                scale = a.get("scale")
                adapters.append(LoraAdapter(name=_str(a.get("task_name")) or None, path=_str(a.get("path")),
                                            id=_index(a.get("id"), len(adapters)),
                                            scale=float(scale) if isinstance(scale, (int, float))
                                            and not isinstance(scale, bool) else None))
    elif isinstance(obj, dict) and isinstance(obj.get("data"), list):  # /v1/models: an adapter has a parent
        for m in obj["data"]:
            if isinstance(m, dict) and m.get("parent"):
                adapters.append(LoraAdapter(name=_str(m.get("id")), path=_str(m.get("root"))))
    else:
        raise ProtocolError("LoRA adapter list is neither a list nor a models answer",
                            offending=json.dumps(obj)[:500], endpoint=url)
    return LoraAdaptersResponse(adapters=tuple(adapters), backend=engine, endpoint_url=url, request_id=req.request_id)


def parse_control(obj: object, engine: str, req: Request, url: str | None) -> ControlResponse:
    """A 2xx control answer. vLLM answers text (or nothing), SGLang `/flush_cache` text, its LoRA calls
    `{success, error_message, ...}`, llama.cpp JSON (`{"success": true}`, slot counts)."""
    if isinstance(obj, str):
        return ControlResponse(endpoint=req.endpoint, ok=True, message=obj.strip() or None, backend=engine,
                               endpoint_url=url, request_id=req.request_id)
    ok = True
    message = None
    if isinstance(obj, dict):
        if obj.get("success") is False:
            ok = False
        message = _str(obj.get("error_message")) or _str(obj.get("message"))
    return ControlResponse(endpoint=req.endpoint, ok=ok, message=message or None, detail=json_to_edn(obj),
                           backend=engine, endpoint_url=url, request_id=req.request_id)


PARSERS: dict[str, Callable[[object, str, Request, str | None], AnyResponse]] = {"rerank": parse_rerank, "score": parse_score, "classify": parse_classify, "pooling": parse_pooling,
           "lora-list": parse_lora_list}


def parse_endpoint(obj: object, engine: str, req: Request, url: str | None) -> AnyResponse:
    parse = PARSERS.get(req.endpoint, parse_control)
    return parse(obj, engine, req, url)


# ------------------------------------------------------------------ base64 embeddings


def decode_base64_floats(text: str, obj: object = None, url: str | None = None) -> list[float]:
    """An embedding sent as base64 (`encoding_format: base64`): little-endian float32, as vLLM (float32,
    native order by default) and llama.cpp (the float vector's bytes) write it on the machines they run on."""
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        raise ProtocolError("embedding is not valid base64", offending=text[:500], endpoint=url) from None
    if len(raw) % 4:
        raise ProtocolError(f"base64 embedding is {len(raw)} bytes, not a whole number of float32s",
                            offending=text[:500], endpoint=url)
    floats = array("f")
    floats.frombytes(raw)
    if sys.byteorder == "big":
        floats.byteswap()
    return floats.tolist()
