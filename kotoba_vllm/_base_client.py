"""Every decision the sync and async clients share; they differ only at I/O call sites.

Holds: turning input into a typed request, validating, choosing the dialect, building
the URL and headers, mapping answers and transport failures to typed results, the
stale-keep-alive resend rule, and the pure backend-detection decision.
"""

from __future__ import annotations

import os
import time
from typing import Iterable, Iterator, Mapping, Protocol, TypeVar, Union, cast

import attrs
import httpx

from ._codec import structure_located
from ._edn import Edn, EdnMap, Keyword, kw
from ._memo import BoundedMemo
from ._fields import EXTRA_BODY, KWARG_KEYS, key_of_param, version_problems
from ._errors import (ConfigError, KotobaError, ProtocolError, Redirected, RequestTimeout, ResponseTooLarge,
                      ServerError, StreamBroken, TransportError, Unreachable, ValidationError, register_secret)
from ._model import (BACKENDS, CONTROL_REQUESTS, REQUEST_TYPES, ROLES, SERVER_ID_ANSWERS, TEXT_REQUESTS, AnyResponse,
                     ChatRequest, CompletionRequest,
                     GenerateRequest, Message, Request, Response, Sampling, StreamDelta, TextRequest)
from ._openai_messages import MESSAGE_FIELDS, message_to_edn
from ._origins import TrustedOrigins, origin_of, show
from ._problems import Problem
from ._requests import request_from_edn
from ._resend import AttemptEvidence
from ._resend import may_resend as evidence_allows_resend
from ._timings import ClientClock
from ._validate import send_problems
from ._wire_core import DEFAULT_MAX_BYTES, PROBE_MAX_BYTES, too_large
from .dialects import ChunkStream, Dialect, HttpRequest, classify_error, get_dialect
from .dialects._http import decode_json, decode_json_refusing_wide_ints, may_hold_wide_int, stream_error

RequestInput = Union[Request, EdnMap]
"""What `send` takes: a typed request, or an EDN request map (its endpoint is data)."""
MessagesInput = Union[str, Iterable[Union[Message, EdnMap, Mapping[str, object]]]]
"""What `chat` takes: one user turn as a string, or messages (typed, EDN maps, or OpenAI-style
dicts, whose values are JSON and checked when they become a `Message`)."""
TimeoutArg = Union[float, httpx.Timeout, None]
"""Seconds for every phase, an `httpx.Timeout` per phase, or None for the client's default."""
DeadlineArg = Union[float, None]
"""Seconds for the whole call (`inf`: none), or None for the request's `:vllm/deadline-s`, else the client's."""

DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=5.0)
DEFAULT_DEADLINE_S = 600.0
"""The whole call, connect to last byte (a trickling server cannot hold a call past it)."""
DEFAULT_STREAM_IDLE_S = 120.0
"""Between a stream's data events, from the first one on (comments and heartbeats do not count;
the wait for the first token - a long prefill - is bounded by the deadline, not by this)."""
DEFAULT_SSE_LINE_BYTES = 16 * 1024 * 1024
DETECT_TIMEOUT = httpx.Timeout(3.0)
DETECT_DEADLINE_S = 5.0
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


def decide_backend(path: str, status: int, body: object) -> str | None:
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

_SamplingKey = tuple[tuple[str, type, object], ...]  # (name, type, value) per keyword argument


def _as_edn_value(v: object) -> Edn:
    # a keyword argument's value, read and checked as EDN after this
    return list(v) if isinstance(v, tuple) else cast(Edn, v)  # a Python tuple is an EDN vector here, as a list is


def sampling_from_kwargs(kwargs: Mapping[str, object]) -> Sampling | None:
    """`temperature=0.2, max_tokens=64` -> Sampling, checked exactly as the EDN `:vllm/sampling` map is:
    types here by the same reader, ranges and engine support by `validate` before sending. A wrong
    value is a ValidationError and nothing is sent."""
    if not kwargs:
        return None
    key: _SamplingKey | None = None
    items: list[tuple[str, type, object]] = []
    for k, v in kwargs.items():  # a loop, not generators: this runs once per request
        if type(v) not in _SCALARS:
            break
        items.append((k, type(v), v))  # keyed by type too: True == 1 == 1.0 in Python
    else:
        key = tuple(items)
        cached = _SAMPLING_SEEN.get(key)
        if cached is not None:
            return cached
    sampling = _structure_sampling(kwargs)
    if key is not None:
        _SAMPLING_SEEN.keep(key, sampling)
    return sampling


# Batch callers repeat the same few keyword sets; Sampling is frozen, so one checked instance serves them all.
_SAMPLING_SEEN: BoundedMemo[_SamplingKey, Sampling] = BoundedMemo(256)
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _structure_sampling(kwargs: Mapping[str, object]) -> Sampling:
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


class Reply(Protocol):
    """An answer read whole, as `_finish` reads it (every wire's answer is one)."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def content(self) -> bytes: ...


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
    sends: int = 1  # how many times it went out (a stale keep-alive connection sends it once more)


_CONNECT_EVENTS = ("connection.connect_tcp", "connection.connect_unix")
_SEND_EVENTS = ("http11.send_request_headers.started", "http2.send_request_headers.started")
_RESPONSE_EVENTS = ("http11.receive_response_headers.complete", "http2.receive_response_headers.complete")


class Attempt(AttemptEvidence):
    """httpx/httpcore trace hook reporting into the transport-neutral evidence (see `_resend`):
    a connect event means a new connection; sending headers without one means a reused one;
    complete response headers mean the server answered. No events: nothing known, no resend."""

    __slots__ = ()

    def __call__(self, name: str, info: Mapping[str, object]) -> None:
        trace_event(self, name)


def trace_event(ev: AttemptEvidence, name: str, info: object = None) -> None:
    """One httpcore trace event into the evidence."""
    # Called for every trace event of every request: one tuple-prefix test each, cheapest first.
    if name.startswith(_RESPONSE_EVENTS):
        ev.response(seen=True)
    elif name.startswith(_SEND_EVENTS):
        ev.connection(reused=True)  # no connect event before the request went out: a pooled connection
        ev.response(seen=False)
    elif name.startswith(_CONNECT_EVENTS):
        ev.connection(reused=False)


class AsyncAttempt(Attempt):
    """The same hook for async transports: httpcore awaits the trace callback there."""

    __slots__ = ()

    # override: httpcore awaits the trace hook on async transports, so the same hook is a coroutine here.
    async def __call__(self, name: str, info: Mapping[str, object]) -> None:  # type: ignore[override]
        trace_event(self, name)


# What a dialect's parser raises on JSON of an unexpected shape (a list where a map belongs ...)
SHAPE_ERRORS = (AttributeError, TypeError, KeyError, IndexError, ValueError, RecursionError, OverflowError)


def may_resend(exc: TransportError, attempt: AttemptEvidence | None) -> bool:
    """The evidence rule (`_resend.may_resend`) on a wire's failure: the connection was lost under a
    reused keep-alive connection before any response byte, as the wire reported it."""
    return evidence_allows_resend(connection_failed=exc.connection_lost, evidence=attempt)


def broken_stream(exc: TransportError, url: str, partial: str) -> TransportError:
    """A wire's failure in the middle of a stream: the text so far kept. A timeout or a limit stays
    what it is (with the partial text); anything else is `StreamBroken`."""
    if isinstance(exc, RequestTimeout):
        exc.partial_text = partial
        return exc
    if isinstance(exc, (StreamBroken, ResponseTooLarge)):
        return exc
    return StreamBroken(f"stream from {url} broke: {exc.message}", partial_text=partial, endpoint=url)


K_PARAM = kw("param")


def _extra_body(extras: Mapping[str, Edn]) -> Mapping[object, object] | None:
    v = extras.get(EXTRA_BODY) if extras else None
    return v if isinstance(v, Mapping) else None


_Err = TypeVar("_Err", bound=KotobaError)


def identify(err: _Err, request: Request | None, dialect: str | None = None,
             server_request_id: str | None = None) -> _Err:
    """`err` stamped with who it concerns: the one rule for every path that raises about a request (an error
    answer, an error inside a 200 stream, a transport failure or timeout, a pool's refusal), run only when an
    error is built. It gets our request id, the id the server answered with (`x-request-id`), the engine
    dialect that sent the request, and the EDN key of the field the engine named as refused (vLLM's `param`).
    What is stamped already is kept: an inner layer (the one that read the answer's headers) knows more."""
    if err.request_id is None and request is not None:
        err.request_id = request.request_id
    if err.server_request_id is None:
        err.server_request_id = server_request_id
    if err.backend is None and dialect is not None:
        err.backend = dialect
        if isinstance(err, ServerError) and err.field is None:
            param = err.details.get(K_PARAM)
            if type(param) is str:  # which request key the refused field came from
                extra = _extra_body(request.extras) if request is not None else None
                err.field = key_of_param(dialect, param, extra)
    return err


def answer_error(status: int, raw: bytes, headers: Mapping[str, str], url: str) -> ServerError:
    """The typed error for an answer that is not a success: a 3xx names its status and `Location`
    (redirects are never followed, nor taken as the answer); 4xx/5xx by `classify_error`."""
    if status >= 400:
        return classify_error(status, raw, headers, url)
    location = headers.get("location")
    return Redirected(f"{url} answered HTTP {status} (a redirect{f' to {location}' if location else ''}); redirects "
                      f"are not followed: use the final URL as base_url", status=status, location=location,
                      endpoint=url, raw_body=raw)


class StreamRun:
    """Pure-ish driver of one stream: feeds SSE payloads into the dialect's decoder and keeps the clock."""

    def __init__(self, plan: Plan, sent: float | None = None, server_request_id: str | None = None) -> None:
        self.plan = plan
        self.server_request_id = server_request_id  # the response's x-request-id: the id the server used
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
        return with_server_id(self.decoder.response(clock), self.server_request_id, self.plan.sends)

    @property
    def partial_text(self) -> str:
        return self.decoder.partial_text


_Answer = TypeVar("_Answer", bound=AnyResponse)


def with_server_id(resp: _Answer, server_request_id: str | None, sends: int = 1) -> _Answer:
    """The answer with the request id the server says it used (its `x-request-id` header), beside ours, and
    how many times the request was sent when that was more than once."""
    if server_request_id is None and sends == 1 or not isinstance(resp, SERVER_ID_ANSWERS):
        return resp
    return attrs.evolve(resp, server_request_id=server_request_id, sends=sends if sends > 1 else None)


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
    non-standard `error:` field is kept as an `error` event so its failure is typed, not lost.

    Linear in the bytes, whatever the line length: a read with no line end is only set aside, and
    the pieces of a long line are joined once, when it ends (`scanned` counts the bytes looked at).
    A line longer than `max_line` is `ResponseTooLarge` (what="sse-line")."""

    __slots__ = ("_buf", "_parts", "_held", "_data", "_event", "_skip_lf", "_carry_wide", "url", "max_line",
                 "scanned")

    def __init__(self, url: str = "", max_line: int = DEFAULT_SSE_LINE_BYTES) -> None:
        self._buf = b""
        self._parts: list[bytes] = []  # reads with no line end, after `_buf`: joined when the line ends
        self._held = 0  # bytes in `_buf` and `_parts`
        self._data: list[str] = []
        self._event: str | None = None
        self._skip_lf = False  # the last chunk ended in CR: a leading LF belongs to that CRLF
        self._carry_wide = False  # the event in progress has a line from an earlier read with a 19-digit run
        self.url, self.max_line = url, max_line
        self.scanned = 0

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
        if self._held:
            self.scanned += len(chunk)
            if b"\n" not in chunk and b"\r" not in chunk:  # the line goes on: set aside, not rescanned
                self._held += len(chunk)
                if self._held > self.max_line:
                    raise too_large(self.url, self.max_line, self._held, "sse-line")
                self._parts.append(chunk)
                return
            buf = b"".join([self._buf, *self._parts, chunk]) if self._parts else self._buf + chunk
            self._parts = []
        else:
            buf = chunk
        self.scanned += len(buf)
        if b"\r" in buf:
            if buf[-1:] == b"\r":
                self._skip_lf = True
                buf += b"\n"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        cut = buf.rfind(b"\n") + 1
        self._buf = buf[cut:]  # an incomplete last line waits for the next read
        self._held = len(self._buf)
        if self._held > self.max_line:
            raise too_large(self.url, self.max_line, self._held, "sse-line")
        if not cut:
            return
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


def _finite(seconds: float, name: str) -> float | None:
    """A limit in seconds: positive, `inf` for none."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds > 0:
        raise ConfigError(f"{name} must be a positive number of seconds (inf for none), got {seconds!r}")
    return None if seconds == float("inf") else float(seconds)


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


# Keyword arguments that are not sampling knobs: the engine fields (named as the engines name them), the
# pass-through, and two request attributes.
_REQUEST_KWARGS = frozenset({"request_id", "tool_choice"})
_NOT_SAMPLING = frozenset(KWARG_KEYS) | _REQUEST_KWARGS


class KwargsSplit:
    """Keyword arguments sorted: sampling knobs, the extras with the engine fields in them (by EDN key), and
    the request attributes (`attrs`; `request_id` read out of them)."""

    __slots__ = ("sampling", "extras", "attrs", "request_id")

    def __init__(self, kwargs: Mapping[str, object], extras: Mapping[str, Edn] | None) -> None:
        self.sampling: Mapping[str, object] = kwargs
        self.extras: dict[str, Edn] = dict(extras) if extras else {}
        self.attrs: dict[str, Edn] = {}
        self.request_id: str | int | None = None
        if _NOT_SAMPLING.isdisjoint(kwargs):  # the common call: sampling knobs only, nothing copied
            return
        self.sampling = {}
        fields: dict[str, Edn] = {}
        for k, v in kwargs.items():
            if k in _REQUEST_KWARGS:
                self.attrs[k] = cast(Edn, v)  # read and checked with the request it goes into
            elif k in KWARG_KEYS:
                fields[KWARG_KEYS[k]] = _as_edn_value(v)
            else:
                self.sampling[k] = v
        for k, v in fields.items():
            if k in self.extras:
                raise ValidationError([Problem("error", "request/conflict", f"{k.rsplit('/', 1)[1]!r} is given twice: "
                                               f"as a keyword argument and as :{k} in extras", field=k)])
            self.extras[k] = v
        self.request_id = cast("str | int | None", self.attrs.get("request_id"))


def chat_request(messages: MessagesInput, model: str | None, tools: Edn, stream: bool, sampling: Mapping[str, object],
                 extras: Mapping[str, Edn] | None) -> ChatRequest:
    split = KwargsSplit(sampling, extras)
    return ChatRequest(messages=as_messages(messages), model=model, sampling=sampling_from_kwargs(split.sampling),
                       stream=stream or None, tools=tools, extras=split.extras,
                       tool_choice=split.attrs.get("tool_choice"), request_id=split.request_id)


class ManagedServer(Protocol):
    """A server process this caller started (`kotoba_vllm.local.LlamaServer`): asked, after a transport
    failure, whether it died, so the call raises why (a signal, an exit status) instead."""

    def failure(self, wait_s: float = 0.0) -> KotobaError | None: ...


# A killed server's sockets close just before it can be reaped: how long a failed call waits to learn why.
SERVER_EXIT_WAIT_S = 1.0


class BaseClient:
    def __init__(self, base_url: str | None = None, *, backend: str = "auto", api_key: str | None = None,
                 timeout: float | httpx.Timeout | None = None, headers: Mapping[str, str] | None = None,
                 model: str | None = None, trusted_origins: Iterable[str] = (), deadline: float | None = None,
                 stream_idle_s: float | None = None, max_response_bytes: int | None = None) -> None:
        if backend != "auto" and backend not in BACKENDS:
            raise ConfigError(f"backend must be one of auto, {', '.join(BACKENDS)}; got {backend!r}")
        # Origins the key may go to besides the base URL's own (see `_origins`).
        self.trusted = TrustedOrigins(trusted_origins)
        self.base_url = server_root(base_url or os.environ.get(BASE_URL_ENV) or "http://127.0.0.1:8000")
        self._backend = backend
        self._detected: dict[str, str] = {}
        self._versions: dict[str, str] = {}  # base URL -> the engine version its detection answer named
        self.__api_key = api_key_or_env(api_key)
        register_secret(self.__api_key)  # a server quoting our Authorization header back never shows it
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else (
            DEFAULT_TIMEOUT if timeout is None else httpx.Timeout(timeout))
        # The limits every call is held to (docs/trust.md); `inf` turns a deadline off.
        self.deadline_s = _finite(DEFAULT_DEADLINE_S if deadline is None else deadline, "deadline")
        self.stream_idle_s = _finite(DEFAULT_STREAM_IDLE_S if stream_idle_s is None else stream_idle_s, "stream_idle_s")
        self.max_response_bytes = max_response_bytes or DEFAULT_MAX_BYTES
        self.max_sse_line = min(self.max_response_bytes, DEFAULT_SSE_LINE_BYTES)
        self.probe_max_bytes = min(self.max_response_bytes, PROBE_MAX_BYTES)
        self.model = model
        self._headers = client_headers(self.__api_key, headers)
        self._has_key = "authorization" in self._headers  # a caller's own http client may carry one (subclasses)
        self._urls: BoundedMemo[str, httpx.URL] = BoundedMemo(256)  # see `_url`
        self.resends = 0  # requests sent again after a stale keep-alive connection (see `_resend`)
        self.managed_server: ManagedServer | None = None  # see `ManagedServer`; set by `LlamaServer.client()`

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

    def _http_error(self, status: int, raw: bytes, headers: Mapping[str, str], plan: Plan) -> KotobaError:
        """The typed error for an HTTP error answer, carrying our request id and the one the server used."""
        err = answer_error(status, raw, headers, plan.url)
        return self._explain_withheld(identify(err, plan.request, plan.dialect.name, headers.get("x-request-id")),
                                      plan)

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

    def _identify(self, base: str, path: str, status: int, body: object) -> str | None:
        """`decide_backend` for one probe answer; the engine's version, when the answer names it, is kept for
        the fields that version has (`_fields.version_problems`)."""
        hit = decide_backend(path, status, body)
        if hit is not None and isinstance(body, dict) and isinstance(body.get("version"), str):
            self._versions[server_root(base)] = body["version"]
        return hit

    def server_version(self, base_url: str | None = None) -> str | None:
        """The engine version detection read (vLLM's /version, SGLang's server info), if any."""
        return self._versions.get(server_root(base_url) if base_url else self.base_url)

    def _plan(self, req: Request, backend: str, base: str | None = None, checked: bool = False) -> Plan:
        """`base`: `_base_for(req)` when the caller has it already; `checked`: see `Client.send`."""
        if base is None:
            base = self._base_for(req)
        problems = send_problems(req, backend, checked)
        if req.extras and self._versions:
            version = self._versions.get(base)
            if version is not None:
                problems = problems + version_problems(backend, version, req.extras)
        if problems and any(p.is_error for p in problems):
            raise ValidationError(problems, endpoint=base)
        dialect = get_dialect(backend)
        http = dialect.render(req)
        return Plan(req, dialect, http, base + http.path, base, self._key_withheld(base))

    def _finish(self, plan: Plan, r: Reply, sent: float, server_id: str | None) -> AnyResponse:
        """The typed answer to a whole-read `r`; `server_id`: its `x-request-id` (the id the server used).
        `r.headers` is read only for an error (the sync wire builds that map when asked)."""
        status, raw = r.status_code, r.content
        if status >= 300:
            raise self._http_error(status, raw, r.headers, plan)
        obj = decode_json(raw)
        refused: list[str] = []
        if obj is None:
            obj, refused = decode_json_refusing_wide_ints(raw)
        if obj is None:
            if plan.request.endpoint not in plan.dialect.text_answers:
                raise identify(ProtocolError(f"malformed JSON from {plan.url} (HTTP {status})", offending=raw,
                                             endpoint=plan.url), plan.request, plan.dialect.name, server_id)
            obj = raw.decode("utf-8", "replace")  # a control call's answer in words (vLLM, SGLang), or none
        clock = ClientClock(sent=sent, done=time.perf_counter())
        try:
            resp = plan.dialect.parse(plan.request, obj, plan.url, clock)
            if server_id is not None or plan.sends != 1:  # most answers: nothing to add, no call
                resp = with_server_id(resp, server_id, plan.sends)
        except KotobaError as e:  # about this answer (an abort in it ...): whose request, the id its server used
            e.endpoint = e.endpoint or plan.url  # a parser may not know which server answered
            raise identify(e, plan.request, plan.dialect.name, server_id)
        except SHAPE_ERRORS as e:  # well-formed JSON of the wrong shape is a protocol error, not a crash
            raise identify(ProtocolError(f"unexpected answer shape from {plan.url}: {e}", offending=raw,
                                         endpoint=plan.url), plan.request, plan.dialect.name, server_id) from None
        if refused and isinstance(getattr(resp, "extras", None), dict):
            resp.extras["kotoba/refused"] = refused  # type: ignore[union-attr]  # which fields were dropped, and why
        return resp

    def _url(self, url: str) -> httpx.URL:
        """The parsed URL, cached: parsing a URL string costs as much as the rest of building a request."""
        parsed = self._urls.get(url)
        return parsed if parsed is not None else self._urls.keep(url, httpx.URL(url))

    def _deadline_for(self, deadline: float | None, req: Request) -> float | None:
        """The call's deadline: the argument, else the request's `:vllm/deadline-s`, else the client's."""
        if deadline is None:
            deadline = req.deadline_s
            if deadline is None:
                return self.deadline_s
        return _finite(deadline, "deadline")

    @staticmethod
    def detection_fatal(e: TransportError) -> bool:
        """A detection probe that failed this way ends detection: the server cannot be reached at all, or
        detection's own deadline (`DETECT_DEADLINE_S`, every probe together) has passed."""
        return isinstance(e, Unreachable) or (isinstance(e, RequestTimeout) and e.phase in ("connect", "total"))

    def _timeout_for(self, timeout: float | httpx.Timeout | None) -> httpx.Timeout:
        if timeout is None:
            return self.timeout
        return timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)

    def _chat_request(self, messages: MessagesInput, model: str | None, tools: Edn, stream: bool,
                      sampling: Mapping[str, object], extras: Mapping[str, Edn] | None) -> ChatRequest:
        # The client's default model goes in here: `_with_defaults` would rebuild the request (attrs.evolve).
        return chat_request(messages, model if model is not None else self.model, tools, stream, sampling, extras)

    def _completion_request(self, prompt: str, model: str | None, stream: bool, sampling: Mapping[str, object],
                            extras: Mapping[str, Edn] | None, native: bool) -> CompletionRequest | GenerateRequest:
        cls: type[CompletionRequest | GenerateRequest] = GenerateRequest if native else CompletionRequest
        model = model if model is not None else self.model
        split = KwargsSplit(sampling, extras)
        if "tool_choice" in split.attrs:
            raise ValidationError([Problem("error", "request/type", "tool_choice is a chat argument",
                                           field="vllm/tool-choice")])
        return cls(prompt=prompt, model=model, sampling=sampling_from_kwargs(split.sampling), stream=stream or None,
                   extras=split.extras, request_id=split.request_id)
