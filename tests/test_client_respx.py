"""`Client` and `AsyncClient` against mocked servers (respx): error mapping, admission without
retries, streams (truncated, malformed, UTF-8 split), timeouts, API key, backend detection.

Every behaviour runs through both clients (`mode` = sync | async).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import socket
import threading
import time
from typing import Any, AsyncIterator, Callable, Iterator

import httpx
import pytest
import respx

from kotoba_vllm import (AdmissionRejected, AsyncClient, BadRequest, Client, NotReady, ProtocolError,
                         RequestTimeout, StreamBroken, TransportError, Unreachable, ValidationError)
from kotoba_vllm._base_client import Attempt, may_resend
from kotoba_vllm._resend import AttemptEvidence
from kotoba_vllm._wire import from_httpx
from kotoba_vllm._edn import dumps, kw, read_all, read_one
from kotoba_vllm._errors import KotobaError

BASE = "http://engine.test:8000"
CHAT_URL = BASE + "/v1/chat/completions"
CHAT = read_one('{:vllm/endpoint :chat :vllm/model "m" :vllm/messages [{:vllm/role :user :vllm/content "hi"}]'
                ' :vllm/sampling {:vllm/max-tokens 4}}')
GEN = read_one('{:vllm/endpoint :generate :vllm/prompt "Once" :vllm/sampling {:vllm/max-tokens 4}}')
MODES = ["sync", "async"]


def call(mode: str, fn: Callable[[Any], Any], *, backend: str = "vllm", base: str = BASE, **kw: Any) -> Any:
    """Run `fn(client)` on a Client, or `await fn(client)` on an AsyncClient."""
    # respx intercepts httpx only: both clients run on a caller's httpx client here (the default wires,
    # http.client and aiohttp, run the same behaviours against real sockets in test_faults and the
    # cassette replay)
    if mode == "sync":
        with Client(base, backend=backend, http_client=httpx.Client(), **kw) as c:
            return fn(c)

    async def go() -> Any:
        async with AsyncClient(base, backend=backend, http_client=httpx.AsyncClient(), **kw) as c:
            return await fn(c)
    return asyncio.run(go())


def send(mode: str, req: Any = CHAT, **kw: Any) -> Any:
    if mode == "sync":
        return call(mode, lambda c: c.send(req), **kw)

    async def a(c: AsyncClient) -> Any:
        return await c.send(req)
    return call(mode, a, **kw)


def stream(mode: str, req: Any = CHAT, **kw: Any) -> tuple[list[Any], Any]:
    """All deltas, then the assembled response (raises what the stream raises)."""
    if mode == "sync":
        def s(c: Client) -> Any:
            st = c.stream(req)
            return list(st), st.response
        return call(mode, s, **kw)  # type: ignore[no-any-return]

    async def a(c: AsyncClient) -> Any:
        st = await c.stream(req)
        return [d async for d in st], st.response
    return call(mode, a, **kw)  # type: ignore[no-any-return]


def answer(text: str = "ok") -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def sse(*objs: Any, done: bool = True) -> bytes:
    out = b"".join(b"data: " + (o if isinstance(o, bytes) else json.dumps(o, ensure_ascii=False).encode()) + b"\n\n" for o in objs)
    return out + (b"data: [DONE]\n\n" if done else b"")


def chunk(text: str | None = None, finish: str | None = None) -> dict[str, Any]:
    delta = {"content": text} if text is not None else {}
    return {"id": "c1", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


SSE_HEADERS = {"content-type": "text/event-stream"}


class Chunks(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A response body delivered in the given byte pieces, optionally failing after them."""

    def __init__(self, pieces: list[bytes], fail: Exception | None = None) -> None:
        self.pieces, self.fail = pieces, fail

    def __iter__(self) -> Iterator[bytes]:
        yield from self.pieces
        if self.fail is not None:
            raise self.fail

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for p in self.pieces:
            yield p
        if self.fail is not None:
            raise self.fail


# ------------------------------------------------------------------ admission: one call, one request


@pytest.mark.parametrize("mode", MODES)
def test_429_retry_after_seconds_is_admission_after_exactly_one_request(mode: str) -> None:
    with respx.mock(assert_all_called=True) as m:
        route = m.post(CHAT_URL).respond(429, headers={"Retry-After": "7"},
                                         json={"error": {"message": "too many requests", "type": "rate_limited"}})
        with pytest.raises(AdmissionRejected) as ei:
            send(mode)
        assert route.call_count == 1
    e = ei.value
    assert e.retry_after_s == 7.0 and e.status == 429 and e.reason == "rate_limited"  # as the server said
    assert e.endpoint == CHAT_URL and "too many requests" in (e.raw_body or "")
    edn = read_one(dumps(e.to_edn()))
    assert edn[kw("vllm/error")] == kw("admission-rejected") and edn[kw("vllm/retry-after-s")] == 7.0


@pytest.mark.parametrize("mode", MODES)
def test_429_retry_after_http_date(mode: str) -> None:
    when = email.utils.formatdate(time.time() + 120, usegmt=True)
    with respx.mock() as m:
        route = m.post(CHAT_URL).respond(429, headers={"Retry-After": when}, text="busy")
        with pytest.raises(AdmissionRejected) as ei:
            send(mode)
        assert route.call_count == 1
    assert 100 <= (ei.value.retry_after_s or 0) <= 121
    assert ei.value.reason == "rate-limited" and ei.value.raw_body == "busy"


@pytest.mark.parametrize("mode", MODES)
def test_429_on_a_stream_is_admission_after_one_request(mode: str) -> None:
    with respx.mock() as m:
        route = m.post(CHAT_URL).respond(429, headers={"Retry-After": "7"}, json={"error": {"message": "full"}})
        with pytest.raises(AdmissionRejected) as ei:
            stream(mode)
        assert route.call_count == 1
    assert ei.value.retry_after_s == 7.0


def test_cli_run_prints_admission_as_edn_with_reason_and_seconds(tmp_path: Any,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from kotoba_vllm.cli import main
    f = tmp_path / "one.edn"
    f.write_text(dumps(CHAT), encoding="utf-8")
    from faultserver import FaultServer, reply

    # `run` sends on the default wire (aiohttp), which respx cannot see: a real loopback server answers
    with FaultServer(lambda seen: reply({"error": {"message": "busy"}}, 429, [("retry-after", "7")])) as srv:
        code = main(["run", str(f), "--base-url", srv.base_url, "--backend", "vllm"])
        # one chat post, never resent (run's flow control may also probe the server's capacity with a GET)
        assert [s.method for s in srv.seen if s.method == "POST"] == ["POST"]
    assert code == 1
    [rec] = read_all(capsys.readouterr().out)
    assert rec[kw("vllm/error")] == kw("admission-rejected")
    assert rec[kw("vllm/reason")] == kw("rate-limited") and rec[kw("vllm/retry-after-s")] == 7.0


SGLANG_FULL = {"object": "error", "message": "The request queue is full.", "type": "ServiceUnavailable",
               "param": None, "code": 503}


@pytest.mark.parametrize("mode", MODES)
def test_sglang_503_queue_full_is_admission(mode: str) -> None:
    with respx.mock() as m:
        route = m.post(BASE + "/generate").respond(503, json=SGLANG_FULL)
        with pytest.raises(AdmissionRejected) as ei:
            send(mode, GEN, backend="sglang")
        assert route.call_count == 1
    assert ei.value.reason == "queue-full" and ei.value.status == 503
    assert ei.value.to_edn()[kw("vllm/reason")] == kw("queue-full")


@pytest.mark.parametrize("mode", MODES)
def test_sglang_queue_full_inside_a_200_stream_is_admission(mode: str) -> None:
    with respx.mock() as m:
        route = m.post(BASE + "/generate").respond(200, headers=SSE_HEADERS,
                                                   content=sse({"error": SGLANG_FULL}, done=False))
        with pytest.raises(AdmissionRejected) as ei:
            stream(mode, GEN, backend="sglang")
        assert route.call_count == 1
    assert ei.value.reason == "queue-full"


# ------------------------------------------------------------------ other server answers


@pytest.mark.parametrize("mode", MODES)
def test_llamacpp_503_loading_is_not_ready(mode: str) -> None:
    with respx.mock() as m:
        route = m.post(CHAT_URL).respond(503, json={"error": {"code": 503, "message": "Loading model",
                                                              "type": "unavailable_error"}})
        with pytest.raises(NotReady) as ei:
            send(mode, backend="llamacpp")
        assert route.call_count == 1
    assert ei.value.error_type == "unavailable_error"


@pytest.mark.parametrize("mode", MODES)
def test_exceed_context_error_kept_whole(mode: str) -> None:
    body = {"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
                      "type": "exceed_context_size_error", "n_prompt_tokens": 21026, "n_ctx": 512}}
    with respx.mock() as m:
        m.post(CHAT_URL).respond(400, json=body)
        with pytest.raises(BadRequest) as ei:
            send(mode, backend="llamacpp")
    e = ei.value
    assert e.message == body["error"]["message"] and e.error_type == "exceed_context_size_error"
    assert e.details == {kw("code"): 400, kw("n_prompt_tokens"): 21026, kw("n_ctx"): 512}
    edn = read_one(dumps(e.to_edn()))
    assert edn[kw("vllm/details")][kw("n_ctx")] == 512 and edn[kw("vllm/status")] == 400


@pytest.mark.parametrize("mode", MODES)
def test_malformed_json_is_a_protocol_error_with_the_bytes(mode: str) -> None:
    with respx.mock() as m:
        m.post(CHAT_URL).respond(200, content=b'{"choices": [oops')
        with pytest.raises(ProtocolError) as ei:
            send(mode)
    assert ei.value.offending == '{"choices": [oops'


@pytest.mark.parametrize("mode", MODES)
def test_a_good_answer_says_which_server_answered(mode: str) -> None:
    with respx.mock() as m:
        m.post(CHAT_URL).respond(200, json=answer("Hello"))
        r = send(mode)
    assert r.text == "Hello" and r.backend == "vllm" and r.endpoint_url == CHAT_URL
    assert r.timings.end_to_end.provenance == "client-measured"


@pytest.mark.parametrize("mode", MODES)
def test_invalid_request_is_never_sent(mode: str) -> None:
    bad = read_one('{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "x"}]'
                   ' :vllm/sampling {:vllm/temperature 9.0}}')
    with respx.mock(assert_all_called=False) as m:
        route = m.post(CHAT_URL).respond(200, json=answer())
        with pytest.raises(ValidationError) as ei:
            send(mode, bad)
        assert route.call_count == 0
    assert ei.value.problems[0].field == "vllm/temperature"


# ------------------------------------------------------------------ transport failures


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


@pytest.mark.parametrize("mode", MODES)
def test_connection_refused_is_unreachable(mode: str) -> None:
    base = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(Unreachable) as ei:
        send(mode, base=base, timeout=2.0)
    assert ei.value.endpoint == base + "/v1/chat/completions"
    assert ei.value.to_edn()[kw("vllm/error")] == kw("unreachable")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("exc, phase", [(httpx.ConnectTimeout, "connect"), (httpx.ReadTimeout, "read"),
                                        (httpx.WriteTimeout, "write"), (httpx.PoolTimeout, "pool")])
def test_timeouts_say_phase_and_limit(mode: str, exc: type[Exception], phase: str) -> None:
    with respx.mock() as m:
        m.post(CHAT_URL).mock(side_effect=exc("slow"))
        with pytest.raises(RequestTimeout) as ei:
            send(mode, timeout=httpx.Timeout(3.0, connect=1.5))
    assert ei.value.phase == phase
    assert ei.value.limit_s == (1.5 if phase == "connect" else 3.0)
    assert ei.value.to_edn()[kw("vllm/timeout-phase")] == kw(phase)


class SilentServer:
    """Accepts, reads the request, never answers: a real read timeout."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _run(self) -> None:
        try:
            while True:
                c, _ = self.sock.accept()
                self.conns.append(c)
        except OSError:
            pass

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_real_read_timeout_per_call(mode: str) -> None:
    srv = SilentServer()
    try:
        if mode == "sync":
            def f(c: Client) -> Any:
                return c.send(CHAT, timeout=0.3)
        else:
            async def f(c: AsyncClient) -> Any:  # type: ignore[misc]
                return await c.send(CHAT, timeout=0.3)
        with pytest.raises(RequestTimeout) as ei:
            call(mode, f, base=srv.base_url)
    finally:
        srv.close()
    assert ei.value.phase == "read" and ei.value.limit_s == 0.3


class HangAfterFirstChunk(SilentServer):
    """Answers a stream's headers and one delta, then goes quiet (a stalled engine)."""

    def _run(self) -> None:
        try:
            while True:
                c, _ = self.sock.accept()
                self.conns.append(c)
                c.recv(65536)
                c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                          b"transfer-encoding: chunked\r\n\r\n")
                data = b"data: " + json.dumps(chunk("first")).encode() + b"\n\n"
                c.sendall(b"%x\r\n%s\r\n" % (len(data), data))
        except OSError:
            pass


@pytest.mark.parametrize("mode", MODES)
def test_a_stalled_stream_times_out_with_the_per_call_limit_and_partial_text(mode: str) -> None:
    srv = HangAfterFirstChunk()
    try:
        with pytest.raises(RequestTimeout) as ei:
            if mode == "sync":
                with Client(srv.base_url, backend="vllm", timeout=60.0) as c:
                    st = c.stream(CHAT, timeout=0.3)
                    list(st)
            else:
                async def go() -> None:
                    async with AsyncClient(srv.base_url, backend="vllm", timeout=60.0) as c:
                        st = await c.stream(CHAT, timeout=0.3)
                        [d async for d in st]
                asyncio.run(go())
    finally:
        srv.close()
    assert ei.value.phase == "read" and ei.value.limit_s == 0.3 and ei.value.partial_text == "first"


# ------------------------------------------------------------------ streams


@pytest.mark.parametrize("mode", MODES)
def test_stream_deltas_concatenate_to_the_response(mode: str) -> None:
    body = sse(chunk("Hel"), chunk("lo"), chunk(None, "stop"),
               {"id": "c1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
    with respx.mock() as m:
        m.post(CHAT_URL).respond(200, headers=SSE_HEADERS, content=body)
        deltas, r = stream(mode)
    assert "".join(d.delta for d in deltas) == r.text == "Hello"
    assert r.usage.total_tokens == 5 and r.finish_reason == "stop"
    assert r.timings.ttft.provenance == "client-measured"


@pytest.mark.parametrize("mode", MODES)
def test_truncated_stream_raises_stream_broken_with_partial_text(mode: str) -> None:
    with respx.mock() as m:
        m.post(CHAT_URL).respond(200, headers=SSE_HEADERS, content=sse(chunk("Hel"), chunk("lo"), done=False))
        with pytest.raises(StreamBroken) as ei:
            stream(mode)
    assert ei.value.partial_text == "Hello"
    assert ei.value.to_edn()[kw("vllm/partial-text")] == "Hello"


@pytest.mark.parametrize("mode", MODES)
def test_connection_dropped_mid_stream_raises_stream_broken(mode: str) -> None:
    pieces = [sse(chunk("par"), done=False), b"data: " + json.dumps(chunk("tial")).encode() + b"\n\n"]
    with respx.mock() as m:
        m.post(CHAT_URL).mock(return_value=httpx.Response(
            200, headers=SSE_HEADERS, stream=Chunks(pieces, httpx.RemoteProtocolError("peer closed connection"))))
        with pytest.raises(StreamBroken) as ei:
            stream(mode)
    assert ei.value.partial_text == "partial" and "peer closed" in ei.value.message


@pytest.mark.parametrize("mode", MODES)
def test_malformed_json_in_a_stream_keeps_offending_text_and_partial(mode: str) -> None:
    with respx.mock() as m:
        m.post(CHAT_URL).respond(200, headers=SSE_HEADERS, content=sse(chunk("ok"), b'{"choices": [', done=False))
        with pytest.raises(ProtocolError) as ei:
            stream(mode)
    assert ei.value.offending == '{"choices": [' and ei.value.partial_text == "ok"


@pytest.mark.parametrize("mode", MODES)
def test_utf8_split_across_chunks_is_reassembled(mode: str) -> None:
    body = sse(chunk("héllo 日本"), chunk(None, "stop"))
    cut = body.index("日".encode()) + 1  # split inside the 3-byte character
    cut2 = body.index("é".encode()) + 1
    pieces = [body[:cut2], body[cut2:cut], body[cut:]]
    with respx.mock() as m:
        m.post(CHAT_URL).mock(return_value=httpx.Response(200, headers=SSE_HEADERS, stream=Chunks(pieces)))
        deltas, r = stream(mode)
    assert r.text == "héllo 日本"


@pytest.mark.parametrize("mode", MODES)
def test_invalid_utf8_bytes_become_replacement_characters(mode: str) -> None:
    # the tiny random model emits byte fragments that are not valid UTF-8
    raw = b'data: {"choices": [{"index": 0, "delta": {"content": "a\xff\xfeb"}, "finish_reason": null}]}\n\n'
    body = raw + sse(chunk(None, "stop"))
    with respx.mock() as m:
        m.post(CHAT_URL).mock(return_value=httpx.Response(200, headers=SSE_HEADERS,
                                                          stream=Chunks([body[:40], body[40:]])))
        deltas, r = stream(mode)
    assert r.text.startswith("a") and r.text.endswith("b") and "\ufffd" in r.text


@pytest.mark.parametrize("mode", MODES)
def test_crlf_lines_comments_and_no_space_after_colon(mode: str) -> None:
    # sse-starlette style: CRLF line ends and ": ping" keep-alive comments; "data:" without a space
    body = (b": ping\r\n\r\ndata:" + json.dumps(chunk("ab")).encode() + b"\r\n\r\n"
            + b"data: " + json.dumps(chunk("cd", "stop")).encode() + b"\r\n\r\ndata: [DONE]\r\n\r\n")
    cut = body.index(b"\r\n\r\ndata: ") + 1  # a chunk boundary between CR and LF
    with respx.mock() as m:
        m.post(CHAT_URL).mock(return_value=httpx.Response(200, headers=SSE_HEADERS,
                                                          stream=Chunks([body[:cut], body[cut:]])))
        deltas, r = stream(mode)
    assert [d.delta for d in deltas] == ["ab", "cd"] and r.text == "abcd"


@pytest.mark.parametrize("mode", MODES)
def test_a_json_answer_where_a_stream_was_asked_is_a_protocol_error(mode: str) -> None:
    with respx.mock() as m:
        m.post(CHAT_URL).respond(200, json=answer())
        with pytest.raises(ProtocolError) as ei:
            stream(mode)
    assert "event stream" in ei.value.message


@pytest.mark.parametrize("mode", MODES)
def test_llamacpp_native_stream_through_the_client(mode: str) -> None:
    # llama.cpp's own rates: (predicted_n - 1) / predicted_ms, as it reports them
    timings = {"cache_n": 0, "prompt_n": 2, "prompt_ms": 1.0, "prompt_per_second": 2000.0, "predicted_n": 2,
               "predicted_ms": 4.0, "predicted_per_second": 250.0}
    body = sse({"content": "He", "stop": False}, {"content": "y", "stop": False},
               {"content": "", "stop": True, "stop_type": "limit", "tokens_predicted": 2, "tokens_evaluated": 2,
                "timings": timings}, done=False)
    with respx.mock() as m:
        route = m.post(BASE + "/completion").respond(200, headers=SSE_HEADERS, content=body)
        deltas, r = stream(mode, GEN, backend="llamacpp")
        assert json.loads(route.calls[0].request.content)["n_predict"] == 4
    assert "".join(d.delta for d in deltas) == r.text == "Hey"
    assert r.timings.decode.provenance == "server-reported" and r.timings.decode.tokens_per_s == 250.0


def test_cancelling_an_async_stream_closes_the_response() -> None:
    gate = asyncio.Event()

    class Hang(httpx.AsyncByteStream):
        closed = False

        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield sse(chunk("first"), done=False)
            await gate.wait()  # the server never sends more
            yield b""

        async def aclose(self) -> None:
            Hang.closed = True

    async def go() -> None:
        with respx.mock() as m:
            m.post(CHAT_URL).mock(return_value=httpx.Response(200, headers=SSE_HEADERS, stream=Hang()))
            async with AsyncClient(BASE, backend="vllm", http_client=httpx.AsyncClient()) as c:
                st = await c.stream(CHAT)
                got: list[str] = []

                async def consume() -> None:
                    async for d in st:
                        got.append(d.delta)

                task = asyncio.create_task(consume())
                for _ in range(100):
                    await asyncio.sleep(0.01)
                    if got:
                        break
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert got == ["first"]
                assert st._http.is_closed and Hang.closed

    asyncio.run(go())


# ------------------------------------------------------------------ the stale keep-alive rule


def _attempt(*events: str) -> Attempt:
    a = Attempt()
    for e in events:
        a(e, {})
    return a


def test_may_resend_only_for_a_reused_connection_before_any_response_byte() -> None:
    def seam(e: Exception) -> Any:  # a caller's httpx failure, in our words once (the httpx wires do this)
        return from_httpx(e, CHAT_URL, httpx.Timeout(5.0))

    stale = seam(httpx.RemoteProtocolError("Server disconnected without sending a response."))
    reused_no_reply = _attempt("http11.send_request_headers.started", "http11.receive_response_headers.started")
    assert may_resend(stale, reused_no_reply) is True
    assert may_resend(seam(httpx.ReadError("reset")), reused_no_reply) is True
    # a fresh connection that failed: the server may have read the request
    assert may_resend(stale, _attempt("connection.connect_tcp.started", "connection.connect_tcp.complete")) is False
    # any response byte means the server answered: never resend
    assert may_resend(stale, _attempt("http11.receive_response_headers.complete")) is False
    # timeouts and refusals are not stale connections
    assert may_resend(seam(httpx.ReadTimeout("slow")), reused_no_reply) is False
    assert may_resend(seam(httpx.ConnectError("refused")), reused_no_reply) is False
    # no trace events: nothing is known, and unknown never resends
    assert may_resend(stale, _attempt()) is False
    assert may_resend(stale, None) is False
    # a reused connection but no word on the response (the transport did not say): no resend
    half = AttemptEvidence()
    half.connection(reused=True)
    assert may_resend(stale, half) is False


def test_a_transport_reports_evidence_through_the_neutral_interface() -> None:
    from kotoba_vllm._resend import may_resend as rule
    ev = AttemptEvidence()
    assert not rule(connection_failed=True, evidence=ev)  # nothing reported
    ev.connection(reused=True)
    ev.response(seen=False)
    assert rule(connection_failed=True, evidence=ev)
    assert not rule(connection_failed=False, evidence=ev)  # a timeout, a refusal, an HTTP answer
    ev.response(seen=True)
    ev.response(seen=False)  # a byte that arrived stays arrived
    assert not rule(connection_failed=True, evidence=ev)  # the server answered: never again
    fresh = AttemptEvidence()
    fresh.connection(reused=False)
    fresh.connection(reused=True)  # the first connection of the attempt is the one that counts
    fresh.response(seen=False)
    assert not rule(connection_failed=True, evidence=fresh)


@pytest.mark.parametrize("mode", MODES)
def test_a_429_is_a_response_and_never_resent(mode: str) -> None:
    with respx.mock() as m:
        route = m.post(CHAT_URL).mock(side_effect=[httpx.Response(429, json={"error": {"message": "no"}}),
                                                   httpx.Response(200, json=answer())])
        with pytest.raises(AdmissionRejected):
            send(mode)
        assert route.call_count == 1


@pytest.mark.parametrize("mode", MODES)
def test_a_transport_without_evidence_makes_exactly_one_request(mode: str) -> None:
    # respx emits no connection trace events: nothing says the connection was a reused one,
    # so the failure is reported, never resent (the resend rule needs positive evidence).
    with respx.mock() as m:
        route = m.post(CHAT_URL).mock(side_effect=[
            httpx.RemoteProtocolError("Server disconnected without sending a response."),
            httpx.Response(200, json=answer("again"))])
        with pytest.raises(TransportError):
            send(mode)
        assert route.call_count == 1


# ------------------------------------------------------------------ API key


@pytest.mark.parametrize("mode", MODES)
def test_api_key_is_sent_as_bearer_and_never_shown(mode: str) -> None:
    secret = "sk-test-SECRET-123"
    with respx.mock() as m:
        route = m.post(CHAT_URL).respond(401, json={"error": {"message": "bad key", "type": "auth"}})
        with pytest.raises(BadRequest) as ei:
            send(mode, api_key=secret)
        assert route.calls[0].request.headers["authorization"] == f"Bearer {secret}"
    assert secret not in dumps(ei.value.to_edn()) and secret not in repr(ei.value) and secret not in str(ei.value)
    with Client(BASE, api_key=secret) as c:
        assert secret not in repr(c) and "api_key=<set>" in repr(c)


def test_api_key_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOTOBA_VLLM_API_KEY", "env-key")
    with respx.mock() as m:
        route = m.post(CHAT_URL).respond(200, json=answer())
        send("sync")
        assert route.calls[0].request.headers["authorization"] == "Bearer env-key"


# ------------------------------------------------------------------ backend detection


def _probe_routes(m: respx.MockRouter, hits: dict[str, Any]) -> None:
    for path in ("/props", "/server_info", "/get_server_info", "/version"):
        if path in hits:
            m.get(BASE + path).respond(200, json=hits[path])
        else:
            m.get(BASE + path).respond(404, json={"detail": "Not Found"})


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("hits, expected", [
    ({"/props": {"default_generation_settings": {"n_ctx": 2048}, "total_slots": 2}}, "llamacpp"),
    ({"/server_info": {"model_path": "Qwen/Qwen2.5-0.5B", "tokenizer_path": "Qwen/Qwen2.5-0.5B"}}, "sglang"),
    ({"/version": {"version": "0.11.0"}}, "vllm"),
    ({}, "openai"),
])
def test_backend_auto_detection(mode: str, hits: dict[str, Any], expected: str) -> None:
    with respx.mock(assert_all_called=False) as m:
        _probe_routes(m, hits)
        route = m.post(CHAT_URL).respond(200, json=answer())
        if mode == "sync":
            def f(c: Client) -> Any:
                return c.detect_backend(), c.send(CHAT), c.backend
        else:
            async def f(c: AsyncClient) -> Any:  # type: ignore[misc]
                return await c.detect_backend(), await c.send(CHAT), c.backend
        found, r, cached = call(mode, f, backend="auto")
        assert route.call_count == 1
    assert found == expected and r.backend == expected and cached == expected


@pytest.mark.parametrize("mode", MODES)
def test_detection_against_a_dead_server_is_unreachable(mode: str) -> None:
    with pytest.raises(Unreachable):
        send(mode, base=f"http://127.0.0.1:{_closed_port()}", backend="auto")


def test_every_client_error_is_a_kotoba_error() -> None:
    for cls in (AdmissionRejected, BadRequest, NotReady, ProtocolError, RequestTimeout, StreamBroken, Unreachable,
                ValidationError):
        assert issubclass(cls, KotobaError)
