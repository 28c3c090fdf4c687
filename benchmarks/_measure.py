"""Measurement primitives: interleaved rounds so drift on a shared machine hits every contender alike."""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import time
import tracemalloc
from typing import Any, Awaitable, Callable, Mapping

Names = Mapping[str, Callable[[], Any]]


def _rotations(names: list[str], r: int) -> list[str]:
    k = r % len(names)
    return names[k:] + names[:k]


def latency_ms(fns: Names, n: int, warmup: int = 20) -> dict[str, float]:
    """Median wall time of one call, `n` calls each, interleaved one call at a time."""
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    samples: dict[str, list[float]] = {k: [] for k in names}
    for r in range(n):
        for name in _rotations(names, r):
            t = time.perf_counter()
            fns[name]()
            samples[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) * 1e3 for k, v in samples.items()}


def cpu_us(fns: Names, rounds: int, per_round: int, units: Callable[[Any], int] | None = None) -> dict[str, float]:
    """Client-process CPU (user+sys, `time.process_time`) per call — or per unit, when `units(result)` counts
    what one call produced (e.g. streamed chunks). Blocks of `per_round` calls, interleaved by round."""
    names = list(fns)
    cpu = {k: 0.0 for k in names}
    count = {k: 0 for k in names}
    for name in names:
        fns[name]()
    for r in range(rounds):
        for name in _rotations(names, r):
            fn = fns[name]
            gc.collect()
            p = time.process_time()
            for _ in range(per_round):
                out = fn()
                count[name] += units(out) if units else 1
            cpu[name] += time.process_time() - p
    return {k: cpu[k] / count[k] * 1e6 for k in names}


def rss_kb() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def memory_growth(fn: Callable[[], Any], total: int, first: int) -> dict[str, float]:
    """Python heap (tracemalloc) and RSS after `first` calls and after `total`: flat means no per-request leak."""
    for _ in range(first):
        fn()
    gc.collect()
    tracemalloc.start()
    heap0, rss0 = tracemalloc.get_traced_memory()[0], rss_kb()
    for _ in range(total - first):
        fn()
    gc.collect()
    heap1, rss1 = tracemalloc.get_traced_memory()[0], rss_kb()
    tracemalloc.stop()
    return {"heap_growth_kb": (heap1 - heap0) / 1024, "rss_growth_kb": float(rss1 - rss0),
            "per_request_bytes": (heap1 - heap0) / max(1, total - first)}


async def throughput(fn: Callable[[], Awaitable[Any]], concurrency: int, total: int) -> float:
    """Requests per second with `concurrency` workers sharing `total` requests."""
    left = total

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await fn()

    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total / (time.perf_counter() - t)


async def memory_per_stream(open_one: Callable[[], Awaitable[Callable[[], Awaitable[None]]]], k: int) -> float:
    """Python heap held per open stream (KB): `k` streams opened and one delta read from each, then closed."""
    closer = await open_one()
    await closer()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    closers = await asyncio.gather(*(open_one() for _ in range(k)))
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    for c in closers:
        await c()
    return held / k / 1024
