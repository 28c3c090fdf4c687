"""`python benchmarks/readme_table.py results/<run>.edn [results/<other run>.edn ...] [--write]`: the README's
performance tables, generated from the named result files (`--write` puts them into benchmarks/README.md and
README.md between the `<!-- throughput-table -->` markers). The first file gives the batch tables; each later
table comes from the first file that holds its scenario, and says which file that is when it is not the first
(a run of some scenarios only, `benchmarks/run.py --only`, leaves the others to an earlier full run)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE)]

from kotoba_vllm._edn import Keyword, read_file  # noqa: E402

COLUMNS = (("kotoba-run", "kotoba `run`"), ("kotoba", "kotoba `AsyncClient`"), ("aiohttp", "raw aiohttp"),
           ("httpx", "raw httpx"), ("httpx2", "raw httpx2"), ("openai", "openai-python"), ("flexllm", "flexllm"),
           ("kotoba-httpx", "kotoba on a caller's httpx"))
BEGIN, END = "<!-- throughput-table -->", "<!-- /throughput-table -->"


def plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {(k.name.split("/")[-1].replace("-", "_") if isinstance(k, Keyword) else k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    return v


def load(path: str) -> dict[str, Any]:
    [form] = read_file(path)
    return plain(form.value)  # type: ignore[no-any-return]


def _cell(v: Any, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def _verdict(met: bool | None) -> str:
    """A target's cell: met, missed, or nothing when it was not measured."""
    return "met" if met else "**missed**" if met is False else ""


def tables(result: dict[str, Any], name: str) -> str:
    tp = result.get("throughput") or []
    mach = result["machine"]
    concs = sorted({r["concurrency"] for r in tp})
    by = {(r["contender"], r["concurrency"]): r for r in tp}
    present = [(k, label) for k, label in COLUMNS if any((k, c) in by for c in concs)]
    head = "| in flight | " + " | ".join(label for _, label in present) + " |"
    sep = "|---" * (len(present) + 1) + "|"
    out = [f"From `benchmarks/results/{name}` ({result['date']}; {mach['nproc']} cores, load "
           f"{mach.get('load_avg', mach.get('load_avg_1m'))} (1, 5, 15 min) at the end; Python {mach['python']}, aiohttp {mach.get('aiohttp')}, "
           f"httpx {mach['httpx']}, httpx2 {mach.get('httpx2')}, openai {mach['openai']}, flexllm "
           f"{mach.get('flexllm')}). Client pinned to one core, server to the other, each answer after 20 ms; "
           "median of the rounds; every contender got every answer right.", ""]
    for title, key, fmt in (("Client CPU per request (ms; lower is better)", "cpu_ms_per_req", ".2f"),
                            ("Throughput (requests/s; higher is better)", "req_per_s", ".0f"),
                            ("p99 latency (ms; lower is better)", "p99_ms", ".1f"),
                            ("Connections the server accepted (= in flight is right)", "connections_max", "d")):
        out += [f"**{title}**", "", head, sep]
        for c in concs:
            out.append(f"| {c} | " + " | ".join(_cell(by.get((k, c), {}).get(key), fmt) for k, _ in present) + " |")
        out.append("")
    pool = [r for r in tp if r["contender"] == "kotoba-run-pool"]
    if pool:
        # the pool's dialect on one member with no pool, when the file has it: how far `run` itself moves
        with_vllm = any(r["contender"] == "kotoba-run-vllm" for r in tp)
        with_paired = any(r.get("paired_cpu_ratio") is not None for r in pool)
        out += ["**`run --pool` over two members (vLLM probes, both unmeasured)**", "",
                "| in flight | CPU/request (ms) | vs plain `run` | throughput vs plain `run` | probes/request | "
                "first member's share |" + (" paired by round: CPU, throughput vs plain `run` |" if with_paired else "")
                + (" `run --backend vllm` on one member: CPU, throughput vs plain `run` |" if with_vllm else ""),
                "|---" * (6 + with_vllm + with_paired) + "|"]
        for r in sorted(pool, key=lambda r: r["concurrency"]):
            one = by.get(("kotoba-run", r["concurrency"]), {})
            cpu_ratio = r["cpu_ms_per_req"] / one["cpu_ms_per_req"] if one.get("cpu_ms_per_req") else None
            tp_ratio = r["req_per_s"] / one["req_per_s"] if one.get("req_per_s") else None
            vl = by.get(("kotoba-run-vllm", r["concurrency"]), {})
            vl_cpu = vl["cpu_ms_per_req"] / one["cpu_ms_per_req"] if vl.get("cpu_ms_per_req") and one.get(
                "cpu_ms_per_req") else None
            vl_tp = vl["req_per_s"] / one["req_per_s"] if vl.get("req_per_s") and one.get("req_per_s") else None
            out.append(f"| {r['concurrency']} | {_cell(r['cpu_ms_per_req'], '.2f')} | {_cell(cpu_ratio, '.2f')}x | "
                       f"{_cell(tp_ratio, '.2f')}x | {_cell(r.get('probes_per_request'), '.3f')} | "
                       f"{_cell(100 * r['split_first'] if r.get('split_first') is not None else None, '.0f')}% |"
                       + ("" if not with_paired else
                          f" {_cell(r.get('paired_cpu_ratio'), '.2f')}x, {_cell(r.get('paired_throughput_ratio'), '.2f')}x |")
                       + ("" if not with_vllm else " — |" if vl_cpu is None else
                          f" {vl_cpu:.2f}x, {_cell(vl_tp, '.2f')}x |"))
        out.append("")
        if with_paired:
            out += ["Paired by round: each round runs the pool and the plain `run` back to back, and the figure is "
                    "the median of the rounds' ratios. This machine's speed moves between two levels for every "
                    "contender alike, so a ratio of two medians can compare rounds taken at different levels; the "
                    "pool's targets (CPU <= 1.5x, throughput >= 0.9x) are read from the paired figures.", ""]
    return "\n".join(out)


def sections(results: list[tuple[str, dict[str, Any]]]) -> str:
    """The batch tables of the first file (`tables`) and its paired and predecessor tables, then each other table
    from the first file that has it, naming that file when it is not the first."""
    (first, main), out = results[0], []
    if main.get("throughput"):
        out.append(tables(main, first))
    for make in (paired_table, predecessor_table, instructions_table, flow_table):
        # the paired and the predecessor tables read the batch run the first file holds, never another's
        for name, result in results if make not in (paired_table, predecessor_table) else results[:1]:
            found = make(result)
            if found:
                if name != first or not main.get("throughput"):
                    found = [f"From `benchmarks/results/{name}` ({result['date']}):", ""] + found
                out.append("\n".join(found))
                break
    # the sync table's rows, each from the first file that measured it
    rows: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
    for name, result in results:
        for r in result.get("rows") or []:
            rows.setdefault((r.get("scenario", ""), r.get("server") or "canned"), (name, r))
    found = sync_table({"rows": [r for _, r in rows.values()]})
    if found:
        used = {name: (scenario, result_date(results, name)) for (scenario, _), (name, _r) in rows.items()
                if any(scenario == s for s, _, _ in SYNC_SCENARIOS)}
        if set(used) != {first} or not main.get("throughput"):
            found = ["From " + ", ".join(f"`benchmarks/results/{n}` ({d})" for n, (_, d) in used.items()) + ":", ""] + found
        out.append("\n".join(found))
    return "\n".join(out)


def result_date(results: list[tuple[str, dict[str, Any]]], name: str) -> str:
    return next(str(r.get("date")) for n, r in results if n == name)


def paired_table(result: dict[str, Any]) -> list[str]:
    """Scenario d: `AsyncClient`'s and `run`'s CPU over raw aiohttp's, paired by round, with their targets."""
    found = [r for r in result.get("rows") or [] if "CPU / raw aiohttp's paired by round" in r.get("scenario", "")]
    if not found:
        return []
    medians = {r["scenario"]: r for r in result.get("rows") or [] if " CPU per request, conc " in r.get("scenario", "")}
    out = ["**`AsyncClient` and `run` over raw aiohttp: CPU per request, paired by round (the median of each "
           "round's ratio, both in the same round) and as the ratio of the medians**", "",
           "| contender, in flight | paired by round | ratio of medians | target |", "|---|---|---|---|"]
    for r in found:
        label, conc = r["scenario"].removeprefix("d. ").split(" CPU / ")[0], r["scenario"].rsplit(" ", 1)[-1]
        med = (medians.get(f"d. {label} CPU per request, conc {conc}", {}).get("ratios") or {}).get("aiohttp")
        target, met = next(iter((r.get("targets") or {}).items()), ("—", None))
        out.append(f"| `{label}`, {conc} | {_cell((r.get('values') or {}).get('kotoba'), '.3f')}x | "
                   f"{_cell(med, '.3f')}{'x' if med is not None else ''} | {target.replace('aiohttp_max_', '<= ')}x "
                   f"{_verdict(met)} |")
    out.append("")
    return out


def instructions_table(result: dict[str, Any]) -> list[str]:
    """Scenario g: thousands of instructions per request, this run and its predecessor file."""
    found = [r for r in result.get("rows") or [] if r.get("scenario", "").startswith("g. instructions per request")]
    if not found:
        return []
    out = ["**Instructions per request (cachegrind, thousands; no target: a count does not move with the "
           "machine's speed)**", "", "| mode | this run | predecessor | ratio |", "|---|---|---|---|"]
    for r in found:
        values, ratio = r.get("values") or {}, (r.get("ratios") or {}).get("predecessor")
        out.append(f"| {r['scenario'].split(', ', 1)[-1]} | {_cell(values.get('kotoba'), '.1f')} | "
                   f"{_cell(values.get('predecessor'), '.1f')} | {_cell(ratio, '.3f')}{'x' if ratio else ''} |")
    out.append("")
    return out


def flow_table(result: dict[str, Any]) -> list[str]:
    """Scenario h: `run`'s CPU per request with flow control on over off, paired by round."""
    found = [r for r in result.get("rows") or [] if r.get("scenario", "").startswith(("h. flow control", "h. the floor"))]
    if not found:
        return []
    out = ["**Flow control's cost: `run`'s CPU per request, on over `--flow-control off`, paired by round**", "",
           "| server, in flight | on / baseline | target | how read |", "|---|---|---|---|"]
    for r in found:
        values = r.get("values") or {}
        ratio = values.get("kotoba", values.get("aiohttp"))  # the floor's row measures raw aiohttp
        target = next(iter(r.get("targets") or {}), "—")
        met = next(iter((r.get("targets") or {}).values()), None)
        out.append(f"| {r['scenario'].split('per request, ', 1)[-1]} | {_cell(ratio, '.3f')}x | "
                   f"{target.replace('off_max_', '<= ') + 'x' if target != '—' else target} "
                   f"{_verdict(met)} | "
                   f"{r.get('note') or ''} |")
    out.append("")
    return out


def predecessor_table(result: dict[str, Any]) -> list[str]:
    """At 1 in flight: CPU over raw httpx's, this run against its predecessor file (target: no worse)."""
    found = [r for r in result.get("rows") or [] if r.get("scenario", "").endswith("/ raw httpx's, conc 1")]
    if not found:
        return []
    out = ["**At 1 in flight: CPU over raw httpx's, against the previous result file (target: no worse)**", "",
           "| contender | this run | predecessor | | how read; the other reading |", "|---|---|---|---|---|"]
    for r in found:
        values, met = r.get("values") or {}, next(iter((r.get("targets") or {}).values()), None)
        label = r["scenario"].split(" CPU")[0].removeprefix("d. ")
        paired = (r.get("note") or "").split("; ", 1)[-1]
        out.append(f"| `{label}` | {_cell(values.get('kotoba'), '.3f')}x | {_cell(values.get('predecessor'), '.3f')}x "
                   f"({(r.get('note') or '').split('predecessor is ')[-1].split(';')[0]}) | "
                   f"{_verdict(met)} | {paired} |")
    out.append("")
    return out


SYNC_SCENARIOS = (("a. latency, small chat (median)", "latency (ms)", 1.1),
                  ("b. client CPU per request", "CPU per request (us)", 1.1),
                  ("c. client CPU per streamed chunk", "CPU per streamed chunk (us)", 1.2),
                  ("d. heap per open stream", "heap per open stream (KB, async)", 1.5))
SYNC_COLUMNS = (("kotoba", "kotoba `Client`"), ("httpx", "raw httpx"), ("http.client", "raw http.client"),
                ("kotoba_httpx", "kotoba on a caller's httpx"), ("openai", "openai-python"))


def sync_table(result: dict[str, Any]) -> list[str]:
    """Scenarios a-c (sync `Client`, default wire) and the async heap per open stream, against raw httpx."""
    rows = result.get("rows") or []
    found = [(r, label, target) for scenario, label, target in SYNC_SCENARIOS
             for r in rows if r.get("scenario") == scenario]
    if not found:
        return []
    out = ["**Sync `Client` and streams (one process, contenders interleaved; target: kotoba / raw httpx)**", "",
           "| measure | server | " + " | ".join(label for _, label in SYNC_COLUMNS) + " | kotoba / raw httpx | target |",
           "|---" * (len(SYNC_COLUMNS) + 4) + "|"]
    for r, label, target in found:
        values, fmt = r.get("values") or {}, ".3f" if r.get("unit") == "ms" else ".1f"
        ratio = (r.get("ratios") or {}).get("httpx")
        met = "" if ratio is None else ("met" if ratio <= target else "**missed**")
        out.append(f"| {label} | {r.get('server') or 'canned'} | "
                   + " | ".join(_cell(values.get(k), fmt) for k, _ in SYNC_COLUMNS)
                   + f" | {_cell(ratio, '.2f')}x | <= {target}x {met} |")
    out.append("")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result", nargs="+", help="result files under benchmarks/results/")
    ap.add_argument("--write", action="store_true", help="replace the tables in benchmarks/README.md and README.md")
    a = ap.parse_args(argv)
    text = sections([(os.path.basename(p), load(p)) for p in a.result])
    if not a.write:
        print(text)
        return 0
    block = f"{BEGIN}\n{text}\n{END}"
    # benchmarks/README.md always gets the table; the project README only where it has the markers.
    for readme in (os.path.join(HERE, "README.md"), os.path.join(HERE, os.pardir, "README.md")):
        doc = open(readme, encoding="utf-8").read()
        if BEGIN in doc:
            doc = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, doc, flags=re.S)
        elif os.path.dirname(readme) == HERE:
            doc = doc.rstrip("\n") + "\n\n" + block + "\n"
        else:
            continue
        with open(readme, "w", encoding="utf-8") as fh:
            fh.write(doc)
        print(f"wrote the tables from {', '.join(a.result)} into {os.path.normpath(readme)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
