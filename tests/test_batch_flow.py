"""Flow control and the explicit requeue: what the runner keeps in flight per member, what it sends again
(admission rejections only, at most N times, every attempt in the record), and one record per input."""

from __future__ import annotations

import asyncio
import io
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kotoba_vllm._edn import kw, read_all
from kotoba_vllm._errors import AdmissionRejected, RequestTimeout, ServerFailure
from kotoba_vllm._model import ChatRequest, Choice, Message, Response
from kotoba_vllm.batch import BatchEntry, BatchRunner, FlowControl, OrderedSink, Recorder
from kotoba_vllm.batch._flow import MAX_PAUSE_S, MemberFlow

K_INDEX = kw("vllm/request-index")
K_ERROR = kw("vllm/error")
K_ATTEMPTS = kw("vllm/attempts")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _entries(n: int) -> list[BatchEntry]:
    req = ChatRequest(messages=(Message(role="user", content="q"),))
    return [BatchEntry(i, f"mem:{i}", req) for i in range(n)]


def _ok(i: int) -> tuple[Any, list[Any]]:
    return Response(text=f"a{i}", choices=(Choice(index=0, text=f"a{i}"),)), []


def _rejected(retry_after: float | None = None) -> AdmissionRejected:
    return AdmissionRejected("busy", reason="queue-full", status=429, endpoint="http://m", retry_after_s=retry_after)


# ------------------------------------------------------------------ the limit (pure)


def test_a_burst_of_rejections_shrinks_the_limit_once_and_answers_grow_it_back_to_the_ceiling() -> None:
    m = MemberFlow("m", 64)
    seqs = [m.start() for _ in range(64)]
    for s in seqs[:40]:  # 40 requests sent under the same limit come back rejected
        m.rejected(s, None, 0.0)
    assert m.limit == 32  # one halving, not forty
    s = m.start()
    m.rejected(s, None, 0.0)  # sent under the new limit: a new signal
    assert m.limit == 16
    for s in seqs[40:]:
        m.answered(0.0)
    assert m.limit == 16  # held after a shrink
    while m.limit < 64:
        m.start()
        m.answered(10.0)
    assert m.limit == 64 and m.in_flight == 0


def test_the_limit_never_goes_below_one() -> None:
    m = MemberFlow("m", 4)
    for _ in range(10):
        m.rejected(m.start(), None, 0.0)
    assert m.limit == 1 and m.may_start(0.0)


def test_retry_after_pauses_the_member_capped_at_a_minute() -> None:
    clock = Clock()
    flow = FlowControl(8, lambda e: "m", clock=clock)
    e = _entries(1)[0]
    t = flow.admit(e)
    flow.settled(t, _rejected(retry_after=3600))  # a hostile value
    assert flow.admit(e) is None
    assert flow.wake_in() == MAX_PAUSE_S
    clock.now += MAX_PAUSE_S
    assert flow.admit(e) is not None
    assert flow.members["m"].pauses == 1


def test_errors_that_are_not_admission_answers_move_the_limit_neither_way() -> None:
    flow = FlowControl(8, lambda e: "m")
    e = _entries(1)[0]
    for err in (RequestTimeout("slow", phase="total", limit_s=1.0), ServerFailure("boom", status=500)):
        flow.settled(flow.admit(e), err)
    m = flow.members["m"]
    assert m.limit == 8 and m.rejections == 0 and m.in_flight == 0


class Measured:
    def __init__(self) -> None:
        self.free: bool | None = None
        self.begun: Counter[str] = Counter()

    def admits(self, member: str) -> bool | None:
        return self.free

    def begin(self, member: str) -> None:
        self.begun[member] += 1

    def end(self, member: str) -> None:
        self.begun[member] -= 1


def test_a_member_measured_busy_gets_nothing_new_and_unmeasured_starts_at_the_ceiling() -> None:
    view = Measured()
    flow = FlowControl(3, lambda e: "m", capacity=view)
    e = _entries(1)[0]
    tickets = [flow.admit(e) for _ in range(3)]  # unmeasured: the ceiling
    assert None not in tickets and flow.admit(e) is None
    flow.settled(tickets.pop(), _ok(0))
    view.free = False
    assert flow.admit(e) is None  # measured busy
    view.free = True
    assert flow.admit(e) is not None
    assert view.begun["m"] == 3


def test_a_rejected_request_waits_for_its_members_pause_or_a_slot_seen_free() -> None:
    clock = Clock()
    flow = FlowControl(8, lambda e: "m", clock=clock)
    e = _entries(1)[0]
    first, second = flow.admit(e), flow.admit(e)
    mark = flow.settled(first, _rejected())
    assert flow.admit_again(e, mark) is None  # no pause, and nothing of ours to it ended since
    flow.settled(second, _ok(1))
    again = flow.admit_again(e, mark)
    assert again is not None  # a slot was freed
    flow.settled(again, _ok(0))
    t = flow.admit(e)
    other = flow.admit(e)
    mark = flow.settled(t, _rejected(retry_after=2))
    assert flow.admit_again(e, mark) is None
    clock.now += 2
    assert flow.admit_again(e, mark) is not None
    flow.settled(other, _ok(2))


# ------------------------------------------------------------------ the runner with it


class Member:
    """A member with `slots` places: a request beyond them is rejected at once (it never ran)."""

    def __init__(self, slots: int, *, retry_after: float | None = None, fail: frozenset[int] = frozenset()) -> None:
        self.slots, self.retry_after, self.fail = slots, retry_after, fail
        self.running = 0
        self.most = 0
        self.calls: Counter[int] = Counter()
        self.ran: Counter[int] = Counter()  # requests that reached the engine

    async def send(self, e: BatchEntry) -> tuple[Any, list[Any]]:
        self.calls[e.index] += 1
        await asyncio.sleep(0)
        if self.running >= self.slots:
            raise _rejected(self.retry_after)
        self.running += 1
        self.most = max(self.most, self.running)
        self.ran[e.index] += 1
        try:
            await asyncio.sleep(0.001)
        finally:
            self.running -= 1
        if e.index in self.fail:
            raise ServerFailure("engine died", status=500, endpoint="http://m")
        return _ok(e.index)


def _run(member: Member, n: int, concurrency: int, requeue: int, flow: bool = True) -> tuple[Any, list[Any]]:
    out = io.StringIO()
    limiter = FlowControl(concurrency, lambda e: "m") if flow else None
    runner = BatchRunner(member.send, OrderedSink(out), Recorder("edn"), concurrency=concurrency,
                         limiter=limiter, requeue=requeue)
    summary = asyncio.run(runner.run(_entries(n)))
    return summary, read_all(out.getvalue())


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(n=st.integers(1, 40), slots=st.integers(1, 6), concurrency=st.integers(1, 16), requeue=st.integers(0, 3),
       fail=st.frozensets(st.integers(0, 39), max_size=5))
def test_one_record_per_input_and_only_admission_rejections_are_sent_again(
        n: int, slots: int, concurrency: int, requeue: int, fail: frozenset[int]) -> None:
    member = Member(slots, fail=fail)
    summary, records = _run(member, n, concurrency, requeue)
    assert [r[K_INDEX] for r in records] == list(range(n))
    assert summary.recorded == n and summary.complete
    assert all(k <= 1 for k in member.ran.values())  # what reached the engine was never sent twice
    for i, r in enumerate(records):
        assert member.calls[i] <= requeue + 1
        attempts = r.get(K_ATTEMPTS)
        if attempts is not None:
            assert len(attempts) == member.calls[i] >= 2 and requeue
            assert all(a[kw("vllm/outcome")] == kw("admission-rejected") for a in attempts[:-1])
        else:
            assert member.calls[i] == 1
        if r.get(K_ERROR) == kw("admission-rejected") and requeue:
            assert len(attempts) == requeue + 1  # rejected every time it was sent: N+1 attempts
        if i in fail and member.ran[i]:
            assert r.get(K_ERROR) == kw("server-failure")  # a failure after it ran is never sent again
    assert summary.sent == sum(member.calls.values())


def test_with_requeue_every_record_is_an_answer_and_some_took_more_than_one_attempt() -> None:
    member = Member(4)
    summary, records = _run(member, 200, 32, requeue=10)
    assert all(r.get(K_ERROR) is None for r in records), Counter(str(r.get(K_ERROR)) for r in records)
    assert any(len(r.get(K_ATTEMPTS) or ()) >= 2 for r in records)
    assert summary.requeued > 0 and summary.sent == 200 + summary.requeued


def test_flow_control_keeps_far_fewer_rejections_than_a_fixed_limit() -> None:
    fixed_member, flow_member = Member(4), Member(4)
    fixed, _ = _run(fixed_member, 300, 64, requeue=0, flow=False)
    flowed, _ = _run(flow_member, 300, 64, requeue=0)
    assert flowed.outcomes["admission-rejected"] < fixed.outcomes["admission-rejected"]


# ------------------------------------------------------------------ the CLI, against a real socket


def _request_file(tmp_path: Any, n: int) -> str:
    p = tmp_path / "in.edn"
    p.write_text("".join('{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "q%d"}]}\n' % i
                         for i in range(n)), encoding="utf-8")
    return str(p)


def _rejecting_first(k: int) -> Any:
    """A server that answers 429 (queue full, never ran) to its first `k` chat requests, then answers."""
    from faultserver import reply, chat_answer
    posts = [0]

    def script(seen: Any) -> Any:
        if seen.method != "POST":
            return reply({"error": {"message": "not found"}}, 404)
        posts[0] += 1
        if posts[0] <= k:
            return reply({"error": {"message": "queue is full", "type": "rate_limit"}}, 429)
        return reply(chat_answer(f"a{posts[0]}"))
    return script


def test_cli_requeue_and_redo_leave_n_of_n_answers_in_input_order(tmp_path: Any) -> None:
    from faultserver import FaultServer
    from kotoba_vllm.cli import main

    path = _request_file(tmp_path, 12)
    out = tmp_path / "out.edn"
    with FaultServer(_rejecting_first(5)) as srv:
        base = ["run", path, "--base-url", srv.base_url, "--backend", "openai", "-c", "4", "--no-progress",
                "--output", str(out)]
        assert main(base) == 1  # no requeue: the rejections are records
        first = read_all(out.read_text())
        assert [r[K_INDEX] for r in first] == list(range(12))
        rejected = [r[K_INDEX] for r in first if r.get(K_ERROR) == kw("admission-rejected")]
        assert len(rejected) == 5
        posts = sum(1 for s in srv.seen if s.method == "POST")
        assert main(base + ["--resume", "--redo", "admission-rejected"]) == 0
        again = read_all(out.read_text())
        assert [r[K_INDEX] for r in again] == list(range(12))
        assert all(r.get(K_ERROR) is None for r in again)
        assert sum(1 for s in srv.seen if s.method == "POST") - posts == 5  # only the rejected went again
        kept = {r[K_INDEX]: r for r in first if r[K_INDEX] not in rejected}
        assert all(again[i] == r for i, r in kept.items())  # the other records are kept as they were
    out2 = tmp_path / "out2.edn"
    with FaultServer(_rejecting_first(3)) as srv:
        assert main(["run", path, "--base-url", srv.base_url, "--backend", "openai", "-c", "4", "--no-progress",
                     "--output", str(out2), "--requeue-rejected", "10"]) == 0
        records = read_all(out2.read_text())
        assert [r[K_INDEX] for r in records] == list(range(12)) and all(r.get(K_ERROR) is None for r in records)
        tried = [r for r in records if r.get(K_ATTEMPTS)]
        assert tried and all(len(r[K_ATTEMPTS]) >= 2 for r in tried)
        assert sum(len(r[K_ATTEMPTS]) - 1 for r in tried) == 3  # each rejection is one attempt in a record
        assert sum(1 for s in srv.seen if s.method == "POST") == 15


def test_cli_runs_on_either_loop(tmp_path: Any, capsys: Any) -> None:
    import importlib.util

    from faultserver import FaultServer
    from kotoba_vllm.cli import main

    path = _request_file(tmp_path, 5)
    loops = ["asyncio"] + (["uvloop"] if importlib.util.find_spec("uvloop") else [])
    with FaultServer() as srv:
        for loop in loops:
            assert main(["run", path, "--base-url", srv.base_url, "--backend", "openai", "--no-progress",
                         "--loop", loop]) == 0
            assert [r[K_INDEX] for r in read_all(capsys.readouterr().out)] == list(range(5))


def test_cli_background_sends_the_priority_each_engine_puts_behind_interactive_requests(tmp_path: Any) -> None:
    from faultserver import FaultServer
    from kotoba_vllm.cli import main

    path = _request_file(tmp_path, 3)
    for backend, want in (("vllm", 10), ("sglang", -10), ("openai", None), ("llamacpp", None)):
        with FaultServer() as srv:
            assert main(["run", path, "--base-url", srv.base_url, "--backend", backend, "--no-progress",
                         "--background", "--output", str(tmp_path / f"{backend}.edn")]) == 0
            bodies = [s.json() for s in srv.seen if s.method == "POST"]
            assert len(bodies) == 3 and all(b.get("priority") == want for b in bodies), (backend, bodies)


def test_the_limit_does_not_grow_while_the_member_is_measured_busy() -> None:
    view = Measured()
    clock = Clock()
    flow = FlowControl(8, lambda e: "m", capacity=view, clock=clock)
    e = _entries(1)[0]
    flow.settled(flow.admit(e), _rejected())  # 8 -> 4
    view.free = False
    for _ in range(20):
        view.free = True
        t = flow.admit(e)
        view.free = False  # answered while the engine has a queue
        flow.settled(t, _ok(0))
    assert flow.members["m"].limit == 4
    view.free = True
    clock.now += 10  # past the hold after the shrink
    for _ in range(20):
        flow.settled(flow.admit(e), _ok(0))
    assert flow.members["m"].limit > 4
