"""Live tier: `Client` and `AsyncClient` against a real llama-server (tiny random GGUF).

The model's output is gibberish (and may hold invalid UTF-8 fragments); tests assert the
protocol, never the words. The two 1,000-request runs are issue 3's Done-when: sequential
streaming through one pooled connection, where plain httpx loses ~1-2% to stale keep-alives:
every stream must succeed, and (sync) at least one resend on the transport's evidence must be seen.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kotoba_vllm import AsyncClient, BadRequest, Client, ChatRequest, Message, Sampling
from kotoba_vllm._edn import kw, read_all

pytestmark = pytest.mark.live
ROOT = Path(__file__).resolve().parent.parent
HI = [Message(role="user", content="hello")]


@pytest.fixture()
def client(llama_url: str) -> Client:
    with Client(llama_url, backend="auto", timeout=60.0) as c:
        yield c  # type: ignore[misc]


def test_detects_llamacpp(client: Client) -> None:
    assert client.detect_backend() == "llamacpp"


def test_health_and_models(client: Client, llama_url: str) -> None:
    h = client.health()
    assert h.ok and h.status == 200 and h.endpoint_url == llama_url + "/health"
    m = client.models()
    assert m.models and m.models[0].id and m.backend == "llamacpp"


def test_chat(client: Client, llama_url: str) -> None:
    r = client.chat(HI, max_tokens=4, temperature=0.0)
    assert r.backend == "llamacpp" and r.endpoint_url == llama_url + "/v1/chat/completions"
    assert isinstance(r.text, str) and r.finish_reason in ("length", "stop")
    assert r.usage.completion_tokens is not None and 1 <= r.usage.completion_tokens <= 4
    assert r.timings.prefill.provenance == "server-reported" and r.timings.decode.provenance == "server-reported"


def test_completion(client: Client) -> None:
    r = client.completion("Once upon a time", max_tokens=4)
    assert r.endpoint == "completion" and isinstance(r.text, str) and r.usage.completion_tokens <= 4


def test_streaming_chat(client: Client) -> None:
    st = client.stream_chat(HI, max_tokens=8)
    deltas = list(st)
    r = st.response
    assert r is not None and "".join(d.delta for d in deltas) == r.text
    assert r.usage is not None and r.usage.completion_tokens is not None
    assert r.timings.prefill.provenance == "server-reported"
    assert r.timings.decode.provenance == "server-reported"
    assert r.timings.ttft.provenance == "client-measured"


def test_native_completion_plain_and_streaming(client: Client, llama_url: str) -> None:
    r = client.completion("Once upon a time", native=True, max_tokens=5, extras={"llamacpp/cache-prompt": True})
    assert r.endpoint == "generate" and r.endpoint_url == llama_url + "/completion"
    assert r.usage.completion_tokens is not None and r.usage.completion_tokens <= 5
    assert r.timings.decode.provenance == "server-reported" and r.timings.decode.ms is not None
    assert r.extras.get("llamacpp/timings") is not None
    st = client.stream_completion("Once upon a time", native=True, max_tokens=5)
    deltas = list(st)
    assert st.response is not None and "".join(d.delta for d in deltas) == st.response.text
    assert deltas[-1].finish_reason in ("length", "stop")
    assert st.response.timings.prefill.provenance == "server-reported"
    assert st.response.timings.decode.provenance == "server-reported"


def test_tokenize_detokenize_round_trip(client: Client) -> None:
    toks = client.tokenize("hello world", add_special=False)
    assert toks.tokens and all(isinstance(t, int) for t in toks.tokens)
    assert client.detokenize(toks.tokens).text.strip() == "hello world"


def test_prompt_over_the_context_size_is_a_bad_request_kept_whole(client: Client) -> None:
    with pytest.raises(BadRequest) as ei:
        client.completion("hello " * 5000, native=True, max_tokens=4)
    e = ei.value
    assert e.status == 400 and e.error_type == "exceed_context_size_error"
    assert e.details.get(kw("n_ctx")) is not None and e.details.get(kw("n_prompt_tokens")) is not None
    assert e.details[kw("n_prompt_tokens")] > e.details[kw("n_ctx")]


def test_async_chat_and_stream(llama_url: str) -> None:
    async def go() -> None:
        async with AsyncClient(llama_url) as c:
            assert await c.detect_backend() == "llamacpp"
            r = await c.chat(HI, max_tokens=4)
            assert r.backend == "llamacpp"
            st = await c.stream_chat(HI, max_tokens=4)
            deltas = [d async for d in st]
            assert st.response is not None and "".join(d.delta for d in deltas) == st.response.text
    asyncio.run(go())


def test_cli_run_example_prints_edn_response(llama_url: str) -> None:
    p = subprocess.run([sys.executable, "-m", "kotoba_vllm", "run", "examples/chat.edn", "--base-url", llama_url],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    [rec] = read_all(p.stdout)
    assert rec[kw("vllm/backend")] == kw("llamacpp")
    assert rec[kw("vllm/endpoint-url")] == llama_url + "/v1/chat/completions"
    assert rec[kw("vllm/request-id")] == "chat-1" and isinstance(rec[kw("vllm/text")], str)


STREAM_REQ = ChatRequest(messages=tuple(HI), sampling=Sampling(max_tokens=4), stream=True)
N = 1000


@pytest.mark.parametrize("wire", ["stdlib", "httpx"])  # the default wire, and a caller's httpx client
def test_1000_sequential_streams_through_client(llama_url: str, wire: str) -> None:
    failures: list[str] = []
    sent = 0

    def one() -> None:
        nonlocal sent
        try:
            st = c.stream(STREAM_REQ)
            text = "".join(d.delta for d in st)
            assert st.response is not None and st.response.text == text
        except Exception as e:  # noqa: BLE001 - counted and reported below
            failures.append(f"{sent}: {type(e).__name__}: {e}")
        sent += 1

    http = httpx.Client(timeout=30.0) if wire == "httpx" else None
    with Client(llama_url, backend="llamacpp", timeout=30.0, http_client=http) as c:
        assert c.transport == wire
        for _ in range(N):
            one()
        # Whether llama-server's close races our next request is timing: 111 in 1,000 on a loaded machine, 0 in
        # one quiet CI run. Keep going (every stream must still succeed) until the race is seen once.
        # The default wire polls an idle connection before reusing it, so most closes are caught there, never
        # sent on (counted as `idle_dropped`); the rest race our request and are resent on the evidence.
        dropped = (lambda: c._wire.idle_dropped) if wire == "stdlib" else (lambda: 0)  # type: ignore[attr-defined]
        while c.resends + dropped() == 0 and sent < 5 * N:
            one()
        resends, idle_dropped = c.resends, dropped()
    assert failures == [], f"{len(failures)}/{sent} failed: {failures[:5]}"
    # the stale keep-alives plain httpx loses were seen and handled: dropped before use, or resent on evidence
    assert resends + idle_dropped >= 1, f"no server close seen in {sent} streams: the keep-alive rules never fired"


def test_1000_sequential_streams_through_async_client(llama_url: str) -> None:
    failures: list[str] = []

    async def go() -> None:
        async with AsyncClient(llama_url, backend="llamacpp", timeout=30.0) as c:
            for i in range(N):
                try:
                    st = await c.stream(STREAM_REQ)
                    text = "".join([d.delta async for d in st])
                    assert st.response is not None and st.response.text == text
                except Exception as e:  # noqa: BLE001
                    failures.append(f"{i}: {type(e).__name__}: {e}")
            resends.append(c.resends)
    resends: list[int] = []
    asyncio.run(go())
    # async reuse races llama-server's closes less often: resends happen here too, but not every run
    assert failures == [], f"{len(failures)}/{N} failed: {failures[:5]} ({resends} resends)"
