"""The capacity answer as typed data (DESIGN §4), with its EDN shape.

Per endpoint::

    {:capacity/endpoint "http://h:8080" :capacity/backend :llamacpp
     :capacity/verdict :slot-available :capacity/enforced? true
     :capacity/slots {:capacity/total 2 :capacity/busy 1 :capacity/idle 1 :capacity/deferred 0}
     :capacity/evidence {:capacity/probe "/slots" :capacity/probes ["/slots" "/metrics" "/props"]
                         :capacity/at "2026-11-30T01:20:00.123Z" :capacity/ms 3.2}}

An unmeasured answer has no slot or queue numbers at all (never zeros) and says why
in `:capacity/reason`. The pool answer counts measured-available, measured-busy and
unmeasured members separately.
"""

from __future__ import annotations

import attrs

from .._codec import BOOL, INT, KW, MANY, NESTED, NUM, STR, register
from .._edn import Edn, Keyword
from .._model import BACKENDS, from_edn, to_edn

SLOT_AVAILABLE = "slot-available"
ALL_SLOTS_BUSY = "all-slots-busy"
UNMEASURED = "capacity-unmeasured"
VERDICTS = (SLOT_AVAILABLE, ALL_SLOTS_BUSY, UNMEASURED)


@register
@attrs.frozen
class Slots:
    """llama.cpp: fixed slots (`--parallel`); `deferred` = requests already waiting for one."""

    total: int = attrs.field(metadata={"edn": "capacity/total", "codec": INT})
    busy: int = attrs.field(metadata={"edn": "capacity/busy", "codec": INT})
    idle: int = attrs.field(metadata={"edn": "capacity/idle", "codec": INT})
    deferred: int | None = attrs.field(default=None, metadata={"edn": "capacity/deferred", "codec": INT})


@register
@attrs.frozen
class Queue:
    """vLLM / SGLang: continuous batching, so a running count and a waiting queue instead of slots."""

    running: int = attrs.field(metadata={"edn": "capacity/running", "codec": INT})
    waiting: int = attrs.field(metadata={"edn": "capacity/waiting", "codec": INT})
    max_running: int | None = attrs.field(default=None, metadata={"edn": "capacity/max-running", "codec": INT})
    kv_cache_usage: float | None = attrs.field(default=None,
                                               metadata={"edn": "capacity/kv-cache-usage", "codec": NUM})
    server_load: int | None = attrs.field(default=None, metadata={"edn": "capacity/server-load", "codec": INT})


@register
@attrs.frozen
class Evidence:
    """Which probe decided, every probe asked, when, and how long the deciding probe took."""

    probe: str | None = attrs.field(default=None, metadata={"edn": "capacity/probe", "codec": STR})
    probes: tuple[str, ...] | None = attrs.field(default=None,
                                                 metadata={"edn": "capacity/probes", "codec": MANY(STR)})
    at: str | None = attrs.field(default=None, metadata={"edn": "capacity/at", "codec": STR})
    ms: float | None = attrs.field(default=None, metadata={"edn": "capacity/ms", "codec": NUM})
    series: int | None = attrs.field(default=None, metadata={"edn": "capacity/series", "codec": INT})
    note: str | None = attrs.field(default=None, metadata={"edn": "capacity/note", "codec": STR})


@register
@attrs.frozen
class CapacityAnswer:
    endpoint: str = attrs.field(metadata={"edn": "capacity/endpoint", "codec": STR})
    verdict: str = attrs.field(metadata={"edn": "capacity/verdict", "codec": KW(*VERDICTS)})
    enforced: bool = attrs.field(metadata={"edn": "capacity/enforced?", "codec": BOOL})
    backend: str | None = attrs.field(default=None, metadata={"edn": "capacity/backend", "codec": KW(*BACKENDS)})
    slots: Slots | None = attrs.field(default=None, metadata={"edn": "capacity/slots", "codec": NESTED(Slots)})
    queue: Queue | None = attrs.field(default=None, metadata={"edn": "capacity/queue", "codec": NESTED(Queue)})
    evidence: Evidence | None = attrs.field(default=None,
                                            metadata={"edn": "capacity/evidence", "codec": NESTED(Evidence)})
    reason: str | None = attrs.field(default=None, metadata={"edn": "capacity/reason", "codec": STR})
    # Unmeasured answers only: did any probe get an HTTP answer? (a closed port: false)
    reachable: bool | None = attrs.field(default=None, metadata={"edn": "capacity/reachable?", "codec": BOOL})

    @property
    def measured(self) -> bool:
        return self.verdict != UNMEASURED

    @property
    def busy(self) -> bool:
        """Measured busy: the only state that demotes a member or refuses a request."""
        return self.verdict == ALL_SLOTS_BUSY

    @property
    def available(self) -> bool:
        return self.verdict == SLOT_AVAILABLE

    def to_edn(self) -> dict[Keyword, Edn]:
        return to_edn(self)

    @classmethod
    def from_edn(cls, m: Edn) -> "CapacityAnswer":
        return from_edn(m, cls)


@register
@attrs.frozen
class PoolCapacity:
    """Every member's answer, in pool order, and the three counts kept apart.

    `verdict`: :slot-available when some member is measured available; else
    :capacity-unmeasured when some member could not be measured (admitted, not
    enforced); :all-slots-busy only when every member was measured busy."""

    members: tuple[CapacityAnswer, ...] = attrs.field(
        metadata={"edn": "capacity/members", "codec": MANY(NESTED(CapacityAnswer))})
    verdict: str = attrs.field(metadata={"edn": "capacity/verdict", "codec": KW(*VERDICTS)})
    enforced: bool = attrs.field(metadata={"edn": "capacity/enforced?", "codec": BOOL})
    measured_available: int = attrs.field(metadata={"edn": "capacity/measured-available", "codec": INT})
    measured_busy: int = attrs.field(metadata={"edn": "capacity/measured-busy", "codec": INT})
    unmeasured: int = attrs.field(metadata={"edn": "capacity/unmeasured", "codec": INT})
    at: str | None = attrs.field(default=None, metadata={"edn": "capacity/at", "codec": STR})

    def to_edn(self) -> dict[Keyword, Edn]:
        return to_edn(self)

    @classmethod
    def from_edn(cls, m: Edn) -> "PoolCapacity":
        return from_edn(m, cls)

    def answer_for(self, endpoint: str) -> CapacityAnswer | None:
        return next((a for a in self.members if a.endpoint == endpoint), None)
