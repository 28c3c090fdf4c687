"""The cyclic garbage collector while a batch runs.

At 256 in flight a batch keeps tens of thousands of objects alive for the 20+ ms each request
waits; CPython's defaults (a young collection every 700 net allocations, full collections that
walk every module and class loaded) traverse them again and again, so the collector's share of
`run`'s CPU grows with the number in flight (the measurements: CHANGELOG.md, performance history). A request leaves no cyclic garbage behind (the sender,
the wire and the record free by reference count), so during the run everything alive at its
start (modules, the client) is left out of collection (`gc.freeze`) and young collections come
every 20,000 net allocations. Both are undone when the run ends.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

YOUNG_THRESHOLD = 20_000


@contextlib.contextmanager
def batch_collector() -> Iterator[None]:
    before = gc.get_threshold()
    already_frozen = gc.get_freeze_count() > 0  # someone else froze: leave their freeze alone
    gc.freeze()
    gc.set_threshold(max(before[0], YOUNG_THRESHOLD), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        if not already_frozen:
            gc.unfreeze()
