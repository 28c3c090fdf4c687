"""Capacity as data: per-engine probes, verdicts, the pool merge and demotion (DESIGN §4).

Pure core: `_parse` (bytes -> numbers), `_verdict` (numbers -> answers, merge, demote,
admit). Shells: `_probe` (sync threads / async gather, short timeouts).
"""

from .._errors import Unparsable
from ._answer import (ALL_SLOTS_BUSY, SLOT_AVAILABLE, UNMEASURED, VERDICTS, CapacityAnswer, Evidence, PoolCapacity,
                      Queue, Slots)
from ._parse import Fetched, metric_sums
from ._probe import (PROBE_TIMEOUT, aprobe_capacity, aprobe_endpoints, aprobe_pool, probe_capacity, probe_endpoints,
                     probe_pool)
from ._verdict import (PROBE_PATHS, VLLM_LOAD, Admission, admit, capacity_answer, demote_busy_endpoints,
                       merge_pool_capacity, probe_paths, unmeasured)

__all__ = [
    "ALL_SLOTS_BUSY", "Admission", "CapacityAnswer", "Evidence", "Fetched", "PROBE_PATHS", "PROBE_TIMEOUT",
    "PoolCapacity", "Queue", "SLOT_AVAILABLE", "Slots", "UNMEASURED", "Unparsable", "VERDICTS", "admit",
    "aprobe_capacity", "aprobe_endpoints", "aprobe_pool", "capacity_answer", "demote_busy_endpoints",
    "merge_pool_capacity", "metric_sums", "probe_capacity", "probe_endpoints", "probe_paths", "probe_pool",
    "unmeasured", "VLLM_LOAD",
]
