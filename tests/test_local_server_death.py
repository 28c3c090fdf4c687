"""A local llama-server that dies mid-request is a `LocalServerError` naming the signal, with the tail
of its log, raised to the call in flight within 2 s: never a hang, never a bare transport error.

Each test starts its own real llama-server (tiny model) and kills it while it is generating: the
request runs under a long regex grammar (thousands of forced tokens), the test waits until
`/slots` shows the slot processing, freezes the server (SIGSTOP, so the answer cannot finish first),
sends the signal and lets it run (SIGCONT)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any, Callable

import httpx
import pytest

from conftest import _start
from kotoba_vllm import LocalServerError
from kotoba_vllm._edn import kw
from kotoba_vllm.local import LlamaServer, describe_exit

pytestmark = pytest.mark.live

LONG = {"guided_regex": "[a-z]{2000}", "max_tokens": 2000, "temperature": 1.0, "seed": 1}
KILL_TO_ERROR_S = 2.0


def _server() -> LlamaServer:
    return _start(n_ctx=4096, threads=1)  # type: ignore[no-any-return]


def _kill_while_generating(server: LlamaServer, sig: signal.Signals, killed: list[float]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            slots = httpx.get(server.base_url + "/slots", timeout=1.0).json()
        except httpx.HTTPError:
            slots = []
        if any(s.get("is_processing") for s in slots):
            break
        time.sleep(0.005)
    proc = server.process
    assert proc is not None
    os.kill(proc.pid, signal.SIGSTOP)  # mid-generation: the answer cannot complete before the signal lands
    killed.append(time.monotonic())
    os.kill(proc.pid, sig)
    os.kill(proc.pid, signal.SIGCONT)


def _check(err: LocalServerError, sig: signal.Signals, server: LlamaServer, killed: list[float],
           raised: float) -> None:
    assert err.signal == sig.name and sig.name in err.message
    assert err.log_tail and err.log_tail in err.message  # the server's own last lines
    assert err.endpoint and err.endpoint.startswith(server.base_url)
    assert raised - killed[0] < KILL_TO_ERROR_S, raised - killed[0]
    edn = err.to_edn()
    assert edn[kw("vllm/error")] == kw("local-server") and edn[kw("local/signal")] == sig.name


def _in_thread(fn: Callable[[], Any]) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("sig,stream", [(signal.SIGILL, False), (signal.SIGSEGV, True)], ids=["SIGILL", "SIGSEGV"])
def test_sync_call_in_flight_gets_the_signal(sig: signal.Signals, stream: bool) -> None:
    server, killed = _server(), []
    try:
        with server.client(timeout=60.0) as client:
            killer = _in_thread(lambda: _kill_while_generating(server, sig, killed))
            with pytest.raises(LocalServerError) as info:
                if stream:
                    for _ in client.stream_completion("Answer:", **LONG):
                        pass
                else:
                    client.completion("Answer:", **LONG)
            raised = time.monotonic()
            killer.join(5)
        _check(info.value, sig, server, killed, raised)
    finally:
        server.stop()


@pytest.mark.parametrize("sig,stream", [(signal.SIGKILL, False), (signal.SIGILL, True)], ids=["SIGKILL", "SIGILL"])
async def test_async_call_in_flight_gets_the_signal(sig: signal.Signals, stream: bool) -> None:
    server, killed = _server(), []
    try:
        async with server.async_client(timeout=60.0) as client:
            killer = _in_thread(lambda: _kill_while_generating(server, sig, killed))
            with pytest.raises(LocalServerError) as info:
                if stream:
                    s = await client.stream_chat([{"role": "user", "content": "Answer:"}], **LONG)
                    async for _ in s:
                        pass
                else:
                    await client.completion("Answer:", **LONG)
            raised = time.monotonic()
            await asyncio.to_thread(killer.join, 5)
        _check(info.value, sig, server, killed, raised)
    finally:
        server.stop()


def test_a_call_after_the_death_is_the_same_error_and_a_plain_client_still_sees_transport() -> None:
    server = _server()
    try:
        proc = server.process
        assert proc is not None
        os.kill(proc.pid, signal.SIGSEGV)
        proc.wait(10)
        with server.client(timeout=10.0) as client:
            with pytest.raises(LocalServerError, match="killed by SIGSEGV"):
                client.completion("hi", max_tokens=2)
        from kotoba_vllm import Client, Unreachable
        with Client(server.base_url, backend="llamacpp", timeout=10.0) as plain:  # knows no process
            with pytest.raises(Unreachable):
                plain.completion("hi", max_tokens=2)
    finally:
        server.stop()


def test_stop_is_no_failure() -> None:
    server = _server()
    server.stop()
    assert server.failure() is None


def test_exit_descriptions() -> None:
    assert describe_exit(-signal.SIGILL) == "killed by SIGILL (Illegal instruction)"
    assert describe_exit(3) == "exited with status 3"
