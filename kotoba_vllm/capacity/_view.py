"""The pool's shared capacity view (pure: the caller passes the clock, the pool's shells probe).

Instead of probing every member for every request, a pool keeps the last probe round and
its own count of requests in flight per member, and every request in flight reads that:

- a round is at most `interval_s` old when a decision reads it; a request that finds it
  older takes one new round (one round at a time; requests arriving meanwhile wait for it
  and read its result);
- a member measured busy stays busy for decisions until one of our own requests to it
  finishes after the round started (a slot we held was freed) or the next round says
  otherwise — so the all-busy refusal is exactly as strict as the measurement: nothing is
  sent when every member was measured busy within `interval_s` (plus one round's duration)
  and none has finished a request of ours since;
- among equally eligible members the one with fewest of our requests in flight wins (then
  the one we sent fewest), so independent requests spread over unmeasured or equally free
  members, at any concurrency.
"""

from __future__ import annotations

import math
from typing import Sequence

from .._errors import ConfigError
from ._answer import CapacityAnswer, PoolCapacity
from ._verdict import Admission, admit_in_order, answers_by_endpoint, demote_busy_endpoints

DEFAULT_INTERVAL_S = 0.5


class CapacityView:
    def __init__(self, members: Sequence[str], interval_s: float = DEFAULT_INTERVAL_S) -> None:
        if interval_s < 0 or math.isnan(interval_s):
            raise ConfigError("the capacity interval must be >= 0 seconds")
        self.members = tuple(members)
        self.interval_s = interval_s
        self.snapshot: PoolCapacity | None = None
        self.started = -math.inf  # when the snapshot's round started (its age is measured from there)
        self.inflight = {m: 0 for m in self.members}
        self.sent = {m: 0 for m in self.members}
        self._last_done = {m: -math.inf for m in self.members}
        self.rounds = 0
        # the last round read for a decision, its answers by endpoint and its demoted order (once per round)
        self._read: tuple[PoolCapacity | None, dict[str, CapacityAnswer], list[str]] = (None, {}, [])

    def fresh(self, now: float) -> bool:
        return self.snapshot is not None and now - self.started <= self.interval_s

    def record(self, cap: PoolCapacity, started: float) -> None:
        """A probe round that started at `started` (monotonic seconds) answered `cap`."""
        if started >= self.started:  # an older round finishing late never replaces a newer one
            self.snapshot, self.started = cap, started
        self.rounds += 1

    def begin(self, member: str) -> None:
        self.inflight[member] = self.inflight.get(member, 0) + 1
        self.sent[member] = self.sent.get(member, 0) + 1

    def end(self, member: str, now: float) -> None:
        self.inflight[member] = max(0, self.inflight.get(member, 0) - 1)
        self._last_done[member] = now

    def freed(self) -> list[str]:
        """Members that finished one of our requests since the snapshot's round started."""
        return [m for m, t in self._last_done.items() if t > self.started]

    def decide(self, cap: PoolCapacity, affinity: str | None) -> Admission:
        read, by, order = self._read
        if read is not cap:
            by = answers_by_endpoint(cap.members)
            order = demote_busy_endpoints(self.members, by)
            self._read = (cap, by, order)
        started = self.started
        freed = {m.rstrip("/") for m, t in self._last_done.items() if t > started}
        return admit_in_order(order, by, affinity, inflight=self.inflight, freed=freed, sent=self.sent)
