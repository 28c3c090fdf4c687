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
from typing import Callable, Protocol, Sequence, Union, cast

from .._edn import Edn, Keyword, kw
from .._errors import AdmissionRejected, ConfigError, KotobaError
from ._entry import BatchEntry

# How a request ended: (response, deltas), the typed error, or None (abandoned: no answer at all).
Outcome = Union["tuple[object, Sequence[object]]", KotobaError, None]
EdnMap = dict[Keyword, Edn]


class Limiter(Protocol):
    def admit(self, e: BatchEntry) -> object | None:
        """A ticket when `e` may be sent now (counted in flight until `settled`), else None."""

    def settled(self, ticket: object, outcome: Outcome) -> object | None:
        """The request admitted with `ticket` ended with `outcome`; for an admission answer, a mark that
        `admit_again` reads."""

    def admit_again(self, e: BatchEntry, mark: object) -> object | None:
        """`admit` for an entry rejected at admission (its `settled` gave `mark`): only once its member's
        pause is over, or a slot of it was seen free since (one of ours to it ended, or the view says so)."""

    def wake_in(self) -> float | None:
        """Seconds until a refusal may change with nothing settling (None: only a settle changes it)."""


class FixedLimit:
    """At most `limit` in flight, whatever the answers say."""

    def __init__(self, limit: int) -> None:
        self.limit = self.free = limit

    def admit(self, e: BatchEntry) -> object | None:
        if self.free:
            self.free -= 1
            return True
        return None

    def settled(self, ticket: object, outcome: Outcome) -> object | None:
        self.free += 1
        return None

    def admit_again(self, e: BatchEntry, mark: object) -> object | None:
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
# Slots flow control leaves free on each member for other clients (an interactive user): an engine that
# refuses past N in flight gets at most N - headroom of the batch's, and a measured member keeps this many
# slots free. 1 measured best on the real vLLM engine (benchmarks/fleet_share.py, docs/flow-control.md).
DEFAULT_HEADROOM = 1
# How long a member's refusal edge (what of ours it held when it refused one) is remembered: the limit does
# not grow past it meanwhile, so the batch does not walk back into the edge it found (each walk costs an
# interactive user a refusal); after it, the limit may probe past the old edge again (the engine may have
# grown, or the other clients gone).
EDGE_MEMORY_S = 60.0


class FlowTicket:
    """One request admitted to `member`, and its start number there."""

    __slots__ = ("member", "seq")

    def __init__(self, member: MemberFlow, seq: int) -> None:
        self.member, self.seq = member, seq


class MemberFlow:
    """One member's limit and what happened to it. `limit` is what the member is believed to take of ours: it
    shrinks by SHRINK (and to what the member held when it refused) on an admission answer to a request sent
    under the current limit, and grows by one per `limit` requests answered (additive) while the member is not
    measured busy, never past `ceiling`, below FLOOR, nor (for EDGE_MEMORY_S) past the last refusal edge.
    Requests start while fewer than `cap` = limit - headroom are in flight (at least FLOOR)."""

    def __init__(self, name: str, ceiling: int, headroom: int = 0) -> None:
        self.name, self.ceiling, self.headroom = name, ceiling, headroom
        self.limit = float(ceiling)  # unmeasured members start at the ceiling
        self.cap = self._cap()
        self.in_flight = 0
        self.paused_until = -math.inf
        self.started = 0  # requests started (the ticket of each has its start number)
        self.shrunk_at = -1  # start number at the last shrink: an earlier request's rejection is old news
        self.hold_until = -math.inf  # no growth before this (HOLD_S after the last shrink)
        self.edge: int | None = None  # the most of ours it held when refusing, remembered until edge_until
        self.edge_until = -math.inf
        self._edge_before = 0  # the edge before the current wave of rejections
        self._wave_cap = float(ceiling)  # the current wave's limit, halved
        self._wave_sent = 0  # ours in flight when the current wave's first refusal came (it included)
        self._wave_refused = 0  # refusals of requests of the current wave
        self.rejections = 0
        self.pauses = 0
        self.ended_count = 0  # requests of ours to it that ended, however
        self.limits: Counter[int] = Counter()  # the cap each request was started under
        self.round: object = None  # the measured round `at_round` was counted for
        self.at_round = 0  # ours in flight when that round was first read

    def _cap(self) -> int:
        return max(FLOOR, int(self.limit) - self.headroom)

    def may_start(self, now: float) -> bool:
        return self.in_flight < self.cap and now >= self.paused_until

    def start(self) -> FlowTicket:
        self.in_flight += 1
        self.started += 1
        self.limits[self.cap] += 1
        return FlowTicket(self, self.started)

    def answered(self, now: float, grow: bool = True) -> None:
        self.in_flight -= 1
        self.ended_count += 1
        if grow and now >= self.hold_until:
            bound = self.ceiling if self.edge is None or now >= self.edge_until else min(self.ceiling, self.edge)
            if self.limit < bound:
                self.limit = min(float(bound), self.limit + 1.0 / self.limit)
                self.cap = self._cap()

    def rejected(self, t: FlowTicket, retry_after_s: float | None, now: float) -> None:
        self.in_flight -= 1
        self.ended_count += 1
        self.rejections += 1
        # What it holds of ours, counted over the wave: of the `_wave_sent` of ours in flight when its first
        # refusal came, `_wave_refused` were refused so far. Not read off one refusal's own `fit`: requests
        # overtake each other on the way (a loaded client or network), so a request started early can be the
        # one refused while later ones got in.
        if t.seq > self.shrunk_at:  # sent under the current limit: a new signal
            self._wave_cap = self.limit * SHRINK
            self._wave_sent, self._wave_refused = self.in_flight + 1, 1
            self.shrunk_at = self.started
            self.hold_until = now + HOLD_S
            self._edge_before = self.edge if self.edge is not None and now < self.edge_until else 0
        else:  # the same wave
            self._wave_refused += 1
        held = max(FLOOR, self._wave_sent - self._wave_refused)
        self.limit = max(float(FLOOR), min(self._wave_cap, float(held)))
        self.edge = max(self._edge_before, held)
        self.edge_until = now + EDGE_MEMORY_S
        self.cap = self._cap()
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

    def to_edn(self) -> EdnMap:
        return {kw("flow/member"): self.name, kw("flow/ceiling"): self.ceiling, kw("flow/headroom"): self.headroom,
                kw("flow/limit"): _spread(self.limits), kw("flow/rejections"): self.rejections,
                kw("flow/pauses"): self.pauses}


def _spread(limits: Counter[int]) -> EdnMap:
    """min/median/max of the cap requests were started under."""
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

    def reading(self, member: str) -> tuple[bool | None, tuple[int, object, int | None] | None]:
        """`admits(member)`, and `member`'s measured free slots with the round they were read in and the fewest
        of ours in flight that round can have counted busy (None: not known), or None for no count of them: all
        from one look at the view, as flow control asks them together before every request."""

    def begin(self, member: str) -> None:
        """One of ours started on `member`."""

    def end(self, member: str) -> None:
        """One of ours to `member` ended."""


# A pool's choice among the members flow control allows now: the member for `e`, or None (its view refuses all).
Choose = Callable[[BatchEntry, Sequence[str]], Union[str, None]]


class FlowControl:
    """Per member: in flight <= the member's cap (its AIMD limit less `headroom`, at most `ceiling`, the `-c`),
    not during its pause, only when the measured view (when there is one) admits a request to it with
    `headroom` slots left free; in all, at most `ceiling` in flight.

    The member of a request is `member_of(e)` (one server, or the URL the request names); for a pool, `members`
    and `choose`: the pool picks among the members under their limits, and `placed(e)` says which it picked."""

    def __init__(self, ceiling: int, member_of: Callable[[BatchEntry], str] | None = None, *,
                 capacity: MeasuredCapacity | None = None, clock: Callable[[], float] = time.monotonic,
                 headroom: int = 0, members: Sequence[str] = (), choose: Choose | None = None) -> None:
        if member_of is None and choose is None:
            raise ConfigError("flow control needs member_of, or members and choose")
        self.ceiling, self.member_of, self.capacity, self.clock = ceiling, member_of, capacity, clock
        self.headroom, self.choose = headroom, choose
        self.members: dict[str, MemberFlow] = {}
        for name in members:
            self.member(name)
        self.in_flight = 0
        self._placed: dict[int, str] = {}  # entry index -> the pool member chosen for it
        self._view_refused = False  # the last refusal was the measured view's (it changes with the next round)

    def member(self, name: str) -> MemberFlow:
        m = self.members.get(name)
        if m is None:
            m = self.members[name] = MemberFlow(name, self.ceiling, self.headroom)
        return m

    def _room(self, m: MemberFlow) -> bool:
        """The measured view leaves `headroom` slots of `m` free (counting ours started since its round's probe
        went out), or, while none of ours is in flight there, has a slot free at all."""
        cap = self.capacity
        if cap is None:
            return True
        admits, free = cap.reading(m.name)
        if admits is False:
            return False
        if free is None:
            return True
        slots, round_, counted = free
        if round_ is not m.round:
            # Ours started since the round's probe went out take slots it counted free. Counted from its first
            # read instead, a request started between the probe and that read was missed: a refusal.
            m.round, m.at_round = round_, m.in_flight if counted is None else counted
        # the headroom never takes a member's last free slot from a batch holding none there (FLOOR, as `_cap`):
        # a member with no more slots than the headroom would otherwise get nothing, ever
        keep = self.headroom if m.in_flight >= FLOOR else 0
        return slots - max(0, m.in_flight - m.at_round) > keep

    def admit(self, e: BatchEntry) -> object | None:
        if self.in_flight >= self.ceiling:
            return None
        now = self.clock()
        if self.choose is not None:
            allowed = [m.name for m in self.members.values() if m.may_start(now) and self._room(m)]
            if not allowed:
                self._view_refused = self.capacity is not None
                return None
            name = self.choose(e, allowed)
            if name is None:
                self._view_refused = True
                return None
            m = self.member(name)
            self._placed[e.index] = name
        else:
            assert self.member_of is not None
            m = self.member(self.member_of(e))
            if not m.may_start(now):
                return None
            if not self._room(m):
                self._view_refused = True
                return None
        if self.capacity is not None:
            self.capacity.begin(m.name)
        self._view_refused = False
        self.in_flight += 1
        return m.start()

    def placed(self, e: BatchEntry) -> str | None:
        """The pool member `admit` chose for `e` (None: not a pool, or not admitted)."""
        return self._placed.pop(e.index, None)

    def settled(self, ticket: object, outcome: Outcome) -> object | None:
        t = cast(FlowTicket, ticket)
        m = t.member
        self.in_flight -= 1
        if self.capacity is not None:
            self.capacity.end(m.name)
        if isinstance(outcome, AdmissionRejected):
            now = self.clock()
            m.rejected(t, outcome.retry_after_s, now)
            return (m, m.ended_count, m.paused_until > now)
        if isinstance(outcome, KotobaError) or outcome is None:
            m.ended()
        else:
            # no growth while the member is measured busy (a queue of its own): growing then only fills the
            # engine's queue, where an interactive request would wait or be refused
            grow = m.limit < m.ceiling and (self.capacity is None or self.capacity.admits(m.name) is not False)
            m.answered(self.clock() if grow else 0.0, grow)
        return None

    def admit_again(self, e: BatchEntry, mark: object) -> object | None:
        m, ended, paused = cast("tuple[MemberFlow, int, bool]", mark)
        if not paused and m.ended_count <= ended and m.in_flight:
            # no pause to wait out and no slot seen free since: only the view can say one is, or (a pool)
            # another member that may take it
            if self.capacity is None or self.capacity.admits(m.name) is not True:
                now = self.clock()
                if self.choose is None or not any(o is not m and o.may_start(now) for o in self.members.values()):
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
        return min(self.ceiling, sum(m.cap for m in self.members.values())) or self.ceiling

    @property
    def rejections(self) -> int:
        return sum(m.rejections for m in self.members.values())

    def to_edn(self) -> list[EdnMap]:
        return [m.to_edn() for m in self.members.values()]


# How often a request refused by the measured view looks again (the view itself refreshes by its interval).
CAPACITY_RECHECK_S = 0.05
