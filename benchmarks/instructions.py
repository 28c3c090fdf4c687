"""`python benchmarks/instructions.py run|vllm|pool|async|stream|sync|aiohttp [--concurrency N] [--tree DIR]`: instructions
per request, counted.

CPU time on a shared or virtual machine moves between levels (benchmarks/README.md); an instruction count does
not. This runs one contender under valgrind's cachegrind twice, for 100 and for 300 requests against the canned
server (answering after 20 ms), and prints the slope: instructions per request with start-up cancelled out.
Above 16 in flight the two runs are 1,000 and 3,000 requests (100 would hardly outlast filling the slots);
`--sizes A B` chooses others.

- `run`: `python -m kotoba_vllm run` on a file of plain chat requests, with no harness around it.
- `vllm`: the same with `--backend vllm`, against one member: what `pool` is compared with.
- `pool`: the same over two members (`--backend vllm` and two `--base-url`s: the canned server's two ports).
  The pool probes by the clock (a round at most every 0.5 s) and valgrind runs the client ~16x slower, so at
  the default interval a counted run would take ~16x the rounds per request of a real one, and at 256 in flight
  most requests would wait for a round (measured: every one of 1,000, against 256 of 3,000 outside valgrind).
  The interval is scaled by the same factor (`--capacity-interval 8`): as many rounds per request as a real run.
- `async`: `benchmarks/_peers.py kotoba` (an `AsyncClient`, one worker per slot, as in scenario d).
- `stream`: `benchmarks/_peers.py kotoba-stream` (`AsyncClient.stream_chat` read to its end, 4 chunks).
- `sync`: `benchmarks/_peers.py kotoba-sync` (the sync `Client`, one request at a time; `--concurrency` ignored).
- `aiohttp`: `benchmarks/_peers.py aiohttp`, raw aiohttp as scenario d runs it: the floor `async` is read against.

`--tree DIR` counts another checkout's `kotoba_vllm` (e.g. a `git worktree` at an older commit) with this
harness: an A/B of two commits under the same contender.

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
sys.path[:0] = [HERE, ROOT]

from canned_server import CannedServer  # noqa: E402
from kotoba_vllm.capacity._view import DEFAULT_INTERVAL_S  # noqa: E402

SIZES = (100, 300)
SIZES_MANY_IN_FLIGHT = (1000, 3000)
VALGRIND_SLOWDOWN = 16  # a 256-in-flight pool run: 1,280 requests/s outside valgrind, 81 inside
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


def sizes_for(conc: int) -> tuple[int, int]:
    return SIZES if conc <= 16 else SIZES_MANY_IN_FLIGHT


PEER_MODES = {"async": "kotoba", "stream": "kotoba-stream", "sync": "kotoba-sync", "aiohttp": "aiohttp"}


def argv_for(mode: str, n: int, conc: int, urls: list[str], work: str, extra: tuple[str, ...] = (),
             backend: str | None = None) -> list[str]:
    """The contender's command line: `run`, `vllm` and `pool` are the CLI, the others the peer script."""
    if mode in PEER_MODES:
        return [sys.executable, os.path.join(HERE, "_peers.py"), PEER_MODES[mode], urls[0], str(conc), str(n)]
    src = os.path.join(work, f"requests-{n}.edn")
    with open(src, "w", encoding="utf-8") as fh:
        fh.writelines(REQUEST.format(i=i) for i in range(n))
    members = urls if mode == "pool" else urls[:1]
    backend = backend or ("openai" if mode == "run" else "vllm")
    return [sys.executable, "-m", "kotoba_vllm", "run", src, "--backend", backend,
            "--concurrency", str(conc), "--output", os.path.join(work, f"records-{n}.edn"), "--no-progress",
            *(a for u in members for a in ("--base-url", u)),
            *(("--capacity-interval", f"{DEFAULT_INTERVAL_S * VALGRIND_SLOWDOWN:g}")
              if mode == "pool" or backend == "llamacpp" else ()),  # flow control probes a member with slots
            *extra]


def measure(mode: str, conc: int, sizes: tuple[int, int] | None = None, extra: tuple[str, ...] = (),
            slots: int = 0, tree: str = ROOT) -> dict[str, float]:
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: instructions are not counted (nothing measured)")
    sizes = sizes or sizes_for(conc)
    env = dict(os.environ, PYTHONPATH=tree)  # _peers.py puts its own tree first: the peer modes get `tree` too
    env["KOTOBA_BENCH_TREE"] = tree
    seen: dict[int, tuple[int, int]] = {}
    with CannedServer(delay_ms=20, cpu=1 if (os.cpu_count() or 1) >= 2 else None,
                      ports=2 if mode == "pool" else 1, slots=slots) as srv, tempfile.TemporaryDirectory() as work:
        for n in sizes:
            out = os.path.join(work, f"cachegrind-{n}.out")
            r = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}"]
                               + argv_for(mode, n, conc, srv.base_urls, work, extra,
                                          "llamacpp" if slots and mode == "run" else None),
                               capture_output=True, text=True, cwd=tree, env=env)
            # a server with slots answers 429 beyond them: those records are failures, and `run` exits 1
            if r.returncode not in ((0, 1) if slots else (0,)) or not re.search(r"I\s+refs:", r.stderr):
                raise SystemExit(f"{mode} with {n} requests failed (rc {r.returncode}):\n{r.stderr[-2000:]}")
            seen[n] = counts(out)
    (a_all, a_gc), (b_all, b_gc) = seen[sizes[0]], seen[sizes[1]]
    per = sizes[1] - sizes[0]
    return {"per_request": (b_all - a_all) / per, "per_request_without_collector": ((b_all - b_gc) - (a_all - a_gc)) / per,
            "total_small": a_all, "total_large": b_all, "small": sizes[0], "large": sizes[1]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("run", "vllm", "pool", *PEER_MODES))
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--sizes", type=int, nargs=2, metavar=("A", "B"), help="the two batch sizes (A < B)")
    ap.add_argument("--slots", type=int, default=0,
                    help="the canned server has this many slots: /slots reports them, a POST beyond them is "
                         "answered 429 (`run` then says --backend llamacpp, the engine with that probe)")
    ap.add_argument("--extra", default="", help="more arguments for `run`, one string (e.g. '--flow-control off')")
    ap.add_argument("--tree", default=ROOT, help="the checkout whose kotoba_vllm is counted (default: this one)")
    a = ap.parse_args(argv)
    m = measure(a.mode, a.concurrency, tuple(a.sizes) if a.sizes else None, tuple(a.extra.split()), a.slots,
                os.path.abspath(a.tree))
    print(f"{a.mode} at {a.concurrency} in flight: {m['per_request_without_collector'] / 1e3:.1f} k instructions per "
          f"request without the collector ({m['per_request'] / 1e3:.1f} k with it; whole process "
          f"{m['total_small']:,} at {m['small']:,} requests, {m['total_large']:,} at {m['large']:,})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
