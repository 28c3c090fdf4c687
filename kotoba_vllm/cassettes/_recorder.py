"""The recorder: send a fixed set of requests to a live server and keep each exchange whole.

Requests are built as EDN request maps and rendered by the SDK's own dialect, so what is
recorded is exactly what the SDK sends. A raw httpx stream captures status, headers and
the body chunks as they arrive (`iter_raw`: no decoding, boundaries kept).
"""

from __future__ import annotations

import datetime as _dt
import json
import threading
import time
from pathlib import Path
from typing import Callable

import attrs
import httpx

from .._edn import Edn, Keyword, kw
from .._errors import ValidationError
from .._requests import request_from_edn
from ._format import KEPT_HEADERS, Cassette, write_cassette
from ..dialects import get_dialect
from ..local import LlamaServer, build_string
from ..server_config import config_paths, redacted_body
from ._expect import expect_for

RECORD_TIMEOUT = httpx.Timeout(120.0, connect=5.0)
# Long enough to overflow a 512-token slot with the tiny byte-level vocabulary.
OVERFLOW_PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 120)


@attrs.frozen
class Exchange:
    """One request to record. `request` (an EDN map) for `send`; `method`/`path`/`body` for the rest."""

    name: str
    op: str
    request: dict[Keyword, Edn] | None = None
    method: str = "GET"
    path: str = ""
    body: bytes | None = None
    # Long requests kept in flight while this exchange is sent (the server's queue is then busy or
    # full); consecutive exchanges with the same load share it.
    load: int = 0


def _m(**kv: Edn) -> dict[Keyword, Edn]:
    return {kw("vllm/" + k.replace("_", "-")): v for k, v in kv.items()}


def _edn(endpoint: str, **kv: Edn) -> dict[Keyword, Edn]:
    out: dict[Keyword, Edn] = {kw("vllm/endpoint"): kw(endpoint)}
    out.update(_m(**kv))
    return out


def _chat(text: str) -> list[dict[Keyword, Edn]]:
    return [_m(role=kw("user"), content=text)]


# Public doors for the per-engine exchange sets (vllm_sets): a {:vllm/..} map, a request, a user turn.
vllm_map, edn_request, user_chat = _m, _edn, _chat


def sampling(max_tokens: int = 8) -> dict[Keyword, Edn]:
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
        # A wrong type reaches the engine only through the unchecked pass-through (the SDK checks :llamacpp/n-keep)
        Exchange("error-wrong-type", "send", {**_edn("generate", prompt="hi", sampling=s),
                                               kw("vllm/extra-body"): {"n_keep": "many"}}),
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


def config_exchanges(engine: str) -> list[Exchange]:
    """What `inspect` asks an engine (server_config CONFIG_PATHS), one probe each: `config-version`,
    `config-v1-models`, ... A server's secrets in them are redacted by `record` as in every set."""
    return [Exchange("config-" + p.strip("/").replace("/", "-").replace("_", "-"), "probe", method="GET", path=p)
            for p in config_paths(engine)]


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


def sglang_exchanges(model: str, which: str = "default") -> list[Exchange]:
    """The SGLang set, for a server started by `scripts/record-sglang` (`--enable-metrics`, one
    running and one queued request at most). `incremental`: the `/generate` streams of a server
    with `--incremental-streaming-output`. Queue-full exchanges run with two long requests in
    flight (one running, one queued), so the next one meets SGLang's own queue limit."""
    s = {**sampling(16), kw("vllm/temperature"): 0.0}
    gen = _edn("generate", prompt="The capital of France is", model=model, sampling=s)
    stream = {kw("vllm/stream"): True}
    if which == "router":  # sglang-router in front, one request at a time, no queue: its own 429
        return [Exchange("429-sglang-router-stream", "send",
                         {**_edn("chat", messages=_chat("hi"), model=model, sampling=s), **stream}, load=1),
                Exchange("429-sglang-router-generate", "send", _edn("generate", prompt="hi", model=model), load=1)]
    if which == "incremental":
        return [Exchange("generate-stream-incremental", "send", {**gen, **stream}),
                Exchange("generate-queue-full-stream-incremental", "send", {**gen, **stream}, load=2)]
    chat = _edn("chat", messages=_chat("Say hello."), model=model, sampling=s)
    comp = _edn("completion", prompt="Once upon a time", model=model, sampling=s)
    too_long = {kw("vllm/sampling"): {**s, kw("vllm/max-tokens"): 10_000_000}}
    long_prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 80)
    over = _edn("generate", prompt=long_prompt, model=model, sampling=s)
    return [
        Exchange("health", "health", method="GET", path="/health"),
        # counters before any generation: with `metrics` below, the run a bench would compare against
        Exchange("metrics-start", "probe", method="GET", path="/metrics"),
        Exchange("models", "models", method="GET", path="/v1/models"),
        Exchange("server-info", "probe", method="GET", path="/server_info"),
        Exchange("tokenize", "send", _edn("tokenize", text="Hello, world", model=model)),
        Exchange("detokenize", "send", _edn("detokenize", tokens=[40, 41, 42, 43], model=model)),
        Exchange("generate", "send", gen),
        Exchange("generate-stream", "send", {**gen, **stream}),
        Exchange("chat", "send", chat),
        Exchange("chat-stream", "send", {**chat, **stream}),
        Exchange("completion", "send", comp),
        Exchange("completion-stream", "send", {**comp, **stream}),
        Exchange("error-context-length", "send", {**chat, **too_long}),
        Exchange("error-context-length-stream", "send", {**chat, **too_long, **stream}),
        Exchange("completion-error-context-length", "send", {**comp, **too_long}),
        Exchange("completion-error-context-length-stream", "send", {**comp, **too_long, **stream}),
        Exchange("error-prompt-too-long", "send", {**chat, kw("vllm/messages"): _chat(long_prompt)}),
        Exchange("error-prompt-too-long-stream", "send", {**chat, kw("vllm/messages"): _chat(long_prompt), **stream}),
        Exchange("completion-error-prompt-too-long", "send", {**comp, kw("vllm/prompt"): long_prompt}),
        Exchange("completion-error-prompt-too-long-stream", "send", {**comp, kw("vllm/prompt"): long_prompt, **stream}),
        Exchange("generate-error", "send", over),
        Exchange("generate-error-stream", "send", {**over, **stream}),
        Exchange("generate-error-max-new-tokens", "send", {**gen, **too_long}),
        Exchange("metrics", "probe", method="GET", path="/metrics"),
        Exchange("metrics-busy", "probe", method="GET", path="/metrics", load=2),
        Exchange("queue-full", "send", chat, load=2),
        Exchange("queue-full-stream", "send", {**chat, **stream}, load=2),
        Exchange("completion-queue-full", "send", comp, load=2),
        Exchange("completion-queue-full-stream", "send", {**comp, **stream}, load=2),
        Exchange("generate-queue-full", "send", gen, load=2),
        Exchange("generate-queue-full-stream", "send", {**gen, **stream}, load=2),
    ]


# A load request: long enough (480 tokens, within the 512-token context, at the fake scheduler's 20 ms a step) to outlast a group
# of queue-full exchanges; `ignore_eos` keeps it from stopping early. Sent raw, never recorded.
LOAD_BODY = {"text": "load", "sampling_params": {"max_new_tokens": 480, "ignore_eos": True, "temperature": 0.0}}


class _Load:
    """`n` long `/generate` requests in flight, each on its own thread and connection; each is started
    once the server's own gauges show the one before it (a loaded machine delays them by seconds)."""

    GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs")

    def __init__(self, base_url: str, n: int) -> None:
        self.threads = [threading.Thread(target=self._one, args=(base_url,), daemon=True) for _ in range(n)]
        for i, t in enumerate(self.threads, 1):
            t.start()
            self._wait_for(base_url, i)

    def _wait_for(self, base_url: str, n: int, limit_s: float = 30.0) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                text = httpx.get(base_url.rstrip("/") + "/metrics", headers={"accept-encoding": "identity"},
                                 timeout=5.0).text
            except httpx.HTTPError:
                continue
            seen = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(self.GAUGES)]
            if sum(seen) >= n:
                return
            if not seen and time.monotonic() > deadline - limit_s + 0.5:
                # No engine gauges (a router): half a second on loopback, and short enough that a
                # router's token bucket (sglang-router refills one a second) has not refilled.
                return

    @staticmethod
    def _one(base_url: str) -> None:
        try:
            httpx.post(base_url.rstrip("/") + "/generate", json=LOAD_BODY, timeout=RECORD_TIMEOUT)
        except httpx.HTTPError:
            pass

    def join(self) -> None:
        for t in self.threads:
            t.join(timeout=60)


# Where each engine says what it is.
VERSION_PROBES = {"vllm": ("/version", "version"), "sglang": ("/server_info", "version")}


def _wire(ex: Exchange, backend: str) -> tuple[str, str, bytes | None, str | None, dict[str, str]]:
    """(method, path, body bytes, endpoint, headers): the SDK's own rendering for `send`."""
    if ex.op != "send":
        return ex.method, ex.path, ex.body, None, {}
    assert ex.request is not None
    req, problems = request_from_edn(ex.request)
    if req is None:
        raise ValidationError(problems)
    http = get_dialect(backend).render(req)
    body = None if http.body is None else json.dumps(http.body, ensure_ascii=False, separators=(",", ":")).encode()
    return http.method, http.path, body, req.endpoint, {k.lower(): v for k, v in (http.headers or {}).items()}


def capture(client: httpx.Client, base_url: str, method: str, path: str,
            body: bytes | None, sent_headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], list[bytes]]:
    headers = {"content-type": "application/json", "accept": "application/json"} if body is not None else {}
    headers.update(sent_headers or {})  # the dialect's own (x-request-id)
    # Uncompressed: the bytes are kept as read (iter_raw), and SGLang's /metrics gzips when asked.
    headers["accept-encoding"] = "identity"
    with client.stream(method, base_url.rstrip("/") + path, content=body, headers=headers) as r:
        chunks = [c for c in r.iter_raw() if c]
        kept = {k: r.headers[k] for k in KEPT_HEADERS if k in r.headers and k not in ("content-length",
                                                                                     "transfer-encoding")}
        return r.status_code, kept, chunks


class EngineLog:
    """The JSON lines a faked engine core / scheduler appends, one per request it is handed
    (tests/recording/*_fake_*.py, KOTOBA_FAKE_RECEIVED): each exchange takes the lines written while
    it ran, so a cassette carries what the engine's own serving layer passed on."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.seen = self.path.stat().st_size if self.path.exists() else 0

    def since_last(self, settle_s: float = 0.3) -> tuple[Edn, ...]:
        time.sleep(settle_s)  # the scheduler process writes its line on its own clock
        if not self.path.exists():
            return ()
        with open(self.path, "rb") as f:
            f.seek(self.seen)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next exchange
        self.seen += end
        return tuple(json.loads(line) for line in data[:end].splitlines() if line.strip())


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
           source: str = "", simulated: str | None = None, engine_log: str | Path | None = None,
           log: Callable[[str], None] = lambda s: None) -> list[Cassette]:
    now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    out = []
    # No keep-alive: llama-server closes a connection just after a stream ends (DESIGN §7), and a
    # recorder must not turn that race into a missing cassette.
    with httpx.Client(timeout=RECORD_TIMEOUT, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        reported = server_build(client, base_url, engine)
        fingerprint = None
        load: _Load | None = None
        received = EngineLog(engine_log) if engine_log is not None else None
        for i, ex in enumerate(exchanges):
            if ex.load and load is None:
                load = _Load(base_url, ex.load)
            method, path, body, endpoint, sent_headers = _wire(ex, engine)
            status, headers, chunks = capture(client, base_url, method, path, body, sent_headers)
            ctype = headers.get("content-type", "")
            streaming = "text/event-stream" in ctype
            raw = b"".join(chunks)
            if not streaming:
                raw = redacted_body(raw)  # a server's own secrets (SGLang's /server_info api_key) never land
            if fingerprint is None and not streaming:
                try:
                    obj = json.loads(raw)
                    fingerprint = obj.get("system_fingerprint") if isinstance(obj, dict) else None
                except (ValueError, UnicodeDecodeError):
                    pass
            call: dict[Keyword, Edn] = {kw("call/op"): kw(ex.op)}
            if ex.request is not None:
                call[kw("call/request")] = ex.request
            expect = expect_for(ex.op, endpoint, engine, status, headers, raw, streaming, path)
            out.append(Cassette(name=ex.name, engine=engine, backend=engine, provenance={}, call=call,
                                method=method, path=path, request_body=body, status=status, headers=headers,
                                body=None if streaming else raw, chunks=tuple(chunks) if streaming else None,
                                expect=expect, request_headers=sent_headers,
                                engine_received=received.since_last() if received is not None else None))
            log(f"{ex.name}: HTTP {status} {method} {path} ({len(chunks)} chunk(s), {len(raw)} bytes)")
            if load is not None and (i + 1 == len(exchanges) or exchanges[i + 1].load != ex.load):
                load.join()
                load = None
    prov = {kw("cassette/how"): kw("recorded"), kw("cassette/engine-version"): reported or fingerprint or "unknown",
            kw("cassette/build"): build or "unknown", kw("cassette/date"): now,
            kw("cassette/source"): source or f"live {engine} server at {base_url}"}
    if fingerprint:
        prov[kw("cassette/system-fingerprint")] = fingerprint
    if simulated:
        prov[kw("cassette/simulated")] = simulated
    return [attrs.evolve(c, provenance=prov) for c in out]


# The local server the llama.cpp set is recorded from: 2 slots of 512 tokens (so the overflow
# prompt overflows), --metrics --slots (LlamaServer always passes them), embeddings by mean pooling
# (the default pooling "none" is refused by /v1/embeddings).
def local_server() -> LlamaServer:
    return LlamaServer(n_ctx=1024, parallel=2, embeddings=True, extra_args=("--pooling", "mean"))


def record_local(out_dir: str | Path, log: Callable[[str], None] = lambda s: None) -> list[Path]:
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
