"""Live: two real llama-servers with `--parallel 1`, capacity and the pool against them.

The "long generation" runs on a slower random model (n_embd 384, 6 layers, one thread
per server: ~25 ms per token here, so 1900 tokens hold the slot ~47 s) while we look;
the stream is closed as soon as the checks are done, which makes llama-server cancel the
task. (Two servers with 2 threads each on 2 cores thrashed: 50+ s per run instead of ~10.) The servers' own counters
(`/metrics` prompt_tokens_total, and the slot's `id_task` in `/slots`, which only changes
when a completion runs on the slot) prove what was and was not sent.
"""

from __future__ import annotations

import io
import threading
import time
from contextlib import redirect_stdout
from typing import Any, Iterator

import httpx
import pytest

from _live import PATIENT_PROBE, PATIENT_PROBE_S, unavailable
from kotoba_vllm import AdmissionRejected, ChatRequest, Message, Sampling, kw, read_forms
from kotoba_vllm.capacity import ALL_SLOTS_BUSY, SLOT_AVAILABLE, UNMEASURED, probe_pool
from kotoba_vllm.capacity._parse import metric_sums
from kotoba_vllm.cli import main
from kotoba_vllm.pool import Pool

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    from kotoba_vllm.local import LlamaServer, LocalServerError, write_tiny_gguf
    model = write_tiny_gguf(tmp_path_factory.mktemp("capacity") / "slow-tiny.gguf", n_embd=384, n_layer=6,
                            n_head=8, n_head_kv=4, n_ff=1152)
    started: list[Any] = []
    try:
        for _ in range(2):
            started.append(LlamaServer(model, parallel=1, n_ctx=2048, threads=1).start())
    except LocalServerError as e:
        for s in started:
            s.stop()
        unavailable(f"no llama-server here: {e}")
    yield started[0].base_url, started[1].base_url
    for s in started:
        s.stop()


class Busy:
    """A long streamed generation holding a server's only slot, until stopped."""

    def __init__(self, url: str) -> None:
        self.url, self.stop = url, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        # decoding has begun, so the prompt is already in the server's counters
        wait_for(lambda: decoding(slot(url)), f"{url} never got busy")

    def _run(self) -> None:
        body = {"messages": [{"role": "user", "content": "tell me a long story"}], "max_tokens": 1900,
                "ignore_eos": True, "stream": True}
        with httpx.stream("POST", self.url + "/v1/chat/completions", json=body, timeout=60) as r:
            for _ in r.iter_lines():
                if self.stop.is_set():
                    break

    def end(self) -> None:
        self.stop.set()
        self.thread.join(30)
        wait_for(lambda: not slot(self.url)["is_processing"], f"{self.url} never went idle")


def wait_for(cond: Any, msg: str, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(msg)


def decoding(s: dict[str, Any]) -> bool:
    return bool(s.get("is_processing")) and any(t.get("n_decoded", 0) > 0 for t in s.get("next_token", []))


def slot(url: str) -> dict[str, Any]:
    return httpx.get(url + "/slots", timeout=5).json()[0]  # type: ignore[no-any-return]


def counters(url: str) -> dict[str, float]:
    sums = metric_sums(httpx.get(url + "/metrics", timeout=5).text,
                       ["llamacpp:prompt_tokens_total", "llamacpp:requests_deferred"])
    return {k.split(":")[1]: v.value for k, v in sums.items()} | {"id_task": slot(url).get("id_task", -1)}


def run_cli(*argv: str) -> tuple[int, list[Any]]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(["capacity", *argv])
    return rc, [f.value for f in read_forms(buf.getvalue())]


V, E = kw("capacity/verdict"), kw("capacity/endpoint")


def test_busy_member_reported_busy_and_the_pool_sends_to_the_idle_one(servers: tuple[str, str]) -> None:
    a, b = servers
    busy = Busy(a)
    try:
        rc, forms = run_cli(a, b, "--backend", "llamacpp", "--timeout", PATIENT_PROBE_S)
        assert rc == 0
        assert (forms[0][E], forms[0][V]) == (a, kw(ALL_SLOTS_BUSY))
        assert (forms[1][E], forms[1][V]) == (b, kw(SLOT_AVAILABLE))
        assert forms[2][kw("capacity/measured-busy")] == 1 and forms[2][kw("capacity/measured-available")] == 1
        before_b = counters(b)
        with Pool([a, b], backend="llamacpp", probe_timeout=PATIENT_PROBE) as pool:
            r = pool.chat("hello there", max_tokens=4)
        assert r.extras["pool/member"] == b and r.endpoint_url.startswith(b)
        assert r.extras["capacity/enforced?"] is True
        assert counters(b)["id_task"] != before_b["id_task"]  # b's own task counter moved
    finally:
        busy.end()


def test_both_busy_the_pool_raises_and_nothing_reaches_either_server(servers: tuple[str, str]) -> None:
    a, b = servers
    busy_a, busy_b = Busy(a), Busy(b)
    try:
        before = {u: counters(u) for u in servers}
        with Pool([a, b], backend="llamacpp", probe_timeout=PATIENT_PROBE) as pool, \
                pytest.raises(AdmissionRejected) as err:
            pool.chat("this must not be sent", max_tokens=4)
        assert err.value.reason == "all-slots-busy" and err.value.sent is False
        assert err.value.capacity[kw("capacity/measured-busy")] == 2
        assert all(counters(u)["requests_deferred"] == 0 for u in servers)  # nothing waiting for a slot
    finally:
        busy_a.end()
        busy_b.end()
    # After both drain: no request ran later either (no new prompt tokens, same last task).
    for u in servers:
        after = counters(u)
        assert after["prompt_tokens_total"] == before[u]["prompt_tokens_total"], u
        assert after["id_task"] == before[u]["id_task"], u


def test_closed_port_counts_as_unmeasured_not_empty(servers: tuple[str, str]) -> None:
    from kotoba_vllm.local import free_port

    a, _ = servers
    closed = f"http://127.0.0.1:{free_port()}"
    pool = probe_pool([closed, a], "llamacpp", timeout=PATIENT_PROBE)
    assert (pool.measured_available, pool.measured_busy, pool.unmeasured) == (1, 0, 1)
    assert pool.verdict == SLOT_AVAILABLE and pool.enforced is False  # one member's word is not the pool's
    gone = pool.answer_for(closed)
    assert gone is not None and gone.verdict == UNMEASURED and gone.slots is None and gone.reachable is False
    assert "connection refused" in (gone.reason or "")
    rc, forms = run_cli(closed, "--backend", "llamacpp")
    assert rc == 3 and forms[0][V] == kw(UNMEASURED) and forms[1][kw("capacity/unmeasured")] == 1
    assert forms[1][kw("capacity/measured-available")] == 0  # never counted as empty capacity
    with Pool([closed, a], backend="llamacpp", probe_timeout=PATIENT_PROBE) as p:
        r = p.chat("hi", max_tokens=2)  # the closed leader is passed over for the measured free member
    assert r.extras["pool/member"] == a


def test_second_turn_lands_on_the_member_that_served_the_first(servers: tuple[str, str]) -> None:
    a, b = servers
    first = ChatRequest(messages=(Message(role="system", content="You are a terse assistant."),
                                  Message(role="user", content="my name is Ada"),),
                        sampling=Sampling(max_tokens=8))
    with Pool([a, b], backend="llamacpp", probe_timeout=PATIENT_PROBE) as pool:
        busy = Busy(a)
        try:
            r1 = pool.send(first)  # a is busy: the conversation starts on b
        finally:
            busy.end()
        assert r1.extras["pool/member"] == b
        before = {u: counters(u) for u in servers}
        second = ChatRequest(messages=first.messages + (Message(role="assistant", content=r1.text or ""),
                                                          Message(role="user", content="what is my name?")),
                             sampling=Sampling(max_tokens=8))
        r2 = pool.send(second)  # both idle now: a leads the order, the conversation says b
        assert r2.extras["pool/member"] == b and "affinity" in r2.extras["pool/why"]
        assert counters(a)["prompt_tokens_total"] == before[a]["prompt_tokens_total"]
        assert counters(b)["id_task"] != before[b]["id_task"]
        # b's prefix cache served the first turn's tokens again
        assert r2.timings is not None and (r2.timings.cached.tokens or 0) > 0
