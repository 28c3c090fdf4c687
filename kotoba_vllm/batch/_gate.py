"""`LimiterGate`: a limiter (`_flow.py`) for many coroutines at once, taking turns in arrival order.

The batch runner asks its limiter from one loop; a Ray actor's batch is many coroutines, each with
one request. They queue here: the head asks the limiter and waits for a settle (or the limiter's
`wake_in`) until it is admitted, then hands the turn to the next.
"""

from __future__ import annotations

import asyncio
from collections import deque
from ._entry import BatchEntry
from ._flow import Limiter, Outcome


class LimiterGate:
    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter
        self._turns: deque[asyncio.Future[None]] = deque()
        self._changed: asyncio.Future[None] | None = None

    async def enter(self, e: BatchEntry, mark: object = None, *, again: bool = False) -> object:
        """The limiter's ticket for `e`, once it admits it (in arrival order). `again`: `e` was rejected at
        admission and `mark` is what the limiter's `settled` said then (it is admitted by `admit_again`)."""
        limiter = self.limiter

        def admit() -> object | None:
            return limiter.admit_again(e, mark) if again else limiter.admit(e)

        if not self._turns:
            ticket = admit()
            if ticket is not None:
                return ticket
        loop = asyncio.get_running_loop()
        turn: asyncio.Future[None] = loop.create_future()
        self._turns.append(turn)
        if self._turns[0] is turn:
            turn.set_result(None)
        try:
            await turn
            while True:
                ticket = admit()
                if ticket is not None:
                    return ticket
                changed = self._changed = loop.create_future()
                timeout = limiter.wake_in()
                timer = loop.call_later(timeout, _resolve, changed) if timeout is not None else None
                try:
                    await changed
                finally:
                    if timer is not None:
                        timer.cancel()
        finally:
            self._turns.remove(turn)
            if self._turns:
                _resolve(self._turns[0])

    def leave(self, ticket: object, outcome: Outcome) -> object | None:
        """The request admitted with `ticket` ended with `outcome`; the limiter's mark for `enter(again=True)`."""
        mark = self.limiter.settled(ticket, outcome)
        if self._changed is not None:
            _resolve(self._changed)
        return mark


def _resolve(f: "asyncio.Future[None]") -> None:
    if not f.done():
        f.set_result(None)
