"""Whole-request deadlines for async calls: one timer per client, whatever is in flight.

Arming a call is a dict write; the timer is scheduled at the earliest deadline it knows of and, when
it fires, cancels the calls that are due (a cancelled send closes its connection, so the engine
aborts the request) and sleeps until the next. A deadline that moves later (a stream's idle limit,
moved on each data event) costs nothing until the timer comes due; one that moves earlier moves the
timer. A stream's consumer runs its own code between reads: a call is cancelled only while it waits
on the wire (`task` set), otherwise it is marked `fired` and the next read raises.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from ._errors import RequestTimeout


def _clock(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """The loop's clock: `time.monotonic` itself where the loop's `time` is asyncio's own (which returns
    exactly that), saving a Python call per read; a loop with its own clock (uvloop) is read as it is."""
    return time.monotonic if type(loop).time is asyncio.BaseEventLoop.time else loop.time


class Watch:
    """One call's deadline (`when`, the loop's clock), reported as a `what` timeout of `limit_s`."""

    __slots__ = ("when", "task", "fired", "what", "limit_s")

    def __init__(self, when: float, task: "asyncio.Task[object] | None", what: str, limit_s: float) -> None:
        self.when, self.task, self.what, self.limit_s = when, task, what, limit_s
        self.fired = False

    def timed_out(self, url: str) -> RequestTimeout:
        return RequestTimeout(f"{self.what} deadline after {self.limit_s} s talking to {url}", phase=self.what,
                              limit_s=self.limit_s, endpoint=url)


class Deadlines:
    def __init__(self) -> None:
        self._calls: dict[Watch, None] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._at = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._time: Callable[[], float] = time.monotonic  # the loop's clock (`_clock`)

    def arm(self, limit_s: float, *, what: str = "total", waiting: bool = True) -> Watch:
        """A deadline `limit_s` from now for the current task (`waiting`: it is about to wait on the wire)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new event loop (asyncio.run again): the old timer is gone with its loop
            self._loop, self._timer, self._time = loop, None, _clock(loop)
        w = Watch(self._time() + limit_s, asyncio.current_task(loop) if waiting else None, what, limit_s)
        self._calls[w] = None
        if self._timer is None or w.when < self._at:
            self._schedule(loop, w.when)
        return w

    def move(self, w: Watch, when: float, what: str, limit_s: float) -> None:
        w.when, w.what, w.limit_s = when, what, limit_s
        if w in self._calls and (self._timer is None or when < self._at) and self._loop is not None:
            self._schedule(self._loop, when)

    def disarm(self, w: Watch) -> None:
        self._calls.pop(w, None)  # the timer stays: it finds nothing due, or the next call's deadline

    def now(self) -> float:
        assert self._loop is not None
        return self._time()

    def _schedule(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._at = when
        self._timer = loop.call_at(when, self._due)

    def _due(self) -> None:
        self._timer = None
        loop = self._loop
        assert loop is not None
        now, nxt = loop.time(), None
        for w in list(self._calls):
            if w.when <= now:
                del self._calls[w]
                w.fired = True
                if w.task is not None:
                    w.task.cancel()
            elif nxt is None or w.when < nxt:
                nxt = w.when
        if nxt is not None:
            self._schedule(loop, nxt)


def expired(w: Watch) -> bool:
    """After a `CancelledError`: was it this deadline's? (Then the cancel is taken back: it was ours.)"""
    if not w.fired:
        return False
    task = asyncio.current_task()
    if task is not None and hasattr(task, "uncancel"):  # Python 3.11+
        task.uncancel()
    return True
