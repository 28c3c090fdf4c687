"""Peak memory of `validate` and `render` on a large request file: both stream their input.

    python benchmarks/cli_memory.py                      # 1,000,000 requests (~170 MB of EDN)
    python benchmarks/cli_memory.py --requests 100000    # quicker

Each command runs in its own process (`python -m kotoba_vllm ...`, output to /dev/null) and its
peak resident set size is read from the kernel (`wait4`'s `ru_maxrss`). Target: under 100 MiB
whatever the file's size. Results go to `benchmarks/results/cli-memory-<date>.edn`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from kotoba_vllm._edn import kw, pretty  # noqa: E402

# Requests as a Clojure REPL prints them (#:vllm{} maps, commas) and as people write them, in turn.
FORMS = (
    '{:vllm/endpoint :chat :vllm/model "m" :vllm/messages [{:vllm/role :user :vllm/content "Say hi %d"}]'
    ' :vllm/sampling {:vllm/max-tokens 4 :vllm/temperature 0.0} :vllm/request-id %d}\n',
    '#:vllm{:endpoint :completion, :model "m", :prompt "Count to %d", :sampling #:vllm{:max-tokens 8},'
    ' :request-id %d}\n',
)
TARGET_MIB = 100.0


def write_requests(path: str, n: int) -> int:
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(FORMS[i % 2] % (i, i))
    return os.path.getsize(path)


def peak_rss(argv: list[str]) -> tuple[float, float, int]:
    """(peak RSS in MiB, wall seconds, exit status) of one child process."""
    t = time.perf_counter()
    with open(os.devnull, "wb") as null:
        proc = subprocess.Popen(argv, stdout=null, stderr=subprocess.PIPE, cwd=ROOT)
        assert proc.stderr is not None
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{argv} failed: {err.decode(errors='replace')[-500:]}")
    return usage.ru_maxrss / 1024.0, time.perf_counter() - t, proc.returncode  # Linux: ru_maxrss is KiB


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true", help="also render --format json")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="directory for the EDN result")
    args = ap.parse_args(argv)
    py = [sys.executable, "-m", "kotoba_vllm"]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kotoba-cli-memory-") as tmp:
        path = os.path.join(tmp, "requests.edn")
        size = write_requests(path, args.requests)
        for name, cmd in (("validate", [*py, "validate", path, "--backend", "vllm"]),
                          ("render", [*py, "render", path, "--backend", "vllm"]),
                          ("render json", [*py, "render", path, "--backend", "llamacpp", "--format", "json"]))[
                :None if args.json else 2]:
            mib, wall, code = peak_rss(cmd)
            rows.append({"command": name, "peak-rss-mib": round(mib, 1), "wall-s": round(wall, 1), "exit": code,
                         "ok?": mib < TARGET_MIB})
            print(f"{name:12s} {args.requests:>9,d} requests ({size / 1e6:.0f} MB): peak RSS {mib:6.1f} MiB, "
                  f"{wall:6.1f} s, exit {code}  {'ok' if mib < TARGET_MIB else 'OVER'} (target < {TARGET_MIB:.0f})")
    load = os.getloadavg()[0]
    result = {kw("bench/date"): dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
              kw("bench/requests"): args.requests, kw("bench/file-bytes"): size, kw("bench/load-1m"): round(load, 2),
              kw("bench/cpus"): os.cpu_count(), kw("bench/target-mib"): TARGET_MIB,
              kw("bench/rows"): [{kw(f"bench/{k}"): v for k, v in r.items()} for r in rows]}
    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, f"cli-memory-{dt.date.today().isoformat()}.edn")
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(pretty(result) + "\n")
    print(f"load {load:.1f} on {os.cpu_count()} cores; wrote {out}")
    return 0 if all(r["ok?"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
