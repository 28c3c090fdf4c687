"""Pure HTTP-level pieces shared by every dialect: the outgoing request, error mapping."""

from __future__ import annotations

import datetime as _dt
import email.utils
import json
import math
from typing import Any, Callable, Mapping

import attrs

from .._codec import plain_key, json_to_edn
from .._edn import Edn, Keyword, kw
from .._errors import AdmissionRejected, BadRequest, NotReady, ServerError, ServerFailure


@attrs.frozen
class HttpRequest:
    """What goes on the wire: method, path, JSON body (None for GET), whether it streams, and the
    request's own headers (its id, a pass-through) on top of the client's."""

    method: str
    path: str
    body: dict[str, object] | list[object] | None = None  # a list: llama.cpp's LoRA scales
    stream: bool = False
    headers: dict[str, str] | None = None

    def to_json_obj(self) -> dict[str, object]:
        out: dict[str, object] = {"method": self.method, "path": self.path, "body": self.body}
        if self.headers:
            out["headers"] = self.headers
        return out

    def to_edn(self) -> dict[Keyword, Edn]:
        out: dict[Keyword, Edn] = {kw("http/method"): kw(self.method.lower()), kw("http/path"): self.path}
        if self.body is not None:
            out[kw("http/body")] = json_to_edn(self.body)
        if self.stream:
            out[kw("http/stream?")] = True
        if self.headers:
            out[kw("http/headers")] = dict(self.headers)
        return out


def parse_retry_after(value: str | None, now: _dt.datetime | None = None) -> float | None:
    """`Retry-After` as seconds: delta-seconds or an HTTP-date (relative to `now`, never negative)."""
    if value is None:
        return None
    value = value.strip()
    try:
        secs = float(value)
        return secs if math.isfinite(secs) and secs >= 0 else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return max(0.0, (when - now).total_seconds())


def error_object(body: object) -> dict[str, object] | None:
    """The error object of an OpenAI-style body: `{"error": {...}}`, `{"object": "error", ...}` or `{"detail": ..}`."""
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    if isinstance(err, dict):
        return err
    if isinstance(err, str):
        return {"message": err}
    if body.get("object") == "error":
        return body
    if body.get("success") is False and isinstance(body.get("error_message"), str):  # SGLang's control answers
        return {"message": body["error_message"]}
    if "detail" in body and len(body) <= 2:
        detail = body["detail"]
        return {"message": detail if isinstance(detail, str) else json.dumps(detail)}
    return None


_ORJSON_LOADS: Callable[[bytes | str], Any] | None
try:  # optional (the `fast` extra): decoding is a large share of parsing an answer, and orjson does it faster
    import orjson
    _ORJSON_LOADS = orjson.loads  # an assignment, not `from orjson import`: type-checks with or without it
except ImportError:  # pragma: no cover - depends on the environment
    _ORJSON_LOADS = None
ORJSON = _ORJSON_LOADS is not None
ORJSON_LOADS = _ORJSON_LOADS  # for a hot loop that inlines `loads_narrow` (None without orjson)

# orjson reads an integer outside 64 bits as a float where json keeps the int; such an integer has 19+
# digits in a row. Every digit -> "0", then one substring test: two C scans, where a regex search steps
# through the pattern per byte.
_DIGITS_TO_0 = bytes.maketrans(b"123456789", b"000000000")
_LONG_DIGITS = b"0" * 19


def may_hold_wide_int(raw: bytes) -> bool:
    """Whether `raw` holds 19+ digits in a row (an integer orjson would read differently from json)."""
    return _LONG_DIGITS in raw.translate(_DIGITS_TO_0)


def _orjson_reads_it_as_json(text: bytes | str) -> bool:
    return not may_hold_wide_int(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))


def loads_narrow(text: str) -> Any:
    """`loads_as_json` for text already known to hold no 19-digit run (a stream read checked as a whole)."""
    if _ORJSON_LOADS is not None:
        try:
            return _ORJSON_LOADS(text)
        except ValueError:
            pass
    return json.loads(text)


def loads_as_json(text: bytes | str) -> Any:
    """Exactly `json.loads(text)` (bytes are UTF-8), its value and its errors, faster with orjson installed.
    orjson refuses what only json accepts (NaN, Infinity, lone surrogate escapes, invalid UTF-8, nesting past
    1,024) and that goes to json; the one thing it reads differently, an integer wider than 64 bits, is not
    given to it (tests/test_json_decode.py holds both to the same answers)."""
    if _ORJSON_LOADS is not None and _orjson_reads_it_as_json(text):
        try:
            return _ORJSON_LOADS(text)
        except ValueError:
            pass
    return json.loads(text)


def decode_json(raw: bytes) -> object:
    try:
        # Invalid UTF-8 becomes U+FFFD, as it does inside a stream (httpx decodes SSE text that way):
        # orjson refuses it, and json reads the replaced text.
        if isinstance(raw, bytes) and _ORJSON_LOADS is not None and _orjson_reads_it_as_json(raw):
            try:
                return _ORJSON_LOADS(raw)
            except ValueError:
                pass
        return json.loads(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: absurdly deep nesting
        return None


class _TooWide:
    """An integer past Python's digit limit (`sys.get_int_max_str_digits()`, 4,300 by default)."""

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits


def _int_or_too_wide(text: str) -> int | _TooWide:
    try:
        return int(text)
    except ValueError:
        return _TooWide(len(text.lstrip("-")))


def decode_json_refusing_wide_ints(raw: bytes) -> tuple[object, list[str]]:
    """JSON whose only fault is an integer too wide for Python to read: each such number is refused
    by field (None in its place) and named (`usage.prompt_tokens: an integer of 10000 digits`), the
    rest of the answer kept. (None, []) when the text is not JSON for another reason."""
    try:
        obj = json.loads(raw.decode("utf-8", "replace"), parse_int=_int_or_too_wide)
    except (ValueError, RecursionError):
        return None, []
    refused: list[str] = []

    def walk(v: object, where: str) -> object:
        if isinstance(v, _TooWide):
            refused.append(f"{where or '(the answer)'}: an integer of {v.digits} digits, refused")
            return None
        if isinstance(v, dict):
            return {k: walk(x, f"{where}.{k}" if where else k) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x, f"{where}[{i}]") for i, x in enumerate(v)]
        return v

    return walk(obj, ""), refused


QUEUE_FULL_MARKERS = ("request queue is full", "queue is full")
LOADING_MARKERS = ("loading model", "loading")
# A 503 whose message names a server-side admission limit -> that limit's reason. vLLM 0.33.0's own
# answers (its serving layer, recorded): --max-num-queued-reqs full, and the prefill-token backlog.
ADMISSION_503_MARKERS = (
    ("request queue is full", "queue-full"),
    ("queue is full", "queue-full"),
    ("engine is currently busy and cannot accept new requests", "engine-busy"),
    ("prefill token backlog limit", "prefill-backlog"),
)


def admission_reason_503(lowered_message: str) -> str | None:
    """The admission reason a 503 message names, or None (then it is not an admission answer)."""
    return next((reason for marker, reason in ADMISSION_503_MARKERS if marker in lowered_message), None)


def classify_error(status: int, raw: bytes, headers: Mapping[str, str], endpoint: str | None,
                   *, now: _dt.datetime | None = None) -> ServerError:
    """Map an HTTP error answer to a typed error. Pure; engine specifics live in the markers above."""
    body = decode_json(raw)
    err = error_object(body) or {}
    message = str(err.get("message") or (raw.decode("utf-8", "replace")[:300] if raw else f"HTTP {status}"))
    etype = err.get("type")
    etype = str(etype) if etype is not None else None
    details_edn = error_details(err)
    lowered = message.lower()
    retry_after = parse_retry_after(headers.get("retry-after"), now)
    if status == 429:
        reason = _reason_from(err, body) or "rate-limited"
        return AdmissionRejected(message, reason=reason, retry_after_s=retry_after, status=status,
                                 endpoint=endpoint, raw_body=raw, error_type=etype, details=details_edn)
    admission = admission_reason_503(lowered) if status == 503 else None
    if admission is not None:
        return AdmissionRejected(message, reason=admission, retry_after_s=retry_after, status=status,
                                 endpoint=endpoint, raw_body=raw, error_type=etype, details=details_edn)
    if status == 503 and (etype == "unavailable_error" or any(m in lowered for m in LOADING_MARKERS)):
        return NotReady(message, status=status, endpoint=endpoint, raw_body=raw, error_type=etype,
                        details=details_edn)
    if 400 <= status < 500:
        return BadRequest(message, status=status, endpoint=endpoint, raw_body=raw, error_type=etype,
                          details=details_edn)
    return ServerFailure(message, status=status, endpoint=endpoint, raw_body=raw, error_type=etype,
                         details=details_edn)


def error_details(err: Mapping[str, object]) -> dict[Keyword | str, Edn] | None:
    """An engine's error object's other scalar fields (vLLM's `param`, llama.cpp's `n_ctx` ...), kept as details."""
    return {(kw(k) if plain_key(k) else k): v for k, v in err.items()
            if k not in ("message", "type") and isinstance(v, (str, int, float, bool))} or None


def _reason_from(err: Mapping[str, object], body: object) -> str | None:
    for src in (err, body if isinstance(body, dict) else {}):
        for key in ("reason", "code", "type"):
            v = src.get(key)
            if isinstance(v, str) and v and not v.isdigit():
                return v  # as the server said it; EDN makes it a keyword only when it reads back as one
    return None


def stream_error(obj: Mapping[str, object], endpoint: str | None, partial_text: str | None,
                 raw: str | None = None) -> ServerError:
    """An error object that arrived inside a 200 SSE stream: typed, never text. `raw`: the chunk it
    came in, when the error object was read out of a larger payload."""
    err = error_object(obj) or obj
    message = str(err.get("message") or json.dumps(err))
    code = err.get("code")
    status = code if isinstance(code, int) else None
    etype = err.get("type")
    lowered = message.lower()
    raw = raw if raw is not None else json.dumps(obj)
    details = error_details(err)  # vLLM's `param` among them, as in an error answer
    admission = admission_reason_503(lowered)  # inside a stream the code may be absent or 200
    if status == 429 or admission is not None:
        reason = admission or "rate-limited"
        return AdmissionRejected(message, reason=reason, status=status, endpoint=endpoint, raw_body=raw,
                                 error_type=str(etype) if etype else None, partial_text=partial_text,
                                 details=details)
    cls: type[ServerError] = BadRequest if status is not None and 400 <= status < 500 else ServerFailure
    return cls(message, status=status, endpoint=endpoint, raw_body=raw,
               error_type=str(etype) if etype else None, partial_text=partial_text, details=details)


__all__ = ["ORJSON", "ORJSON_LOADS", "HttpRequest", "classify_error", "decode_json", "error_object", "loads_as_json", "loads_narrow", "may_hold_wide_int", "parse_retry_after", "stream_error",
           "ServerError"]
