"""How many requests the runner keeps in flight: the one component beside its scheduling core.

The core asks `admit(entry)` before it starts a request (a ticket, or None: not now) and calls
`settled(ticket, outcome)` when the request ends; `wake_in()` says when a refusal may change
without any request settling (a pause that ends). `FixedLimit` is `-c` requests, whatever the
answers say (`--flow-control off`).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any, Callable, Protocol

from .._edn import Keyword, kw
from .._errors import AdmissionRejected, KotobaError
from ._entry import BatchEntry


class Limiter(Protocol):
    def admit(self, e: BatchEntry) -> Any:
        """A ticket when `e` may be sent now (counted in flight until `settled`), else None."""

    def settled(self, ticket: Any, outcome: Any) -> Any:
        """The request admitted with `ticket` ended with `outcome` ((response, deltas) or a KotobaError);
        for an admission answer, a mark that `admit_again` reads."""

    def admit_again(self, e: BatchEntry, mark: Any) -> Any:
        """`admit` for an entry rejected at admission (its `settled` gave `mark`): only once its member's
        pause is over, or a slot of it was seen free since (one of ours to it ended, or the view says so)."""

    def wake_in(self) -> float | None:
        """Seconds until a refusal may change with nothing settling (None: only a settle changes it)."""


class FixedLimit:
    """At most `limit` in flight, whatever the answers say."""

    def __init__(self, limit: int) -> None:
        self.limit = self.free = limit

    def admit(self, e: BatchEntry) -> Any:
        if self.free:
            self.free -= 1
            return True
        return None

    def settled(self, ticket: Any, outcome: Any) -> Any:
        self.free += 1
        return None

    def admit_again(self, e: BatchEntry, mark: Any) -> Any:
        return self.admit(e)

    def wake_in(self) -> float | None:
        return None


# ------------------------------------------------------------------ flow control (AIMD, pauses, the view)

# Retry-After is honoured as a pause for its member, at most this long (a hostile value cannot stall a member).
MAX_PAUSE_S = 60.0
SHRINK = 0.5  # multiplicative decrease on an admission answer
FLOOR = 1  # the limit never goes below one request in flight
# After a shrink the limit holds this long before it grows again: growing straight back finds the edge again
# within a second on a busy engine, and a batch sitting at the edge leaves an interactive request no room.
HOLD_S = 2.0


class MemberFlow:
    """One member's limit and what happened to it. `limit` shrinks by SHRINK on an admission answer to a
    request sent under the current limit, and grows by one per `limit` requests answered (additive,
    one step per window of answers) while the member is not measured busy, never past `ceiling` nor
    below FLOOR."""

    def __init__(self, name: str, ceiling: int) -> None:
        self.name, self.ceiling = name, ceiling
        self.limit = float(ceiling)  # unmeasured members start at the ceiling
        self.in_flight = 0
        self.paused_until = -math.inf
        self.started = 0  # requests started (the ticket of each is its start number)
        self.shrunk_at = -1  # start number at the last shrink: an earlier request's rejection is old news
        self.hold_until = -math.inf  # no growth before this (HOLD_S after the last shrink)
        self.rejections = 0
        self.pauses = 0
        self.ended_count = 0  # requests of ours to it that ended, however
        self.limits: Counter[int] = Counter()  # the limit each request was started under

    def may_start(self, now: float) -> bool:
        return self.in_flight < int(self.limit) and now >= self.paused_until

    def start(self) -> int:
        self.in_flight += 1
        self.started += 1
        self.limits[int(self.limit)] += 1
        return self.started

    def answered(self, now: float, grow: bool = True) -> None:
        self.in_flight -= 1
        self.ended_count += 1
        if grow and self.limit < self.ceiling and now >= self.hold_until:
            self.limit = min(float(self.ceiling), self.limit + 1.0 / self.limit)

    def rejected(self, seq: int, retry_after_s: float | None, now: float) -> None:
        self.in_flight -= 1
        self.ended_count += 1
        self.rejections += 1
        if seq > self.shrunk_at:
            self.limit = max(float(FLOOR), self.limit * SHRINK)
            self.shrunk_at = self.started
            self.hold_until = now + HOLD_S
        if retry_after_s is not None and retry_after_s > 0:
            until = now + min(retry_after_s, MAX_PAUSE_S)
            if until > self.paused_until:
                if now >= self.paused_until:
                    self.pauses += 1
                self.paused_until = until

    def ended(self) -> None:
        """Ended without an answer about admission (an error, a timeout, abandoned): no step either way."""
        self.in_flight -= 1
        self.ended_count += 1

    def to_edn(self) -> dict[Keyword, Any]:
        return {kw("flow/member"): self.name, kw("flow/ceiling"): self.ceiling,
                kw("flow/limit"): _spread(self.limits), kw("flow/rejections"): self.rejections,
                kw("flow/pauses"): self.pauses}


def _spread(limits: Counter[int]) -> dict[Keyword, Any]:
    """min/median/max of the limit requests were started under."""
    if not limits:
        return {kw("flow/min"): None, kw("flow/median"): None, kw("flow/max"): None}
    total, seen, median = sum(limits.values()), 0, None
    for v in sorted(limits):
        seen += limits[v]
        if median is None and 2 * seen >= total:
            median = v
    return {kw("flow/min"): min(limits), kw("flow/median"): median, kw("flow/max"): max(limits)}


class MeasuredCapacity(Protocol):
    """The measured view of the members (kotoba_vllm.capacity's rules, read by `_measured.py`)."""

    def admits(self, member: str) -> bool | None:
        """May a request go to `member` now: True / False, None when unmeasured (AIMD and pauses decide)."""

    def begin(self, member: str) -> None:
        """One of ours started on `member`."""

    def end(self, member: str) -> None:
        """One of ours to `member` ended."""


class FlowControl:
    """Per member: in flight <= the member's AIMD limit (at most `ceiling`, the `-c`), not during its
    pause, and only when the measured view (when there is one) admits a request to it."""

    def __init__(self, ceiling: int, member_of: Callable[[BatchEntry], str], *,
                 capacity: MeasuredCapacity | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.ceiling, self.member_of, self.capacity, self.clock = ceiling, member_of, capacity, clock
        self.members: dict[str, MemberFlow] = {}
        self._view_refused = False  # the last refusal was the measured view's (it changes with the next round)

    def member(self, name: str) -> MemberFlow:
        m = self.members.get(name)
        if m is None:
            m = self.members[name] = MemberFlow(name, self.ceiling)
        return m

    def admit(self, e: BatchEntry) -> Any:
        m = self.member(self.member_of(e))
        if not m.may_start(self.clock()):
            return None
        cap = self.capacity
        if cap is not None:
            if cap.admits(m.name) is False:
                self._view_refused = True
                return None
            cap.begin(m.name)
        self._view_refused = False
        return (m, m.start())

    def settled(self, ticket: Any, outcome: Any) -> Any:
        m, seq = ticket
        if self.capacity is not None:
            self.capacity.end(m.name)
        if isinstance(outcome, AdmissionRejected):
            now = self.clock()
            m.rejected(seq, outcome.retry_after_s, now)
            return (m.ended_count, m.paused_until > now)
        if isinstance(outcome, KotobaError) or outcome is None:
            m.ended()
        else:
            # no growth while the member is measured busy (a queue of its own): growing then only fills the
            # engine's queue, where an interactive request would wait or be refused
            grow = m.limit < self.ceiling and (self.capacity is None or self.capacity.admits(m.name) is not False)
            m.answered(self.clock() if grow else 0.0, grow)
        return None

    def admit_again(self, e: BatchEntry, mark: Any) -> Any:
        m = self.member(self.member_of(e))
        ended, paused = mark
        if not paused and m.ended_count <= ended and m.in_flight:
            # no pause to wait out and no slot seen free since: only the view can say one is
            if self.capacity is None or self.capacity.admits(m.name) is not True:
                return None
        return self.admit(e)

    def wake_in(self) -> float | None:
        now = self.clock()
        ends = [m.paused_until - now for m in self.members.values() if m.paused_until > now]
        if self._view_refused:  # the view changes with the next probe round, not only when we settle
            ends.append(CAPACITY_RECHECK_S)
        return min(ends) if ends else None

    @property
    def limit(self) -> int:
        return sum(int(m.limit) for m in self.members.values()) or self.ceiling

    @property
    def rejections(self) -> int:
        return sum(m.rejections for m in self.members.values())

    def to_edn(self) -> list[dict[Keyword, Any]]:
        return [m.to_edn() for m in self.members.values()]


# How often a request refused by the measured view looks again (the view itself refreshes by its interval).
CAPACITY_RECHECK_S = 0.05
