"""Batch `run` against the same requests sent by a minimal raw-httpx script, each in its own process."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

from _edn_bench import request_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RAW_SCRIPT = r'''
import asyncio, json, sys, httpx
path, url, conc = sys.argv[1], sys.argv[2], int(sys.argv[3])
reqs = [json.loads(l) for l in open(path)]
async def main():
    out = open("/dev/null", "w")
    lim = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    async with httpx.AsyncClient(limits=lim, timeout=60) as c:
        it = iter(reqs)
        async def worker():
            for body in it:
                r = await c.post(url + "/v1/chat/completions", json=body)
                out.write(json.dumps(r.json()) + "\n")
        await asyncio.gather(*(worker() for _ in range(conc)))
asyncio.run(main())
'''


def has_concurrency() -> bool:
    r = subprocess.run([sys.executable, "-m", "kotoba_vllm", "run", "--help"], cwd=ROOT, capture_output=True,
                       text=True)
    return "--concurrency" in r.stdout


def _timed(argv: list[str]) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-2000:])
    return wall, cpu, r.returncode


def batch_row(base_url: str, n: int, concurrency: int) -> dict[str, Any]:
    """Wall and process CPU of `run` on `n` requests vs raw httpx at the same concurrency.
    Without `--concurrency` in `run`, kotoba runs sequentially and the baseline uses 1 worker."""
    conc_flag = has_concurrency()
    conc = concurrency if conc_flag else 1
    with tempfile.TemporaryDirectory() as d:
        edn_path, jsonl = os.path.join(d, "reqs.edn"), os.path.join(d, "reqs.jsonl")
        with open(edn_path, "w") as fh:
            fh.write(request_text(n))
        with open(jsonl, "w") as fh:
            for i in range(n):
                fh.write(json.dumps({"model": "canned", "max_tokens": 4, "temperature": 0.0,
                                     "messages": [{"role": "user", "content": f"Say hi {i}"}]}) + "\n")
        run = [sys.executable, "-m", "kotoba_vllm", "run", edn_path, "--base-url", base_url, "--backend", "openai",
               "--output", "/dev/null"] + (["--concurrency", str(conc)] if conc_flag else [])
        k_wall, k_cpu, k_rc = _timed(run)
        h_wall, h_cpu, h_rc = _timed([sys.executable, "-c", RAW_SCRIPT, jsonl, base_url, str(conc)])
        startup, _, _ = _timed([sys.executable, "-c", "import kotoba_vllm.cli"])
    return {"n": n, "concurrency": conc, "concurrency_flag": conc_flag, "kotoba_wall_s": k_wall,
            "kotoba_cpu_s": k_cpu, "kotoba_rc": k_rc, "httpx_wall_s": h_wall, "httpx_cpu_s": h_cpu,
            "httpx_rc": h_rc, "kotoba_import_s": startup}
