"""Every error kotoba-vllm raises on purpose, each with `.to_edn()`. One root: `KotobaError`.

    KotobaError
    ├── ValidationError          problems found before sending; nothing was sent
    ├── TransportError           no usable HTTP answer
    │   ├── Unreachable          connection refused, DNS, TLS, a URL that cannot be sent to
    │   ├── RequestTimeout       connect / read / write / pool timeout, the whole-request deadline
    │   │                        (`total`) or a stream's idle limit (`idle`): says which and the limit
    │   ├── ResponseTooLarge     the answer passed a size limit (received or decoded bytes, an SSE line)
    │   └── StreamBroken         the stream ended early; `.partial_text` kept
    ├── ServerError              the server answered with an error (status, engine message, raw body)
    │   ├── Redirected           a 3xx: names the status and `Location` (redirects are never followed)
    │   ├── AdmissionRejected    429 anywhere, SGLang queue full (503 or in-stream), vLLM's 503
    │   │                        engine-busy / prefill-backlog, pool all busy (docs/errors.md)
    │   ├── NotReady             503 while the model loads
    │   ├── BadRequest           4xx: the engine's own message and type kept
    │   └── ServerFailure        other 5xx
    ├── ProtocolError            malformed JSON or SSE; the offending bytes kept
    ├── EdnError                 EDN text that does not read: `source:line:column: why`   (also a ValueError)
    ├── EdnWriteError            a value with no EDN form given to the writer  (also a TypeError and ValueError)
    ├── StructureError           EDN that reads but is not the typed shape; located problems (also a ValueError)
    ├── ConfigError              an argument or config file that cannot be used (pool file, backend name)
    │                                                                                       (also a ValueError)
    ├── CassetteError            a cassette file without the cassette shape (file and key)  (also a ValueError)
    ├── PromptError              a bench prompt file that is not prompts                    (also a ValueError)
    ├── Unparsable               a capacity endpoint answered with something unreadable     (also a ValueError)
    │   └── BadNumber            ... or with a figure no server can mean (NaN, ±Inf, negative, huge)
    ├── LocalServerError         a local llama.cpp binary is missing, failed to start, or died (also a RuntimeError)
    └── InternalError            an exception nobody typed (a bug): its type and message kept

The second bases keep `except ValueError` callers working. Admission answers are never retried
by the client: one call, one HTTP request.

This module sits below the EDN reader (which raises `EdnError`): it names keywords through
`_keywords`, not `_edn`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Mapping

from ._keywords import Keyword, keyword_or_string, kw

if TYPE_CHECKING:  # _edn and _problems (which imports _edn) import this module
    from ._edn import Edn
    from ._problems import Problem

_MAX_RAW = 4096
REDACTED = "<redacted>"
_SECRETS: set[str] = set()


# Free text is searched for a registered key only from this length on: a shorter one would
# blank out ordinary words. Authorization values are redacted whatever their length (below).
MIN_SECRET_LEN = 8
# An Authorization header quoted back (`authorization: Basic x`, `"Authorization": "Bearer x"`)
# and any bearer token: the credential is replaced, the scheme kept.
_AUTH_VALUE = re.compile(r"""(?i)(\bauthorization\b["']?\s*[:=]\s*["']?)(?:(bearer|basic|token)\s+)?[^"'\r\n,;}\]]+""")
_BEARER = re.compile(r"(?i)\b(bearer)\s+[^\s\"',;}\]]+")


def register_secret(value: str | None) -> None:
    """Never show `value` in an error: a client registers its API key, because a careless
    server or proxy may quote the Authorization header back in its error body."""
    if value and len(value) >= MIN_SECRET_LEN:
        _SECRETS.add(value)


def _auth_value(m: "re.Match[str]") -> str:
    return m.group(1) + (m.group(2) + " " if m.group(2) else "") + REDACTED


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Headers fit to show: Authorization (and Proxy-Authorization) values redacted, any length."""
    return {k: (REDACTED if k.lower() in ("authorization", "proxy-authorization") else v) for k, v in headers.items()}


def redact(text: str | None) -> str | None:
    if not text:
        return text
    if "uthorization" in text or "UTHORIZATION" in text or "earer" in text or "EARER" in text:
        text = _AUTH_VALUE.sub(_auth_value, text)
        text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
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
    # Who an error about a request concerns, stamped by `_base_client.identify` on every path that knows:
    # the request's own id, the one the server answered with (`x-request-id`), the engine dialect that sent it
    request_id: str | int | None = None
    server_request_id: str | None = None
    backend: str | None = None

    def __init__(self, message: str, *, endpoint: str | None = None) -> None:
        message = redact(message) or ""
        super().__init__(message)
        self.message = message
        self.endpoint = endpoint

    def _fields(self) -> dict[str, Edn]:
        return {}

    def to_edn(self) -> dict[Keyword, Edn]:
        out: dict[Keyword, Edn] = {kw("vllm/error"): kw(self.kind), kw("vllm/message"): self.message}
        if self.endpoint is not None:
            out[kw("vllm/endpoint-url")] = self.endpoint
        if self.backend is not None:  # a keyword, as on a response
            out[kw("vllm/backend")] = kw(self.backend)
        for k, v in self._fields().items():
            if v is not None:
                out[kw(k)] = _redact_edn(v)
        if self.request_id is not None:
            out[kw("vllm/request-id")] = self.request_id
        if self.server_request_id is not None:
            out[kw("vllm/server-request-id")] = self.server_request_id
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, endpoint={self.endpoint!r})"


def _redact_edn(v: Edn) -> Edn:
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

    def _fields(self) -> dict[str, Edn]:
        return {"vllm/problems": [p.to_edn() for p in self.problems]}


class TransportError(KotobaError):
    """`connection_lost`: the connection failed under the request (reset, EOF, broken pipe, bytes that
    are not HTTP), the one failure the resend rule (`_resend`) may act on; never set for a timeout,
    a refusal or a limit."""

    kind = "transport"

    def __init__(self, message: str, *, endpoint: str | None = None, connection_lost: bool = False) -> None:
        super().__init__(message, endpoint=endpoint)
        self.connection_lost = connection_lost


class Unreachable(TransportError):
    kind = "unreachable"


class RequestTimeout(TransportError):
    kind = "timeout"

    def __init__(self, message: str, *, phase: str, limit_s: float | None, endpoint: str | None = None,
                 partial_text: str | None = None) -> None:
        super().__init__(message, endpoint=endpoint)
        self.phase, self.limit_s, self.partial_text = phase, limit_s, partial_text

    def _fields(self) -> dict[str, Edn]:
        return {"vllm/timeout-phase": kw(self.phase), "vllm/timeout-s": self.limit_s,
                "vllm/partial-text": self.partial_text}


class ResponseTooLarge(TransportError):
    """The answer passed a size limit: `what` is `received` (bytes off the socket), `decoded` (after
    gzip/deflate) or `sse-line` (one event-stream line); the connection was closed, never reused."""

    kind = "too-large"

    def __init__(self, message: str, *, limit_bytes: int, read_bytes: int, what: str,
                 endpoint: str | None = None) -> None:
        super().__init__(message, endpoint=endpoint)
        self.limit_bytes, self.read_bytes, self.what = limit_bytes, read_bytes, what

    def _fields(self) -> dict[str, Edn]:
        return {"vllm/limit-bytes": self.limit_bytes, "vllm/read-bytes": self.read_bytes,
                "vllm/limit": kw(self.what)}


class StreamBroken(TransportError):
    kind = "stream-broken"

    def __init__(self, message: str, *, partial_text: str, endpoint: str | None = None) -> None:
        super().__init__(message, endpoint=endpoint)
        self.partial_text = partial_text

    def _fields(self) -> dict[str, Edn]:
        return {"vllm/partial-text": self.partial_text}


class ServerError(KotobaError):
    kind = "server-error"

    def __init__(self, message: str, *, status: int | None, endpoint: str | None = None,
                 error_type: str | None = None, raw_body: bytes | str | None = None,
                 details: Mapping[Keyword | str, Edn] | None = None, partial_text: str | None = None) -> None:
        super().__init__(message, endpoint=endpoint)
        self.status, self.error_type = status, error_type
        self.raw_body = _clip(raw_body)
        self.details: dict[Keyword | str, Edn] = dict(details or {})
        self.partial_text = partial_text
        self.key_withheld: str | None = None  # why the API key was not sent to this server, when it was not
        self.field: str | None = None  # the EDN key of the field the server named as refused (vLLM's `param`)

    def _fields(self) -> dict[str, Edn]:
        return {"vllm/status": self.status, "vllm/error-type": self.error_type,
                "vllm/details": self.details or None, "vllm/raw-body": self.raw_body,
                "vllm/partial-text": self.partial_text, "vllm/key-withheld": self.key_withheld,
                "vllm/field": kw(self.field) if self.field else None}


class AdmissionRejected(ServerError):
    """The server, router or pool refused to queue the request. Never retried by the client."""

    kind = "admission-rejected"

    def __init__(self, message: str, *, reason: str, retry_after_s: float | None = None,
                 status: int | None = 429, endpoint: str | None = None, raw_body: bytes | str | None = None,
                 error_type: str | None = None, sent: bool = True, partial_text: str | None = None,
                 capacity: dict[Keyword, Edn] | None = None,
                 details: Mapping[Keyword | str, Edn] | None = None) -> None:
        super().__init__(message, status=status, endpoint=endpoint, raw_body=raw_body, error_type=error_type,
                         partial_text=partial_text, details=details)
        self.reason, self.retry_after_s, self.sent, self.capacity = reason, retry_after_s, sent, capacity

    def _fields(self) -> dict[str, Edn]:
        out: dict[str, Edn] = {"vllm/reason": keyword_or_string(self.reason),
                               "vllm/retry-after-s": self.retry_after_s, "vllm/sent?": self.sent}
        out.update(super()._fields())
        out["vllm/capacity"] = self.capacity
        return out


class Redirected(ServerError):
    """A 3xx answer. Redirects are never followed (the key must not cross origins behind the caller's
    back), and a redirect's body is never taken as the answer."""

    kind = "redirect"

    def __init__(self, message: str, *, status: int, location: str | None, endpoint: str | None = None,
                 raw_body: bytes | str | None = None) -> None:
        super().__init__(message, status=status, endpoint=endpoint, raw_body=raw_body)
        self.location = location

    def _fields(self) -> dict[str, Edn]:
        out = super()._fields()
        out["vllm/location"] = self.location
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

    def _fields(self) -> dict[str, Edn]:
        return {"vllm/offending": self.offending, "vllm/partial-text": self.partial_text}


class EdnError(KotobaError, ValueError):
    """Bad EDN text, located: `source:line:column: message`."""

    kind = "edn-syntax"

    def __init__(self, msg: str, source: str = "<string>", line: int = 0, column: int = 0) -> None:
        self.msg, self.source, self.line, self.column = msg, source, line, column
        super().__init__(f"{source}:{line}:{column}: {msg}")

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}:{self.column}"

    def to_edn(self) -> dict[Keyword, Edn]:
        return {kw("vllm/error"): kw(self.kind), kw("vllm/message"): self.msg,
                kw("vllm/source"): self.source, kw("vllm/line"): self.line,
                kw("vllm/column"): self.column}


class EdnWriteError(KotobaError, TypeError, ValueError):
    kind = "edn-write"


class StructureError(KotobaError, ValueError):
    """The EDN could not become the typed value; `problems` says where and why."""

    kind = "structure"

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(str(p) for p in problems) or "bad structure")
        self.problems = problems

    def _fields(self) -> dict[str, Edn]:
        return {"vllm/problems": [p.to_edn() for p in self.problems]}


class ConfigError(KotobaError, ValueError):
    kind = "config"


class CassetteError(KotobaError, ValueError):
    """A cassette file that does not have the cassette shape (names the file and the key)."""

    kind = "cassette"


class PromptError(KotobaError, ValueError):
    kind = "prompt"


class Unparsable(KotobaError, ValueError):
    """The probe answered, but not with something we can read as capacity."""

    kind = "unparsable"


class BadNumber(Unparsable):
    """A figure no server can mean (NaN, infinite, negative, absurdly large): the member's whole
    reading is untrustworthy, so it is unmeasured, never read as a number."""

    kind = "bad-number"


class LocalServerError(KotobaError, RuntimeError):
    """A local llama.cpp binary is missing, a server failed to start, or a server this process started
    died: then `signal` names what killed it (e.g. "SIGILL") or `exit_status` says how it exited, and
    `log_tail` holds the last lines it wrote."""

    kind = "local-server"

    def __init__(self, message: str, *, endpoint: str | None = None, signal: str | None = None,
                 exit_status: int | None = None, log_tail: str | None = None) -> None:
        super().__init__(message, endpoint=endpoint)
        self.signal = signal
        self.exit_status = exit_status
        self.log_tail = log_tail

    def _fields(self) -> dict[str, Edn]:
        out: dict[str, Edn] = {}
        if self.signal is not None:
            out["local/signal"] = self.signal
        if self.exit_status is not None:
            out["local/exit-status"] = self.exit_status
        if self.log_tail is not None:
            out["local/log-tail"] = self.log_tail
        return out


class InternalError(KotobaError):
    """An exception that is not a `KotobaError` (a bug here or in a caller's hook), or a cancelled
    request: recorded with the exception's type and message instead of being lost."""

    kind = "internal"

    def __init__(self, message: str, *, exception_type: str, endpoint: str | None = None) -> None:
        super().__init__(message, endpoint=endpoint)
        self.exception_type = exception_type

    @classmethod
    def from_exception(cls, exc: BaseException, *, endpoint: str | None = None,
                       during: str | None = None) -> "InternalError":
        t = type(exc)
        name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
        try:
            detail = str(exc)
        except Exception:  # an exception whose __str__ fails still gets its record
            detail = ""
        where = f" {during}" if during else ""
        return cls(f"{name}{where}: {detail}" if detail else f"{name}{where}", exception_type=name,
                   endpoint=endpoint)

    def _fields(self) -> dict[str, Edn]:
        return {"vllm/exception-type": self.exception_type}


ALL_ERRORS = (KotobaError, ValidationError, TransportError, Unreachable, RequestTimeout, ResponseTooLarge,
              StreamBroken, ServerError, AdmissionRejected, Redirected, NotReady, BadRequest, ServerFailure, ProtocolError,
              EdnError, EdnWriteError, StructureError, ConfigError, CassetteError, PromptError, Unparsable,
              BadNumber, LocalServerError, InternalError)
