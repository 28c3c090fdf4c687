"""Replay a cassette into the real `Client` / `AsyncClient`: through respx (no network) for
httpx, through a real loopback server (`_loopback.py`) for the async client's default wire.

The mocked server answers with the recorded status, headers and the body chunk by chunk
(boundaries kept, so a UTF-8 character split across reads reaches the SDK split).
`replay_sync` / `replay_async` return an `Outcome`: the typed result or typed error, the
deltas of a stream, and the request bodies the SDK sent (replay checks them against the cassette).
"""

from __future__ import annotations

import json
from typing import AsyncIterator, Iterator

import attrs
import httpx
import respx

from .._client import AsyncClient, Client
from .._edn import Edn, Keyword, kw
from .._errors import KotobaError
from .._json import JsonValue
from .._model import StreamDelta
from ._format import Cassette
from ..dialects import classify_error
from ._loopback import LoopbackReplay

BASE_URL = "http://cassette.invalid:8000"
K_REQUEST = kw("call/request")
K_STREAM = kw("vllm/stream")


class ChunkedBody(httpx.SyncByteStream, httpx.AsyncByteStream):
    """The recorded chunks, yielded one by one to sync and async readers alike."""

    def __init__(self, chunks: tuple[bytes, ...]) -> None:
        self._chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self._chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for c in self._chunks:
            yield c


def http_response(c: Cassette) -> httpx.Response:
    headers = {k: v for k, v in c.headers.items() if k not in ("content-length", "transfer-encoding")}
    chunks = c.chunks if c.chunks is not None else ((c.body,) if c.body else ())
    return httpx.Response(c.status, headers=headers, stream=ChunkedBody(chunks))


@attrs.define
class Outcome:
    result: object = None  # what the call returned: a Response, a model list, a health answer...
    error: KotobaError | None = None
    deltas: list[StreamDelta] = attrs.field(factory=list)
    sent: list[bytes] = attrs.field(factory=list)
    sent_headers: list[dict[str, str]] = attrs.field(factory=list)  # names lower-cased
    streamed: bool = False
    raw: bytes | None = None  # probe / raw ops: the body the client's transport read


def _mock(c: Cassette) -> tuple[respx.MockRouter, respx.Route]:
    router = respx.mock(assert_all_called=False, assert_all_mocked=True)
    route = router.route(method=c.method, url=BASE_URL + c.path).mock(side_effect=lambda req: http_response(c))
    return router, route


def _heads(request: httpx.Request) -> dict[str, str]:
    return {k.lower(): v for k, v in request.headers.items()}


def _request_map(c: Cassette) -> dict[Keyword, Edn]:
    req = c.call.get(K_REQUEST)
    assert isinstance(req, dict), f"{c.id}: :call/request missing"
    return req


def replay_sync(c: Cassette, wire: str = "default") -> Outcome:
    """Replay into a `Client`: on its default wire (http.client) through a real loopback server
    (`_loopback.py`), or with `wire="httpx"` on an httpx client through respx."""
    if wire == "httpx":
        router, route = _mock(c)
        # Our own httpx client, handed in: probe / raw ops go through the same (mocked) transport.
        with router, httpx.Client() as http, Client(BASE_URL, backend=c.backend, http_client=http) as client:
            out = _drive_sync(c, client, BASE_URL)
            out.sent = [call.request.content for call in route.calls]  # respx forgets calls on exit
            out.sent_headers = [_heads(call.request) for call in route.calls]
        return out
    with LoopbackReplay(c) as srv:
        with Client(srv.base_url, backend=c.backend) as client:
            out = _drive_sync(c, client, srv.base_url)
        out.sent, out.sent_headers = list(srv.sent), list(srv.sent_headers)
    return out


def _drive_sync(c: Cassette, client: Client, base: str) -> Outcome:
    out = Outcome()
    try:
        if c.op == "send":
            req = _request_map(c)
            if req.get(K_STREAM):
                out.streamed = True
                with client.stream(req) as s:
                    for d in s:
                        out.deltas.append(d)
                out.result = s.response
            else:
                out.result = client.send(req)
        elif c.op == "models":
            out.result = client.models()
        elif c.op == "health":
            out.result = client.health()
        else:  # probe / raw: through the client's own wire, errors typed by the SDK
            r = client.send_raw(c.method, base + c.path, content=c.request_body)
            out.raw = r.content
            if r.status_code >= 400:
                raise classify_error(r.status_code, r.content, r.headers, base + c.path)
    except KotobaError as e:
        out.error = e
    return out


async def replay_async(c: Cassette, wire: str = "default") -> Outcome:
    """Replay into an `AsyncClient`: on its default wire (aiohttp) through a real loopback server
    (`_loopback.py`), or with `wire="httpx"` on an httpx client through respx, like `replay_sync`."""
    if wire == "httpx":
        router, route = _mock(c)
        with router:
            http = httpx.AsyncClient()
            async with AsyncClient(BASE_URL, backend=c.backend, http_client=http) as client:
                out = await _drive_async(c, client, BASE_URL)
            await http.aclose()
            out.sent = [call.request.content for call in route.calls]
            out.sent_headers = [_heads(call.request) for call in route.calls]
        return out
    with LoopbackReplay(c) as srv:
        async with AsyncClient(srv.base_url, backend=c.backend) as client:
            out = await _drive_async(c, client, srv.base_url)
        out.sent, out.sent_headers = list(srv.sent), list(srv.sent_headers)
    return out


async def _drive_async(c: Cassette, client: AsyncClient, base: str) -> Outcome:
    out = Outcome()
    try:
        if c.op == "send":
            req = _request_map(c)
            if req.get(K_STREAM):
                out.streamed = True
                s = await client.stream(req)
                async with s:
                    async for d in s:
                        out.deltas.append(d)
                out.result = s.response
            else:
                out.result = await client.send(req)
        elif c.op == "models":
            out.result = await client.models()
        elif c.op == "health":
            out.result = await client.health()
        else:  # probe / raw: through the client's own wire, errors typed by the SDK
            r = await client.send_raw(c.method, base + c.path, content=c.request_body)
            out.raw = r.content
            if r.status_code >= 400:
                raise classify_error(r.status_code, r.content, r.headers, base + c.path)
    except KotobaError as e:
        out.error = e
    return out


def sent_json(out: Outcome) -> list[JsonValue | bytes]:
    res: list[JsonValue | bytes] = []
    for b in out.sent:
        try:
            res.append(json.loads(b) if b else None)
        except ValueError:
            res.append(b)
    return res
