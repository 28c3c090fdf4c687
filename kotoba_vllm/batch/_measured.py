"""The measured view flow control reads: the capacity package's view and verdicts, called, not copied.

- `ProbedCapacity`: for members reached without a pool (one `--base-url`, or the URLs requests name),
  a `CapacityView` per member fed by probe rounds the way the async pool feeds its own: a round at
  most `interval_s` old is read, an older one starts the next round in the background (one at a
  time) while the previous one is read up to one probe timeout longer; a member whose engine
  publishes nothing to probe (an OpenAI-compatible server) is left unmeasured after its first round.
- `PoolViewCapacity`: a pool already keeps the view (and counts its own requests in flight): flow
  control asks it whether the pool would admit a request now, so the runner waits instead of making
  a local `:all-slots-busy` record.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import httpx

from .._base_client import api_key_or_env, client_headers, server_root
from .._client import AsyncClient
from .._wire import AsyncWire, default_wire
from ..capacity._probe import PROBE_TIMEOUT, aprobe_endpoints, now_iso
from ..capacity._verdict import PROBE_PATHS, merge_pool_capacity
from ..capacity._view import DEFAULT_INTERVAL_S, CapacityView
from ..pool import AsyncPool
from ._entry import BatchEntry
from ._flow import FlowControl

POOL_MEMBER = "pool"  # a pool is one member to flow control: it spreads and refuses by its own view


def flow_control_for(client: AsyncClient | AsyncPool, ceiling: int, *, backend: str = "auto", api_key: str | None = None,
                     interval_s: float | None = None) -> tuple[FlowControl, ProbedCapacity | None]:
    """Flow control for `run` or a Ray actor sending through `client` (an AsyncClient or AsyncPool), and
    the probe shell it owns (None for a pool, whose own view is read; `aclose` it when done)."""
    if isinstance(client, AsyncPool):
        return FlowControl(ceiling, lambda e: POOL_MEMBER, capacity=PoolViewCapacity(client)), None
    key = api_key_or_env(api_key)
    limits = httpx.Limits(max_connections=None)
    keyed = default_wire(client_headers(key, None), PROBE_TIMEOUT, True, limits)
    # A member outside the client's configured origins is probed without the key, as its requests are sent.
    keyless = default_wire(client_headers(None, None), PROBE_TIMEOUT, True, limits) if key else None
    measured = ProbedCapacity(keyed, backend, interval_s=DEFAULT_INTERVAL_S if interval_s is None else interval_s,
                              keyless=keyless, trusted=client.trusted.allows)

    def member_of(e: BatchEntry) -> str:
        url = e.request.base_url if e.request is not None else None
        return server_root(url) if url else client.base_url

    return FlowControl(ceiling, member_of, capacity=measured), measured


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
        if cap is None or now - view.started > self._limit_s:
            return None  # no reading to go by (yet, or any more)
        return view.decide(cap, None).member is not None

    def begin(self, member: str) -> None:
        view = self.views.get(member)
        if view is not None:
            view.begin(member)

    def end(self, member: str) -> None:
        view = self.views.get(member)
        if view is not None:
            view.end(member, time.monotonic())

    def _start_round(self, member: str, view: CapacityView) -> None:
        r = self._rounds.get(member)
        if r is None or r.done():
            self._rounds[member] = asyncio.ensure_future(self._round(member, view))

    async def _round(self, member: str, view: CapacityView) -> None:
        started = time.monotonic()
        try:
            answers = await aprobe_endpoints([member], self.backend, http=self._wire_for(member),
                                             timeout=self.timeout, detected=self._detected)
        except Exception:  # a probe never raises by design; if it does, the member is unmeasured, not the run
            self.unprobed.add(member)
            return
        view.record(merge_pool_capacity(answers, at=now_iso()), started)
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


class PoolViewCapacity:
    """Would the pool admit a request now (by its own view, the round it would read)?"""

    def __init__(self, pool: AsyncPool) -> None:
        self.pool = pool

    def admits(self, member: str) -> bool | None:
        view = self.pool.view
        cap = view.snapshot
        if cap is None or not view.fresh(time.monotonic()):
            return None  # the pool takes a round when it sends: let it
        return view.decide(cap, None).member is not None

    def begin(self, member: str) -> None:
        pass  # the pool counts its own requests

    def end(self, member: str) -> None:
        pass
