"""The batch runner's slots: never more than `concurrency` senders at once, started in input order, each
freed slot taking up the next request; a cancelled run takes up nothing more."""

from __future__ import annotations

import asyncio
import io
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kotoba_vllm._edn import kw, read_all
from kotoba_vllm._model import ChatRequest, Choice, Message, Response
from kotoba_vllm._problems import Problem
from kotoba_vllm.batch import BatchEntry, BatchRunner, OrderedSink, Recorder

K_INDEX = kw("vllm/request-index")
K_ERROR = kw("vllm/error")


def _entries(n: int, invalid: frozenset[int] = frozenset()) -> list[BatchEntry]:
    req = ChatRequest(messages=(Message(role="user", content="q"),))
    bad = (Problem("error", "request/empty", "nothing to send"),)
    return [BatchEntry(i, f"mem:{i}", req, bad if i in invalid else ()) for i in range(n)]


class Counting:
    """A sender that answers after `delays[index]` event-loop turns and notes how many run at once."""

    def __init__(self, delays: list[int]) -> None:
        self.delays = delays
        self.running = 0
        self.most = 0
        self.started: list[int] = []

    async def send(self, e: BatchEntry) -> tuple[Any, list[Any]]:
        self.started.append(e.index)
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            for _ in range(self.delays[e.index]):
                await asyncio.sleep(0)
        finally:
            self.running -= 1
        return Response(text=f"a{e.index}", choices=(Choice(index=0, text=f"a{e.index}"),)), []


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(delays=st.lists(st.integers(0, 6), min_size=1, max_size=40), concurrency=st.integers(1, 6),
       invalid=st.frozensets(st.integers(0, 39), max_size=8), window=st.one_of(st.none(), st.integers(1, 8)))
def test_at_most_concurrency_in_flight_started_in_input_order_and_every_input_recorded(
        delays: list[int], concurrency: int, invalid: frozenset[int], window: int | None) -> None:
    n = len(delays)
    sender = Counting(delays)
    out = io.StringIO()
    runner = BatchRunner(sender.send, OrderedSink(out), Recorder("edn"), concurrency=concurrency, window=window)
    summary = asyncio.run(runner.run(_entries(n, invalid)))
    sendable = [i for i in range(n) if i not in invalid]
    assert sender.started == sendable  # each once, in input order
    assert sender.most <= concurrency
    if len(sendable) >= concurrency and (window is None or window >= n) and min(delays) > 0:
        assert sender.most == concurrency  # every slot is used when there is enough to send
    records = read_all(out.getvalue())
    assert [r[K_INDEX] for r in records] == list(range(n))
    assert [i for i, r in enumerate(records) if r.get(K_ERROR) == kw("validation")] == sorted(set(invalid) & set(range(n)))
    assert summary.sent == len(sendable) and summary.recorded == n and summary.complete


def test_a_cancelled_run_takes_up_nothing_more() -> None:
    sent: list[int] = []

    async def send(e: BatchEntry) -> tuple[Any, list[Any]]:
        sent.append(e.index)
        await asyncio.sleep(0.01)
        return Response(text="a", choices=(Choice(index=0, text="a"),)), []

    async def main() -> None:
        runner = BatchRunner(send, OrderedSink(io.StringIO()), Recorder("edn"), concurrency=2)
        task = asyncio.ensure_future(runner.run(_entries(100)))
        while len(sent) < 4:
            await asyncio.sleep(0.001)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        before = len(sent)
        await asyncio.sleep(0.05)  # slots freed after the cancel start nothing
        assert len(sent) == before <= 6

    asyncio.run(main())


def test_a_sender_that_fails_before_returning_an_awaitable_costs_each_request_its_record_only() -> None:
    def send(e: BatchEntry) -> Any:
        raise RuntimeError(f"no sender for {e.index}")

    out = io.StringIO()
    runner = BatchRunner(send, OrderedSink(out), Recorder("edn"), concurrency=1)
    summary = asyncio.run(runner.run(_entries(5)))
    records = read_all(out.getvalue())
    assert [r[K_INDEX] for r in records] == list(range(5))
    assert all(r[K_ERROR] == kw("internal") for r in records)
    assert summary.recorded == 5 and summary.complete
