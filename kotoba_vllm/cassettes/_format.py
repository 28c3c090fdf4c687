"""Cassettes: one recorded (or derived) HTTP exchange with an engine, as EDN.

A cassette is a file under `tests/cassettes/<engine>/NAME.edn`:

    {:cassette/name "chat" :cassette/engine :llamacpp :cassette/backend :llamacpp
     :cassette/provenance {:cassette/how :recorded :cassette/engine-version ".." :cassette/build ".."
                           :cassette/date ".." :cassette/source ".."}
     :cassette/call {:call/op :send :call/request {...the SDK's EDN request...}}
     :cassette/request {:http/method :post :http/path "/v1/chat/completions" :http/body "<JSON text>"
                        :http/headers {"x-request-id" ".."}}  ; only the SDK's own request headers, when any
     :cassette/response {:http/status 200 :http/headers {"content-type" ".."}
                         :http/body "<text>"  |  :http/chunks ["data: ..." ...]  |  :http/chunks-b64 [..]}
     :cassette/expect {...what replay asserts...}
     :cassette/engine-received [{"request_id" ".." "sampling_params" {..}} ...]}  ; fake-core recordings only

`:cassette/engine-received` is what a faked engine core / scheduler was handed by the engine's own
serving layer for this exchange (one map per engine request, as the fake wrote it): the proof that
the serving code read the fields the SDK sent.

Bodies are stored as text so they stay byte-faithful; a body or chunk list that is not valid
UTF-8 (a TCP read can split a multi-byte character) is stored base64 under `-b64` keys.
Pure data and file I/O only: the recorder, replay, expectations and drift tables are the
private modules beside this one.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Iterable, Sequence

import attrs

from .._edn import Edn, EdnMap, Keyword, kw, pretty, read_file
from .._json import JsonValue
from .._errors import CassetteError

ENGINES = ("llamacpp", "vllm", "sglang", "router")
HOWS = ("recorded", "derived")
# Response headers worth keeping: the ones a client decision reads.
KEPT_HEADERS = ("content-type", "retry-after", "content-length", "transfer-encoding", "x-request-id")

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "tests" / "cassettes"


@attrs.frozen
class Cassette:
    name: str
    engine: str
    backend: str  # the dialect the client speaks to this server (a router fronts an engine)
    provenance: dict[Keyword, Edn]
    call: dict[Keyword, Edn]  # {:call/op ..} EDN
    method: str
    path: str
    request_body: bytes | None
    status: int
    headers: dict[str, str]
    body: bytes | None = None
    chunks: tuple[bytes, ...] | None = None
    expect: dict[Keyword, Edn] = attrs.field(factory=dict)
    source_file: str | None = None
    request_headers: dict[str, str] = attrs.field(factory=dict)
    engine_received: tuple[Edn, ...] | None = None

    @property
    def how(self) -> str:
        how = self.provenance.get(kw("cassette/how"))
        return how.name if isinstance(how, Keyword) else str(how)

    @property
    def op(self) -> str:
        op = self.call.get(kw("call/op"))
        return op.name if isinstance(op, Keyword) else "raw"

    @property
    def streaming(self) -> bool:
        return self.chunks is not None

    @property
    def raw(self) -> bytes:
        """The whole response body as bytes (chunks joined)."""
        if self.chunks is not None:
            return b"".join(self.chunks)
        return self.body or b""

    @property
    def id(self) -> str:
        return f"{self.engine}/{self.name}"

    def to_edn(self) -> dict[Keyword, Edn]:
        req: dict[Keyword, Edn] = {kw("http/method"): kw(self.method.lower()), kw("http/path"): self.path}
        if self.request_body is not None:
            req.update(_bytes_entry("http/body", self.request_body))
        if self.request_headers:
            req[kw("http/headers")] = dict(self.request_headers)
        resp: dict[Keyword, Edn] = {kw("http/status"): self.status, kw("http/headers"): dict(self.headers)}
        if self.chunks is not None:
            texts = _utf8_all(self.chunks)
            if texts is not None:
                resp[kw("http/chunks")] = texts
            else:
                resp[kw("http/chunks-b64")] = [base64.b64encode(c).decode("ascii") for c in self.chunks]
        elif self.body is not None:
            resp.update(_bytes_entry("http/body", self.body))
        out: dict[Keyword, Edn] = {
            kw("cassette/name"): self.name, kw("cassette/engine"): kw(self.engine),
            kw("cassette/backend"): kw(self.backend), kw("cassette/provenance"): self.provenance,
            kw("cassette/call"): self.call, kw("cassette/request"): req, kw("cassette/response"): resp,
            kw("cassette/expect"): self.expect}
        if self.engine_received is not None:
            out[kw("cassette/engine-received")] = list(self.engine_received)
        return out


def _bytes_entry(key: str, raw: bytes) -> dict[Keyword, Edn]:
    try:
        return {kw(key): raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {kw(key + "-b64"): base64.b64encode(raw).decode("ascii")}


def _utf8_all(chunks: Iterable[bytes]) -> list[str] | None:
    try:
        return [c.decode("utf-8") for c in chunks]
    except UnicodeDecodeError:
        return None


def _bytes_from(m: EdnMap, key: str) -> bytes | None:
    if kw(key) in m:
        return str(m[kw(key)]).encode("utf-8")
    b64 = m.get(kw(key + "-b64"))
    if b64 is not None:
        return base64.b64decode(_text(b64, key + "-b64", "a base64 string"))
    return None


def _text(v: Edn, key: str, what: str, where: str = "<cassette>") -> str:
    if not isinstance(v, str):
        raise CassetteError(f"{where}: :{key} must be {what}")
    return v


def _need(m: Edn, key: str, where: str) -> Edn:
    if not isinstance(m, dict) or kw(key) not in m:
        raise CassetteError(f"{where}: missing :{key}")
    v: Edn = m[kw(key)]
    return v


def _map(v: Edn, key: str, where: str) -> dict[Keyword, Edn]:
    if not isinstance(v, dict):
        raise CassetteError(f"{where}: :{key} must be a map")
    return v


def _keyword(v: Edn, key: str, where: str) -> Keyword:
    if not isinstance(v, Keyword):
        raise CassetteError(f"{where}: :{key} must be a keyword")
    return v


def _chunks(v: Edn, key: str, where: str) -> Sequence[Edn]:
    if not isinstance(v, (list, tuple)):
        raise CassetteError(f"{where}: :{key} must be a vector")
    return v


def cassette_from_edn(m: Edn, where: str = "<cassette>") -> Cassette:
    prov = _map(_need(m, "cassette/provenance", where), "cassette/provenance", where)
    how = _need(prov, "cassette/how", where)
    if not isinstance(how, Keyword) or how.name not in HOWS:
        raise CassetteError(f"{where}: :cassette/how must be :recorded or :derived")
    top = _map(m, "cassette", where)
    req = _map(_need(m, "cassette/request", where), "cassette/request", where)
    resp = _map(_need(m, "cassette/response", where), "cassette/response", where)
    chunks: tuple[bytes, ...] | None = None
    if kw("http/chunks") in resp:
        chunks = tuple(str(c).encode("utf-8") for c in _chunks(resp[kw("http/chunks")], "http/chunks", where))
    elif kw("http/chunks-b64") in resp:
        chunks = tuple(base64.b64decode(_text(c, "http/chunks-b64", "base64 strings", where))
                       for c in _chunks(resp[kw("http/chunks-b64")], "http/chunks-b64", where))
    engine = _keyword(_need(m, "cassette/engine", where), "cassette/engine", where)
    backend = _keyword(top.get(kw("cassette/backend"), engine), "cassette/backend", where)
    method = _need(req, "http/method", where)
    status = _need(resp, "http/status", where)
    if not isinstance(status, (int, str)):
        raise CassetteError(f"{where}: :http/status must be an integer")
    return Cassette(
        name=str(_need(m, "cassette/name", where)), engine=engine.name, backend=backend.name, provenance=prov,
        call=_map(top.get(kw("cassette/call")) or {kw("call/op"): kw("raw")}, "cassette/call", where),
        method=(method.name if isinstance(method, Keyword) else str(method)).upper(),
        path=str(_need(req, "http/path", where)), request_body=_bytes_from(req, "http/body"),
        status=int(status),
        headers={str(k).lower(): str(v)
                 for k, v in _map(resp.get(kw("http/headers")) or {}, "http/headers", where).items()},
        body=None if chunks is not None else _bytes_from(resp, "http/body"), chunks=chunks,
        expect=_map(top.get(kw("cassette/expect")) or {}, "cassette/expect", where), source_file=where,
        request_headers={str(k).lower(): str(v)
                         for k, v in _map(req.get(kw("http/headers")) or {}, "http/headers", where).items()},
        engine_received=_received(top.get(kw("cassette/engine-received")), where))


def _received(v: Edn, where: str) -> tuple[Edn, ...] | None:
    if v is None:
        return None
    if not isinstance(v, (list, tuple)):
        raise CassetteError(f"{where}: :cassette/engine-received must be a vector of maps")
    return tuple(v)


def read_cassette(path: str | Path) -> Cassette:
    forms = read_file(str(path))
    if len(forms) != 1:
        raise CassetteError(f"{path}: a cassette file holds exactly one map")
    return cassette_from_edn(forms[0].value, str(path))


def write_cassette(c: Cassette, directory: str | Path) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{c.name}.edn"
    p.write_text(pretty(c.to_edn(), width=110) + "\n", encoding="utf-8")
    return p


def load_cassettes(engine: str | None = None, root: str | Path | None = None) -> list[Cassette]:
    """Every cassette under `root` (default `tests/cassettes`), or one engine's, sorted by name."""
    base = Path(root) if root is not None else DEFAULT_ROOT
    dirs = [base / engine] if engine else sorted(p for p in base.iterdir() if p.is_dir())
    out: list[Cassette] = []
    for d in dirs:
        if d.is_dir():
            out.extend(read_cassette(p) for p in sorted(d.glob("*.edn")))
    return out


def cassette_body(c: Cassette) -> bytes:
    """The response body bytes (streaming chunks joined): what a probe or parser would read."""
    return c.raw


def cassette_json(c: Cassette) -> JsonValue:
    """The response body as JSON (None when it is not JSON, e.g. /metrics text or a stream)."""
    try:
        out: JsonValue = json.loads(c.raw)
        return out
    except (ValueError, UnicodeDecodeError):
        return None


def request_json(c: Cassette) -> JsonValue:
    if c.request_body is None:
        return None
    try:
        out: JsonValue = json.loads(c.request_body)
        return out
    except (ValueError, UnicodeDecodeError):
        return None


def sse_payloads(raw: bytes) -> list[str]:
    """`data:` payloads of an event stream, parsed independently of the SDK (for expectations and drift)."""
    text = raw.decode("utf-8", "replace").replace("\r\n", "\n")
    out = []
    for event in text.split("\n\n"):
        data = [ln[5:].lstrip(" ") if ln.startswith("data:") else None for ln in event.split("\n")]
        lines = [d for d in data if d is not None]
        if lines:
            out.append("\n".join(lines))
    return out


__all__ = ["Cassette", "CassetteError", "DEFAULT_ROOT", "ENGINES", "KEPT_HEADERS", "cassette_body",
           "cassette_from_edn", "cassette_json", "load_cassettes", "read_cassette", "request_json", "sse_payloads",
           "write_cassette"]
