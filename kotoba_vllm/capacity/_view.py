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

A round is read once (answers by member, the demoted order, who is eligible); a decision is
then a comparison of plain counts, and its `Admission` is one the view already made.
"""

from __future__ import annotations

import math
from typing import Collection, Sequence

from .._errors import ConfigError
from ._answer import CapacityAnswer, PoolCapacity
from ._verdict import (Admission, admit_in_order, answers_by_endpoint, candidates, demote_busy_endpoints,
                       independent_admission, least_loaded)

DEFAULT_INTERVAL_S = 0.5


class CapacityView:
    def __init__(self, members: Sequence[str], interval_s: float = DEFAULT_INTERVAL_S) -> None:
        if interval_s < 0 or math.isnan(interval_s):
            raise ConfigError("the capacity interval must be >= 0 seconds")
        self.members = tuple(members)
        self.interval_s = interval_s
        self.snapshot: PoolCapacity | None = None
        self.started = -math.inf  # when the snapshot's round started (its age is measured from there)
        # per member, the fewest of ours in flight the snapshot's round can have counted busy (None: not known):
        # ours in flight when it landed, less ours started while it was out
        self.counted: dict[str, int] | None = None
        self.inflight = {m: 0 for m in self.members}
        self.sent = {m: 0 for m in self.members}
        self._last_done = {m: -math.inf for m in self.members}
        self.rounds = 0
        # The last round read for a decision: its answers by endpoint and demoted order, and, when no
        # member was measured busy (so nothing our own requests free can change), the members an
        # independent request chooses among by count, with whether they were measured free.
        self._read: PoolCapacity | None = None
        self._by: dict[str, CapacityAnswer] = {}
        self._order: list[str] = []
        self._eligible: tuple[str, ...] | None = None
        self._measured_free = False
        self._made: dict[tuple[str, int], Admission] = {}  # admissions already made, by member and count
        # likewise for a request restricted to some members (a batch's flow control): their candidates, by the
        # members allowed, in the order given
        self._among: dict[tuple[str, ...], tuple[tuple[str, ...], bool]] = {}

    def fresh(self, now: float) -> bool:
        return self.snapshot is not None and now - self.started <= self.interval_s

    def starts(self) -> dict[str, int]:
        """Ours started so far, per member: taken when a round's probes go out, for its `record`."""
        return dict(self.sent)

    def record(self, cap: PoolCapacity, started: float, starts: dict[str, int] | None = None) -> None:
        """A probe round that started at `started` (monotonic seconds) answered `cap`; `starts`: `starts()` then."""
        if started >= self.started:  # an older round finishing late never replaces a newer one
            self.snapshot, self.started = cap, started
            self.counted = None if starts is None else {
                m: max(0, self.inflight.get(m, 0) - (self.sent.get(m, 0) - starts.get(m, 0))) for m in self.sent}
        self.rounds += 1

    def begin(self, member: str) -> None:
        self.inflight[member] = self.inflight.get(member, 0) + 1
        self.sent[member] = self.sent.get(member, 0) + 1

    def end(self, member: str, now: float) -> None:
        n = self.inflight.get(member, 0)
        self.inflight[member] = n - 1 if n > 0 else 0
        self._last_done[member] = now

    def freed(self) -> list[str]:
        """Members that finished one of our requests since the snapshot's round started."""
        return [m for m, t in self._last_done.items() if t > self.started]

    def _read_round(self, cap: PoolCapacity) -> None:
        by = answers_by_endpoint(cap.members)
        self._read, self._by, self._order = cap, by, demote_busy_endpoints(self.members, by)
        self._made, self._among = {}, {}
        if any((a := by.get(m.rstrip("/"))) is not None and a.busy for m in self._order):
            self._eligible = None  # freed slots matter: every decision takes the general rule
            return
        self._eligible, self._measured_free = candidates(self._order, by)

    def decide(self, cap: PoolCapacity, affinity: str | None, among: Collection[str] | None = None) -> Admission:
        """The member for one request on round `cap`; `among`: only these members may be chosen (a batch's flow
        control: the members under their limits)."""
        if self._read is not cap:
            self._read_round(cap)
        eligible, measured_free = self._eligible, self._measured_free
        if eligible is not None and among is not None:
            eligible, measured_free = self._candidates_among(among)
        if affinity is not None or not eligible:
            freed = {m.rstrip("/") for m, t in self._last_done.items() if t > self.started}
            order = self._order if among is None else [m for m in self._order if m in among]
            return admit_in_order(order, self._by, affinity, inflight=self.inflight, freed=freed, sent=self.sent)
        # no member measured busy: the choice `admit_in_order` makes, from the candidates read once a round
        pick = least_loaded(eligible, self.inflight, self.sent)
        load = self.inflight.get(pick, 0) if measured_free else 0
        adm = self._made.get((pick, load))
        if adm is None:
            adm = self._made[(pick, load)] = independent_admission(pick, load, measured_free)
        return adm

    def admits(self, cap: PoolCapacity, among: Collection[str]) -> bool:
        """Would `decide` choose a member of `among` for a request without a conversation on round `cap`."""
        if self._read is not cap:
            self._read_round(cap)
        if self._eligible is not None and self._candidates_among(among)[0]:
            return True
        return self.decide(cap, None, among).member is not None

    def _candidates_among(self, among: Collection[str]) -> tuple[tuple[str, ...], bool]:
        """`candidates` of the members in `among` (read once a round; only while no member was measured busy)."""
        key = tuple(among)
        found = self._among.get(key)
        if found is None:
            found = self._among[key] = candidates([m for m in self._order if m in among], self._by)
        return found

    def take(self, cap: PoolCapacity, affinity: str | None, among: Collection[str] | None = None) -> Admission:
        """`decide`, and when a member is chosen, `begin` on it (one call per request)."""
        adm = self.decide(cap, affinity, among)
        if adm.member is not None:
            self.begin(adm.member)
        return adm
