"""The default sync wire (http.client under kotoba's keep-alive pool) against real loopback sockets:
keep-alive and the resend rule, timeouts, refusals, chunked streams cut anywhere, compression,
headers, and one `Client` shared by many threads."""

from __future__ import annotations

import gzip
import json
import pathlib
import socket
import ssl
import threading
import time
import zlib
from typing import Any

import httpx
import pytest

from faultserver import (CLOSE, LAST_CHUNK, FaultServer, Seen, Sleep, Step, chat_answer, chat_chunk, chunk, head,
                         ok, refused_url, reply, sse_event, sse_head)
from kotoba_vllm import _errors as E
from kotoba_vllm._client import Client
from kotoba_vllm._edn import read_one
from kotoba_vllm._resend import AttemptEvidence
from kotoba_vllm._stdlib_wire import StdlibWire

MSGS = [{"role": "user", "content": "hi"}]
T = httpx.Timeout(5.0)


def client(url: str, **kw: Any) -> Client:
    c = Client(url, backend="vllm", **kw)
    assert c.transport == "stdlib"
    return c


# ------------------------------------------------------------------ keep-alive and the resend rule


def test_requests_share_one_kept_alive_connection() -> None:
    with FaultServer() as srv, client(srv.base_url) as c:
        texts = [c.chat(MSGS).text for _ in range(5)] + [c.stream_chat(MSGS).until_done().text for _ in range(5)]
        seen = [(s.conn, s.index) for s in srv.seen]
    assert texts == ["Hello"] * 10
    assert seen == [(0, i) for i in range(10)] and c.resends == 0


def test_a_connection_the_server_closed_while_idle_is_not_used_again() -> None:
    """The server's keep-alive timeout closed it between requests: the next request goes on a new
    connection without a failed attempt (the wire sees the idle socket readable at EOF)."""
    def answer_then_close(seen: Seen) -> list[Step]:
        return [*ok(seen), Sleep(0.02), CLOSE]

    with FaultServer(answer_then_close) as srv, client(srv.base_url) as c:
        first = c.chat(MSGS)
        time.sleep(0.2)
        second = c.chat(MSGS)
        seen = [(s.conn, s.index) for s in srv.seen]
    assert first.text == second.text == "Hello"
    assert seen == [(0, 0), (1, 0)] and c.resends == 0


@pytest.mark.parametrize("mode", ["plain", "stream"])
def test_a_reused_connection_closed_on_the_request_is_resent_once_transparently(mode: str) -> None:
    """The server reads the 2nd request on a kept-alive connection and hangs up without a byte:
    the wire reports reused + no response byte, so the call sends again, once, on a new connection."""
    def stale_second(seen: Seen) -> list[Step]:
        return [CLOSE] if (seen.conn, seen.index) == (0, 1) else ok(seen)

    with FaultServer(stale_second) as srv, client(srv.base_url) as c:
        call = (lambda: c.stream_chat(MSGS).until_done()) if mode == "stream" else (lambda: c.chat(MSGS))
        assert call().text == "Hello"
        assert call().text == "Hello"
        seen = [(s.conn, s.index) for s in srv.seen]
    assert seen == [(0, 0), (0, 1), (1, 0)] and c.resends == 1


def test_a_fresh_connection_closed_after_the_request_is_a_typed_error_never_resent() -> None:
    with FaultServer(lambda s: [CLOSE]) as srv, client(srv.base_url) as c:
        with pytest.raises(E.TransportError) as ei:
            c.chat(MSGS)
        requests = srv.requests
    assert type(ei.value) is E.TransportError and "disconnected" in ei.value.message
    assert requests == 1 and c.resends == 0


def test_a_reused_connection_that_answered_part_of_the_headers_is_not_resent() -> None:
    """Bytes arrived before the hang-up: the server saw the request, so it is never sent twice."""
    def half_headers_second(seen: Seen) -> list[Step]:
        return [b"HTTP/1.1 200 OK\r\ncontent-ty", CLOSE] if seen.index == 1 else ok(seen)

    with FaultServer(half_headers_second) as srv, client(srv.base_url) as c:
        c.chat(MSGS)
        # http.client takes a header block cut by EOF as complete, with a close-delimited empty body:
        # a typed error either way (here the empty body is not JSON), and never a second request
        with pytest.raises((E.TransportError, E.ProtocolError)):
            c.chat(MSGS)
        requests = srv.requests
    assert requests == 2 and c.resends == 0


def test_the_wire_reports_its_evidence() -> None:
    def stale_second(seen: Seen) -> list[Step]:
        return [CLOSE] if seen.index == 1 else ok(seen)

    with FaultServer(stale_second) as srv:
        wire = StdlibWire(headers={})
        url = srv.base_url + "/v1/chat/completions"
        first = AttemptEvidence()
        wire.send("POST", url, json={"messages": MSGS}, timeout=T, attempt=first)
        second = AttemptEvidence()
        with pytest.raises(E.TransportError) as lost:
            wire.send("POST", url, json={"messages": MSGS}, timeout=T, attempt=second)
        assert lost.value.connection_lost
        wire.close()
    assert first.reused is False and first.response_seen is None  # it succeeded: nothing to judge
    assert second.reused is True and second.response_seen is False


def test_a_close_delimited_answer_is_read_to_the_end_and_its_connection_not_kept() -> None:
    body = json.dumps(chat_answer("Hello")).encode()

    def no_length(seen: Seen) -> list[Step]:
        return [head(200, [("content-type", "application/json")], close=True) + body, CLOSE]

    with FaultServer(no_length) as srv, client(srv.base_url) as c:
        assert [c.chat(MSGS).text for _ in range(3)] == ["Hello"] * 3
        seen = [(s.conn, s.index) for s in srv.seen]
    assert seen == [(0, 0), (1, 0), (2, 0)] and c.resends == 0


def test_idle_connections_expire() -> None:
    with FaultServer() as srv:
        wire = StdlibWire(headers={}, keepalive_s=0.05)
        url = srv.base_url + "/v1/chat/completions"
        wire.send("POST", url, json={}, timeout=T)
        wire.send("POST", url, json={}, timeout=T)  # reused
        time.sleep(0.1)
        wire.send("POST", url, json={}, timeout=T)  # expired: a new one
        wire.close()
        conns = [s.conn for s in srv.seen]
    assert conns == [0, 0, 1]


# ------------------------------------------------------------------ timeouts and refusals


def test_slow_headers_are_a_read_timeout() -> None:
    with FaultServer(lambda s: [Sleep(30)]) as srv:
        wire = StdlibWire(headers={})
        t0 = time.monotonic()
        with pytest.raises(E.RequestTimeout) as raw:
            wire.send("GET", srv.base_url + "/health", timeout=httpx.Timeout(5.0, read=0.2))
        assert raw.value.phase == "read"
        assert time.monotonic() - t0 < 2
        wire.close()
        with client(srv.base_url) as c, pytest.raises(E.RequestTimeout) as ei:
            c.chat(MSGS, timeout=0.2)
    assert ei.value.phase == "read" and ei.value.limit_s == 0.2


def test_connection_refused() -> None:
    wire = StdlibWire(headers={})
    with pytest.raises(E.Unreachable):
        wire.send("GET", refused_url() + "/health", timeout=T)
    with client(refused_url()) as c, pytest.raises(E.Unreachable):
        c.chat(MSGS)


def test_a_url_of_another_scheme_is_unreachable_not_a_crash() -> None:
    with Client("ftp://127.0.0.1:9", backend="vllm") as c, pytest.raises(E.Unreachable):
        c.chat(MSGS)


# ------------------------------------------------------------------ streams


def _stream_bytes() -> bytes:
    events = b"".join(sse_event(chat_chunk(t)) for t in ("Hé", "llo", " wörld", " 漢字"))
    return sse_head() + events + sse_event(chat_chunk(None, "stop")) + sse_event("[DONE]") + LAST_CHUNK


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 13, 64])
def test_a_chunked_stream_cut_at_any_byte_reads_whole(cut: int) -> None:
    """The whole response (headers, chunk sizes, CRLFs, UTF-8) written `cut` bytes at a time."""
    raw = _stream_bytes()

    def cut_up(seen: Seen) -> list[Step]:
        if not (seen.json() or {}).get("stream"):
            return ok(seen)
        out: list[Step] = []
        for i in range(0, len(raw), cut):
            out += [raw[i:i + cut], Sleep(0.0005)]
        return out[:-1]  # (a pause after the end would read the next request as a hang-up)

    with FaultServer(cut_up) as srv, client(srv.base_url) as c:
        with c.stream_chat(MSGS) as s:
            deltas = [d.delta for d in s if d.delta]
        again = c.chat(MSGS)
    assert deltas == ["Hé", "llo", " wörld", " 漢字"]
    assert s.response is not None and s.response.text == "Héllo wörld 漢字"
    assert again.text == "Hello"


def test_stream_deltas_arrive_as_the_server_sends_them() -> None:
    def slow_tail(seen: Seen) -> list[Step]:
        return [sse_head(), sse_event(chat_chunk("first")), Sleep(1.0), sse_event(chat_chunk(None, "stop")),
                sse_event("[DONE]"), LAST_CHUNK]

    with FaultServer(slow_tail) as srv, client(srv.base_url) as c:
        t0 = time.monotonic()
        with c.stream_chat(MSGS) as s:
            deltas = iter(s)
            first = next(deltas)
            waited = time.monotonic() - t0
            rest = list(deltas)
    assert first.delta == "first" and waited < 0.8
    assert s.response is not None and s.response.text == "first" and rest is not None


def test_a_stream_closed_early_is_not_reused_and_the_next_call_works() -> None:
    def long_stream(seen: Seen) -> list[Step]:
        if (seen.json() or {}).get("stream"):
            return [sse_head(), *[sse_event(chat_chunk("x")) for _ in range(50)], Sleep(5)]
        return ok(seen)

    with FaultServer(long_stream) as srv, client(srv.base_url) as c:
        with c.stream_chat(MSGS) as s:
            next(iter(s))
        assert c.chat(MSGS).text == "Hello"
        seen = [(s2.conn, s2.index) for s2 in srv.seen]
    assert seen == [(0, 0), (1, 0)]


# ------------------------------------------------------------------ bytes on the wire


def test_request_headers_and_key_scope() -> None:
    with FaultServer() as home, FaultServer() as other:
        with client(home.base_url, api_key="sk-test-1234567890") as c:
            c.chat(MSGS)
            c.send(read_one(f'{{:vllm/endpoint :chat :vllm/base-url "{other.base_url}" '
                            ':vllm/messages [{:vllm/role :user :vllm/content "hi"}]}'))
        mine, theirs = home.seen[0], other.seen[0]
    port = home.base_url.rsplit(":", 1)[1]
    assert mine.headers["host"] == f"127.0.0.1:{port}"
    assert mine.headers["authorization"] == "Bearer sk-test-1234567890"
    assert mine.headers["content-type"] == "application/json"
    assert mine.headers["accept-encoding"] == "gzip, deflate"  # both decoded below
    assert int(mine.headers["content-length"]) == len(mine.body) and json.loads(mine.body)["messages"]
    assert "authorization" not in theirs.headers  # an origin the user did not name never sees the key


def test_response_headers_are_case_insensitive() -> None:
    limited = {"error": {"message": "too many requests", "type": "rate_limit"}}
    with FaultServer(lambda s: reply(limited, 429, [("Retry-After", "2")])) as srv, client(srv.base_url) as c:
        with pytest.raises(E.AdmissionRejected) as ei:
            c.chat(MSGS)
    assert ei.value.retry_after_s == 2.0


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate"])
def test_compressed_answers_are_decoded(encoding: str) -> None:
    body = json.dumps(chat_answer("Hello")).encode()
    events = b"".join(b"data: " + json.dumps(chat_chunk(t)).encode() + b"\n\n" for t in ("Hel", "lo"))
    events += b"data: " + json.dumps(chat_chunk(None, "stop")).encode() + b"\n\ndata: [DONE]\n\n"

    def pack(data: bytes) -> bytes:
        if encoding == "gzip":
            return gzip.compress(data)
        if encoding == "deflate":
            return zlib.compress(data)
        d = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        return d.compress(data) + d.flush()

    name = "gzip" if encoding == "gzip" else "deflate"

    def answer(seen: Seen) -> list[Step]:
        if (seen.json() or {}).get("stream"):
            z = pack(events)
            hs = [("content-type", "text/event-stream"), ("content-encoding", name)]
            return [head(200, hs, chunked=True), chunk(z[:5]), Sleep(0.01), chunk(z[5:]), LAST_CHUNK]
        z = pack(body)
        return [head(200, [("content-type", "application/json"), ("content-encoding", name)], length=len(z)) + z]

    with FaultServer(answer) as srv, client(srv.base_url) as c:
        assert c.chat(MSGS).text == "Hello"
        assert c.stream_chat(MSGS).until_done().text == "Hello"


# ------------------------------------------------------------------ threads


def test_one_client_shared_by_threads() -> None:
    """N requests from 8 threads: N good answers, never more connections than threads."""
    threads, per = 8, 25

    with FaultServer() as srv, client(srv.base_url) as c:
        results: list[str] = []
        errors: list[BaseException] = []
        lock = threading.Lock()

        def work(i: int) -> None:
            try:
                for j in range(per):
                    r = c.stream_chat(MSGS).until_done() if (i + j) % 3 == 0 else c.chat(MSGS)
                    with lock:
                        results.append(r.text)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        requests, conns = srv.requests, len({s.conn for s in srv.seen})
    assert not errors, errors[:3]
    assert results == ["Hello"] * (threads * per)
    assert requests == threads * per and conns <= threads and c.resends == 0


# ------------------------------------------------------------------ TLS


TLS_DIR = pathlib.Path(__file__).parent / "tls"  # a self-signed certificate for 127.0.0.1 (tests only)


class TlsServer:
    """A minimal HTTPS/1.1 server on loopback answering every request with a chat answer."""

    def __init__(self) -> None:
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(TLS_DIR / "localhost-cert.pem", TLS_DIR / "localhost-key.pem")
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.base_url = f"https://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = self.requests = 0

    def __enter__(self) -> "TlsServer":
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(raw,), daemon=True).start()

    def _handle(self, raw: socket.socket) -> None:
        try:
            conn = self.ctx.wrap_socket(raw, server_side=True)
        except OSError:  # the client refused our certificate
            raw.close()
            return
        self.connections += 1
        body = json.dumps(chat_answer("Hello")).encode()
        with conn, conn.makefile("rb") as f:
            while f.readline():
                length = 0
                while (line := f.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                f.read(length)
                self.requests += 1
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                             % len(body) + body)


def test_tls_is_verified_by_default_and_kept_alive_when_not() -> None:
    with TlsServer() as srv:
        with client(srv.base_url) as c, pytest.raises(E.Unreachable) as ei:
            c.chat(MSGS)  # a self-signed certificate: refused
        assert "certificate" in ei.value.message.lower() and srv.requests == 0
        with client(srv.base_url, verify=False) as c:
            assert [c.chat(MSGS).text for _ in range(3)] == ["Hello"] * 3
        assert srv.requests == 3 and srv.connections == 1


def test_a_header_value_that_cannot_be_sent_is_a_typed_error_not_a_resend() -> None:
    with FaultServer() as srv, client(srv.base_url, headers={"x-note": "a\r\nb"}) as c:
        with pytest.raises(E.TransportError):
            c.chat(MSGS)
        requests = srv.requests
    assert requests == 0 and c.resends == 0


def test_a_client_dropped_without_close_closes_its_idle_connections() -> None:
    import gc
    import warnings

    with FaultServer() as srv:
        c = client(srv.base_url)
        c.chat(MSGS)
        port = srv.base_url.rsplit(":", 1)[1]
        gc.collect()  # earlier tests' garbage first
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del c
            gc.collect()
        assert srv.wait_idle(limit_s=2.0) == 0  # the server saw its connection close
    ours = [w for w in caught if issubclass(w.category, ResourceWarning) and f", {port})" in str(w.message)]
    assert not ours  # closed by the wire, not left to the collector
