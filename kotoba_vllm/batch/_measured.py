"""The measured view flow control reads: the capacity package's view and verdicts, called, not copied.

- `ProbedCapacity`: for members reached without a pool (one `--base-url`, or the URLs requests name),
  a `CapacityView` per member fed by probe rounds the way the async pool feeds its own: a round at
  most `interval_s` old is read, an older one starts the next round in the background (one at a
  time) while the previous one is read up to one probe timeout longer; nothing is sent to a member
  before its first round is in (as the pool waits for its first); a member whose engine publishes
  nothing to probe (an OpenAI-compatible server) is left unmeasured after that first round.
- `PoolViewCapacity`: a pool already keeps the view (and counts its own requests in flight): flow
  control keeps a limit per member and asks the pool's view which of the members under their limits
  it would choose now (None: it would refuse), so the runner waits instead of making a local
  `:all-slots-busy` record, and the request goes to exactly that member.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Sequence

import httpx

from .._base_client import api_key_or_env, client_headers, server_root
from .._client import AsyncClient
from .._wire import AsyncWire, default_wire
from ..capacity._probe import PROBE_TIMEOUT, aprobe_endpoints, now_iso
from ..capacity._answer import CapacityAnswer, PoolCapacity
from ..capacity._verdict import PROBE_PATHS, least_loaded, merge_pool_capacity
from ..capacity._view import DEFAULT_INTERVAL_S, CapacityView
from ..pool import AsyncPool
from ._entry import BatchEntry
from ._flow import DEFAULT_HEADROOM, FlowControl


def flow_control_for(client: AsyncClient | AsyncPool, ceiling: int, *, backend: str = "auto",
                     api_key: str | None = None, interval_s: float | None = None, headroom: int = DEFAULT_HEADROOM
                     ) -> tuple[FlowControl, ProbedCapacity | None]:
    """Flow control for `run` or a Ray actor sending through `client` (an AsyncClient or AsyncPool), and
    the probe shell it owns (None for a pool, whose own view is read; `aclose` it when done). A pool's
    members each keep their own limit: flow control lets the pool choose among those under theirs."""
    if isinstance(client, AsyncPool):
        view = PoolViewCapacity(client)
        return FlowControl(ceiling, capacity=view, headroom=headroom, members=client.members, choose=view.choose), None
    key = api_key_or_env(api_key)
    limits = httpx.Limits(max_connections=None)
    keyed = default_wire(client_headers(key, None), PROBE_TIMEOUT, True, limits)
    # A member outside the client's configured origins is probed without the key, as its requests are sent.
    keyless = default_wire(client_headers(None, None), PROBE_TIMEOUT, True, limits) if key else None
    measured = ProbedCapacity(keyed, backend, interval_s=DEFAULT_INTERVAL_S if interval_s is None else interval_s,
                              keyless=keyless, trusted=client.trusted.allows)
    def member_of(e: BatchEntry) -> str:
        url = e.request.base_url if e.request is not None else None
        # read at each request: `run --local` points the client at the server it starts after this is built
        return server_root(url) if url else client.base_url

    return FlowControl(ceiling, member_of, capacity=measured, headroom=headroom), measured


def free_slots(a: CapacityAnswer | None) -> int | None:
    """The free slots a measured answer counts (llama.cpp's idle slots less those deferred; a queue engine's
    max running less running and waiting, when it publishes the max); None when it counts none."""
    if a is None or not a.measured:
        return None
    if a.slots is not None:
        return a.slots.idle - (a.slots.deferred or 0)
    q = a.queue
    if q is not None and q.max_running is not None:
        return q.max_running - q.running - q.waiting
    return None


class ProbedCapacity:
    def __init__(self, wire: AsyncWire, backend: str = "auto", *, interval_s: float = DEFAULT_INTERVAL_S,
                 timeout: httpx.Timeout = PROBE_TIMEOUT, keyless: AsyncWire | None = None,
                 trusted: Callable[[str], bool] | None = None) -> None:
        """`wire` may carry the API key; members `trusted` refuses are probed over `keyless` instead."""
        self.wire, self.backend, self.interval_s, self.timeout = wire, backend, interval_s, timeout
        self.keyless, self.trusted = keyless, trusted
        self.views: dict[str, CapacityView] = {}
        self.unprobed: set[str] = set()  # members with nothing to probe: unmeasured for good
        self._rounds: dict[str, asyncio.Task[Any]] = {}
        self._detected: dict[str, str] = {}
        self._limit_s = interval_s + (timeout.read or PROBE_TIMEOUT.read or 1.5)

    def admits(self, member: str) -> bool | None:
        if member in self.unprobed:
            return None
        view = self.views.get(member)
        if view is None:
            view = self.views[member] = CapacityView((member,), self.interval_s)
        now = time.monotonic()
        if not view.fresh(now):
            self._start_round(member, view)
        cap = view.snapshot
        if cap is None:
            # Its first round is out: wait for it (at most one probe timeout) rather than send blind. A member
            # whose slots the round counts would otherwise take the batch's first burst at the ceiling, and
            # refuse all but its slots of it.
            first = self._rounds.get(member)
            return False if first is not None and not first.done() else None
        if now - view.started > self._limit_s:
            return None  # no reading to go by any more
        return view.decide(cap, None).member is not None

    def reading(self, member: str) -> tuple[bool | None, tuple[int, object, int | None] | None]:
        admits = self.admits(member)
        if member in self.unprobed:
            return admits, None
        view = self.views.get(member)
        if view is None or view.snapshot is None:
            return admits, None
        cap = view.snapshot
        n = free_slots(cap.answer_for(member))
        return admits, None if n is None else (n, cap, _counted(view, member))

    def begin(self, member: str) -> None:
        view = self.views.get(member)
        if view is not None and member not in self.unprobed:  # nothing reads an unmeasured member's counts
            view.begin(member)

    def end(self, member: str) -> None:
        view = self.views.get(member)
        if view is not None and member not in self.unprobed:
            view.end(member, time.monotonic())

    def _start_round(self, member: str, view: CapacityView) -> None:
        r = self._rounds.get(member)
        if r is None or r.done():
            self._rounds[member] = asyncio.ensure_future(self._round(member, view))

    async def _round(self, member: str, view: CapacityView) -> None:
        started, starts = time.monotonic(), view.starts()
        try:
            answers = await aprobe_endpoints([member], self.backend, http=self._wire_for(member),
                                             timeout=self.timeout, detected=self._detected)
        except Exception:  # a probe never raises by design; if it does, the member is unmeasured, not the run
            self.unprobed.add(member)
            return
        view.record(merge_pool_capacity(answers, at=now_iso()), started, starts)
        if not answers[0].measured and not PROBE_PATHS.get(answers[0].backend or ""):
            self.unprobed.add(member)

    def _wire_for(self, member: str) -> AsyncWire:
        if self.keyless is not None and self.trusted is not None and not self.trusted(member):
            return self.keyless
        return self.wire

    async def aclose(self) -> None:
        for r in self._rounds.values():
            r.cancel()
        for r in self._rounds.values():
            try:
                await r
            except BaseException:  # a round cut short or failed: nothing to keep
                pass
        await self.wire.aclose()
        if self.keyless is not None:
            await self.keyless.aclose()


def _counted(view: CapacityView, member: str) -> int | None:
    """The fewest of ours in flight to `member` the view's snapshot round can have counted busy (None: not known)."""
    return None if view.counted is None else view.counted.get(member)


def _retrieve(t: "asyncio.Task[PoolCapacity]") -> None:
    if not t.cancelled():
        t.exception()  # a failed round is the next round's to report, not the loop's log


class PoolViewCapacity:
    """Would the pool admit a request now (by its own view, the round it would read), and to which member?"""

    def __init__(self, pool: AsyncPool) -> None:
        self.pool = pool
        self._first_round: asyncio.Task[PoolCapacity] | None = None
        # what the latest round says of each member (its answer, its free slots), read once a round: the round
        # changes only when a probe round lands, and flow control asks several times per request
        self._read: PoolCapacity | None = None
        self._by_member: dict[str, tuple[CapacityAnswer | None, int | None]] = {}

    def _round(self) -> PoolCapacity | None:
        view = self.pool.view
        cap = view.snapshot
        return cap if cap is not None and view.fresh(time.monotonic()) else None

    def _member(self, cap: PoolCapacity, member: str) -> tuple[CapacityAnswer | None, int | None]:
        if cap is not self._read:
            self._read, self._by_member = cap, {}
        found = self._by_member.get(member)
        if found is None:
            a = cap.answer_for(member)
            found = self._by_member[member] = (a, free_slots(a))
        return found

    def _measured(self, cap: PoolCapacity, member: str) -> bool:
        a = self._member(cap, member)[0]
        return a is not None and a.measured

    def _busy(self, cap: PoolCapacity, member: str) -> bool:
        a = self._member(cap, member)[0]
        return a is not None and a.busy

    def admits(self, member: str) -> bool | None:
        cap = self._round()
        if cap is None:
            return None  # the pool takes a round when it sends: let it
        return self.pool.view.admits(cap, (member,))

    def reading(self, member: str) -> tuple[bool | None, tuple[int, object, int | None] | None]:
        cap = self._round()
        if cap is None:
            return None, None
        n = self._member(cap, member)[1]
        return self.pool.view.admits(cap, (member,)), None if n is None else (n, cap, _counted(self.pool.view, member))

    def choose(self, e: BatchEntry, allowed: Sequence[str]) -> str | None:
        """The member the pool's view picks for `e` among `allowed` (its affinity, its spreading), on the
        latest round even when stale; None until the first round is in (it is started here)."""
        pool, view = self.pool, self.pool.view
        cap = self._round() or view.snapshot  # a stale round still says which members failed their probes
        if cap is None and view.interval_s <= 0:
            return least_loaded(allowed, view.inflight, view.sent)  # the pool probes before every send anyway
        if cap is None:
            # No round yet: a member picked blind may be one the first round would rule out (a trickling or
            # bombing /metrics), and the pool then has only that member to choose from. Wait for the round.
            if self._first_round is None:
                self._first_round = asyncio.ensure_future(pool.capacity())
                self._first_round.add_done_callback(_retrieve)
            return None
        affinity = pool.affinity.lookup(e.request) if e.request is not None else None
        name = view.decide(cap, affinity, allowed).member
        if name is not None and len(allowed) < len(pool.members) and not self._measured(cap, name) and any(
                self._measured(cap, m) and not self._busy(cap, m) for m in pool.members if m not in allowed):
            # The members the round measured with room are held back only by our own limits: wait for them
            # rather than spill onto one the round could not measure (a probe past its deadline, too large).
            return None
        return name

    def begin(self, member: str) -> None:
        pass  # the pool counts its own requests

    def end(self, member: str) -> None:
        pass
