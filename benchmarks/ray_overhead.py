"""What Ray Data costs around the client: CPU per request in a Ray actor vs plain `run`, Ray start-up,
per-block overhead, and the driver's memory for a large input. Numbers for docs/ray.md's sizing.

    python benchmarks/ray_overhead.py                 # all, ~3 min on 2 cores
    python benchmarks/ray_overhead.py --only memory --rows 1000000

Each measurement runs against benchmarks/canned_server.py (its own process, prebuilt answers) so the
client side dominates. CPU is read from /proc for every process of the local Ray (raylet, GCS, workers,
driver), so "Ray total" includes what Ray itself spends per request, not only our actor's share.
Side by side in one run: a busy machine slows both; read the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
TICK = os.sysconf("SC_CLK_TCK")


def _chat_line(i: int) -> str:
    return json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "canned", "messages": [{"role": "user", "content": f"hi {i}"}],
                                "max_tokens": 4}})


def _invalid_line(i: int) -> str:
    return json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/nowhere", "body": {}})


def _write(path: str, n: int, line: Any) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(line(i) + "\n")


def _ray_cpu() -> dict[int, float]:
    """CPU seconds of every live Ray process on this machine (and this driver), by pid."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            if b"ray" not in cmd and int(pid) != os.getpid():
                continue
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(pid)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


class RayCpu:
    """CPU every Ray process spent while the block runs, sampled often enough to count the workers
    Ray Data starts and ends inside it (their start-up included)."""

    def __enter__(self) -> "RayCpu":
        import threading
        self.start = _ray_cpu()
        self.last = dict(self.start)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self) -> None:
        while not self.done.wait(0.2):
            self.last.update(_ray_cpu())

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.thread.join()
        self.last.update(_ray_cpu())
        self.seconds = sum(v - self.start.get(pid, 0.0) for pid, v in self.last.items())


def _plain(path: str, url: str, concurrency: int) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kotoba_vllm", "run", path, "--base-url", url, "-b", "openai",
                    "-c", str(concurrency), "-o", os.devnull, "--no-progress"], check=False, cwd=ROOT,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def plain_run(path: str, url: str, n: int, concurrency: int) -> dict[str, float]:
    """`run` in its own process; its start-up (one request) is subtracted."""
    one = path + ".one"
    with open(path) as src, open(one, "w") as dst:
        dst.write(src.readline())
    wall1, cpu1 = _plain(one, url, concurrency)
    wall, cpu = _plain(path, url, concurrency)
    return {"wall_s": wall, "cpu_us_per_request": (cpu - cpu1) / (n - 1) * 1e6,
            "requests_per_s": (n - 1) / max(wall - wall1, 1e-9)}


def _measured_stage() -> Any:
    from kotoba_vllm.ray import RequestStage

    class MeasuredStage(RequestStage):
        """Reports the actor process's CPU spent on batches (its Ray core-worker threads included)."""

        def __init__(self, *, cpu_dir: str, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.cpu_dir, self.cpu = cpu_dir, 0.0

        def __call__(self, batch: Any) -> Any:
            t = time.process_time()
            out = super().__call__(batch)
            self.cpu += time.process_time() - t
            with open(os.path.join(self.cpu_dir, f"{os.getpid()}.json"), "w") as fh:
                json.dump(self.cpu, fh)
            return out

    return MeasuredStage


def ray_run(path: str, url: str, n: int, concurrency: int, block_rows: int) -> dict[str, float]:
    import ray
    from kotoba_vllm.ray._driver import run_pipeline
    out = tempfile.mkdtemp(prefix="ray-bench-")
    cpu_dir = tempfile.mkdtemp(prefix="ray-bench-cpu-")
    t = time.perf_counter()
    try:
        with RayCpu() as total:
            run_pipeline(path, out, pool=[url], backend="openai", block_rows=block_rows, actors=2,
                         actor_cpus=0.5, concurrency=concurrency, stage=_measured_stage(),
                         stage_kwargs={"cpu_dir": cpu_dir})
        wall = time.perf_counter() - t
        cpu = total.seconds
        actor_cpu = sum(json.load(open(os.path.join(cpu_dir, f))) for f in os.listdir(cpu_dir))
    finally:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(cpu_dir, ignore_errors=True)
    assert ray.is_initialized()
    return {"wall_s": wall, "actor_cpu_us_per_request": actor_cpu / n * 1e6,
            "ray_total_cpu_us_per_request": cpu / n * 1e6, "requests_per_s": n / wall}


def per_block(tmp: str, rows: int) -> dict[str, float]:
    """Validation-only rows (nothing sent): the same rows as 1 block and as 64 blocks."""
    from kotoba_vllm.ray._driver import run_pipeline
    path = os.path.join(tmp, "invalid.jsonl")
    _write(path, rows, _invalid_line)
    walls = {}
    for blocks in (1, 64, 1, 64):
        out = tempfile.mkdtemp(prefix="ray-bench-")
        t = time.perf_counter()
        run_pipeline(path, out, pool=["http://127.0.0.1:9"], block_rows=-(-rows // blocks), actors=2,
                     actor_cpus=0.5)
        walls.setdefault(blocks, []).append(time.perf_counter() - t)
        shutil.rmtree(out, ignore_errors=True)
    one, many = min(walls[1]), min(walls[64])
    return {"one_block_s": one, "blocks_64_s": many, "per_block_ms": (many - one) / 63 * 1e3}


def driver_memory(tmp: str, rows: int) -> dict[str, float]:
    import ray
    from kotoba_vllm.ray._driver import run_pipeline
    path = os.path.join(tmp, "big.jsonl")
    _write(path, rows, _invalid_line)
    rss0 = _vm("VmRSS")
    out = tempfile.mkdtemp(prefix="ray-bench-")
    t = time.perf_counter()
    stats = run_pipeline(path, out, pool=["http://127.0.0.1:9"], block_rows=1024, actors=2, actor_cpus=0.5)
    wall = time.perf_counter() - t
    shutil.rmtree(out, ignore_errors=True)
    assert stats["rows"] == rows and ray.is_initialized()
    return {"rows": rows, "input_mb": os.path.getsize(path) / 1e6, "wall_s": wall,
            "driver_rss_before_mb": rss0, "driver_peak_rss_mb": _vm("VmHWM"), "driver_rss_after_mb": _vm("VmRSS")}


def _vm(field: str) -> float:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--rows", type=int, default=1_000_000, help="input rows for the driver-memory run")
    ap.add_argument("--only", choices=["cpu", "blocks", "memory"], default=None)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    import ray
    from canned_server import CannedServer
    tmp = tempfile.mkdtemp(prefix="ray-bench-in-")
    results: dict[str, Any] = {"load_1min": os.getloadavg()[0], "cpus": os.cpu_count()}
    t = time.perf_counter()
    ray.init(address="local", num_cpus=2, object_store_memory=300 * 1024 * 1024, include_dashboard=False,
             log_to_driver=False)
    results["ray_start_s"] = time.perf_counter() - t
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        if args.only in (None, "cpu"):
            path = os.path.join(tmp, "chat.jsonl")
            _write(path, args.requests, _chat_line)
            with CannedServer() as srv:
                url = srv.base_url
                ray_run(path, url, min(400, args.requests), args.concurrency, 256)  # warm the actors' imports
                results["plain_run"] = plain_run(path, url, args.requests, args.concurrency)
                results["ray_run"] = ray_run(path, url, args.requests, args.concurrency, 256)
                results["plain_run_again"] = plain_run(path, url, args.requests, args.concurrency)
        if args.only in (None, "blocks"):
            results["blocks"] = per_block(tmp, 4096)
        if args.only in (None, "memory"):
            results["memory"] = driver_memory(tmp, args.rows)
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    results["load_1min_after"] = os.getloadavg()[0]
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
