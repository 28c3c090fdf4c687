"""Every decision the sync and async clients share; they differ only at I/O call sites.

Holds: turning input into a typed request, validating, choosing the dialect, building
the URL and headers, mapping answers and transport failures to typed results, the
stale-keep-alive resend rule, and the pure backend-detection decision.
"""

from __future__ import annotations

import os
import time
from typing import Any, Iterable, Iterator, Mapping, Union

import attrs
import httpx

from ._codec import structure_located
from ._edn import Edn, EdnMap, Keyword, kw
from ._memo import BoundedMemo
from ._errors import (ConfigError, KotobaError, ProtocolError, RequestTimeout, ServerError, StreamBroken,
                      TransportError, Unreachable, ValidationError, register_secret)
from ._model import (BACKENDS, CONTROL_REQUESTS, REQUEST_TYPES, ROLES, TEXT_REQUESTS, AnyResponse, ChatRequest, CompletionRequest,
                     GenerateRequest, Message, Request, Response, Sampling, StreamDelta, TextRequest)
from ._openai_messages import MESSAGE_FIELDS, message_to_edn
from ._origins import TrustedOrigins, origin_of, show
from ._problems import Problem
from ._requests import request_from_edn
from ._resend import AttemptEvidence
from ._resend import may_resend as evidence_allows_resend
from ._timings import ClientClock
from ._validate import send_problems
from .dialects import ChunkStream, Dialect, HttpRequest, classify_error, get_dialect
from .dialects._http import decode_json, may_hold_wide_int, stream_error

RequestInput = Union[Request, EdnMap]
"""What `send` takes: a typed request, or an EDN request map (its endpoint is data)."""
MessagesInput = Union[str, Iterable[Union[Message, EdnMap, Mapping[str, Any]]]]
"""What `chat` takes: one user turn as a string, or messages (typed, EDN maps, or OpenAI-style
dicts, whose values are JSON and checked when they become a `Message`)."""
TimeoutArg = Union[float, httpx.Timeout, None]
"""Seconds for every phase, an `httpx.Timeout` per phase, or None for the client's default."""

DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=5.0)
DETECT_TIMEOUT = httpx.Timeout(3.0)
API_KEY_ENV = "KOTOBA_VLLM_API_KEY"
BASE_URL_ENV = "KOTOBA_VLLM_BASE_URL"
USER_AGENT = "kotoba-vllm/0.1"

# Probed in order by backend="auto": (path, backend, test on the JSON answer)
DETECTION_PROBES: tuple[tuple[str, str], ...] = (
    ("/props", "llamacpp"),
    ("/server_info", "sglang"),
    ("/get_server_info", "sglang"),
    ("/version", "vllm"),
)


def decide_backend(path: str, status: int, body: Any) -> str | None:
    """Pure: does this probe answer identify an engine?"""
    if status != 200 or not isinstance(body, dict):
        return None
    if path == "/props" and ("default_generation_settings" in body or "total_slots" in body):
        return "llamacpp"
    if path in ("/server_info", "/get_server_info") and ("tokenizer_path" in body or "model_path" in body
                                                         or "version" in body):
        return "sglang"
    if path == "/version" and isinstance(body.get("version"), str):
        return "vllm"
    return None


# Keyword argument name -> the EDN key it stands for: keyword arguments go through the EDN reader.
_SAMPLING_KEYS = {a.name: kw(a.metadata["edn"]) for a in attrs.fields(Sampling)}


def _as_edn_value(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v  # a Python tuple is an EDN vector here, as a list is


def sampling_from_kwargs(kwargs: Mapping[str, Any]) -> Sampling | None:
    """`temperature=0.2, max_tokens=64` -> Sampling, checked exactly as the EDN `:vllm/sampling` map is:
    types here by the same reader, ranges and engine support by `validate` before sending. A wrong
    value is a ValidationError and nothing is sent."""
    if not kwargs:
        return None
    key: Any = []
    for k, v in kwargs.items():  # a loop, not generators: this runs once per request
        if type(v) not in _SCALARS:
            key = None
            break
        key.append((k, type(v), v))  # keyed by type too: True == 1 == 1.0 in Python
    if key is not None:
        key = tuple(key)
        cached = _SAMPLING_SEEN.get(key)
        if cached is not None:
            return cached
    sampling = _structure_sampling(kwargs)
    if key is not None:
        _SAMPLING_SEEN.keep(key, sampling)
    return sampling


# Batch callers repeat the same few keyword sets; Sampling is frozen, so one checked instance serves them all.
_SAMPLING_SEEN: BoundedMemo[Any, Sampling] = BoundedMemo(256)
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _structure_sampling(kwargs: Mapping[str, Any]) -> Sampling:
    unknown = [k for k in kwargs if k not in _SAMPLING_KEYS]
    if unknown:
        raise ValidationError([Problem("error", "sampling/unknown", f"unknown sampling argument {k!r}", field=k)
                               for k in unknown])
    edn = {_SAMPLING_KEYS[k]: _as_edn_value(v) for k, v in kwargs.items()}
    sampling, problems = structure_located(edn, Sampling)
    if sampling is None:
        raise ValidationError(problems)
    return sampling  # ranges and engine support: `validate` in `_plan`, as for an EDN request


def _message_problem(i: int, msg: str, field: str | None = None) -> ValidationError:
    return ValidationError([Problem("error", "message/type", f"message {i}: {msg}", field=field)])


_ROLES = frozenset(ROLES)


def as_messages(messages: MessagesInput) -> tuple[Message, ...]:
    """A string (one user turn), typed messages, EDN message maps or OpenAI-style dicts (with
    `tool_calls`, `tool_call_id` and `name` kept). What cannot be kept is a ValidationError."""
    if isinstance(messages, str):
        return (Message(role="user", content=messages),)
    if type(messages) is not list and type(messages) is not tuple and (  # an ABC check is slow: lists skip it
            isinstance(messages, dict) or not isinstance(messages, Iterable)):
        raise _message_problem(0, f"messages must be a string or a list of messages, got "
                                  f"{type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if type(m) is dict and len(m) == 2:
            # the common `{"role": "user", "content": "..."}`: the Message the general reader builds from it,
            # without the reader (tests/test_request_reuse.py holds the two equal)
            role, content = m.get("role"), m.get("content")
            if type(role) is str and role in _ROLES and type(content) is str:
                out.append(Message(role=role, content=content))
                continue
        if isinstance(m, Message):
            out.append(m)
            continue
        if isinstance(m, dict) and m and all(isinstance(k, str) for k in m):
            edn, unknown = message_to_edn(m)
            if unknown:
                raise _message_problem(i, f"field(s) {', '.join(map(repr, unknown))} have no equivalent here "
                                          f"(kept: {', '.join(MESSAGE_FIELDS)})", field=unknown[0])
        elif isinstance(m, dict):
            edn = m
        else:
            raise _message_problem(i, f"expected a Message, an EDN message map or an OpenAI-style dict, got "
                                      f"{type(m).__name__}")
        msg, problems = structure_located(edn, Message)
        if msg is None:
            raise ValidationError([attrs.evolve(p, msg=f"message {i}: {p.msg}") for p in problems])
        out.append(msg)
    return tuple(out)


@attrs.define  # not frozen, as `ClientClock`: one per request, never changed after
class Plan:
    """One request ready for the wire."""

    request: Request
    dialect: Dialect
    http: HttpRequest
    url: str
    base_url: str
    # The request names a server outside the configured origins: send it without Authorization.
    key_withheld: bool = False


_CONNECT_EVENTS = ("connection.connect_tcp", "connection.connect_unix")
_SEND_EVENTS = ("http11.send_request_headers.started", "http2.send_request_headers.started")
_RESPONSE_EVENTS = ("http11.receive_response_headers.complete", "http2.receive_response_headers.complete")


class Attempt(AttemptEvidence):
    """httpx/httpcore trace hook reporting into the transport-neutral evidence (see `_resend`):
    a connect event means a new connection; sending headers without one means a reused one;
    complete response headers mean the server answered. No events: nothing known, no resend."""

    __slots__ = ()

    def __call__(self, name: str, info: Mapping[str, Any]) -> None:
        # Called ~10 times per request: one tuple-prefix test each, cheapest first.
        if name.startswith(_RESPONSE_EVENTS):
            self.response_seen = True
        elif name.startswith(_SEND_EVENTS):
            if self.reused is None:
                self.reused = True  # no connect event before the request went out: a pooled connection
            if self.response_seen is None:
                self.response_seen = False
        elif name.startswith(_CONNECT_EVENTS):
            if self.reused is None:
                self.reused = False


class AsyncAttempt(Attempt):
    """The same hook for async transports: httpcore awaits the trace callback there."""

    __slots__ = ()

    # override: httpcore awaits the trace hook on async transports, so the same hook is a coroutine here.
    async def __call__(self, name: str, info: Mapping[str, Any]) -> None:  # type: ignore[override]
        Attempt.__call__(self, name, info)


# httpx's connection-level failures: what a closed keep-alive connection raises (never a timeout or refusal).
STALE_ERRORS = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
# What a dialect's parser raises on JSON of an unexpected shape (a list where a map belongs ...)
SHAPE_ERRORS = (AttributeError, TypeError, KeyError, IndexError, ValueError, RecursionError, OverflowError)


def may_resend(exc: BaseException, attempt: AttemptEvidence | None) -> bool:
    """httpx's side of the evidence rule (`_resend.may_resend`): a connection-level failure on a
    reused keep-alive connection before any response byte, as the trace reported it."""
    return evidence_allows_resend(connection_failed=isinstance(exc, STALE_ERRORS), evidence=attempt)


def transport_error(exc: BaseException, url: str, timeout: httpx.Timeout, partial: str | None = None) -> KotobaError:
    """Map an httpx failure to a typed error (pure)."""
    if isinstance(exc, httpx.TimeoutException):
        phase = {httpx.ConnectTimeout: "connect", httpx.ReadTimeout: "read", httpx.WriteTimeout: "write",
                 httpx.PoolTimeout: "pool"}.get(type(exc), "read")
        limit = getattr(timeout, phase, None)
        return RequestTimeout(f"{phase} timeout after {limit} s talking to {url}", phase=phase, limit_s=limit,
                              endpoint=url, partial_text=partial)
    if isinstance(exc, httpx.ConnectError):
        return Unreachable(f"cannot connect to {url}: {exc}", endpoint=url)
    if isinstance(exc, (httpx.UnsupportedProtocol, httpx.InvalidURL)):
        return Unreachable(f"bad URL {url}: {exc}", endpoint=url)
    if partial is not None:
        return StreamBroken(f"stream from {url} broke: {exc or type(exc).__name__}", partial_text=partial,
                            endpoint=url)
    return TransportError(f"{url}: {exc or type(exc).__name__}", endpoint=url)


class StreamRun:
    """Pure-ish driver of one stream: feeds SSE payloads into the dialect's decoder and keeps the clock."""

    def __init__(self, plan: Plan, sent: float | None = None) -> None:
        self.plan = plan
        self.decoder: ChunkStream = plan.dialect.stream_decoder(plan.request, plan.url)
        # `sent` is taken before the request goes out: TTFT includes the wait for response headers.
        self.sent = time.perf_counter() if sent is None else sent
        self.first: float | None = None
        self.token_times: list[float] = []
        self.finished = False

    def on_data(self, data: str, event: str | None = None, wide_ints: bool = True) -> list[StreamDelta]:
        if event == "error":
            obj = decode_json(data.encode())
            raise stream_error(obj if isinstance(obj, dict) else {"message": data}, self.plan.url,
                               self.decoder.partial_text)
        try:
            deltas = self.decoder.feed(data, wide_ints)
        except KotobaError as e:
            e.endpoint = e.endpoint or self.plan.url  # a decoder may not know which server answered
            raise
        except SHAPE_ERRORS as e:  # well-formed JSON of the wrong shape is a protocol error, not a crash
            raise ProtocolError(f"unexpected stream chunk shape: {e}", offending=data, endpoint=self.plan.url,
                                partial_text=self.decoder.partial_text) from None
        if deltas:
            now = time.perf_counter()
            for d in deltas:
                if d.delta or d.reasoning:
                    if self.first is None:
                        self.first = now
                    self.token_times.append(now)
                if d.finish_reason is not None:
                    self.finished = True
        if self.decoder.done:
            self.finished = True
        return deltas

    def on_end(self) -> Response:
        if not self.finished:
            raise StreamBroken(f"stream from {self.plan.url} ended before the server finished",
                               partial_text=self.decoder.partial_text, endpoint=self.plan.url)
        clock = ClientClock(sent=self.sent, first_token=self.first,
                            last_token=self.token_times[-1] if self.token_times else None, done=time.perf_counter(),
                            token_times=tuple(self.token_times))
        return self.decoder.response(clock)

    @property
    def partial_text(self) -> str:
        return self.decoder.partial_text


def not_event_stream(content_type: str) -> str | None:
    """Why a response is not an SSE stream (None when it is)."""
    ctype = content_type.partition(";")[0]
    if "text/event-stream" in ctype:
        return None
    return f"Expected response header Content-Type to contain 'text/event-stream', got {ctype!r}"


class SseDecoder:
    """Bytes in, `(event, data)` out: the WHATWG event-stream line protocol, sans-I/O.

    Leaner than text decoding plus per-line event objects (httpx-sse): lines are split as
    bytes and only `data`/`event` values are decoded (UTF-8, invalid bytes replaced; a
    newline byte never sits inside a UTF-8 sequence, so per-line decoding is exact). An
    event is dispatched on a blank line when it has data or an event name; `id`, `retry`
    and comments are ignored; a trailing event with no blank line is dropped. llama-server's
    non-standard `error:` field is kept as an `error` event so its failure is typed, not lost."""

    __slots__ = ("_buf", "_data", "_event", "_skip_lf", "_carry_wide")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []
        self._event: str | None = None
        self._skip_lf = False  # the last chunk ended in CR: a leading LF belongs to that CRLF
        self._carry_wide = False  # the event in progress has a line from an earlier read with a 19-digit run

    def feed(self, chunk: bytes) -> list[tuple[str | None, str]]:
        return list(self.events(chunk))

    def events(self, chunk: bytes) -> Iterator[tuple[str | None, str]]:
        """`feed`, lazily: each event is decoded only when asked for, so a consumer holding the
        first delta of a large read does not hold every event of that read decoded."""
        for event, data, _ in self.payloads(chunk):
            yield event, data

    def payloads(self, chunk: bytes) -> Iterator[tuple[str | None, str, bool]]:
        """`events`, each with whether its bytes may hold 19+ digits in a row (a JSON integer orjson reads as
        a float): checked once per read over every line it completes, carried while an event spans reads."""
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            if buf[-1:] == b"\r":
                self._skip_lf = True
                buf += b"\n"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        cut = buf.rfind(b"\n") + 1
        self._buf = buf[cut:]  # an incomplete last line waits for the next read
        read_wide = may_hold_wide_int(buf)
        wide = read_wide or self._carry_wide
        data = self._data
        start, find = 0, buf.find
        while start < cut:
            end = find(b"\n", start)
            if not data and end + 1 < cut and buf[end + 1] == 10 and buf.startswith(b"data: ", start) \
                    and self._event is None:  # the common event, one `data: ` line and its blank line: at once
                yield None, buf[start + 6:end].decode("utf-8", "replace"), wide
                start = end + 2
                wide = read_wide
                continue
            line = buf[start:end]
            start = end + 1
            if line[:6] == b"data: ":
                data.append(line[6:].decode("utf-8", "replace"))
            elif not line:
                if data or self._event is not None:
                    event, self._event = self._event, None
                    self._data = []
                    yield event, "\n".join(data), wide
                    data = self._data
                    wide = read_wide  # the next event's lines are all from this read
            elif line[:1] != b":":
                name, _, value = line.partition(b":")
                if value[:1] == b" ":
                    value = value[1:]
                if name == b"data":
                    data.append(value.decode("utf-8", "replace"))
                elif name == b"event":
                    self._event = value.decode("utf-8", "replace") or None
                elif name == b"error":  # llama-server writes mid-stream failures as `error: {...}` lines
                    data.append(value.decode("utf-8", "replace"))
                    self._event = "error"
        self._carry_wide = wide and bool(data or self._event is not None)


def server_root(url: str) -> str:
    """The server's root URL. An OpenAI-style `.../v1` is accepted: the dialects' routes carry `/v1` themselves."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def client_headers(api_key: str | None, headers: Mapping[str, str] | None) -> dict[str, str]:
    """The headers every request of a client carries: ours, the caller's (lower-cased), the key."""
    h = {"user-agent": USER_AGENT, "accept": "application/json"}
    if headers:
        h.update({k.lower(): v for k, v in headers.items()})
    if api_key:
        h["authorization"] = f"Bearer {api_key}"
    return h


def api_key_or_env(api_key: str | None) -> str | None:
    return api_key if api_key is not None else os.environ.get(API_KEY_ENV)


def to_request(request: RequestInput) -> Request:
    """A typed request as is; an EDN request map read into one (ValidationError when it cannot be)."""
    if isinstance(request, REQUEST_TYPES):
        return request
    if isinstance(request, Mapping) and all(isinstance(k, Keyword) for k in request):
        req, problems = request_from_edn(dict(request))
        if req is None:
            raise ValidationError(problems)
        return req
    if isinstance(request, Mapping):
        raise ValidationError([Problem("error", "request/type", "a request map needs :vllm/* keyword keys")])
    raise ValidationError([Problem("error", "request/type", f"not a request: {type(request).__name__}")])


def streaming(request: RequestInput) -> TextRequest:
    """The request with streaming switched on; only text-generating requests stream."""
    req = to_request(request)
    if not isinstance(req, TEXT_REQUESTS):
        raise ValidationError([Problem("error", "request/stream", f"a {req.endpoint} request does not stream",
                                       field="vllm/stream")])
    return req if req.stream else attrs.evolve(req, stream=True)


def chat_request(messages: MessagesInput, model: str | None, tools: Edn, stream: bool, sampling: Mapping[str, Any],
                 extras: Mapping[str, Edn] | None) -> ChatRequest:
    return ChatRequest(messages=as_messages(messages), model=model, sampling=sampling_from_kwargs(sampling),
                       stream=stream or None, tools=tools, extras=dict(extras or {}))


class BaseClient:
    def __init__(self, base_url: str | None = None, *, backend: str = "auto", api_key: str | None = None,
                 timeout: float | httpx.Timeout | None = None, headers: Mapping[str, str] | None = None,
                 model: str | None = None, trusted_origins: Iterable[str] = ()) -> None:
        if backend != "auto" and backend not in BACKENDS:
            raise ConfigError(f"backend must be one of auto, {', '.join(BACKENDS)}; got {backend!r}")
        # Origins the key may go to besides the base URL's own (see `_origins`).
        self.trusted = TrustedOrigins(trusted_origins)
        self.base_url = server_root(base_url or os.environ.get(BASE_URL_ENV) or "http://127.0.0.1:8000")
        self._backend = backend
        self._detected: dict[str, str] = {}
        self.__api_key = api_key_or_env(api_key)
        register_secret(self.__api_key)  # a server quoting our Authorization header back never shows it
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else (
            DEFAULT_TIMEOUT if timeout is None else httpx.Timeout(timeout))
        self.model = model
        self._headers = client_headers(self.__api_key, headers)
        self._has_key = "authorization" in self._headers  # a caller's own http client may carry one (subclasses)
        self._urls: BoundedMemo[str, httpx.URL] = BoundedMemo(256)  # see `_url`
        self.resends = 0  # requests sent again after a stale keep-alive connection (see `_resend`)

    def __repr__(self) -> str:  # the key is never shown
        key = ", api_key=<set>" if self.__api_key else ""
        return f"{type(self).__name__}(base_url={self.base_url!r}, backend={self._backend!r}{key})"

    @property
    def base_url(self) -> str:
        return self._base_url

    @base_url.setter
    def base_url(self, url: str) -> None:
        self._base_url = url
        if origin_of(url) is not None:  # the configured server is trusted with the key, always
            self.trusted.add(url)

    def _key_withheld(self, base: str) -> bool:
        """True when a key is set and `base` is outside the configured origins."""
        return self._has_key and not self.trusted.allows(base)

    def _explain_withheld(self, err: KotobaError, plan: Plan) -> KotobaError:
        """A 401/403 from a server we withheld the key from says so, and how to trust it."""
        if plan.key_withheld and isinstance(err, ServerError) and err.status in (401, 403):
            o = origin_of(plan.base_url)
            where = show(o) if o is not None else plan.base_url
            note = (f"the API key was withheld from {where}: it goes only to configured origins "
                    f"({self.trusted.describe()}); to send it there, trust that origin explicitly "
                    f"(trusted_origins=[{where!r}], or `run --trust-origin {where}`) or make it a pool member "
                    f"(:pool/members in the pool file)")
            err.key_withheld = note
            err.message = f"{err.message} ({note})"
            err.args = (err.message,)
        return err

    @property
    def backend(self) -> str:
        """The configured backend, or the one detected for the default base URL ("auto" until detected)."""
        return self._detected.get(self.base_url, self._backend)

    def learn_backend(self, base_url: str, backend: str) -> None:
        """Take the backend detected elsewhere (a pool's capacity probe) for `base_url`: no second detection."""
        self._detected.setdefault(server_root(base_url), backend)

    # ------------------------------------------------------------ decisions

    def _to_request(self, request: RequestInput) -> Request:
        return to_request(request)

    def _with_defaults(self, req: Request) -> Request:
        if req.model is None and self.model is not None and not isinstance(req, CONTROL_REQUESTS):
            return attrs.evolve(req, model=self.model)
        return req

    def _base_for(self, req: Request) -> str:
        return server_root(req.base_url) if req.base_url else self.base_url

    def _backend_for(self, base: str) -> str | None:
        if self._backend != "auto":
            return self._backend
        return self._detected.get(base)

    def _plan(self, req: Request, backend: str, base: str | None = None, checked: bool = False) -> Plan:
        """`base`: `_base_for(req)` when the caller has it already; `checked`: see `send`."""
        if base is None:
            base = self._base_for(req)
        problems = send_problems(req, backend, checked)
        if problems and any(p.is_error for p in problems):
            raise ValidationError(problems, endpoint=base)
        dialect = get_dialect(backend)
        http = dialect.render(req)
        return Plan(req, dialect, http, base + http.path, base, self._key_withheld(base))

    def _finish(self, plan: Plan, status: int, headers: Mapping[str, str], raw: bytes, sent: float) -> AnyResponse:
        if status >= 400:
            raise self._explain_withheld(classify_error(status, raw, headers, plan.url), plan)
        obj = decode_json(raw)
        if obj is None:
            if plan.request.endpoint not in plan.dialect.text_answers:
                raise ProtocolError(f"malformed JSON from {plan.url} (HTTP {status})", offending=raw, endpoint=plan.url)
            obj = raw.decode("utf-8", "replace")  # a control call's answer in words (vLLM, SGLang), or none
        clock = ClientClock(sent=sent, done=time.perf_counter())
        try:
            return plan.dialect.parse(plan.request, obj, plan.url, clock)
        except KotobaError as e:
            e.endpoint = e.endpoint or plan.url  # a parser may not know which server answered
            raise
        except SHAPE_ERRORS as e:  # well-formed JSON of the wrong shape is a protocol error, not a crash
            raise ProtocolError(f"unexpected answer shape from {plan.url}: {e}", offending=raw,
                                endpoint=plan.url) from None

    def _url(self, url: str) -> httpx.URL:
        """The parsed URL, cached: parsing a URL string costs as much as the rest of building a request."""
        parsed = self._urls.get(url)
        return parsed if parsed is not None else self._urls.keep(url, httpx.URL(url))

    def _timeout_for(self, timeout: float | httpx.Timeout | None) -> httpx.Timeout:
        if timeout is None:
            return self.timeout
        return timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)

    def _chat_request(self, messages: MessagesInput, model: str | None, tools: Edn, stream: bool,
                      sampling: Mapping[str, Any], extras: Mapping[str, Edn] | None) -> ChatRequest:
        # The client's default model goes in here: `_with_defaults` would rebuild the request (attrs.evolve).
        return chat_request(messages, model if model is not None else self.model, tools, stream, sampling, extras)

    def _completion_request(self, prompt: str, model: str | None, stream: bool, sampling: Mapping[str, Any],
                            extras: Mapping[str, Edn] | None, native: bool) -> CompletionRequest | GenerateRequest:
        cls: type[CompletionRequest | GenerateRequest] = GenerateRequest if native else CompletionRequest
        model = model if model is not None else self.model
        return cls(prompt=prompt, model=model, sampling=sampling_from_kwargs(sampling), stream=stream or None,
                   extras=dict(extras or {}))
