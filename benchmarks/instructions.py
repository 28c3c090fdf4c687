"""`python benchmarks/instructions.py run|async [--concurrency N]`: instructions per request, counted.

CPU time on a shared or virtual machine moves between levels (benchmarks/README.md); an instruction count does
not. This runs one contender under valgrind's cachegrind twice, for 100 and for 300 requests against the canned
server (answering after 20 ms), and prints the slope: instructions per request with start-up cancelled out.

- `run`: `python -m kotoba_vllm run` on a file of plain chat requests, with no harness around it.
- `async`: `benchmarks/_peers.py kotoba` (an `AsyncClient`, one worker per slot, as in scenario d).

A cyclic garbage collection costs ~17 M instructions; whether one lands between request 100 and 300 can move the
slope by ~90 k per request. So the slope is printed twice: everything, and without the collector's own functions
(`gcmodule.c` and the containers' traverse walks). Compare trees on the second. Needs `valgrind`; takes a minute or two.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE]

from canned_server import CannedServer  # noqa: E402

SIZES = (100, 300)
REQUEST = ('{{:vllm/endpoint :chat :vllm/model "canned" :vllm/sampling {{:vllm/max-tokens 4}} '
           ':vllm/messages [{{:vllm/role :user :vllm/content "Say hi {i}"}}]}}\n')


def collector(file: str, fn: str) -> bool:
    """A function of the cyclic garbage collector: its module, or a container's traverse walk."""
    return file.endswith("gcmodule.c") or fn.endswith("traverse")  # dict_traverse, tupletraverse, ...


def counts(out_file: str) -> tuple[int, int]:
    """Total instructions in a cachegrind output file, and those spent in the collector."""
    per: dict[tuple[str, str], int] = defaultdict(int)
    fl = fn = ""
    with open(out_file, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.startswith("fl="):
                fl = line[3:].strip()
            elif line.startswith("fn="):
                fn = line[3:].strip()
            elif line[:1].isdigit():
                parts = line.split()
                if len(parts) >= 2:
                    per[(fl, fn)] += int(parts[1])
    total = sum(per.values())
    return total, sum(n for (f, g), n in per.items() if collector(f, g))


def argv_for(mode: str, n: int, conc: int, url: str, work: str) -> list[str]:
    if mode == "run":
        src = os.path.join(work, f"requests-{n}.edn")
        with open(src, "w", encoding="utf-8") as fh:
            fh.writelines(REQUEST.format(i=i) for i in range(n))
        return [sys.executable, "-m", "kotoba_vllm", "run", src, "--backend", "openai", "--concurrency", str(conc),
                "--output", os.path.join(work, f"records-{n}.edn"), "--no-progress", "--base-url", url]
    return [sys.executable, os.path.join(HERE, "_peers.py"), "kotoba", url, str(conc), str(n)]


def measure(mode: str, conc: int) -> dict[str, float]:
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: instructions are not counted (nothing measured)")
    env = dict(os.environ, PYTHONPATH=ROOT)
    seen: dict[int, tuple[int, int]] = {}
    with CannedServer(delay_ms=20, cpu=1 if (os.cpu_count() or 1) >= 2 else None) as srv, \
            tempfile.TemporaryDirectory() as work:
        for n in SIZES:
            out = os.path.join(work, f"cachegrind-{n}.out")
            r = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}"]
                               + argv_for(mode, n, conc, srv.base_url, work),
                               capture_output=True, text=True, cwd=ROOT, env=env)
            if r.returncode != 0 or not re.search(r"I\s+refs:", r.stderr):
                raise SystemExit(f"{mode} with {n} requests failed (rc {r.returncode}):\n{r.stderr[-2000:]}")
            seen[n] = counts(out)
    (a_all, a_gc), (b_all, b_gc) = seen[SIZES[0]], seen[SIZES[1]]
    per = SIZES[1] - SIZES[0]
    return {"per_request": (b_all - a_all) / per, "per_request_without_collector": ((b_all - b_gc) - (a_all - a_gc)) / per,
            "total_small": a_all, "total_large": b_all}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("run", "async"))
    ap.add_argument("--concurrency", type=int, default=1)
    a = ap.parse_args(argv)
    m = measure(a.mode, a.concurrency)
    print(f"{a.mode} at {a.concurrency} in flight: {m['per_request_without_collector'] / 1e3:.1f} k instructions per "
          f"request without the collector ({m['per_request'] / 1e3:.1f} k with it; whole process "
          f"{m['total_small']:,} at {SIZES[0]} requests, {m['total_large']:,} at {SIZES[1]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
