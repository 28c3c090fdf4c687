"""The recorder: send a fixed set of requests to a live server and keep each exchange whole.

Requests are built as EDN request maps and rendered by the SDK's own dialect, so what is
recorded is exactly what the SDK sends. A raw httpx stream captures status, headers and
the body chunks as they arrive (`iter_raw`: no decoding, boundaries kept).
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any, Callable

import attrs
import httpx

from .._edn import Keyword, kw
from .._errors import ValidationError
from .._requests import request_from_edn
from ..cassettes import KEPT_HEADERS, Cassette, write_cassette
from ..dialects import get_dialect
from ..local import LlamaServer, build_string
from .expect import expect_for

RECORD_TIMEOUT = httpx.Timeout(120.0, connect=5.0)
# Long enough to overflow a 512-token slot with the tiny byte-level vocabulary.
OVERFLOW_PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 120)


@attrs.frozen
class Exchange:
    """One request to record. `request` (an EDN map) for `send`; `method`/`path`/`body` for the rest."""

    name: str
    op: str
    request: dict[Keyword, Any] | None = None
    method: str = "GET"
    path: str = ""
    body: bytes | None = None


def _m(**kv: Any) -> dict[Keyword, Any]:
    return {kw("vllm/" + k.replace("_", "-")): v for k, v in kv.items()}


def _edn(endpoint: str, **kv: Any) -> dict[Keyword, Any]:
    out = {kw("vllm/endpoint"): kw(endpoint)}
    out.update(_m(**kv))
    return out


def _chat(text: str) -> list[dict[Keyword, Any]]:
    return [_m(role=kw("user"), content=text)]


def sampling(max_tokens: int = 8) -> dict[Keyword, Any]:
    return _m(temperature=0.0, seed=42, max_tokens=max_tokens)


def llamacpp_exchanges(embeddings: bool = True) -> list[Exchange]:
    """Every endpoint the SDK uses on llama-server, plus real error answers. Order matters:
    generation first so /slots and /metrics show work done."""
    s = sampling()
    out = [
        Exchange("health", "health", method="GET", path="/health"),
        Exchange("models", "models", method="GET", path="/v1/models"),
        Exchange("tokenize", "send", _edn("tokenize", text="Hello, world")),
        Exchange("detokenize", "send", _edn("detokenize", tokens=[72, 101, 108, 108, 111])),
        Exchange("chat", "send", _edn("chat", messages=_chat("Say hello."), sampling=s)),
        Exchange("chat-stream", "send", _edn("chat", messages=_chat("Say hello."), sampling=s, stream=True)),
        Exchange("completion", "send", _edn("completion", prompt="Once upon a time", sampling=s)),
        Exchange("completion-stream", "send", _edn("completion", prompt="Once upon a time", sampling=s,
                                                   stream=True)),
        Exchange("native-completion", "send", _edn("generate", prompt="Once upon a time", sampling=s)),
        Exchange("native-completion-stream", "send", _edn("generate", prompt="Once upon a time", sampling=s,
                                                          stream=True)),
        Exchange("error-context-overflow", "send", _edn("chat", messages=_chat(OVERFLOW_PROMPT), sampling=s)),
        Exchange("error-context-overflow-stream", "send",
                 _edn("chat", messages=_chat(OVERFLOW_PROMPT), sampling=s, stream=True)),
        # A wrong type the SDK passes through (engine extras are the engine's business)
        Exchange("error-wrong-type", "send", {**_edn("generate", prompt="hi", sampling=s),
                                               kw("llamacpp/n-keep"): "many"}),
        Exchange("error-invalid-json", "raw", method="POST", path="/v1/chat/completions", body=b'{"messages": [ '),
    ]
    if embeddings:
        out.append(Exchange("embeddings", "send", _edn("embedding", input="Hello, world")))
    out += [
        Exchange("props", "probe", method="GET", path="/props"),
        Exchange("slots", "probe", method="GET", path="/slots"),
        Exchange("metrics", "probe", method="GET", path="/metrics"),
    ]
    return out


def engine_exchanges(engine: str, model: str) -> list[Exchange]:
    """The vLLM / SGLang set, for whoever can run those engines: recording it replaces the derived
    cassettes with `:recorded` ones. Reasoning and tool-call answers depend on the model and its
    parsers, so they stay derived unless the server was started with them."""
    s = {**sampling(16), kw("vllm/temperature"): 0.0}
    out = [
        Exchange("health", "health", method="GET", path="/health"),
        Exchange("models", "models", method="GET", path="/v1/models"),
        Exchange("tokenize", "send", _edn("tokenize", text="Hello, world", model=model)),
        Exchange("chat", "send", _edn("chat", messages=_chat("Say hello."), model=model, sampling=s)),
        Exchange("chat-stream", "send", _edn("chat", messages=_chat("Say hello."), model=model, sampling=s,
                                             stream=True)),
        Exchange("chat-logprobs", "send", _edn("chat", messages=_chat("Greet me."), model=model,
                                               sampling={**s, kw("vllm/logprobs"): 2})),
        Exchange("completion", "send", _edn("completion", prompt="The capital of France is", model=model,
                                            sampling=s)),
        Exchange("completion-stream", "send", _edn("completion", prompt="The capital of France is", model=model,
                                                   sampling=s, stream=True)),
        Exchange("error-context-length", "send", _edn("chat", messages=_chat("hi"), model=model,
                                                      sampling={**s, kw("vllm/max-tokens"): 10_000_000})),
        Exchange("error-model-not-found", "send", _edn("chat", messages=_chat("hi"), model="no-such-model")),
    ]
    if engine == "sglang":
        gen = _edn("generate", prompt="The capital of France is", model=model, sampling=s)
        out += [Exchange("generate", "send", gen),
                Exchange("generate-stream", "send", {**gen, kw("vllm/stream"): True})]
    out.append(Exchange("metrics", "probe", method="GET", path="/metrics"))
    return out


# Where each engine says what it is.
VERSION_PROBES = {"vllm": ("/version", "version"), "sglang": ("/server_info", "version")}


def _wire(ex: Exchange, backend: str) -> tuple[str, str, bytes | None, str | None]:
    """(method, path, body bytes, endpoint): the SDK's own rendering for `send`."""
    if ex.op != "send":
        return ex.method, ex.path, ex.body, None
    assert ex.request is not None
    req, problems = request_from_edn(ex.request)
    if req is None:
        raise ValidationError(problems)
    http = get_dialect(backend).render(req)
    body = None if http.body is None else json.dumps(http.body, ensure_ascii=False, separators=(",", ":")).encode()
    return http.method, http.path, body, req.endpoint


def capture(client: httpx.Client, base_url: str, method: str, path: str,
            body: bytes | None) -> tuple[int, dict[str, str], list[bytes]]:
    headers = {"content-type": "application/json", "accept": "application/json"} if body is not None else {}
    with client.stream(method, base_url.rstrip("/") + path, content=body, headers=headers) as r:
        chunks = [c for c in r.iter_raw() if c]
        kept = {k: r.headers[k] for k in KEPT_HEADERS if k in r.headers and k not in ("content-length",
                                                                                     "transfer-encoding")}
        return r.status_code, kept, chunks


def server_build(client: httpx.Client, base_url: str, engine: str) -> str | None:
    """What the server says it is: llama.cpp `/props` `build_info`, vLLM `/version`, SGLang `/server_info`."""
    path, key = VERSION_PROBES.get(engine, ("/props", "build_info"))
    try:
        r = client.get(base_url.rstrip("/") + path)
        v = r.json().get(key)
        return str(v) if v is not None else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


def record(base_url: str, engine: str, exchanges: list[Exchange], *, build: str | None = None,
           source: str = "", log: Callable[[str], None] = lambda s: None) -> list[Cassette]:
    now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    out = []
    # No keep-alive: llama-server closes a connection just after a stream ends (DESIGN §7), and a
    # recorder must not turn that race into a missing cassette.
    with httpx.Client(timeout=RECORD_TIMEOUT, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        reported = server_build(client, base_url, engine)
        fingerprint = None
        for ex in exchanges:
            method, path, body, endpoint = _wire(ex, engine)
            status, headers, chunks = capture(client, base_url, method, path, body)
            ctype = headers.get("content-type", "")
            streaming = "text/event-stream" in ctype
            raw = b"".join(chunks)
            if fingerprint is None and not streaming:
                try:
                    obj = json.loads(raw)
                    fingerprint = obj.get("system_fingerprint") if isinstance(obj, dict) else None
                except (ValueError, UnicodeDecodeError):
                    pass
            call: dict[Keyword, Any] = {kw("call/op"): kw(ex.op)}
            if ex.request is not None:
                call[kw("call/request")] = ex.request
            expect = expect_for(ex.op, endpoint, engine, status, headers, raw, streaming, path)
            out.append(Cassette(name=ex.name, engine=engine, backend=engine, provenance={}, call=call,
                                method=method, path=path, request_body=body, status=status, headers=headers,
                                body=None if streaming else raw, chunks=tuple(chunks) if streaming else None,
                                expect=expect))
            log(f"{ex.name}: HTTP {status} {method} {path} ({len(chunks)} chunk(s), {len(raw)} bytes)")
    prov = {kw("cassette/how"): kw("recorded"), kw("cassette/engine-version"): reported or fingerprint or "unknown",
            kw("cassette/build"): build or "unknown", kw("cassette/date"): now,
            kw("cassette/source"): source or f"live {engine} server at {base_url}"}
    if fingerprint:
        prov[kw("cassette/system-fingerprint")] = fingerprint
    return [attrs.evolve(c, provenance=prov) for c in out]


# The local server the llama.cpp set is recorded from: 2 slots of 512 tokens (so the overflow
# prompt overflows), --metrics --slots (LlamaServer always passes them), embeddings by mean pooling
# (the default pooling "none" is refused by /v1/embeddings).
def local_server() -> LlamaServer:
    return LlamaServer(n_ctx=1024, parallel=2, embeddings=True, extra_args=("--pooling", "mean"))


def record_local(out_dir: Any, log: Callable[[str], None] = lambda s: None) -> list[Any]:
    """Start a local llama-server, record the whole llama.cpp set into `out_dir`, stop it."""

    out = Path(out_dir)
    with local_server() as srv:
        cassettes = record(srv.base_url, "llamacpp", llamacpp_exchanges(embeddings=True), build=build_string(),
                           source="scripts/record-llamacpp: local llama-server, tiny random GGUF "
                                  f"(kotoba_vllm.local.tiny_model_path), n_ctx 1024, 2 slots, --metrics --slots, "
                                  "--embeddings --pooling mean", log=log)
    for old in out.glob("*.edn") if out.is_dir() else ():
        old.unlink()  # a renamed or dropped exchange must not linger
    return [write_cassette(c, out) for c in cassettes]
