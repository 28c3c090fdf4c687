"""The batch engine: one event loop, N slots for concurrency, results in input order.

Every input position ends as exactly one record: the response, the typed error
(`KotobaError.to_edn()`), or the validation problems of a request that was never sent.
Whatever a sender does - raise any exception, get cancelled, never return - becomes that
entry's record (`:vllm/error :internal` with the exception's type and message when nothing
better fits; a sender past its deadline is a `:timeout`), so the ordered output never waits on
a gap. Admission rejections are recorded like any other answer and never retried.
Stopping (`stop()`, wired to SIGINT/SIGTERM by the CLI): nothing new is sent, requests
already in flight finish and are recorded; a second stop abandons them (they are not
recorded, so `--resume` sends them again; the server may have seen them).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter, deque
from typing import Any, Awaitable, Callable, Iterable, Iterator

import attrs

from .._edn import EdnError, Keyword, dumps, kw
from .._errors import ConfigError, InternalError, KotobaError, RequestTimeout, ValidationError
from .._codec import write_edn, write_fields
from .._model import to_edn
from .._requests import request_to_edn
from ._entries import BatchEntry
from ._jsonl import output_line
from ._output import ExistingOutput, OrderedSink, render_edn

K_INDEX = kw("vllm/request-index")
K_RID = kw("vllm/request-id")
_INDEX_KEY = frozenset((K_INDEX,))
_HEAD_KEYS = frozenset((K_INDEX, K_RID))


@attrs.define
class BatchSummary:
    """Counts by outcome (`ok`, `validation`, `admission-rejected`, each error kind) and rates."""

    outcomes: Counter[str] = attrs.field(factory=Counter)
    sent: int = 0  # HTTP requests this run started
    recorded: int = 0  # records this run produced (sent, invalid, or taken from the journal)
    already_done: int = 0  # positions the output held before this run
    from_journal: int = 0
    abandoned: int = 0  # in flight at a second interrupt: not recorded
    interrupted: bool = False
    stopped_at: int | None = None  # first input position not taken up (None: input exhausted)
    elapsed_s: float = 0.0
    output: str | None = None
    pending: str | None = None  # the journal left behind, when records wait past a gap
    input_error: str | None = None  # the input stopped reading as a whole

    @property
    def failed(self) -> int:
        return sum(n for k, n in self.outcomes.items() if k != "ok")

    @property
    def complete(self) -> bool:
        return not self.interrupted and self.abandoned == 0 and self.stopped_at is None and not self.input_error

    def to_edn(self) -> dict[Keyword, Any]:
        rate = self.recorded / self.elapsed_s if self.elapsed_s > 0 else None
        sent_rate = self.sent / self.elapsed_s if self.elapsed_s > 0 else None
        return {kw("batch/outcomes"): {kw(k): n for k, n in sorted(self.outcomes.items())},
                kw("batch/recorded"): self.recorded, kw("batch/sent"): self.sent,
                kw("batch/already-done"): self.already_done, kw("batch/from-journal"): self.from_journal,
                kw("batch/abandoned"): self.abandoned, kw("batch/interrupted?"): self.interrupted,
                kw("batch/complete?"): self.complete, kw("batch/stopped-at"): self.stopped_at,
                kw("batch/elapsed-s"): round(self.elapsed_s, 3),
                kw("batch/records-per-s"): round(rate, 1) if rate is not None else None,
                kw("batch/requests-per-s"): round(sent_rate, 1) if sent_rate is not None else None,
                kw("batch/output"): self.output, kw("batch/pending"): self.pending,
                kw("batch/input-error"): self.input_error}

    def line(self) -> str:
        parts = " ".join(f"{k}={n}" for k, n in sorted(self.outcomes.items())) or "nothing"
        rate = f"{self.sent / self.elapsed_s:.1f} req/s" if self.elapsed_s > 0 and self.sent else "no requests sent"
        extra = f", {self.already_done} already done" if self.already_done else ""
        extra += f", {self.from_journal} from the journal" if self.from_journal else ""
        state = "complete" if self.complete else "INTERRUPTED (run again with --resume)"
        return (f";; batch {state}: {self.recorded} records ({parts}){extra}; {self.sent} sent in "
                f"{self.elapsed_s:.2f} s, {rate}")


# One request -> (response, deltas); a KotobaError is the typed failure, anything else a bug recorded as one.
SendFn = Callable[[BatchEntry], Awaitable[tuple[Any, list[Any]]]]
Outcome = Any  # (response, deltas) | KotobaError
# After cancelling a sender past its deadline, how long to wait for it to unwind.
CANCEL_GRACE_S = 1.0


class Recorder:
    """Turns outcomes into output text in the chosen format."""

    def __init__(self, fmt: str, pretty_print: bool = False) -> None:
        self.fmt, self.pretty = fmt, pretty_print

    def _head(self, e: BatchEntry) -> dict[Keyword, Any]:
        head: dict[Keyword, Any] = {K_INDEX: e.index}
        if e.request_id is not None:
            head[K_RID] = e.request_id
        return head

    def invalid(self, e: BatchEntry) -> list[str]:
        errors = tuple(p for p in e.problems if p.is_error)
        if self.fmt == "jsonl":
            return [output_line(e, problems=errors)]
        rec = self._head(e)
        rec.update({kw("vllm/error"): kw("validation"), kw("vllm/where"): e.where,
                    kw("vllm/problems"): [p.to_edn() for p in errors]})
        return [render_edn(rec, self.pretty)]

    def failed(self, e: BatchEntry, err: KotobaError) -> list[str]:
        if self.fmt == "jsonl":
            return [output_line(e, error=err)]
        rec = self._head(e)
        rec.update(err.to_edn())
        if e.request is not None:
            rec[kw("vllm/request")] = request_to_edn(e.request)
        return [render_edn(rec, self.pretty)]

    def ok(self, e: BatchEntry, resp: Any, deltas: list[Any]) -> list[str]:
        if self.fmt == "jsonl":
            return [output_line(e, result=resp)]
        if not self.pretty:  # the same text as below, written without building the record's maps
            head = [":vllm/request-index " + dumps(e.index)]
            rid = e.request_id
            if rid is not None:
                head.append(":vllm/request-id " + dumps(rid))
            body = write_fields(resp, _HEAD_KEYS if rid is not None else _INDEX_KEY)
            return [write_edn(d) for d in deltas] + ["{" + " ".join(head + body) + "}"]
        rec = self._head(e)
        rec.update(to_edn(resp))
        rec[K_INDEX] = e.index
        if e.request_id is not None:
            rec[K_RID] = e.request_id
        return [render_edn(to_edn(d), False) for d in deltas] + [render_edn(rec, self.pretty)]


class BatchRunner:
    def __init__(self, send: SendFn, sink: OrderedSink, recorder: Recorder, *, concurrency: int = 8,
                 window: int | None = None, existing: ExistingOutput | None = None,
                 progress: Any = None, deadline_s: float | None = None) -> None:
        if concurrency < 1:
            raise ConfigError("concurrency must be >= 1")
        self.send, self.sink, self.recorder = send, sink, recorder
        # A sender still running after this many seconds is cancelled and recorded as a timeout.
        self.deadline_s = deadline_s
        self.concurrency = concurrency
        # Out-of-order results wait in memory; cap how far ahead of the oldest unwritten we go.
        self.window = window or max(1024, 64 * concurrency)
        self.existing = existing or ExistingOutput()
        self.progress = progress
        self.summary = BatchSummary()
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()  # senders running, deadline not passed
        self._expiring: dict[asyncio.Task[Any], tuple[BatchEntry, asyncio.TimerHandle]] = {}
        # Deadlines, one [deadline, task, entry] per sender in start order (so in deadline order), and
        # one timer for the first: a timer per request cost ~5-9 us of heap work each at 64-256 in flight.
        # A settled sender's slot is emptied; empty slots leave from the front, so the queue holds no more
        # than the window of requests started since the oldest one still running.
        self._deadlines: deque[list[Any]] = deque()
        self._sweep: asyncio.TimerHandle | None = None
        self._pending = 0  # requests started and not yet recorded or abandoned
        self._free = concurrency  # slots for senders
        # Taking up entries: the input while it is being read; the entry taken but not started (no slot free,
        # or the window full); `_parked` while `run` itself waits for the window, else a freed slot takes the
        # next entry in its own callback (no semaphore, no turn of the loop to wake `run` per request).
        self._entries: Iterator[BatchEntry] | None = None
        self._held: BatchEntry | None = None
        self._parked = False
        self._filling = False
        self._wake: asyncio.Future[None] | None = None  # `run` waits: the input ended, or the window is full
        self._idle: asyncio.Future[None] | None = None
        self._failures: list[Exception] = []
        self._abandoning = False
        self._stops = 0

    def stop(self) -> None:
        """First call: send nothing new, let in-flight requests finish. Second: abandon them."""
        self._stops += 1
        self.summary.interrupted = True
        self._stop.set()
        self.sink.wake()
        if self._stops >= 2:
            self._abandon()

    @property
    def stopping(self) -> bool:
        """`stop()` was called: nothing new is sent."""
        return self._stops > 0

    @property
    def in_flight(self) -> int:
        return len(self._tasks) + len(self._expiring)

    def _record(self, index: int, lines: list[str], outcome: str, *, journaled: bool = False) -> None:
        self.sink.put(index, lines, journaled=journaled)
        self.summary.outcomes[outcome] += 1
        self.summary.recorded += 1
        if self.progress is not None:
            self.progress.update(1)

    # One task per request, the sender's own: its record is made by a callback when it settles, or when
    # its deadline passes first (cancelled, given CANCEL_GRACE_S to unwind, then recorded as a timeout).
    # A second task per request to watch the first cost as much CPU as the rest of the runner.

    def _start(self, e: BatchEntry) -> None:
        self._pending += 1
        try:
            task = asyncio.ensure_future(self.send(e))
        except Exception as exc:  # a sender that fails before it returns an awaitable
            self._finish(e, InternalError.from_exception(exc))
            return
        slot = None
        if self.deadline_s is not None:
            loop = task.get_loop()
            deadline = loop.time() + self.deadline_s
            slot = [deadline, task, e]
            self._deadlines.append(slot)
            if self._sweep is None:
                self._sweep = loop.call_at(deadline, self._expire_due, loop)
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._settled, e, slot))

    def _expire_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """Expire every sender whose deadline has come; wake again at the next one."""
        self._sweep = None
        q, now = self._deadlines, loop.time()
        while q and (q[0][1] is None or q[0][0] <= now):
            _, task, e = q.popleft()
            if task is not None:
                self._expire(e, task)
        if q:
            self._sweep = loop.call_at(q[0][0], self._expire_due, loop)

    def _settled(self, e: BatchEntry, slot: list[Any] | None, task: "asyncio.Task[Any]") -> None:
        if slot is not None:
            slot[1:] = (None, None)
            q = self._deadlines
            while q and q[0][1] is None:
                q.popleft()
            # The sweep timer stays armed when the queue empties: it fires at a deadline no later than any
            # sender started since, and re-arms for the first one still running. At 1 in flight, arming and
            # cancelling a timer per request was a heap push and a cancelled handle per request.
        if task in self._expiring:  # past its deadline, unwound within the grace: a timeout all the same
            self._expired(task)
            return
        if task not in self._tasks:  # left behind after its grace: its record is made
            _retrieve(task)
            return
        self._tasks.discard(task)
        if self._abandoning:  # a second stop: not recorded, even if it answered; --resume sends it again
            _retrieve(task)
            self.summary.abandoned += 1
            self._release()
            return
        self._finish(e, _outcome(task))

    def _expire(self, e: BatchEntry, task: "asyncio.Task[Any]") -> None:
        if task.done():  # answered just in time: its settled callback is already queued
            return
        self._tasks.discard(task)
        task.cancel()
        grace = task.get_loop().call_later(CANCEL_GRACE_S, self._expired, task)
        self._expiring[task] = (e, grace)

    def _expired(self, task: "asyncio.Task[Any]") -> None:
        """Record the timeout of a sender cancelled at its deadline: it unwound, or its grace ran out
        (then it is left behind, a sender that ignores cancel)."""
        held = self._expiring.pop(task, None)
        if held is None:
            return
        e, grace = held
        grace.cancel()
        if task.done():
            _retrieve(task)
        endpoint = e.request.base_url if e.request is not None else None
        self._finish(e, RequestTimeout(f"no answer within {self.deadline_s} s (the whole request); cancelled",
                                       phase="total", limit_s=self.deadline_s, endpoint=endpoint))

    def _finish(self, e: BatchEntry, outcome: Outcome) -> None:
        try:
            if isinstance(outcome, ValidationError):
                self.summary.sent -= 1  # refused by validation before any byte went out
            lines, kind = self._lines(e, outcome)
            self._record(e.index, lines, kind)
        except Exception as exc:  # the output itself failed: `run` raises it once every request settled
            self._failures.append(exc)
        finally:
            self._release()

    def _release(self) -> None:
        self._free += 1
        self._pending -= 1
        if self._held is not None and not self._parked:
            self._fill()  # the slot takes the entry waiting for one
        if self._pending == 0 and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    def _abandon(self) -> None:
        """Every request in flight is given up: not recorded, so --resume sends it again."""
        self._abandoning = True
        for t in list(self._tasks):
            t.cancel()
        for task, (_, grace) in list(self._expiring.items()):
            del self._expiring[task]
            grace.cancel()
            self.summary.abandoned += 1
            self._release()

    def _lines(self, e: BatchEntry, outcome: Outcome) -> tuple[list[str], str]:
        """The record's text and its outcome; a record that cannot be rendered is an :internal one."""
        try:
            if isinstance(outcome, KotobaError):
                lines, kind = self.recorder.failed(e, outcome), outcome.kind
            else:
                resp, deltas = outcome
                lines, kind = self.recorder.ok(e, resp, deltas), "ok"
        except Exception as exc:
            err = InternalError.from_exception(exc, during="while writing the record")
            lines, kind = self.recorder.failed(attrs.evolve(e, request=None), err), err.kind
        return [_writable(line) for line in lines], kind

    def _fill(self) -> bool:
        """Take up entries in input order while a slot is free: record those with nothing to send, start the
        others. Stops at an entry that waits (for a slot: the slot's release calls this again; for the window:
        `run` waits for the output, then calls this), or at the input's end or a stop (then `run` is woken).
        True while there is input left to take up."""
        if self._filling or self._entries is None:
            return self._entries is not None
        self._filling = True
        ex = self.existing
        try:
            while True:
                e = self._held
                if e is None:
                    e = next(self._entries, None)
                    if e is None:
                        self._entries = None
                        break
                else:
                    self._held = None
                if self._stop.is_set():
                    self.summary.stopped_at = e.index
                    self._entries = None
                    break
                if e.index in ex.done:
                    self.summary.already_done += 1
                    continue  # the sink skips it
                journaled = ex.journal.pop(e.index, None)
                if journaled is not None:
                    self.summary.from_journal += 1
                    self._record(e.index, journaled[0], journaled[1], journaled=True)
                    continue
                if not e.sendable:
                    self._record(e.index, self.recorder.invalid(e), "validation")
                    continue
                if e.index - self.sink.next >= self.window or not self._free:
                    self._held = e  # the window is full (`run` waits for the output) or every slot is taken
                    if not self._free:
                        return True
                    break
                self._free -= 1
                self.summary.sent += 1
                self._start(e)
                # No yield while slots are free: yielding once per entry fed one request per event-loop turn,
                # so at high concurrency the window drained to ~20 in flight.
        except EdnError as err:  # the input stopped reading as a whole (e.g. an unclosed vector)
            self.summary.input_error = str(err)
            self._stop.set()
            self._entries = None
        except Exception as err:  # the reader itself failed: say so, keep every record already made
            self.summary.input_error = str(InternalError.from_exception(err, during="while reading the input"))
            self._stop.set()
            self._entries = None
        finally:
            self._filling = False
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)
        return self._entries is not None

    async def run(self, entries: Iterable[BatchEntry]) -> BatchSummary:
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        self._entries = iter(entries)
        try:
            while True:
                self._wake = loop.create_future()
                if not self._fill():
                    break
                if self._held is not None and self._free:  # the window is full: wait for the output
                    self._parked = True
                    await self.sink.wait_window(self._held.index, self.window, self._stop)
                    self._parked = False
                    continue
                await self._wake  # freed slots take up the entries until the input ends or the window fills
        finally:
            self._entries = None  # nothing more is taken up, whatever ended the run
            self._wake = None
            try:
                while self._pending:
                    self._idle = loop.create_future()
                    await self._idle
            except asyncio.CancelledError:  # the run itself is cancelled: what is in flight is abandoned
                self._abandon()
                raise
            if self._sweep is not None:
                self._sweep.cancel()
                self._sweep = None
            failures = self._failures
            self.sink.close(keep_journal=bool(self.existing.journal))
            self.summary.elapsed_s = time.perf_counter() - started
        if failures:  # the output itself failed (disk full ...): the run cannot claim its records
            raise failures[0]
        return self.summary


def _outcome(task: "asyncio.Task[Any]") -> Outcome:
    """What a settled sender made of its entry: (response, deltas) or a typed error, never an exception."""
    if task.cancelled():
        return InternalError("CancelledError: the request was cancelled before it answered",
                             exception_type="CancelledError")
    exc = task.exception()
    if exc is None:
        return task.result()
    return exc if isinstance(exc, KotobaError) else InternalError.from_exception(exc)


def _retrieve(task: "asyncio.Future[Any]") -> None:
    """Collect what an abandoned sender ends with, so asyncio never reports it as never retrieved."""
    if not task.cancelled():
        task.exception()


def _writable(line: str) -> str:
    """Lone surrogates cannot be written as UTF-8: keep them as `\\uXXXX` escapes (EDN and JSON both read those)."""
    if line.isascii():  # no surrogate can be in it; the check below copies the line
        return line
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return line.encode("utf-8", "backslashreplace").decode("utf-8")
    return line
