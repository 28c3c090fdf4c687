"""The fault matrix: every fault against real loopback sockets (tests/faultserver.py), sync and
async, streaming and not. Each row states the typed outcome, what is kept, and how many requests
the server saw; a watchdog turns a hang into a failure instead of a stuck run.

docs/fault-matrix.md is the same table for readers; `test_doc_lists_every_row` keeps them together.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import threading
from typing import Any, Callable

import attrs
import httpx
import pytest

from faultserver import (CLOSE, LAST_CHUNK, RESET, FaultServer, Seen, Sleep, Step, chat_answer, chat_chunk, chunk,
                         head, ok, refused_url, reply, sse_event, sse_head, sse_stream)
from kotoba_vllm import _errors as E
from kotoba_vllm._client import AsyncClient, Client
from kotoba_vllm._edn import kw

HANG_S = 20.0  # watchdog per call; every fault below resolves far sooner or it is a hang
SHORT = 0.3  # client timeout for the slow-server rows
MSGS = [{"role": "user", "content": "hi"}]
RID = "fault-1"  # every call's request id: each typed error says whose request it was
MB = 1024 * 1024
HUGE = 50 * MB


# ------------------------------------------------------------------ scripts (one per fault)


def _plain_or_stream(plain: list[Step], stream: list[Step]) -> Callable[[Seen], list[Step]]:
    return lambda seen: stream if (seen.json() or {}).get("stream") else plain


def _half_body() -> list[Step]:
    body = json.dumps(chat_answer("Hello")).encode()
    return [head(200, [("content-type", "application/json")], length=len(body)), body[: len(body) // 2]]


HELLO = [sse_head(), sse_event(chat_chunk("Hel")), sse_event(chat_chunk("lo"))]
HUGE_PIECE = "x" * (64 * 1024)


def _huge_stream() -> list[Step]:
    return sse_stream([HUGE_PIECE] * (HUGE // len(HUGE_PIECE)))


@attrs.frozen
class Fault:
    name: str
    script: Callable[[Seen], list[Step]] | None  # None: nobody listens (connection refused)
    outcome: type[BaseException] | None  # None: the call succeeds
    kept: str | None = None  # partial text the error must carry (streaming)
    requests: int | None = 1  # requests the server must see per call
    timeout: float | None = None
    modes: tuple[str, ...] = ("plain", "stream")
    check: Callable[[Any], None] | None = None
    summary: str = ""


def _limit_named(e: Any) -> None:
    assert e.limit_s == SHORT and f"{SHORT} s" in e.message and e.phase == "read"


def _offending_kept(e: Any) -> None:
    assert e.offending and "{" in e.offending


def _bounded(e: Any) -> None:  # a 50 MB garbage answer gives a bounded error map
    assert len(e.offending) < 5000 and "more chars" in e.offending


def _huge_text(r: Any) -> None:
    assert len(r.text) == HUGE


def _replacement(r: Any) -> None:
    assert r.text == "a\ufffd\ufffdb"


def _split_char(r: Any) -> None:
    assert r.text == "é漢"


def _admission(e: Any) -> None:
    assert e.status == 429 and e.retry_after_s == 1.0 and e.sent is True


def _not_ready(e: Any) -> None:
    assert e.status == 503 and e.error_type == "unavailable_error"


BAD_UTF8 = b'{"choices":[{"index":0,"delta":{"content":"a\xff\xfeb"},"finish_reason":null}]}'
BAD_UTF8_PLAIN = (b'{"choices":[{"index":0,"message":{"role":"assistant","content":"a\xff\xfeb"},'
                  b'"finish_reason":"stop"}]}')
SPLIT = 'data: {"choices":[{"index":0,"delta":{"content":"é漢"},"finish_reason":null}]}\n\n'.encode()
CUT = SPLIT.index("漢".encode()) + 1
LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
LIMITED = {"error": {"message": "too many requests", "type": "rate_limit"}}

FAULTS: tuple[Fault, ...] = (
    Fault("connection refused", None, E.Unreachable, requests=None, summary="Unreachable"),
    Fault("reset before headers", lambda s: [RESET], E.TransportError, summary="TransportError, not resent"),
    Fault("reset mid-stream", _plain_or_stream(_half_body() + [RESET], HELLO + [Sleep(0.05), RESET]),
          E.TransportError, kept="Hello", summary="StreamBroken (stream) / TransportError"),
    Fault("server closes mid-stream (FIN)", _plain_or_stream(_half_body() + [CLOSE], HELLO + [CLOSE]),
          E.TransportError, kept="Hello", summary="StreamBroken (stream) / TransportError"),
    Fault("stream ends without a finish", lambda s: HELLO + [LAST_CHUNK], E.StreamBroken, kept="Hello",
          modes=("stream",), summary="StreamBroken"),
    Fault("malformed JSON", _plain_or_stream(reply(b'{"choices": [{"index": 0,'),
                                             HELLO + [sse_event(b'{"choices": [{"ind'), LAST_CHUNK]),
          E.ProtocolError, kept="Hello", check=_offending_kept, summary="ProtocolError, offending bytes kept"),
    Fault("JSON of the wrong shape", _plain_or_stream(reply({"choices": [1]}),
                                                      HELLO + [sse_event({"choices": [1]}), LAST_CHUNK]),
          E.ProtocolError, kept="Hello", summary="ProtocolError"),
    Fault("deeply nested JSON", _plain_or_stream(reply(b"[" * 100_000 + b"]" * 100_000),
                                                 HELLO + [sse_event(b"[" * 100_000 + b"]" * 100_000), LAST_CHUNK]),
          E.ProtocolError, kept="Hello", summary="ProtocolError (was RecursionError)"),
    Fault("SSE framing: no data: prefix", lambda s: [sse_head(), chunk(json.dumps(chat_chunk("Hel")).encode()
                                                                       + b"\n\n"), LAST_CHUNK],
          E.StreamBroken, kept="", modes=("stream",), summary="StreamBroken (no event arrived)"),
    Fault("SSE framing: wrong content type", lambda s: [sse_head(content_type="text/plain"),
                                                        sse_event(chat_chunk("Hel")), LAST_CHUNK],
          E.ProtocolError, kept="", modes=("stream",), summary="ProtocolError"),
    Fault("slow headers", lambda s: [Sleep(30)], E.RequestTimeout, timeout=SHORT, check=_limit_named,
          summary="RequestTimeout naming phase and limit"),
    Fault("slow body", _plain_or_stream(_half_body() + [Sleep(30)], HELLO + [Sleep(30)]), E.RequestTimeout,
          kept="Hello", timeout=SHORT, check=_limit_named, summary="RequestTimeout, partial text kept"),
    Fault("429", lambda s: reply(LIMITED, 429, [("retry-after", "1")]), E.AdmissionRejected,
          check=_admission, summary="AdmissionRejected, Retry-After parsed, never resent"),
    Fault("503 while loading", lambda s: reply(LOADING, 503), E.NotReady, check=_not_ready, summary="NotReady"),
    Fault("huge body (50 MB)", _plain_or_stream(reply(chat_answer("x" * HUGE)), _huge_stream()), None,
          check=_huge_text, summary="succeeds; no size cap, memory ~ body"),
    Fault("huge malformed body (50 MB)", lambda s: reply(b"<" * HUGE), E.ProtocolError, modes=("plain",),
          check=_bounded, summary="ProtocolError; offending clipped to 4 KiB"),
    Fault("invalid UTF-8", _plain_or_stream(reply(BAD_UTF8_PLAIN), [sse_head(), chunk(b"data: " + BAD_UTF8 + b"\n\n"),
                                                                    sse_event(chat_chunk(None, "stop")), LAST_CHUNK]),
          None, check=_replacement, summary="succeeds; bad bytes become U+FFFD"),
    Fault("UTF-8 char split across reads", lambda s: [sse_head(), chunk(SPLIT[:CUT]), Sleep(0.02),
                                                      chunk(SPLIT[CUT:]), sse_event(chat_chunk(None, "stop")),
                                                      LAST_CHUNK],
          None, modes=("stream",), check=_split_char, summary="succeeds; the character is whole"),
)

# every shipped wire: http.client sync (default), a caller's httpx sync, aiohttp async (default), a caller's httpx async
FLAVOURS = ("sync", "sync-httpx", "async", "async-httpx")
CASES = [(f, mode, flavour) for f in FAULTS for mode in f.modes for flavour in FLAVOURS]


# ------------------------------------------------------------------ drivers


def _watchdog(fn: Callable[[], Any]) -> Any:
    """Run `fn` in a thread; a call still running after HANG_S is a hang (the test fails, the run goes on)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(HANG_S)
    assert not t.is_alive(), f"hang: no outcome within {HANG_S} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def sync_client(url: str, flavour: str) -> Client:
    """flavour "sync": the default wire (http.client); "sync-httpx": a caller's httpx.Client."""
    if flavour == "sync-httpx":
        return Client(url, backend="vllm", http_client=httpx.Client())
    client = Client(url, backend="vllm")
    assert client.transport == "stdlib"
    return client


def call_sync(url: str, mode: str, timeout: float | None, flavour: str = "sync") -> Any:
    with sync_client(url, flavour) as c:
        if mode == "stream":
            with c.stream_chat(MSGS, timeout=timeout, request_id=RID) as s:
                return s.until_done()
        return c.chat(MSGS, timeout=timeout, request_id=RID)


def async_client(url: str, flavour: str) -> AsyncClient:
    """flavour "async": the default wire (aiohttp); "async-httpx": a caller's httpx.AsyncClient."""
    if flavour == "async-httpx":
        return AsyncClient(url, backend="vllm", http_client=httpx.AsyncClient())
    client = AsyncClient(url, backend="vllm")
    assert client.transport == "aiohttp"
    return client


async def _call_async(url: str, mode: str, timeout: float | None, flavour: str) -> Any:
    async with async_client(url, flavour) as c:
        if mode == "stream":
            async with await c.stream_chat(MSGS, timeout=timeout, request_id=RID) as s:
                return await s.until_done()
        return await c.chat(MSGS, timeout=timeout, request_id=RID)


def call_async(url: str, mode: str, timeout: float | None, flavour: str = "async") -> Any:
    return asyncio.run(asyncio.wait_for(_call_async(url, mode, timeout, flavour), HANG_S))


def outcome(fault: Fault, mode: str, flavour: str) -> tuple[Any, BaseException | None, int | None]:
    def call(url: str, mode: str, timeout: float | None) -> Any:
        if flavour.startswith("sync"):
            return call_sync(url, mode, timeout, flavour)
        return call_async(url, mode, timeout, flavour)

    def go(url: str) -> tuple[Any, BaseException | None]:
        try:
            return _watchdog(lambda: call(url, mode, fault.timeout)), None
        except Exception as e:  # noqa: BLE001 - the outcome under test
            return None, e

    if fault.script is None:
        return (*go(refused_url()), None)
    with FaultServer(fault.script) as srv:
        value, err = go(srv.base_url)
        return value, err, srv.requests


@pytest.mark.parametrize("fault,mode,flavour", CASES,
                         ids=[f"{f.name}-{m}-{fl}".replace(" ", "_") for f, m, fl in CASES])
def test_fault_matrix(fault: Fault, mode: str, flavour: str) -> None:
    value, err, requests = outcome(fault, mode, flavour)
    if fault.outcome is None:
        assert err is None, f"expected success, got {err!r}"
        subject = value
    else:
        assert isinstance(err, fault.outcome), f"expected {fault.outcome.__name__}, got {err!r}"
        assert isinstance(err, E.KotobaError)
        edn = err.to_edn()  # every typed error renders, and says which endpoint failed
        assert edn and err.endpoint and err.message
        # whose request and which engine dialect sent it, whatever failed: a refusal, a timeout, a broken stream
        assert edn[kw("vllm/request-id")] == RID and edn[kw("vllm/backend")] == kw("vllm"), edn
        subject = err
        if fault.kept is not None and mode == "stream":
            assert err.partial_text == fault.kept  # type: ignore[attr-defined]
        if mode == "stream" and isinstance(err, E.TransportError) and not isinstance(err, (E.Unreachable,)) \
                and fault.kept:
            assert isinstance(err, (E.StreamBroken, E.RequestTimeout))
    if fault.requests is not None:
        assert requests == fault.requests, f"server saw {requests} requests"
    if fault.check is not None:
        fault.check(subject)


# ------------------------------------------------------------------ keep-alive and admission (counted at the server)


def _stale_second(seen: Seen) -> list[Step]:
    """The server reads the 2nd request on connection 0 and hangs up without answering."""
    if seen.conn == 0 and seen.index == 1:
        return [CLOSE]
    return ok(seen)


def _idle_close(seen: Seen) -> list[Step]:
    """Answer, then close the idle connection a moment later (a server's keep-alive timeout)."""
    return [*ok(seen), Sleep(0.05), CLOSE]


def _limited_second(seen: Seen) -> list[Step]:
    if seen.index == 1:
        return reply(LIMITED, 429, [("retry-after", "1")])
    return ok(seen)


def _two_calls(flavour: str, url: str, mode: str, pause: float = 0.0) -> list[Any]:
    """Two calls on one client (so the second may reuse the first's connection)."""

    def one_sync(c: Client) -> Any:
        try:
            if mode == "stream":
                with c.stream_chat(MSGS) as s:
                    return s.until_done()
            return c.chat(MSGS)
        except E.KotobaError as e:
            return e

    async def one_async(c: AsyncClient) -> Any:
        try:
            if mode == "stream":
                async with await c.stream_chat(MSGS) as s:
                    return await s.until_done()
            return await c.chat(MSGS)
        except E.KotobaError as e:
            return e

    if flavour.startswith("sync"):
        def go() -> list[Any]:
            import time
            with sync_client(url, flavour) as c:
                first = one_sync(c)
                time.sleep(pause)
                return [first, one_sync(c)]
        return _watchdog(go)  # type: ignore[no-any-return]

    async def ago() -> list[Any]:
        async with async_client(url, flavour) as c:
            first = await one_async(c)
            await asyncio.sleep(pause)
            return [first, await one_async(c)]
    return asyncio.run(asyncio.wait_for(ago(), HANG_S))


BOTH = [(m, fl) for m in ("plain", "stream") for fl in FLAVOURS]


@pytest.mark.parametrize("mode,flavour", BOTH)
def test_stale_keepalive_is_resent_once_on_a_fresh_connection(mode: str, flavour: str) -> None:
    with FaultServer(_stale_second) as srv:
        first, second = _two_calls(flavour, srv.base_url, mode)
        seen = [(s.conn, s.index) for s in srv.seen]
    assert first.text == "Hello" and second.text == "Hello"
    # the stale request was never answered, so it went again, once, on a new connection
    assert seen == [(0, 0), (0, 1), (1, 0)]


@pytest.mark.parametrize("mode,flavour", BOTH)
def test_idle_keepalive_closed_by_server_next_call_succeeds(mode: str, flavour: str) -> None:
    with FaultServer(_idle_close) as srv:
        first, second = _two_calls(flavour, srv.base_url, mode, pause=0.3)
        requests = srv.requests
    assert first.text == "Hello" and second.text == "Hello"
    assert requests == 2


@pytest.mark.parametrize("mode,flavour", BOTH)
def test_429_on_a_reused_connection_is_never_resent(mode: str, flavour: str) -> None:
    with FaultServer(_limited_second) as srv:
        first, second = _two_calls(flavour, srv.base_url, mode)
        seen = [(s.conn, s.index) for s in srv.seen]
    assert first.text == "Hello"
    assert isinstance(second, E.AdmissionRejected) and second.retry_after_s == 1.0
    assert seen == [(0, 0), (0, 1)]  # one call, one request


@pytest.mark.parametrize("mode,flavour", BOTH)
def test_a_reset_on_a_fresh_connection_is_not_resent(mode: str, flavour: str) -> None:
    with FaultServer(lambda s: [RESET]) as srv:
        first, second = _two_calls(flavour, srv.base_url, mode)
        requests = srv.requests
    assert type(first) is E.TransportError and type(second) is E.TransportError
    assert requests == 2


STORM = 40


@pytest.mark.parametrize("flavour", ["sync", "sync-httpx"])
@pytest.mark.parametrize("mode", ["plain", "stream"])
def test_429_storm_sync_one_request_per_call(mode: str, flavour: str) -> None:
    with FaultServer(lambda s: reply(LIMITED, 429, [("retry-after", "1")])) as srv:
        def go() -> list[Any]:
            out = []
            with sync_client(srv.base_url, flavour) as c:
                for _ in range(STORM):
                    try:
                        out.append(c.stream_chat(MSGS).until_done() if mode == "stream" else c.chat(MSGS))
                    except E.KotobaError as e:
                        out.append(e)
            return out
        results = _watchdog(go)
        requests = srv.requests
    assert requests == STORM
    assert all(type(r) is E.AdmissionRejected and r.retry_after_s == 1.0 for r in results)


@pytest.mark.parametrize("flavour", ["async", "async-httpx"])
@pytest.mark.parametrize("mode", ["plain", "stream"])
def test_429_storm_async_concurrent_one_request_per_call(mode: str, flavour: str) -> None:
    async def go(url: str) -> list[Any]:
        async with async_client(url, flavour) as c:
            async def one() -> Any:
                if mode == "stream":
                    return await (await c.stream_chat(MSGS)).until_done()
                return await c.chat(MSGS)
            return await asyncio.gather(*(one() for _ in range(STORM)), return_exceptions=True)

    with FaultServer(lambda s: reply(LIMITED, 429, [("retry-after", "1")])) as srv:
        results = asyncio.run(asyncio.wait_for(go(srv.base_url), HANG_S))
        requests = srv.requests
    assert requests == STORM
    assert all(type(r) is E.AdmissionRejected and r.retry_after_s == 1.0 for r in results)


def test_lone_surrogate_from_the_server_still_prints_as_edn(tmp_path: pathlib.Path) -> None:
    """JSON may escape half a surrogate pair ("\\ud83d"); the CLI must still write valid UTF-8 EDN."""
    from kotoba_vllm._edn import kw, read_all
    from kotoba_vllm.cli import main

    ev = r'{"choices":[{"index":0,"delta":{"content":"a\ud83d"},"finish_reason":null}]}'
    req = tmp_path / "r.edn"
    req.write_text('{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "hi"}]}')
    out = tmp_path / "out.edn"
    with FaultServer(lambda s: [sse_head(), sse_event(ev), sse_event(chat_chunk(None, "stop")), LAST_CHUNK]) as srv:
        rc = _watchdog(lambda: main(["run", str(req), "--base-url", srv.base_url, "-b", "vllm", "--stream",
                                     "-o", str(out)]))
    assert rc == 0
    forms = read_all(out.read_text(encoding="utf-8"))
    assert forms[-1][kw("vllm/text")] == "a\ud83d"


def test_doc_lists_every_row() -> None:
    doc = (pathlib.Path(__file__).parent.parent / "docs" / "fault-matrix.md").read_text(encoding="utf-8")
    for f in FAULTS:
        assert f"| {f.name} |" in doc, f"docs/fault-matrix.md lacks the row {f.name!r}"
