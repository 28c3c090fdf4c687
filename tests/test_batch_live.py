"""Batch runs against a real llama-server: a server restart mid-run, an interrupt then --resume
(counted at the server), and a JSONL batch whose output run-batch's model accepts."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import httpx
import pydantic
import pytest
from openai.types.chat import ChatCompletion

from _live import unavailable
from kotoba_vllm._client import AsyncClient
from kotoba_vllm._edn import kw, read_all
from kotoba_vllm.batch import BatchEntry, BatchRunner, OrderedSink, Recorder, iter_entries
from kotoba_vllm.cli import main

pytestmark = pytest.mark.live

ROOT = Path(__file__).resolve().parent.parent
K_INDEX = kw("vllm/request-index")
K_ERROR = kw("vllm/error")
TRANSPORT_KINDS = {"unreachable", "transport", "timeout", "stream-broken", "protocol-error"}


def batch_file(tmp_path: Path, n: int, *, invalid_every: int = 0) -> str:
    lines = []
    for i in range(n):
        if invalid_every and i % invalid_every == invalid_every - 1:
            lines.append('{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "bad"}] '
                         ':vllm/sampling {:vllm/temperature 5.0}}' if i % 2 else
                         '{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content #= x}]}')
        else:
            lines.append('{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "n %d"}] '
                         ':vllm/sampling {:vllm/max-tokens 2 :vllm/temperature 0.0}}' % i)
    p = tmp_path / "batch.edn"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(p)


def _server(**kw_: Any) -> Any:
    from kotoba_vllm.local import LlamaServer, LocalServerError
    try:
        # One thread: with two, a loaded 2-core machine spins them (~670 ms vs ~2 ms a request).
        return LlamaServer(n_ctx=2048, parallel=2, threads=1, **kw_).start()
    except LocalServerError as e:
        unavailable(f"no llama-server here: {e}")


def test_thousand_requests_with_invalid_ones_and_a_server_restart_mid_run(tmp_path: Path) -> None:
    path = batch_file(tmp_path, 1000, invalid_every=97)
    from kotoba_vllm.local import LlamaServer
    first = _server()
    port = first.port
    servers = [first]
    down_at, up_at = 300, 320

    async def go() -> tuple[Any, str]:
        stopped, restarted = asyncio.Event(), asyncio.Event()
        async with AsyncClient(first.base_url, backend="llamacpp", timeout=30) as client:
            async def send(e: BatchEntry) -> tuple[Any, list[Any]]:
                # The harness stops the server when position 300 is taken up and brings a new
                # one up on the same port at 320; sends in between meet a dead port.
                if e.index == down_at:
                    await asyncio.to_thread(first.stop)
                    stopped.set()
                elif e.index > down_at:
                    await stopped.wait()
                if e.index == up_at:
                    servers.append(await asyncio.to_thread(lambda: LlamaServer(n_ctx=2048, parallel=2, threads=1,
                                                                               port=port).start()))
                    restarted.set()
                elif e.index > up_at:
                    await restarted.wait()
                return await client.send(e.request), []

            out = tmp_path / "out.edn"
            with open(out, "w", encoding="utf-8") as fh:
                runner = BatchRunner(send, OrderedSink(fh), Recorder("edn"), concurrency=8)
                summary = await runner.run(iter_entries(path))
            return summary, out.read_text(encoding="utf-8")

    try:
        summary, text = asyncio.run(go())
    finally:
        for s in servers:
            s.stop()
    records = read_all(text)
    assert [r[K_INDEX] for r in records] == list(range(1000))
    kinds = Counter(r[K_ERROR].name if K_ERROR in r else "ok" for r in records)
    assert set(kinds) <= {"ok", "validation"} | TRANSPORT_KINDS, kinds
    assert kinds["validation"] == 10
    for r in records[down_at:up_at]:
        assert K_ERROR in r  # the server was down: typed failures, not silence
    outage = [r for r in records[down_at:up_at] if r[K_ERROR] != kw("validation")]
    assert outage and all(r[K_ERROR].name in TRANSPORT_KINDS for r in outage)
    assert all(K_ERROR not in r or r[K_ERROR] == kw("validation") for r in records[up_at:])  # back up
    assert summary.complete and sum(summary.outcomes.values()) == 1000


def _metric(base_url: str, name: str) -> float:
    for line in httpx.get(base_url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_interrupt_then_resume_sends_nothing_finished_twice(tmp_path: Path) -> None:
    n = 1000
    path = batch_file(tmp_path, n)
    out = tmp_path / "out.edn"
    server = _server()  # a fresh server: its counters and log hold only this test's requests
    try:
        cmd = [sys.executable, "-m", "kotoba_vllm", "run", path, "--base-url", server.base_url, "-b", "llamacpp",
               "-c", "8", "-o", str(out), "--no-progress"]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.read_text(encoding="utf-8").count("\n") >= 200:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 130, err
        assert "INTERRUPTED" in err
        first = read_all(out.read_text(encoding="utf-8"))
        assert 200 <= len(first) < n
        assert [r[K_INDEX] for r in first] == list(range(len(first)))

        done = subprocess.run(cmd + ["--resume"], cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        final = read_all(out.read_text(encoding="utf-8"))
        assert [r[K_INDEX] for r in final] == list(range(n))
        assert all(K_ERROR not in r for r in final)
        assert not Path(str(out) + ".pending").exists()

        # Counted at the server: one slot task per request it processed, and the tokens it
        # predicted equal the tokens the output accounts for. A finished request sent twice
        # would show in both.
        tasks = server.log_text().count("launch_slot_")
        predicted = _metric(server.base_url, "llamacpp:tokens_predicted_total")
        accounted = sum(r[kw("vllm/usage")][kw("vllm/completion-tokens")] for r in final)
        assert tasks == n
        assert predicted == accounted
    finally:
        server.stop()


class _Data(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    status_code: int = 200
    request_id: str
    body: Optional[ChatCompletion] = None


class _Line(pydantic.BaseModel):  # vLLM run_batch.py BatchRequestOutput
    model_config = pydantic.ConfigDict(extra="allow")
    id: str
    custom_id: str
    response: Optional[_Data]
    error: Optional[Any]


def test_jsonl_batch_runs_and_writes_run_batch_jsonl(llama_url: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(
        json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": "tiny", "messages": [{"role": "user", "content": f"hi {i}"}],
                             "max_tokens": 2, **({"bogus": 1} if i == 3 else {})}}) + "\n"
        for i in range(6)), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    code = main(["run", str(src), "--base-url", llama_url, "-o", str(out), "--no-progress"])
    assert code == 1  # one invalid line
    lines = [_Line.model_validate_json(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert [x.custom_id for x in lines] == [f"c{i}" for i in range(6)]
    assert lines[3].response is None and lines[3].error["code"] == "validation"
    for x in lines[:3] + lines[4:]:
        assert x.error is None and x.response is not None and x.response.status_code == 200
        assert isinstance(x.response.body, ChatCompletion) and x.response.body.usage is not None
        assert x.response.body.usage.completion_tokens <= 2
