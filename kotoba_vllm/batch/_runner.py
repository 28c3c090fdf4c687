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
import datetime
import time
from collections import Counter, deque
from typing import Awaitable, Callable, Iterable, Iterator, Protocol, Sequence, Union, cast

import attrs

from .._edn import EdnError, Keyword, dumps, kw, pretty, read_coll_at, read_one
from .._errors import (AdmissionRejected, ConfigError, InternalError, KotobaError, RequestTimeout, ServerError,
                       ValidationError)
from .._codec import write_edn, write_fields
from .._model import AnyResponse, StreamDelta
from .._requests import key_where, request_to_edn
from ._deadlines import Deadline, DeadlineQueue
from ._entries import BatchEntry
from ._flow import EdnMap, FixedLimit, Limiter
from ._flow import Outcome as FlowOutcome
from ._jsonl import output_line
from ._output import ExistingOutput, OrderedSink, render_edn

K_INDEX = kw("vllm/request-index")
K_RID = kw("vllm/request-id")
K_ATTEMPTS = kw("vllm/attempts")
K_AT, K_MEMBER, K_OUTCOME = kw("vllm/at"), kw("vllm/member"), kw("vllm/outcome")
K_REASON, K_RETRY_AFTER = kw("vllm/reason"), kw("vllm/retry-after-s")
_INDEX_KEY = frozenset((K_INDEX,))
_HEAD_KEYS = frozenset((K_INDEX, K_RID))


@attrs.define
class BatchSummary:
    """Counts by outcome (`ok`, `validation`, `admission-rejected`, each error kind) and rates."""

    outcomes: Counter[str] = attrs.field(factory=Counter)
    sent: int = 0  # HTTP requests this run started
    requeued: int = 0  # of them, admission-rejected requests sent again (--requeue-rejected)
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
    flow: list[EdnMap] | None = None  # flow control per member (None: a fixed --concurrency)

    @property
    def failed(self) -> int:
        return sum(n for k, n in self.outcomes.items() if k != "ok")

    @property
    def complete(self) -> bool:
        return not self.interrupted and self.abandoned == 0 and self.stopped_at is None and not self.input_error

    def to_edn(self) -> EdnMap:
        rate = self.recorded / self.elapsed_s if self.elapsed_s > 0 else None
        sent_rate = self.sent / self.elapsed_s if self.elapsed_s > 0 else None
        return {kw("batch/outcomes"): {kw(k): n for k, n in sorted(self.outcomes.items())},
                kw("batch/recorded"): self.recorded, kw("batch/sent"): self.sent, kw("batch/requeued"): self.requeued,
                kw("batch/already-done"): self.already_done, kw("batch/from-journal"): self.from_journal,
                kw("batch/abandoned"): self.abandoned, kw("batch/interrupted?"): self.interrupted,
                kw("batch/complete?"): self.complete, kw("batch/stopped-at"): self.stopped_at,
                kw("batch/elapsed-s"): round(self.elapsed_s, 3),
                kw("batch/records-per-s"): round(rate, 1) if rate is not None else None,
                kw("batch/requests-per-s"): round(sent_rate, 1) if sent_rate is not None else None,
                kw("batch/output"): self.output, kw("batch/pending"): self.pending,
                kw("batch/input-error"): self.input_error, kw("batch/flow"): self.flow}

    def line(self) -> str:
        parts = " ".join(f"{k}={n}" for k, n in sorted(self.outcomes.items())) or "nothing"
        rate = f"{self.sent / self.elapsed_s:.1f} req/s" if self.elapsed_s > 0 and self.sent else "no requests sent"
        extra = f", {self.already_done} already done" if self.already_done else ""
        extra += f", {self.from_journal} from the journal" if self.from_journal else ""
        extra += f", {self.requeued} sent again after an admission rejection" if self.requeued else ""
        state = "complete" if self.complete else "INTERRUPTED (run again with --resume)"
        text = (f";; batch {state}: {self.recorded} records ({parts}){extra}; {self.sent} sent in "
                f"{self.elapsed_s:.2f} s, {rate}")
        for m in self.flow or ():
            lim = cast(EdnMap, m[kw("flow/limit")])
            text += (f"\n;; flow {m[kw('flow/member')]}: limit min/median/max {lim[kw('flow/min')]}/"
                     f"{lim[kw('flow/median')]}/{lim[kw('flow/max')]} of {m[kw('flow/ceiling')]}, "
                     f"{m[kw('flow/rejections')]} rejected, {m[kw('flow/pauses')]} paused")
        return text


# One request -> (response, deltas); a KotobaError is the typed failure, anything else a bug recorded as one.
Answer = tuple[AnyResponse, Sequence[StreamDelta]]
SendFn = Callable[[BatchEntry], Awaitable[Answer]]
Outcome = Union[Answer, KotobaError]
SendTask = asyncio.Task[Answer]
Attempts = list[EdnMap]


class Progress(Protocol):
    def update(self, n: int) -> None: ...
# After cancelling a sender past its deadline, how long to wait for it to unwind.
CANCEL_GRACE_S = 1.0


class Recorder:
    """Turns outcomes into output text in the chosen format."""

    def __init__(self, fmt: str, pretty_print: bool = False) -> None:
        self.fmt, self.pretty = fmt, pretty_print

    def _head(self, e: BatchEntry) -> EdnMap:
        head: EdnMap = {K_INDEX: e.index}
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

    def failed(self, e: BatchEntry, err: KotobaError, attempts: Attempts | None = None) -> list[str]:
        if self.fmt == "jsonl":
            return [output_line(e, error=err, attempts=attempts)]
        rec = self._head(e)
        rec.update(err.to_edn())
        rec[kw("vllm/where")] = e.where  # the request's file:line:column: an engine's refusal names it too
        field = err.field if isinstance(err, ServerError) else None
        if field is not None and e.anchor is not None:  # the refused field's own key, where the request has it
            again = read_coll_at(*e.anchor)[0]  # a map: the request; a vector holding it has no one place
            at = key_where(again, field) if isinstance(again.value, dict) else None
            if at is not None:
                rec[kw("vllm/field-where")] = at
        if e.request is not None:
            rec[kw("vllm/request")] = request_to_edn(e.request)
        if attempts is not None:
            rec[K_ATTEMPTS] = attempts
        return [render_edn(rec, self.pretty)]

    def ok(self, e: BatchEntry, resp: AnyResponse, deltas: Sequence[StreamDelta],
           attempts: Attempts | None = None) -> list[str]:
        """A record written by the one per-class writer (`write_fields`) without building its maps; `--pretty`
        lays its line breaks over that text read back, so both print the same record."""
        if self.fmt == "jsonl":
            return [output_line(e, result=resp, attempts=attempts)]
        head = [":vllm/request-index " + dumps(e.index)]
        rid = e.request_id
        if rid is not None:
            head.append(":vllm/request-id " + dumps(rid))
        body = write_fields(resp, _HEAD_KEYS if rid is not None else _INDEX_KEY)
        if attempts is not None:
            body.append(":vllm/attempts " + dumps(attempts))
        text = "{" + " ".join(head + body) + "}"
        return [write_edn(d) for d in deltas] + [pretty(read_one(text)) if self.pretty else text]


class Flight:
    """One request the runner started: its entry, its limiter ticket, its deadline; once rejected at
    admission and queued again, its attempts so far, the last rejection and the limiter's mark."""

    __slots__ = ("entry", "ticket", "deadline", "attempts", "rejection", "mark")

    def __init__(self, entry: BatchEntry, ticket: object) -> None:
        self.entry, self.ticket = entry, ticket
        self.deadline: Deadline[SendTask] | None = None
        self.attempts: Attempts | None = None
        self.rejection: AdmissionRejected | None = None
        self.mark: object = None


class BatchRunner:
    """The scheduling core: `run` takes up entries in input order and starts each one the limiter admits;
    every request is one task (the sender's own) whose done callback makes its record; `run` waits only
    when the limiter says not now, the window is full, or the input is taken up and requests are in flight.

    Flow control is the limiter's (`_flow.py`); deadlines are the `DeadlineQueue`'s."""

    def __init__(self, send: SendFn, sink: OrderedSink, recorder: Recorder, *, concurrency: int = 8,
                 window: int | None = None, existing: ExistingOutput | None = None,
                 progress: Progress | None = None, deadline_s: float | None = None, limiter: Limiter | None = None,
                 requeue: int = 0) -> None:
        if concurrency < 1:
            raise ConfigError("concurrency must be >= 1")
        self.send, self.sink, self.recorder = send, sink, recorder
        # A sender still running after this many seconds is cancelled and recorded as a timeout.
        self.deadline_s = deadline_s
        self.concurrency = concurrency
        self.limiter: Limiter = limiter if limiter is not None else FixedLimit(concurrency)
        # An admission-rejected request is sent again at most this many times (never another failure).
        self.requeue = requeue
        self._again: deque[Flight] = deque()  # rejected at admission, waiting to be sent again
        self._taking_up = False
        # Out-of-order results wait in memory; cap how far ahead of the oldest unwritten we go.
        self.window = window or max(1024, 64 * concurrency)
        self.existing = existing or ExistingOutput()
        self.progress = progress
        self.summary = BatchSummary()
        self._stops = 0
        self._abandoning = False
        self._running: dict[SendTask, Flight] = {}  # started, deadline not passed
        self._expiring: dict[SendTask, tuple[Flight, asyncio.TimerHandle]] = {}  # cancelled at it
        self._deadlines: DeadlineQueue[SendTask] | None = (
            DeadlineQueue(deadline_s, self._expire) if deadline_s is not None else None)
        self._wake: asyncio.Future[None] | None = None  # `run` waits on it; anything that may unblock it sets it
        self._failures: list[Exception] = []
        self._loop: asyncio.AbstractEventLoop | None = None  # `run`'s

    def stop(self) -> None:
        """First call: send nothing new, let in-flight requests finish. Second: abandon them."""
        self._stops += 1
        self.summary.interrupted = True
        self._poke()
        if self._stops >= 2:
            self._abandon()

    @property
    def stopping(self) -> bool:
        """`stop()` was called: nothing new is sent."""
        return self._stops > 0

    @property
    def in_flight(self) -> int:
        return len(self._running) + len(self._expiring)

    # ---------------------------------------------------------------- taking up the input

    async def run(self, entries: Iterable[BatchEntry]) -> BatchSummary:
        started = time.perf_counter()
        self._loop = asyncio.get_running_loop()
        self._taking_up = True
        try:
            await self._take_up(iter(entries))
        finally:
            self._taking_up = False
            while self._again:  # a stop (or the input) ended the run first: they keep their last rejection
                f = self._again.popleft()
                assert f.rejection is not None
                self._finish(f, f.rejection, settled=True)
            try:
                while self.in_flight:
                    await self._wait()
            except asyncio.CancelledError:  # the run itself is cancelled: what is in flight is abandoned
                self._abandon()
                raise
            if self._deadlines is not None:
                self._deadlines.close()
            self.sink.close(keep_journal=bool(self.existing.journal))
            self.summary.elapsed_s = time.perf_counter() - started
        if self._failures:  # the output itself failed (disk full ...): the run cannot claim its records
            raise self._failures[0]
        return self.summary

    async def _take_up(self, entries: Iterator[BatchEntry]) -> None:
        """Every entry in input order: recorded at once (already done, journaled, invalid) or started when
        the window and the limiter allow; returns at the input's end, a stop, or an input that stops reading."""
        ex, sink, limiter = self.existing, self.sink, self.limiter
        loop = asyncio.get_running_loop()
        while True:
            try:
                e = next(entries, None)
            except EdnError as err:  # the input stopped reading as a whole (e.g. an unclosed vector)
                self.summary.input_error = str(err)
                return
            except Exception as err:  # the reader itself failed: say so, keep every record already made
                self.summary.input_error = str(InternalError.from_exception(err, during="while reading the input"))
                return
            if e is None:
                while self._again or (self.requeue and self.in_flight):  # answers may still come back rejected
                    if not (self._again and self._resend()):
                        await self._wait(limiter.wake_in())
                    if self._stops > 0:
                        return
                return
            if self._stops > 0:
                self.summary.stopped_at = e.index
                return
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
            while e.index - sink.next >= self.window:  # bound memory: wait for the output to catch up
                await self._wait(limiter.wake_in() if self._again else None)
                self._resend()
                if self._stops > 0:
                    self.summary.stopped_at = e.index
                    return
            ticket = limiter.admit(e) if not self._again else None
            while ticket is None:
                if not (self._again and self._resend()):
                    await self._wait(limiter.wake_in())
                if self._stops > 0:
                    self.summary.stopped_at = e.index
                    return
                ticket = limiter.admit(e) if not self._again else None
            self.summary.sent += 1
            self._start(Flight(e, ticket), loop)

    def _resend(self) -> bool:
        """Send again, oldest first, the rejected requests the limiter admits again; True when it sent any."""
        again, sent = self._again, False
        if not again:
            return False
        loop = asyncio.get_running_loop()
        while again:
            f = again[0]
            ticket = self.limiter.admit_again(f.entry, f.mark)
            if ticket is None:
                break
            again.popleft()
            f.ticket = ticket
            self.summary.sent += 1
            self.summary.requeued += 1
            self._start(f, loop)
            sent = True
        return sent

    def _wait(self, timeout: float | None = None) -> "asyncio.Future[None]":
        """What `run` awaits until something that may unblock it happens: a request settles, a stop, or
        `timeout` passes. (A future, not a coroutine: one frame less to resume per wake.)"""
        loop = self._loop
        assert loop is not None  # set by `run`, the only caller
        wake = self._wake = loop.create_future()
        if timeout is not None:
            wake.add_done_callback(_cancel_timer(loop.call_later(timeout, _resolve, wake)))
        return wake

    def _poke(self) -> None:
        wake = self._wake
        if wake is not None:
            self._wake = None
            if not wake.done():
                wake.set_result(None)

    # ---------------------------------------------------------------- one request

    # One task per request, the sender's own: its record is made by its done callback, or when its
    # deadline passes first (cancelled, given CANCEL_GRACE_S to unwind, then recorded as a timeout).
    # A second task per request to watch the first cost as much CPU as the rest of the runner.

    def _start(self, f: Flight, loop: asyncio.AbstractEventLoop) -> None:
        try:
            task = asyncio.ensure_future(self.send(f.entry))
        except Exception as exc:  # a sender that fails before it returns an awaitable
            self._finish(f, InternalError.from_exception(exc))
            return
        if self._deadlines is not None:
            f.deadline = self._deadlines.add(task, loop)
        self._running[task] = f
        task.add_done_callback(self._settled)

    def _settled(self, task: SendTask) -> None:
        f = self._running.pop(task, None)
        if f is None:
            held = self._expiring.pop(task, None)
            if held is not None:  # past its deadline, unwound within the grace: a timeout all the same
                held[1].cancel()
                _retrieve(task)
                self._timed_out(held[0])
            else:  # left behind after its grace (its record is made), or abandoned
                _retrieve(task)
            return
        if f.deadline is not None and self._deadlines is not None:
            self._deadlines.cancel(f.deadline)
        if self._abandoning:  # a second stop: not recorded, even if it answered; --resume sends it again
            _retrieve(task)
            self.summary.abandoned += 1
            self.limiter.settled(f.ticket, None)
            self._poke()
            return
        self._finish(f, _outcome(task))

    def _expire(self, task: SendTask) -> None:
        """Its deadline came first: cancel it and give it CANCEL_GRACE_S to unwind."""
        f = self._running.get(task)
        if f is None or task.done():  # answered just in time: its done callback is already queued
            return
        del self._running[task]
        task.cancel()
        grace = task.get_loop().call_later(CANCEL_GRACE_S, self._grace_over, task)
        self._expiring[task] = (f, grace)

    def _grace_over(self, task: SendTask) -> None:
        """A sender that ignores cancel: left behind, recorded as the timeout it is."""
        held = self._expiring.pop(task, None)
        if held is not None:
            self._timed_out(held[0])

    def _timed_out(self, f: Flight) -> None:
        e = f.entry
        endpoint = e.request.base_url if e.request is not None else None
        self._finish(f, RequestTimeout(f"no answer within {self.deadline_s} s (the whole request); cancelled",
                                       phase="total", limit_s=self.deadline_s, endpoint=endpoint))

    def _finish(self, f: Flight, outcome: Outcome, *, settled: bool = False) -> None:
        e = f.entry
        if self.requeue and not settled:  # (settled: a queued rejection recorded as it is, attempts and all)
            mark = self.limiter.settled(f.ticket, outcome)
            settled = True
            if isinstance(outcome, AdmissionRejected) or f.attempts is not None:
                f.attempts = (f.attempts or []) + [attempt_of(e, outcome)]
            if (isinstance(outcome, AdmissionRejected) and len(f.attempts or ()) <= self.requeue
                    and self._taking_up and not self._stops and not self._abandoning):
                f.rejection, f.mark = outcome, mark
                self._again.append(f)
                self._poke()
                return
        try:
            if isinstance(outcome, ValidationError):
                self.summary.sent -= 1  # refused by validation before any byte went out
            lines, kind = self._lines(e, outcome, f.attempts)
            self._record(e.index, lines, kind)
        except Exception as exc:  # the output itself failed: `run` raises it once every request settled
            self._failures.append(exc)
        finally:
            if not settled:
                self.limiter.settled(f.ticket, outcome)
            self._poke()

    def _record(self, index: int, lines: list[str], outcome: str, *, journaled: bool = False) -> None:
        self.sink.put(index, lines, journaled=journaled)
        self.summary.outcomes[outcome] += 1
        self.summary.recorded += 1
        if self.progress is not None:
            self.progress.update(1)

    def _abandon(self) -> None:
        """Every request in flight is given up: not recorded, so --resume sends it again."""
        self._abandoning = True
        for t in list(self._running):
            t.cancel()
        for task, (f, grace) in list(self._expiring.items()):
            del self._expiring[task]
            grace.cancel()
            self.summary.abandoned += 1
            self.limiter.settled(f.ticket, None)
        self._poke()

    def _lines(self, e: BatchEntry, outcome: Outcome,
               attempts: Attempts | None = None) -> tuple[list[str], str]:
        """The record's text and its outcome; a record that cannot be rendered is an :internal one."""
        try:
            if isinstance(outcome, KotobaError):
                lines, kind = self.recorder.failed(e, outcome, attempts), outcome.kind
            else:
                resp, deltas = outcome
                lines, kind = self.recorder.ok(e, resp, deltas, attempts), "ok"
        except Exception as exc:
            err = InternalError.from_exception(exc, during="while writing the record")
            lines, kind = self.recorder.failed(attrs.evolve(e, request=None), err), err.kind
        return [_writable(line) for line in lines], kind


def attempt_of(e: BatchEntry, outcome: FlowOutcome) -> EdnMap:
    """One attempt of a request that was rejected at admission at least once: when it ended, where, how
    (`:vllm/attempts` holds one per attempt, in `run`'s records and a Ray stage's alike)."""
    at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if isinstance(outcome, KotobaError):
        out: EdnMap = {K_AT: at, K_MEMBER: outcome.endpoint, K_OUTCOME: kw(outcome.kind)}
        if isinstance(outcome, AdmissionRejected):
            out[K_REASON] = outcome.reason
            out[K_RETRY_AFTER] = outcome.retry_after_s
        return out
    resp = outcome[0] if outcome is not None else None
    extras = getattr(resp, "extras", None)
    member = (extras.get("pool/member") if isinstance(extras, dict) else None) or getattr(resp, "endpoint_url", None)
    return {K_AT: at, K_MEMBER: member, K_OUTCOME: kw("ok")}


def _cancel_timer(timer: asyncio.TimerHandle) -> Callable[["asyncio.Future[None]"], None]:
    return lambda _: timer.cancel()


def _resolve(f: "asyncio.Future[None]") -> None:
    if not f.done():
        f.set_result(None)


def _outcome(task: SendTask) -> Outcome:
    """What a settled sender made of its entry: (response, deltas) or a typed error, never an exception."""
    if task.cancelled():
        return InternalError("CancelledError: the request was cancelled before it answered",
                             exception_type="CancelledError")
    exc = task.exception()
    if exc is None:
        return task.result()
    return exc if isinstance(exc, KotobaError) else InternalError.from_exception(exc)


def _retrieve(task: SendTask) -> None:
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
