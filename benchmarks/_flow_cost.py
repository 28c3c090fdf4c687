"""h. Flow control's client CPU per request, paired with `--flow-control off`, in CPU time.

Two canned servers (each answering a POST after 20 ms, on core 1; the client on core 0):
- one that never rejects (the plain canned server `run` is measured against in d);
- one with 8 slots that `GET /slots` reports in llama.cpp's shape and that answers 429 to a POST beyond 8
  in flight (a fleet member that refuses rather than queues), spoken to as `--backend llamacpp` so flow
  control reads its slots.

Per server, every round runs `run` with flow control on, with it off, and off once more (an A/A pair that
shows the method's own noise), in a rotating order, each in its own process. The figure is the median over
rounds of each round's on/off CPU ratio (`_throughput.paired`): the machine's level moves between rounds,
and two runs back to back mostly share it.
"""

from __future__ import annotations

import os
import statistics
from typing import Any, Callable

from _throughput import child, paired, summarise
from canned_server import CannedServer

# (contender on, off, off again) per server: (label, slots, contenders)
SERVERS: tuple[tuple[str, int, tuple[str, str, str]], ...] = (
    ("never rejects", 0, ("kotoba-run-flow-on", "kotoba-run-flow-off", "kotoba-run-flow-off-again")),
    ("8 slots + 429", 8, ("kotoba-run-slots", "kotoba-run-slots-flow-off", "kotoba-run-slots-flow-off-again")),
)
# the Done-when's budgets: within noise (read as 3%, beside the A/A figure) and at most 5%
TARGETS = {0: 1.03, 8: 1.05}


def measure(conc: int, n: int, rounds: int, step: Callable[[str], None]) -> tuple[list[dict[str, Any]], list[str]]:
    """Each contender's summary (with `paired_cpu_ratio` to flow control off, and `rejected_per_round`)."""
    results: list[dict[str, Any]] = []
    notes: list[str] = []
    for label, slots, names in SERVERS:
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        with CannedServer(delay_ms=20, cpu=1, slots=slots) as srv:
            for r in range(rounds):
                order = list(names[r % 3:] + names[:r % 3])
                for name in order:
                    step(f"h  {label}, conc {conc} round {r + 1}/{rounds}: {name}")
                    before = srv.stats(0)
                    res = child(name, srv.base_urls[:1], conc, n)
                    res["rejected"] = srv.stats(0).get("rejected", 0) - before.get("rejected", 0)
                    res["load_1m"] = os.getloadavg()[0]
                    runs[name].append(res)
        base = runs[names[1]]
        for name in names:
            s = summarise(name, conc, n, runs[name])
            s["server"] = label
            s["rejected_per_round"] = [x.get("rejected", 0) for x in runs[name]]
            if slots and not any("error" in x for x in runs[name]):
                s.pop("error", None)  # 429s are records too: not every answer is the canned text
            if name != names[1]:
                p = paired(runs[name], base)
                if p is not None:
                    s["paired_cpu_ratio"] = p["cpu"]
                    s["rounds_cpu_ratio"] = [a["cpu_s"] / b["cpu_s"] for a, b in zip(runs[name], base)
                                             if a.get("cpu_s") and b.get("cpu_s")]
            results.append(s)
            if s.get("error"):
                notes.append(f"h {label} {name}: {s['error']}")
    return results, notes


def rows(results: list[dict[str, Any]], conc: int,
         row: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for label, slots, (on, off, again) in SERVERS:
        at = {r["contender"]: r for r in results if r.get("server") == label}
        if on not in at or off not in at:
            continue
        a, b, aa = at[on], at[off], at.get(again, {})
        spread = a.get("rounds_cpu_ratio") or []
        out.append(row(
            f"h. flow control CPU per request, {label}, conc {conc}", "canned+20ms" + (" 8 slots" if slots else ""),
            "x off", {"kotoba": a.get("paired_cpu_ratio"), "off": 1.0}, (("off", TARGETS[slots]),),
            f"paired by round over {len(spread)} rounds (on/off per round: "
            f"{', '.join(f'{x:.3f}' for x in spread)}); the method's noise, the same code twice (off again/off): "
            f"{_x(aa.get('paired_cpu_ratio'))}; "
            f"medians {a.get('cpu_ms_per_req') or 0:.3f} ms on, {b.get('cpu_ms_per_req') or 0:.3f} ms off; "
            f"429s per run on {_median(a['rejected_per_round'])}, off {_median(b['rejected_per_round'])}"))
    return out


def _x(v: float | None) -> str:
    return "not measured" if v is None else f"{v:.3f}x"


def _median(xs: list[int]) -> str:
    return f"{statistics.median(xs):.0f}" if xs else "-"
