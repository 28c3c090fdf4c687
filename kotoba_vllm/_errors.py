"""Every error the client raises, each with `.to_edn()`.

    KotobaError
    ├── ValidationError          problems found before sending; nothing was sent
    ├── TransportError           no usable HTTP answer
    │   ├── Unreachable          connection refused, DNS, TLS
    │   ├── RequestTimeout       connect / read / write / pool timeout (says which and the limit)
    │   └── StreamBroken         the stream ended early; `.partial_text` kept
    ├── ServerError              the server answered with an error (status, engine message, raw body)
    │   ├── AdmissionRejected    429 anywhere, SGLang queue full (503 or in-stream), pool all busy
    │   ├── NotReady             503 while the model loads
    │   ├── BadRequest           4xx: the engine's own message and type kept
    │   └── ServerFailure        other 5xx
    └── ProtocolError            malformed JSON or SSE; the offending bytes kept

Admission answers are never retried by the client: one call, one HTTP request.
"""

from __future__ import annotations

from typing import Any

from ._edn import Keyword, keyword_or_string, kw
from ._problems import Problem

_MAX_RAW = 4096
REDACTED = "<redacted>"
_SECRETS: set[str] = set()


def register_secret(value: str | None) -> None:
    """Never show `value` in an error: a client registers its API key, because a careless
    server or proxy may quote the Authorization header back in its error body."""
    if value and len(value) >= 8:
        _SECRETS.add(value)


def redact(text: str | None) -> str | None:
    if text is None or not _SECRETS:
        return text
    for secret in _SECRETS:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def _clip(raw: bytes | str | None) -> str | None:
    if raw is None:
        return None
    text = redact(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw)
    assert text is not None
    return text if len(text) <= _MAX_RAW else text[:_MAX_RAW] + f"...[{len(text) - _MAX_RAW} more chars]"


class KotobaError(Exception):
    """Base of every kotoba-vllm error."""

    kind = "error"

    def __init__(self, message: str, *, endpoint: str | None = None) -> None:
        message = redact(message) or ""
        super().__init__(message)
        self.message = message
        self.endpoint = endpoint

    def _fields(self) -> dict[str, Any]:
        return {}

    def to_edn(self) -> dict[Keyword, Any]:
        out: dict[Keyword, Any] = {kw("vllm/error"): kw(self.kind), kw("vllm/message"): self.message}
        if self.endpoint is not None:
            out[kw("vllm/endpoint-url")] = self.endpoint
        for k, v in self._fields().items():
            if v is not None:
                out[kw(k)] = _redact_edn(v)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, endpoint={self.endpoint!r})"


def _redact_edn(v: Any) -> Any:
    if not _SECRETS:
        return v
    if isinstance(v, str):
        return redact(v)
    if isinstance(v, dict):
        return {k: _redact_edn(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_redact_edn(x) for x in v]
    return v


class ValidationError(KotobaError):
    kind = "validation"

    def __init__(self, problems: list[Problem], *, endpoint: str | None = None) -> None:
        errors = [p for p in problems if p.is_error]
        super().__init__("; ".join(str(p) for p in errors) or "invalid request", endpoint=endpoint)
        self.problems = problems

    def _fields(self) -> dict[str, Any]:
        return {"vllm/problems": [p.to_edn() for p in self.problems]}


class TransportError(KotobaError):
    kind = "transport"


class Unreachable(TransportError):
    kind = "unreachable"


class RequestTimeout(TransportError):
    kind = "timeout"

    def __init__(self, message: str, *, phase: str, limit_s: float | None, endpoint: str | None = None,
                 partial_text: str | None = None) -> None:
        super().__init__(message, endpoint=endpoint)
        self.phase, self.limit_s, self.partial_text = phase, limit_s, partial_text

    def _fields(self) -> dict[str, Any]:
        return {"vllm/timeout-phase": kw(self.phase), "vllm/timeout-s": self.limit_s,
                "vllm/partial-text": self.partial_text}


class StreamBroken(TransportError):
    kind = "stream-broken"

    def __init__(self, message: str, *, partial_text: str, endpoint: str | None = None) -> None:
        super().__init__(message, endpoint=endpoint)
        self.partial_text = partial_text

    def _fields(self) -> dict[str, Any]:
        return {"vllm/partial-text": self.partial_text}


class ServerError(KotobaError):
    kind = "server-error"

    def __init__(self, message: str, *, status: int | None, endpoint: str | None = None,
                 error_type: str | None = None, raw_body: bytes | str | None = None,
                 details: dict[str, Any] | None = None, partial_text: str | None = None) -> None:
        super().__init__(message, endpoint=endpoint)
        self.status, self.error_type = status, error_type
        self.raw_body = _clip(raw_body)
        self.details = details or {}
        self.partial_text = partial_text

    def _fields(self) -> dict[str, Any]:
        return {"vllm/status": self.status, "vllm/error-type": self.error_type,
                "vllm/details": self.details or None, "vllm/raw-body": self.raw_body,
                "vllm/partial-text": self.partial_text}


class AdmissionRejected(ServerError):
    """The server, router or pool refused to queue the request. Never retried by the client."""

    kind = "admission-rejected"

    def __init__(self, message: str, *, reason: str, retry_after_s: float | None = None,
                 status: int | None = 429, endpoint: str | None = None, raw_body: bytes | str | None = None,
                 error_type: str | None = None, sent: bool = True, partial_text: str | None = None,
                 capacity: Any = None, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, status=status, endpoint=endpoint, raw_body=raw_body, error_type=error_type,
                         partial_text=partial_text, details=details)
        self.reason, self.retry_after_s, self.sent, self.capacity = reason, retry_after_s, sent, capacity

    def _fields(self) -> dict[str, Any]:
        out = {"vllm/reason": keyword_or_string(self.reason), "vllm/retry-after-s": self.retry_after_s, "vllm/sent?": self.sent}
        out.update(super()._fields())
        out["vllm/capacity"] = self.capacity
        return out


class NotReady(ServerError):
    kind = "not-ready"


class BadRequest(ServerError):
    kind = "bad-request"


class ServerFailure(ServerError):
    kind = "server-failure"


class ProtocolError(KotobaError):
    kind = "protocol-error"

    def __init__(self, message: str, *, offending: bytes | str | None = None, endpoint: str | None = None,
                 partial_text: str | None = None) -> None:
        super().__init__(message, endpoint=endpoint)
        self.offending = _clip(offending)
        self.partial_text = partial_text

    def _fields(self) -> dict[str, Any]:
        return {"vllm/offending": self.offending, "vllm/partial-text": self.partial_text}


ALL_ERRORS = (KotobaError, ValidationError, TransportError, Unreachable, RequestTimeout, StreamBroken,
              ServerError, AdmissionRejected, NotReady, BadRequest, ServerFailure, ProtocolError)
