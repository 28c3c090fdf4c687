"""`DeadlineQueue`: the runner's whole-request deadlines, one timer for all of them.

Every request gets the same timeout, so deadlines come due in the order they were set: the queue is
a deque in start order and one timer waits for its front. A settled request's deadline is emptied
where it stands and empty ones leave from the front, so the queue holds no more than the requests
started since the oldest one still running. (A timer per request is a heap push and a cancelled
handle per request: measurable at 64-256 in flight.)
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


# One request's deadline: [due, item]; the item is None once cancelled. (A list, not a class: made once per
# request, and a Python __init__ would cost more than the rest of `add`.)
Deadline = list


class DeadlineQueue(Generic[T]):
    """`add(item)` sets a deadline `timeout_s` from now; `expire(item)` is called when it comes first;
    `cancel(deadline)` when the item settled in time."""

    def __init__(self, timeout_s: float, expire: Callable[[T], None]) -> None:
        self.timeout_s = timeout_s
        self._expire = expire
        self._queue: deque[Deadline[Any]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, item: T, loop: asyncio.AbstractEventLoop) -> Deadline[Any]:
        d: Deadline[Any] = [loop.time() + self.timeout_s, item]
        self._queue.append(d)
        if self._timer is None:
            self._timer = loop.call_at(d[0], self._due, loop)
        return d

    def cancel(self, d: Deadline[Any]) -> None:
        d[1] = None
        q = self._queue
        while q and q[0][1] is None:
            q.popleft()
        # The timer stays armed when the queue empties: it fires no later than any deadline set since and
        # re-arms for the first one still live (at 1 in flight, no timer is armed and cancelled per request).

    def _due(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        q, now = self._queue, loop.time()
        while q and (q[0][1] is None or q[0][0] <= now):
            item = q.popleft()[1]
            if item is not None:
                self._expire(item)
        if q:
            self._timer = loop.call_at(q[0][0], self._due, loop)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._queue.clear()
