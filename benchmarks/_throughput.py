"""Batch throughput at 1/16/64/256 in flight: every contender in its own process (`_peers.py`).

The client runs pinned to core 0 and the canned server (answering each POST after 20 ms) to
core 1 where `taskset` exists. Per run: client CPU (its process and children, start-up
excluded), throughput, p50/p99 latency, good answers (all N must be the canned text) and
distinct connections the server accepted. Contenders rotate between rounds; the median of the
rounds is reported. `run --pool` goes to two members with vLLM's probes (which they do not
answer: both members are unmeasured), counting probe requests and the split; the members are
two ports of the same server process, so the pool and the plain contenders get the same server.
The plain `run`, the pool and `run --backend vllm` on one member may get more rounds than the rest
(the three alone, after the rounds with everybody); their medians are over all of their rounds.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
from typing import Any

from canned_server import CannedServer

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.join(HERE, "_peers.py")
CONTENDERS = ("aiohttp", "kotoba", "kotoba-run", "httpx", "httpx2", "openai", "flexllm", "kotoba-httpx")
# `run` on each loop it can own, beside raw aiohttp on each (asyncio's: "aiohttp")
LOOP_CONTENDERS = ("kotoba-run-asyncio", "kotoba-run-uvloop", "aiohttp-uvloop")
PROBE_PATHS = ("/metrics", "/load")  # whichever of them vLLM's probe asks
CHAT = "/v1/chat/completions"
# run alongside the plain `run` (when it is a contender): the pool, and the pool's dialect on one member
POOL_GROUP = ("kotoba-run", "kotoba-run-pool", "kotoba-run-vllm")


def available(names: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Contenders whose library is installed, and notes for the missing ones."""
    import importlib.util
    need = {"aiohttp": "aiohttp", "httpx2": "httpx2", "openai": "openai", "flexllm": "flexllm",
            "aiohttp-uvloop": "uvloop", "kotoba-run-uvloop": "uvloop"}
    ok, notes = [], []
    for n in names:
        mod = need.get(n)
        if mod is None or importlib.util.find_spec(mod) is not None:
            ok.append(n)
        else:
            notes.append(f"{n} not measured: {mod} is not installed (pip install 'kotoba-vllm[bench]')")
    return ok, notes


def pinned(argv: list[str], cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu)] + argv if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else argv


def child(name: str, urls: list[str], conc: int, n: int) -> dict[str, Any]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(pinned([sys.executable, PEERS, name, ",".join(urls), str(conc), str(n)], 0),
                       capture_output=True, text=True, timeout=900)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0 or not r.stdout.strip():
        return {"error": (r.stderr or r.stdout)[-600:], "good": 0, "n": n}
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    out["process_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out


def _delta(a: dict[str, Any], b: dict[str, Any], path: str) -> int:
    return int(b["requests"].get(path, 0)) - int(a["requests"].get(path, 0))


def matrix(concs: tuple[int, ...], n_for: dict[int, int], rounds_for: int | dict[int, int], step: Any,
           contenders: tuple[str, ...] = CONTENDERS,
           group_rounds_for: dict[int, int] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Every contender at every concurrency; `rounds_for` is a count of rounds, or one per concurrency.

    `group_rounds_for` gives the plain `run`, the pool and the pool's dialect on one member more rounds of
    their own (the three alone, back to back) after the rounds with every contender: the pool's targets are
    ratios to the plain `run` read round by round, and five rounds left one noisy round deciding them."""
    names, notes = available(contenders)
    results: list[dict[str, Any]] = []
    # One server process on core 1 listening on two ports: every contender talks to the first port,
    # `run --pool` to both (two members with exactly the server the plain contenders have alone).
    with CannedServer(delay_ms=20, cpu=1, ports=2) as srv:
        notes.append(f"server answers each POST after 20 ms; client on core 0, server on core 1 "
                     f"({'taskset' if shutil.which('taskset') else 'no taskset: not pinned'}); the pool's two "
                     f"members are two ports of that one server process")
        for conc in concs:
            n = n_for[conc]
            rounds = rounds_for if isinstance(rounds_for, int) else rounds_for[conc]
            runs: dict[str, list[dict[str, Any]]] = {k: [] for k in dict.fromkeys(names + list(POOL_GROUP[1:]))}
            group_rounds = max(rounds, (group_rounds_for or {}).get(conc, 0))
            for r in range(group_rounds):
                order = names[r % len(names):] + names[:r % len(names)]
                if r >= rounds:  # the pool group's own rounds
                    order = [n for n in order if n == POOL_GROUP[0]]
                    if not order:
                        break
                for name in _with_pool(order, r):
                    step(f"d  conc {conc} round {r + 1}/{group_rounds}: {name}")
                    sa, sb = srv.stats(0), srv.stats(1)
                    urls = srv.base_urls if name == "kotoba-run-pool" else srv.base_urls[:1]
                    res = child(name, urls, conc, n)
                    ea, eb = srv.stats(0), srv.stats(1)
                    res["connections"] = ea["connections"] - sa["connections"] - 1  # minus the stats call's own
                    res["load_1m"] = os.getloadavg()[0]
                    if name == "kotoba-run-pool":
                        res["connections"] += eb["connections"] - sb["connections"] - 1
                        probes = sum(_delta(sa, ea, p) + _delta(sb, eb, p) for p in PROBE_PATHS)
                        posts = (_delta(sa, ea, CHAT), _delta(sb, eb, CHAT))
                        res["probes_per_request"] = probes / max(1, sum(posts))
                        res["split"] = [p / max(1, sum(posts)) for p in posts]
                    runs[name].append(res)
            for name, rs in runs.items():
                if rs:  # `run --backend vllm` only runs beside a plain `run`
                    results.append(summarise(name, conc, n, rs))
            _add_paired(results, conc, runs)
            _add_paired_to_httpx(results, conc, runs)
    return results, notes


def _with_pool(order: list[str], r: int) -> list[str]:
    """The round's order with `run --pool` and `run --backend vllm` on one member right next to the plain
    `run` they are compared with, so drift hits the three alike; their order reverses every other round,
    so none of them always runs first or right after the same other contender."""
    order = [n for n in order if n not in POOL_GROUP[1:]]
    if "kotoba-run" not in order:
        return order + ["kotoba-run-pool"]
    at = order.index("kotoba-run")
    group = list(POOL_GROUP) if r % 2 == 0 else list(POOL_GROUP)[::-1]
    return order[:at] + group + order[at + 1:]


def paired(mine: list[dict[str, Any]], base: list[dict[str, Any]]) -> dict[str, float] | None:
    """Round by round, `mine` over the `base` run right next to it: the median CPU ratio and throughput ratio.

    This machine's CPU per request flips between two levels in phases a few runs long, for every contender
    alike; two runs back to back mostly share a level, so a ratio within a round cancels the flip that a
    ratio of two medians (each over different rounds' levels) can keep."""
    cpu, speed = [], []
    for a, b in zip(mine, base):
        if "error" in a or "error" in b or not a.get("cpu_s") or not b.get("cpu_s"):
            continue
        cpu.append(a["cpu_s"] / b["cpu_s"])
        speed.append(b["wall_s"] / a["wall_s"])  # same n: throughput ratio
    if not cpu:
        return None
    return {"cpu": statistics.median(cpu), "throughput": statistics.median(speed), "rounds": float(len(cpu))}


def _add_paired(results: list[dict[str, Any]], conc: int, runs: dict[str, list[dict[str, Any]]]) -> None:
    for r in results:
        if r["concurrency"] == conc and r["contender"] in POOL_GROUP[1:]:
            p = paired(runs.get(r["contender"], []), runs.get(POOL_GROUP[0], []))
            if p is not None:
                r["paired_cpu_ratio"], r["paired_throughput_ratio"] = p["cpu"], p["throughput"]


def _add_paired_to_httpx(results: list[dict[str, Any]], conc: int, runs: dict[str, list[dict[str, Any]]]) -> None:
    """Each kotoba contender's CPU over raw httpx's and over raw aiohttp's in the same round, median over the
    rounds (1 in flight's "no worse than the predecessor" reads the ratio to raw httpx; issue 34's targets at
    16/64/256 read the ratio to raw aiohttp both paired and as medians)."""
    for r in results:
        if r["concurrency"] == conc and r["contender"] in ("kotoba", "kotoba-run"):
            for peer in ("httpx", "aiohttp"):
                p = paired(runs.get(r["contender"], []), runs.get(peer, []))
                if p is not None:
                    r[f"paired_cpu_ratio_to_{peer}"] = p["cpu"]


def summarise(name: str, conc: int, n: int, rs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rs if "error" not in r]

    def med(key: str) -> float | None:
        vals = [r[key] for r in ok if r.get(key) is not None]
        return statistics.median(vals) if vals else None
    out: dict[str, Any] = {"contender": name, "concurrency": conc, "n": n, "rounds": len(rs),
                           "good_min": min((r.get("good", 0) for r in rs), default=0),
                           "cpu_ms_per_req": (med("cpu_s") or 0) / n * 1e3 if ok else None,
                           "process_cpu_ms_per_req": (med("process_cpu_s") or 0) / n * 1e3 if ok else None,
                           "req_per_s": n / med("wall_s") if ok and med("wall_s") else None,  # type: ignore[operator]
                           "p50_ms": med("p50_ms"), "p99_ms": med("p99_ms"),
                           "connections_max": max((r.get("connections", 0) for r in ok), default=None),
                           "load_1m": med("load_1m"),
                           "rounds_cpu_ms_per_req": [r["cpu_s"] / n * 1e3 for r in ok if r.get("cpu_s") is not None],
                           "rounds_req_per_s": [n / r["wall_s"] for r in ok if r.get("wall_s")]}
    if name == "kotoba-run-pool" and ok:
        out["probes_per_request"] = med("probes_per_request")
        out["split_first"] = statistics.median(r["split"][0] for r in ok)
    errs = [r["error"] for r in rs if "error" in r]
    if errs:
        out["error"] = errs[0][-300:]
    elif out["good_min"] < n:
        out["error"] = f"only {out['good_min']} of {n} good answers: {ok[0].get('first_bad')}"
    return out
