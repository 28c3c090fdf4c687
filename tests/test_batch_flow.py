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
from kotoba_vllm.batch._flow import EDGE_MEMORY_S, MAX_PAUSE_S, MemberFlow
from kotoba_vllm.capacity._verdict import merge_pool_capacity
from kotoba_vllm.capacity._view import CapacityView

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


def test_a_burst_past_the_edge_shrinks_the_limit_to_what_the_member_held_and_it_grows_back_only_later() -> None:
    m = MemberFlow("m", 64)
    tickets = [m.start() for _ in range(64)]
    for t in reversed(tickets[4:]):  # it held 4 of ours and refused the other 60 (answers come in any order)
        m.rejected(t, None, 0.0)
    assert m.limit == 4 and m.edge == 4 and m.cap == 4  # what it held, not 60 halvings nor one
    t = m.start()
    m.rejected(t, None, 0.0)  # sent under the new limit: a new signal, halved
    assert m.limit == 2 and m.edge == 4
    for t in tickets[:4]:
        m.answered(1.0)
    assert m.limit == 2  # held after a shrink
    for _ in range(50):
        m.start()
        m.answered(10.0)
    assert m.limit == 4  # grows back to the edge it found, not past it, while it is remembered
    while m.limit < 64:
        m.start()
        m.answered(10.0 + EDGE_MEMORY_S)
    assert m.limit == 64 and m.in_flight == 0


def test_refusals_that_overtook_each_other_still_find_what_the_member_held() -> None:
    # 15 started, the member held 4: the refused ones are any 11 of them, not the last 11 (a loaded client
    # or network reorders requests on the way), and whichever came first the limit lands on 4, not 1
    for refused in (list(range(4, 15)), list(range(1, 12)), [0, 2, 3, 5, 6, 8, 9, 10, 12, 13, 14]):
        m = MemberFlow("m", 16)
        tickets = [m.start() for _ in range(15)]
        for i in refused:
            m.rejected(tickets[i], None, 0.0)
        assert m.limit == 4 and m.edge == 4, refused


def test_headroom_leaves_slots_of_the_edge_free_for_other_clients() -> None:
    m = MemberFlow("m", 64, headroom=1)
    assert m.cap == 63  # unmeasured, nothing refused: the ceiling less the headroom
    tickets = [m.start() for _ in range(63)]
    for t in tickets[4:]:
        m.rejected(t, None, 0.0)
    assert m.limit == 4 and m.cap == 3  # an engine that held 4 gets 3 of the batch's: one for someone else
    for t in tickets[:4]:
        m.answered(100.0)
    for _ in range(3):
        assert m.may_start(100.0)
        m.start()
    assert not m.may_start(100.0)
    one = MemberFlow("m", 8, headroom=5)
    for t in [one.start() for _ in range(3)][1:]:
        one.rejected(t, None, 0.0)
    assert one.cap == 1  # never below one request in flight


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
        self.free_: bool | None = None
        self.slots: int | None = None  # free slots counted in the round
        self.round = object()
        self.counted: int | None = None  # the fewest of ours the round can have counted busy
        self.begun: Counter[str] = Counter()

    def admits(self, member: str) -> bool | None:
        return self.free_

    def reading(self, member: str) -> tuple[bool | None, tuple[int, object, int | None] | None]:
        return self.free_, None if self.slots is None else (self.slots, self.round, self.counted)

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
    view.free_ = False
    assert flow.admit(e) is None  # measured busy
    view.free_ = True
    assert flow.admit(e) is not None
    assert view.begun["m"] == 3


def test_requests_started_while_a_rounds_probe_was_out_take_the_slots_it_counted_free() -> None:
    """8 slots, one kept free: the probe goes out with 5 of ours in flight and counts 3 free; 2 more of ours
    start (on the previous round) before its answer is read. Those 2 took 2 of the 3, so nothing more starts:
    counted from the first read, 2 more would have gone, and the member's 9th request is refused."""
    view = Measured()
    flow = FlowControl(64, lambda e: "m", capacity=view, headroom=1)
    e = _entries(1)[0]
    for _ in range(7):
        assert flow.admit(e) is not None  # no count yet
    view.slots, view.round, view.counted = 3, object(), 5
    assert flow.admit(e) is None
    view.slots, view.round, view.counted = 3, object(), None  # not known: counted from the first read
    assert flow.admit(e) is not None and flow.admit(e) is not None and flow.admit(e) is None


def test_the_view_counts_which_of_ours_a_round_can_have_seen() -> None:
    """What a round's probe can have counted busy of ours: those in flight when it landed, less those started
    while it was out (their number taken when it went out); never below 0."""
    view = CapacityView(("m", "n"))
    for _ in range(5):
        view.begin("m")
    starts = view.starts()
    view.begin("m")
    view.begin("m")  # started while the probe is out: maybe after it counted
    view.end("m", 1.0)
    view.begin("n")
    view.record(merge_pool_capacity([], at="t"), 1.0, starts)
    assert view.counted == {"m": 6 - 2, "n": 0}
    view.record(merge_pool_capacity([], at="t"), 2.0)
    assert view.counted is None  # a round that took no count of starts


def test_a_rejected_request_waits_for_its_members_pause_or_a_slot_seen_free() -> None:
    clock = Clock()
    flow = FlowControl(8, lambda e: "m", clock=clock)
    e = _entries(1)[0]
    held = [flow.admit(e) for _ in range(3)]
    mark = flow.settled(flow.admit(e), _rejected())  # it held 3 of ours
    assert flow.admit_again(e, mark) is None  # no pause, and nothing of ours to it ended since
    flow.settled(held.pop(), _ok(1))
    again = flow.admit_again(e, mark)
    assert again is not None  # a slot was freed
    flow.settled(again, _ok(0))
    mark = flow.settled(flow.admit(e), _rejected(retry_after=2))
    for t in held:
        flow.settled(t, _ok(2))
    assert flow.admit_again(e, mark) is None  # room, but paused
    clock.now += 2
    assert flow.admit_again(e, mark) is not None


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
    held = [flow.admit(e) for _ in range(6)]
    flow.settled(flow.admit(e), _rejected())  # refused with 6 of ours in flight: 8 -> 4
    for t in held:
        flow.settled(t, _ok(0))
    view.free_ = False
    for _ in range(20):
        view.free_ = True
        t = flow.admit(e)
        view.free_ = False  # answered while the engine has a queue
        flow.settled(t, _ok(0))
    assert flow.members["m"].limit == 4
    view.free_ = True
    clock.now += 10  # past the hold after the shrink
    for _ in range(20):
        flow.settled(flow.admit(e), _ok(0))
    assert flow.members["m"].limit > 4


# ------------------------------------------------------------------ headroom and pools, against canned servers


def _canned(**kw_: Any) -> Any:
    import os
    import sys
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    from canned_server import CannedServer
    return CannedServer(**kw_)


def _interactive_while_batch_runs(headroom: int, tmp_path: Any) -> tuple[int, int, Any, Any]:
    """A batch of 300 at -c 16 against a server that refuses past 4 in flight, and an interactive user sending
    one request at a time once the batch has found the edge: (interactive answered, refused, batch records)."""
    import threading
    import time

    from kotoba_vllm import Client
    from kotoba_vllm.cli import main

    path = _request_file(tmp_path, 300)
    out = tmp_path / f"h{headroom}.edn"
    with _canned(slots=4, delay_ms=20) as srv:
        argv = ["run", path, "--base-url", srv.base_url, "--backend", "openai", "-c", "16", "--no-progress",
                "--output", str(out), "--requeue-rejected", "10", "--headroom", str(headroom),
                "--summary", str(out) + ".summary"]
        rc: list[int] = []
        batch = threading.Thread(target=lambda: rc.append(main(argv)))
        batch.start()
        while srv.stats()["rejected"] == 0 and batch.is_alive():  # the batch's first burst finds the edge
            time.sleep(0.01)
        time.sleep(0.5)  # the burst's 4 that got in have ended
        answered = refused = 0
        with Client(srv.base_url, backend="openai") as user:
            while batch.is_alive() and answered + refused < 40:
                try:
                    user.chat("interactive", max_tokens=2)
                    answered += 1
                except AdmissionRejected:
                    refused += 1
                time.sleep(0.01)
        batch.join()
    assert rc == [0]
    flow = read_all(open(str(out) + ".summary").read())[0][kw("batch/flow")]
    return answered, refused, read_all(out.read_text()), flow[0]


def test_headroom_leaves_the_interactive_user_a_slot_the_batch_does_not_take(tmp_path: Any) -> None:
    answered, refused, records, flow = _interactive_while_batch_runs(1, tmp_path)
    assert [r[K_INDEX] for r in records] == list(range(300)) and all(r.get(K_ERROR) is None for r in records)
    assert answered >= 20 and refused == 0  # the batch held at most 3 of the engine's 4
    # its first burst (15: the ceiling less the headroom) found the edge: 11 refused, and none after it
    assert flow[kw("flow/rejections")] == 11 and flow[kw("flow/limit")][kw("flow/median")] == 3


def test_a_member_whose_slots_are_counted_gets_no_blind_first_burst(tmp_path: Any) -> None:
    """llama.cpp's /slots counts 8 and the member refuses past them: the batch waits for its first probe round
    instead of sending the ceiling (64) blind, so not one request is refused, from the first on."""
    from kotoba_vllm.cli import main

    path = _request_file(tmp_path, 120)
    out, summary = tmp_path / "out.edn", tmp_path / "summary.edn"
    with _canned(slots=8, delay_ms=20) as srv:
        assert main(["run", path, "--base-url", srv.base_url, "--backend", "llamacpp", "-c", "64", "--no-progress",
                     "--output", str(out), "--summary", str(summary)]) == 0
        refused = srv.stats()["rejected"]
    records = read_all(out.read_text())
    assert [r[K_INDEX] for r in records] == list(range(120)) and all(r.get(K_ERROR) is None for r in records)
    [flow] = read_all(summary.read_text())[0][kw("batch/flow")]
    assert refused == flow[kw("flow/rejections")] == 0


def test_a_member_with_no_more_slots_than_the_headroom_still_gets_one_request_at_a_time(tmp_path: Any) -> None:
    """One slot, headroom 1: leaving it free would leave the batch waiting forever; the batch gets that slot
    whenever it holds nothing there, and never refuses itself a second."""
    from kotoba_vllm.cli import main

    path = _request_file(tmp_path, 6)
    out = tmp_path / "out.edn"
    with _canned(slots=1, delay_ms=20) as srv:
        assert main(["run", path, "--base-url", srv.base_url, "--backend", "llamacpp", "-c", "4", "--no-progress",
                     "--output", str(out), "--timeout", "30"]) == 0
        refused = srv.stats()["rejected"]
    records = read_all(out.read_text())
    assert [r[K_INDEX] for r in records] == list(range(6)) and all(r.get(K_ERROR) is None for r in records)
    assert refused == 0


def test_a_pool_keeps_a_limit_per_member(tmp_path: Any) -> None:
    """Two members, one refusing past 3 in flight, one never: only the first one's limit comes down."""
    from kotoba_vllm.cli import main

    path = _request_file(tmp_path, 200)
    out, summary = tmp_path / "pool.edn", tmp_path / "summary.edn"
    with _canned(slots=3, delay_ms=20) as small, _canned(delay_ms=20) as big:
        assert main(["run", path, "--base-url", small.base_url, "--base-url", big.base_url, "--backend", "openai",
                     "-c", "12", "--no-progress", "--output", str(out), "--summary", str(summary),
                     "--requeue-rejected", "10"]) == 0
        refused_small, refused_big = small.stats()["rejected"], big.stats()["rejected"]
    records = read_all(out.read_text())
    assert [r[K_INDEX] for r in records] == list(range(200)) and all(r.get(K_ERROR) is None for r in records)
    flow = {m[kw("flow/member")]: m for m in read_all(summary.read_text())[0][kw("batch/flow")]}
    assert set(flow) == {small.base_url, big.base_url}
    assert flow[small.base_url][kw("flow/rejections")] == refused_small > 0
    assert flow[big.base_url][kw("flow/rejections")] == refused_big == 0
    # the member that refused is held below its 3 (less the headroom); the other keeps the ceiling less it
    assert flow[small.base_url][kw("flow/limit")][kw("flow/median")] <= 2
    assert flow[big.base_url][kw("flow/limit")][kw("flow/median")] == 11


def _stage_rows(stage: Any, n: int) -> list[dict[str, Any]]:
    pa = __import__("pytest").importorskip("pyarrow")
    table = pa.table({"request_index": list(range(n)),
                      "request": ['{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "q%d"}]}' % i
                                  for i in range(n)]})
    try:
        out = stage(table)
    finally:
        stage.close()
    rows: list[dict[str, Any]] = out.to_pylist()
    return rows


def test_the_ray_stage_sends_an_admission_rejected_request_again_and_its_record_keeps_every_attempt() -> None:
    from kotoba_vllm.ray import RequestStage

    with _canned(slots=2, delay_ms=20) as srv:
        rows = _stage_rows(RequestStage(base_url=srv.base_url, backend="openai", concurrency=8, requeue_rejected=10,
                                        batch_lines=True), 60)
        refused = srv.stats()["rejected"]
    assert [r["request_index"] for r in rows] == list(range(60)) and all(r["ok"] for r in rows)
    records = [read_all(r["record"])[0] for r in rows]
    tried = [r for r in records if r.get(K_ATTEMPTS)]
    assert tried and all(len(r[K_ATTEMPTS]) >= 2 for r in tried)
    assert all(a[kw("vllm/outcome")] == kw("admission-rejected") for r in tried for a in r[K_ATTEMPTS][:-1])
    assert sum(len(r[K_ATTEMPTS]) - 1 for r in tried) == refused > 0  # each refusal is one attempt in a record
    lines = [__import__("json").loads(r["batch_line"]) for r in rows]
    assert sum(1 for x in lines if x["kotoba"].get("attempts")) == len(tried)  # the JSONL line says it too


def test_the_ray_stage_without_requeue_records_the_rejection() -> None:
    from kotoba_vllm.ray import RequestStage

    with _canned(slots=2, delay_ms=20) as srv:
        rows = _stage_rows(RequestStage(base_url=srv.base_url, backend="openai", concurrency=8, headroom=0), 30)
        refused = srv.stats()["rejected"]
    assert [r["request_index"] for r in rows] == list(range(30))
    assert sum(1 for r in rows if r["error"] == "admission-rejected") == refused > 0
    assert all(K_ATTEMPTS not in read_all(r["record"])[0] for r in rows)
