"""h. Flow control's client CPU per request, paired with `--flow-control off`, in CPU time.

Two canned servers (each answering a POST after 20 ms, on core 1; the client on core 0):
- one that never rejects (the plain canned server `run` is measured against in d);
- one with 8 slots that `GET /slots` reports in llama.cpp's shape and that answers 429 to a POST beyond 8
  in flight (a fleet member that refuses rather than queues), spoken to as `--backend llamacpp` so flow
  control reads its slots.

Per server, every round runs `run -c 64` with flow control on, with it off, and off once more (an A/A pair
that shows the method's own noise), in a rotating order, each in its own process; against the 8 slots also
`--flow-control off -c 8`, the fixed limit a user would have to know to send without refusals. The figure is
the median over rounds of each round's CPU ratio (`_throughput.paired`): the machine's level moves between
rounds, and two runs back to back mostly share it.

Against the 8 slots, `-c 64` with flow control off turns most requests into 429 records at once, which cost
less than answers; so beside the ratio per request the rows give CPU per answered request, and flow control
against the fixed `-c 8` (both answer every request). Raw aiohttp at `-c 8` over raw aiohttp at `-c 64`,
against the same member, is the same pairing for a client with no bookkeeping at all: what the 8 slots
themselves cost per request, the floor under flow control's ratio.
"""

from __future__ import annotations

import os
import statistics
from typing import Any, Callable

from _throughput import child, paired, summarise
from canned_server import CannedServer

# per server: (label, slots, (flow control on, off, off again, [a fixed -c equal to the slots,
#   raw aiohttp at -c 64 and at -c the slots: the same pairing for a client with no bookkeeping]))
SERVERS: tuple[tuple[str, int, tuple[str, ...]], ...] = (
    ("never rejects", 0, ("kotoba-run-flow-on", "kotoba-run-flow-off", "kotoba-run-flow-off-again")),
    ("8 slots + 429", 8, ("kotoba-run-slots", "kotoba-run-slots-flow-off", "kotoba-run-slots-flow-off-again",
                          "kotoba-run-slots-fixed", "aiohttp-slots", "aiohttp-slots-fixed")),
)
# the Done-when's budgets: within noise (read as 3%, beside the A/A figure) and at most 5%
TARGETS = {0: 1.03, 8: 1.05}


def measure(conc: int, n: int, rounds: int, step: Callable[[str], None]) -> tuple[list[dict[str, Any]], list[str]]:
    """Each contender's summary, with `paired_cpu_ratio` to flow control off (and, for flow control against
    the slots, `paired_cpu_ratio_to_fixed`), `rejected_per_round` and `good_per_round`."""
    results: list[dict[str, Any]] = []
    notes: list[str] = []
    for label, slots, names in SERVERS:
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        with CannedServer(delay_ms=20, cpu=1, slots=slots) as srv:
            for r in range(rounds):
                k = r % len(names)
                for name in names[k:] + names[:k]:
                    step(f"h  {label}, conc {conc} round {r + 1}/{rounds}: {name}")
                    before = srv.stats(0)
                    res = child(name, srv.base_urls[:1], slots if name.endswith("-fixed") else conc, n)
                    res["rejected"] = srv.stats(0).get("rejected", 0) - before.get("rejected", 0)
                    res["load_1m"] = os.getloadavg()[0]
                    runs[name].append(res)
        for name in names:
            s = summarise(name, slots if name.endswith("-fixed") else conc, n, runs[name])
            s["server"] = label
            s["rejected_per_round"] = [x.get("rejected", 0) for x in runs[name]]
            s["good_per_round"] = [x.get("good", 0) for x in runs[name]]
            if slots and not any("error" in x for x in runs[name]):
                s.pop("error", None)  # 429s are records too: not every answer is the canned text
            if name != names[1]:
                _pair(s, runs[name], runs[names[1]], "")
            if slots and name == names[0]:
                _pair(s, runs[name], runs[names[3]], "_to_fixed")
            if slots and name == names[5]:  # raw aiohttp within the slots, over itself flooding them
                _pair(s, runs[name], runs[names[4]], "_to_flood")
            results.append(s)
            if s.get("error"):
                notes.append(f"h {label} {name}: {s['error']}")
    return results, notes


def _pair(s: dict[str, Any], mine: list[dict[str, Any]], base: list[dict[str, Any]], suffix: str) -> None:
    p = paired(mine, base)
    if p is not None:
        s["paired_cpu_ratio" + suffix] = p["cpu"]
        s["rounds_cpu_ratio" + suffix] = [a["cpu_s"] / b["cpu_s"] for a, b in zip(mine, base)
                                          if a.get("cpu_s") and b.get("cpu_s")]


def rows(results: list[dict[str, Any]], conc: int,
         row: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for label, slots, names in SERVERS:
        at = {r["contender"]: r for r in results if r.get("server") == label}
        on, off, again = names[:3]
        if on not in at or off not in at:
            continue
        a, b, aa = at[on], at[off], at.get(again, {})
        out.append(row(
            f"h. flow control CPU per request, {label}, conc {conc}", "canned+20ms" + (" 8 slots" if slots else ""),
            "x off", {"kotoba": a.get("paired_cpu_ratio"), "off": 1.0}, (("off", TARGETS[slots]),),
            f"paired by round ({_rounds(a.get('rounds_cpu_ratio'))}); the method's noise, the same code twice "
            f"(off again/off): {_x(aa.get('paired_cpu_ratio'))}; medians {_ms(a)} on, {_ms(b)} off; "
            f"429s per run: on {_median(a['rejected_per_round'])}, off {_median(b['rejected_per_round'])}; "
            f"answers per run: on {_median(a['good_per_round'])}, off {_median(b['good_per_round'])}"
            + (f"; CPU per answered request: on {_per_answer(a)}, off {_per_answer(b)}" if slots else "")))
        fixed = at.get(names[3]) if len(names) > 3 else None
        if fixed is not None:
            out.append(row(
                f"h. flow control CPU per request, {label}, conc {conc} against a fixed -c {slots}",
                "canned+20ms 8 slots", "x fixed", {"kotoba": a.get("paired_cpu_ratio_to_fixed"), "fixed": 1.0}, (),
                f"flow control at -c {conc} against --flow-control off -c {slots}, the limit a user would have to "
                f"know to send without refusals; paired by round ({_rounds(a.get('rounds_cpu_ratio_to_fixed'))}); "
                f"medians {_ms(a)} on, {_ms(fixed)} fixed; 429s per run: on {_median(a['rejected_per_round'])}, "
                f"fixed {_median(fixed['rejected_per_round'])}; answers per run: on {_median(a['good_per_round'])}, "
                f"fixed {_median(fixed['good_per_round'])}; wall time per run: on {_wall(a)}, fixed {_wall(fixed)}"))
        polite, flood = (at.get(names[5]), at.get(names[4])) if len(names) > 5 else (None, None)
        if polite is not None and flood is not None:
            out.append(row(
                f"h. the floor of the pairing, {label}: raw aiohttp at -c {slots} over raw aiohttp at -c {conc}",
                "canned+20ms 8 slots", "x flooding", {"aiohttp": polite.get("paired_cpu_ratio_to_flood"),
                                                     "flooding": 1.0}, (),
                f"the first row's pairing for a client with no bookkeeping at all: raw aiohttp kept within the "
                f"{slots} slots (no refusals) over raw aiohttp at -c {conc} (refused beyond them, each 429 taken "
                f"as its answer); paired by round ({_rounds(polite.get('rounds_cpu_ratio_to_flood'))}); "
                f"medians {_ms(polite)} within, {_ms(flood)} flooding; 429s per run: within "
                f"{_median(polite['rejected_per_round'])}, flooding {_median(flood['rejected_per_round'])}; "
                f"flow control's own row divided by this: {_x(_over(a.get('paired_cpu_ratio'), polite.get('paired_cpu_ratio_to_flood')))}"))
    return out


def _over(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _rounds(ratios: list[float] | None) -> str:
    return f"{len(ratios or [])} rounds: " + ", ".join(f"{x:.3f}" for x in ratios or [])


def _ms(r: dict[str, Any]) -> str:
    v = r.get("cpu_ms_per_req")
    return "not measured" if v is None else f"{v:.3f} ms"


def _per_answer(r: dict[str, Any]) -> str:
    good = statistics.median(r["good_per_round"]) if r.get("good_per_round") else 0
    v = r.get("cpu_ms_per_req")
    return "no answers" if not good or v is None else f"{v * r['n'] / good:.3f} ms"


def _wall(r: dict[str, Any]) -> str:
    v = r.get("req_per_s")
    return "not measured" if not v else f"{r['n'] / v:.1f} s"


def _x(v: float | None) -> str:
    return "not measured" if v is None else f"{v:.3f}x"


def _median(xs: list[int]) -> str:
    return f"{statistics.median(xs):.0f}" if xs else "-"
