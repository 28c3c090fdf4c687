"""The batch engine without a server: order, exactly-once records, admission, interrupt and resume."""

from __future__ import annotations

import asyncio
import gc
import io
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kotoba_vllm._edn import kw, read_all
from kotoba_vllm._errors import AdmissionRejected, Unreachable
from kotoba_vllm._model import Choice, Response
from kotoba_vllm.batch import (BatchEntry, BatchRunner, OrderedSink, Recorder, iter_entries, journal_path,
                               load_existing)
from kotoba_vllm.cli import main

K_INDEX = kw("vllm/request-index")
K_ERROR = kw("vllm/error")


def request_file(tmp_path: Path, n: int, *, invalid: tuple[int, ...] = ()) -> str:
    lines = []
    for i in range(n):
        temp = "9.0" if i in invalid else "0.0"
        lines.append('{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "q%d"}] '
                     ':vllm/sampling {:vllm/max-tokens 2 :vllm/temperature %s}}' % (i, temp))
        if i in invalid:  # out of range and an unknown key: caught before sending
            lines[-1] = lines[-1][:-1] + " :vllm/bogus 1}"
    p = tmp_path / "in.edn"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(p)


class FakeServer:
    """Answers after a random delay; counts what it was sent, per input position."""

    def __init__(self, *, reject: set[int] = frozenset(), down: set[int] = frozenset(), seed: int = 0) -> None:
        self.calls: Counter[int] = Counter()
        self.reject, self.down = reject, down
        self.rng = random.Random(seed)
        self.gate: asyncio.Event | None = None
        self.hold_from: int | None = None
        self.hold_only: int | None = None

    async def send(self, e: BatchEntry) -> tuple[Any, list[Any]]:
        self.calls[e.index] += 1
        held = e.index == self.hold_only or self.hold_from is not None and e.index >= self.hold_from
        if held and self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(self.rng.random() * 0.004)
        if e.index in self.reject:
            raise AdmissionRejected("queue full", reason="queue-full", status=429, endpoint="http://fake")
        if e.index in self.down:
            raise Unreachable("connection refused", endpoint="http://fake")
        return Response(text=f"a{e.index}", choices=(Choice(index=0, text=f"a{e.index}"),)), []


def run(entries: Any, server: FakeServer, out: io.StringIO | Any, **kw_: Any) -> Any:
    sink = OrderedSink(out, journal=kw_.pop("journal", None), skip=kw_.get("existing").done
                       if kw_.get("existing") else ())
    runner = BatchRunner(server.send, sink, Recorder("edn"), **kw_)
    return runner, asyncio.run(runner.run(entries))


def test_every_input_gets_one_record_in_input_order(tmp_path: Path) -> None:
    path = request_file(tmp_path, 300, invalid=(5, 77))
    server = FakeServer(reject={10, 11}, down={200})
    out = io.StringIO()
    _, summary = run(iter_entries(path), server, out, concurrency=16)
    records = read_all(out.getvalue())
    assert [r[K_INDEX] for r in records] == list(range(300))
    assert records[5][K_ERROR] == kw("validation") and 5 not in server.calls  # never sent
    assert records[10][K_ERROR] == kw("admission-rejected")
    assert records[200][K_ERROR] == kw("unreachable")
    assert records[0][kw("vllm/text")] == "a0"
    assert all(n == 1 for n in server.calls.values())  # admission answers are not retried
    assert summary.outcomes == Counter({"ok": 295, "validation": 2, "admission-rejected": 2, "unreachable": 1})
    assert summary.sent == 298 and summary.complete


def test_window_bounds_how_far_ahead_of_a_stuck_request_we_go(tmp_path: Path) -> None:
    path = request_file(tmp_path, 200)
    server = FakeServer()
    out = io.StringIO()

    async def go() -> tuple[int, Any]:
        server.gate, server.hold_from = asyncio.Event(), 0  # request 0 hangs until released
        sink = OrderedSink(out)
        runner = BatchRunner(server.send, sink, Recorder("edn"), concurrency=4, window=20)
        task = asyncio.ensure_future(runner.run(iter_entries(path)))
        await asyncio.sleep(0.2)
        started = len(server.calls)
        server.gate.set()
        return started, await task

    started, summary = asyncio.run(go())
    assert started <= 20  # with 0 stuck, positions >= 20 were not started
    assert [r[K_INDEX] for r in read_all(out.getvalue())] == list(range(200))


def test_interrupt_keeps_every_finished_result_and_resume_sends_only_the_rest(tmp_path: Path) -> None:
    path = request_file(tmp_path, 120, invalid=(3,))
    output = str(tmp_path / "out.edn")
    server = FakeServer(seed=1)

    async def first() -> Any:
        server.gate, server.hold_only = asyncio.Event(), 40  # 40 hangs: 41.. finish past a gap
        with open(output, "w", encoding="utf-8") as fh:
            sink = OrderedSink(fh, journal=journal_path(output))
            runner = BatchRunner(server.send, sink, Recorder("edn"), concurrency=8)
            task = asyncio.ensure_future(runner.run(iter_entries(path)))
            while len(server.calls) < 47:
                await asyncio.sleep(0.005)
            runner.stop()  # first SIGINT: nothing new; in-flight finish
            while runner.in_flight > 1:
                await asyncio.sleep(0.005)
            runner.stop()  # second SIGINT: abandon the one still hanging
            return await task

    s1 = asyncio.run(first())
    assert s1.interrupted and not s1.complete and s1.abandoned == 1
    assert Path(journal_path(output)).exists()  # 41.. finished and wait there
    written = read_all(Path(output).read_text())
    assert [r[K_INDEX] for r in written] == list(range(len(written)))  # a clean in-order prefix
    finished_first = set(server.calls)
    # every request that was sent finished and is either in the output or in the journal
    in_journal = {r[K_INDEX] for r in read_all(Path(journal_path(output)).read_text())} \
        if Path(journal_path(output)).exists() else set()
    assert finished_first - {3, 40} <= {r[K_INDEX] for r in written} | in_journal
    assert max(r[K_INDEX] for r in written) == 39 and 41 in in_journal

    existing = load_existing(output, "edn")
    server2 = FakeServer(seed=2)
    with open(output, "a", encoding="utf-8") as fh:
        sink = OrderedSink(fh, journal=journal_path(output), skip=existing.done)
        runner = BatchRunner(server2.send, sink, Recorder("edn"), concurrency=8, existing=existing)
        s2 = asyncio.run(runner.run(iter_entries(path)))
    assert s2.complete
    final = read_all(Path(output).read_text())
    assert [r[K_INDEX] for r in final] == list(range(120))
    assert not set(server2.calls) & (finished_first - {40})  # nothing finished was sent again
    assert 40 in server2.calls  # the abandoned one is sent again
    assert set(server.calls) | set(server2.calls) == set(range(120)) - {3}
    assert s2.from_journal == len(in_journal - {r[K_INDEX] for r in written}) > 0
    assert not Path(journal_path(output)).exists()


def test_resume_drops_a_torn_last_record(tmp_path: Path) -> None:
    path = request_file(tmp_path, 10)
    output = tmp_path / "out.edn"
    server = FakeServer()
    with open(output, "w", encoding="utf-8") as fh:
        run(iter_entries(path), server, fh, concurrency=2)
    text = output.read_text().splitlines()
    output.write_text("\n".join(text[:6]) + "\n" + text[6][:40], encoding="utf-8")  # a crash mid-write
    existing = load_existing(str(output), "edn")
    assert existing.done == set(range(6))
    server2 = FakeServer()
    with open(output, "a", encoding="utf-8") as fh:
        run(iter_entries(path), server2, fh, concurrency=2, existing=existing)
    assert [r[K_INDEX] for r in read_all(output.read_text())] == list(range(10))
    assert set(server2.calls) == set(range(6, 10))


def test_cli_resume_needs_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = request_file(tmp_path, 2)
    assert main(["run", path, "--resume", "--base-url", "http://127.0.0.1:9"]) == 2
    assert "--resume needs --output" in capsys.readouterr().err


def test_cli_unreachable_server_every_record_typed_and_summary_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = request_file(tmp_path, 12, invalid=(4,))
    summary_path = tmp_path / "summary.edn"
    code = main(["run", path, "--base-url", "http://127.0.0.1:9", "--backend", "llamacpp", "-c", "3",
                 "--summary", str(summary_path), "--no-progress"])
    out, err = capsys.readouterr()
    records = read_all(out)
    assert code == 1
    assert [r[K_INDEX] for r in records] == list(range(12))
    assert Counter(r[K_ERROR].name for r in records) == Counter({"unreachable": 11, "validation": 1})
    assert "batch complete: 12 records" in err
    summary = read_all(summary_path.read_text())[0]
    assert summary[kw("batch/outcomes")] == {kw("unreachable"): 11, kw("validation"): 1}


def test_cli_run_leaves_the_callers_garbage_collector_as_it_found_it(tmp_path: Path) -> None:
    # `run` freezes what is alive and collects less often while it runs; an embedding program keeps its settings
    saved = gc.get_threshold()
    gc.set_threshold(1234, 11, 12)
    try:
        main(["run", request_file(tmp_path, 3), "--base-url", "http://127.0.0.1:9", "--backend", "llamacpp",
              "--output", str(tmp_path / "out.edn"), "--no-progress"])
        assert gc.get_threshold() == (1234, 11, 12)
        assert gc.get_freeze_count() == 0
    finally:
        gc.set_threshold(*saved)


def test_cli_several_base_urls_go_through_the_pool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = request_file(tmp_path, 3)
    code = main(["run", path, "--base-url", "http://127.0.0.1:9", "--base-url", "http://127.0.0.1:10",
                 "-b", "llamacpp", "--no-progress", "--timeout", "5"])
    out, _ = capsys.readouterr()
    records = read_all(out)
    assert code == 1 and [r[K_INDEX] for r in records] == [0, 1, 2]
    # neither member could be measured: the pool admits anyway, spreading by requests in flight; both are down
    assert all(r[K_ERROR] == kw("unreachable") for r in records)
    assert {r[kw("vllm/endpoint-url")].split("/v1")[0].split("/completion")[0] for r in records} <= {
        "http://127.0.0.1:9", "http://127.0.0.1:10"}


def test_stream_deltas_are_written_just_before_their_result(tmp_path: Path) -> None:
    from kotoba_vllm._model import StreamDelta

    path = request_file(tmp_path, 6)

    async def send(e: BatchEntry) -> tuple[Any, list[Any]]:
        await asyncio.sleep(random.random() * 0.003)
        deltas = [StreamDelta(delta=f"d{e.index}-{k}") for k in range(2)]
        return Response(text=f"a{e.index}", choices=(Choice(index=0, text=f"a{e.index}"),)), deltas

    out = io.StringIO()
    asyncio.run(BatchRunner(send, OrderedSink(out), Recorder("edn"), concurrency=4).run(iter_entries(path)))
    forms = read_all(out.getvalue())
    assert len(forms) == 18
    for i in range(6):
        assert [f.get(kw("vllm/delta")) for f in forms[3 * i:3 * i + 2]] == [f"d{i}-0", f"d{i}-1"]
        assert forms[3 * i + 2][K_INDEX] == i


def test_an_engine_refusal_at_send_still_lists_every_problem_read_time_found(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Reading checks ranges once and sending checks only the engine; a refusal must still list both.
    stops = " ".join(f'"s{i}"' for i in range(17))  # a warning at read, not an error
    path = tmp_path / "in.edn"
    path.write_text('{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "q"}] '
                    ':vllm/sampling {:vllm/n 2 :vllm/stop [%s]}}\n' % stops, encoding="utf-8")
    code = main(["run", str(path), "--base-url", "http://127.0.0.1:9", "--backend", "llamacpp", "--no-progress"])
    records = read_all(capsys.readouterr().out)
    assert code == 1 and records[0][K_ERROR] == kw("validation")
    codes = [p[kw("vllm/code")] for p in records[0][kw("vllm/problems")]]
    assert codes == [kw("sampling/stop"), kw("engine/unsupported")]


def test_an_unclosed_vector_of_many_requests_records_each_one_before_the_input_error(tmp_path: Path) -> None:
    # 150 requests inside a vector that is never closed: every request is an entry and a record, in
    # order, and only then does the input stop reading.
    reqs = [f'{{:vllm/endpoint :chat :vllm/messages [{{:vllm/role :user :vllm/content "q{i}"}}]}}' for i in range(150)]
    f = tmp_path / "open.edn"
    f.write_text("[" + "\n".join(reqs) + "\n", encoding="utf-8")
    seen: list[int] = []
    with pytest.raises(Exception, match="never closed"):
        for e in iter_entries(str(f)):
            seen.append(e.index)
    assert seen == list(range(150))
    server = FakeServer()
    out = io.StringIO()
    _, summary = run(iter_entries(str(f)), server, out, concurrency=4)
    assert "never closed" in (summary.input_error or "")
    assert [r[K_INDEX] for r in read_all(out.getvalue())] == list(range(150))

