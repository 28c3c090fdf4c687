"""What Ray Data costs around the client, for docs/ray.md's sizing: client CPU per request in a Ray
actor vs plain `run`, the CPU of every Ray process per request, `ray.init`, the cost of one more
block, the driver's plan time and memory for large EDN and JSONL inputs, and full runs.

    python benchmarks/ray_overhead.py --only cpu,blocks,plan                # ~6 min on 2 cores
    python benchmarks/ray_overhead.py --only full --validation-rows 1000000  # ~10 min
    python benchmarks/ray_overhead.py --only plan --plan-rows 100000,1000000
    python benchmarks/ray_overhead.py --only full --full-rows 100000 --full-formats jsonl

Every Ray measurement runs in a fresh driver process (this script with --driver), so its peak RSS
(VmHWM) is the driver's alone and "Ray total" is that driver plus every process under it (raylet,
GCS, workers), sampled every 0.2 s with psutil. Answers come from benchmarks/canned_server.py, started
here, outside that tree, so the client side dominates and the server's CPU is never counted.
Writes benchmarks/results/ray-overhead-<UTC time>.edn (machine, load, versions, figures).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

EDN_ROW = ('{:vllm/endpoint :chat :vllm/model "canned" :vllm/messages [{:vllm/role :user :vllm/content "hi %d"}] '
           ':vllm/sampling {:vllm/max-tokens 4} :vllm/request-id "r%d"}')


def _jsonl_row(i: int) -> str:
    return json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "canned", "messages": [{"role": "user", "content": f"hi {i}"}],
                                "max_tokens": 4}})


def _invalid_row(i: int) -> str:
    return json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/nowhere", "body": {}})


EDN_INVALID_ROW = '{:vllm/endpoint :chat :vllm/model "canned" :vllm/messages [] :vllm/request-id "r%d"}'


def write_input(path: str, n: int, fmt: str) -> str:
    """`fmt`: edn, jsonl, or invalid-edn / invalid-jsonl (rows the stage rejects: nothing is sent)."""
    row = {"edn": lambda i: EDN_ROW % (i, i), "jsonl": _jsonl_row, "invalid-jsonl": _invalid_row,
           "invalid-edn": lambda i: EDN_INVALID_ROW % i}[fmt]
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(row(i) + "\n")
    return path


def _vm(field: str) -> float:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


class TreeCpu:
    """CPU seconds of a process and everything under it (Ray: driver, raylet, GCS, workers), polled
    so that workers which start and end inside the block are counted too."""

    def __init__(self, root: int) -> None:
        import psutil
        self.root = psutil.Process(root)
        self.kinds: dict[int, str] = {}

    def sample(self) -> dict[int, float]:
        import psutil
        out = {}
        for p in [self.root, *self.root.children(recursive=True)]:
            try:
                t = p.cpu_times()
                out[p.pid] = t.user + t.system
                self.kinds[p.pid] = self._kind(p)  # again each time: a worker's title changes with its job
            except psutil.Error:
                continue
        return out

    def _kind(self, p: Any) -> str:
        if p.pid == self.root.pid:
            return "driver"
        cmd = " ".join(p.cmdline())
        for kind in ("MapWorker", "raylet", "gcs_server", "dashboard", "log_monitor", "runtime_env"):
            if kind in cmd:
                return "request-actors" if kind == "MapWorker" else kind
        return "other-workers" if cmd.startswith("ray::") or "default_worker" in cmd else "other"

    def by_kind(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, v in self.last.items():
            k = self.kinds.get(pid, "other")
            out[k] = out.get(k, 0.0) + v - self.start.get(pid, 0.0)
        return out

    def __enter__(self) -> "TreeCpu":
        self.start = self.sample()
        self.last = dict(self.start)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self) -> None:
        while not self.done.wait(0.2):
            self.last.update(self.sample())

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.thread.join()
        self.last.update(self.sample())
        self.seconds = sum(v - self.start.get(pid, 0.0) for pid, v in self.last.items())
        self.processes = len(self.last)


# ---- the driver process: one Ray, one measurement --------------------------------------------------

def _measured_stage() -> Any:
    from kotoba_vllm.ray import RequestStage

    class MeasuredStage(RequestStage):
        """Writes down the actor process's CPU (every thread: the client's loop, Ray's core worker)
        from the end of its constructor to the end of its latest batch. Ray runs several batches of
        one actor at once, so timing each call would count the overlap twice."""

        def __init__(self, *, cpu_dir: str, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.cpu_dir, self.base = cpu_dir, time.process_time()

        def __call__(self, batch: Any) -> Any:
            out = super().__call__(batch)
            with open(os.path.join(self.cpu_dir, f"{os.getpid()}.json"), "w") as fh:
                json.dump(time.process_time() - self.base, fh)
            return out

    return MeasuredStage


def driver(spec: dict[str, Any]) -> dict[str, Any]:
    import ray
    import ray.data
    from kotoba_vllm.ray._driver import run_pipeline
    res: dict[str, Any] = {"driver_rss_after_imports_mb": _vm("VmRSS")}
    tree = TreeCpu(os.getpid())
    cpu0, t = sum(tree.sample().values()), time.perf_counter()
    ray.init(address="local", num_cpus=2, object_store_memory=300 * 1024 * 1024, include_dashboard=False,
             log_to_driver=False)
    res["ray_init_s"] = time.perf_counter() - t
    time.sleep(1.0)  # let the raylet's first workers settle before the baseline
    res["ray_init_cpu_s"] = sum(tree.sample().values()) - cpu0
    ray.data.DataContext.get_current().enable_progress_bars = False
    res["driver_rss_after_init_mb"] = _vm("VmRSS")

    def one(path: str, block_rows: int, measured: bool) -> dict[str, Any]:
        out = tempfile.mkdtemp(prefix="ray-bench-out-")
        cpu_dir = tempfile.mkdtemp(prefix="ray-bench-cpu-")
        kwargs: dict[str, Any] = {"stage": _measured_stage(), "stage_kwargs": {"cpu_dir": cpu_dir}} if measured else {}
        t0 = time.perf_counter()
        try:
            with TreeCpu(os.getpid()) as total:
                stats = run_pipeline(path, out, pool=[spec["url"]], backend="openai", block_rows=block_rows,
                                     actors=spec.get("actors", 2), actor_cpus=0.5,
                                     concurrency=spec.get("concurrency", 16), **kwargs)
            wall = time.perf_counter() - t0
            actor = sum(json.load(open(os.path.join(cpu_dir, f))) for f in os.listdir(cpu_dir))
        finally:
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(cpu_dir, ignore_errors=True)
        n = stats["rows"]
        r = {"rows": n, "sent": stats["sent"], "files": stats["files"], "wall_s": wall, "rows_per_s": n / wall,
             "ray_total_cpu_s": total.seconds, "ray_total_cpu_us_per_row": total.seconds / n * 1e6,
             "ray_processes_seen": total.processes, "ray_cpu_s_by_process": total.by_kind()}
        if measured:
            r["actor_cpu_us_per_row"] = actor / n * 1e6
        return r

    if spec["mode"] == "cpu":  # warm the actors' imports first; then a small and a large measured run
        one(spec["warm"], spec["block_rows"], False)
        small, big = one(spec["warm"], spec["block_rows"], True), one(spec["input"], spec["block_rows"], True)
        rows = big["rows"] - small["rows"]
        res.update(small=small, run=big, marginal={  # what one more request costs, fixed costs cancelled
            "ray_total_cpu_us_per_request": (big["ray_total_cpu_s"] - small["ray_total_cpu_s"]) / rows * 1e6,
            "actor_cpu_us_per_request": (big["actor_cpu_us_per_row"] * big["rows"]
                                         - small["actor_cpu_us_per_row"] * small["rows"]) / rows})
    elif spec["mode"] == "blocks":  # validation-only rows: nothing sent; the same rows as 1 and as 64 blocks
        walls: dict[int, list[float]] = {}
        for blocks in (1, 64, 1, 64):
            walls.setdefault(blocks, []).append(one(spec["input"], -(-spec["rows"] // blocks), False)["wall_s"])
        res.update(one_block_s=min(walls[1]), blocks_64_s=min(walls[64]),
                   per_block_ms=(min(walls[64]) - min(walls[1])) / 63 * 1e3)
    else:
        res["run"] = one(spec["input"], spec["block_rows"], True)
    res["driver_peak_rss_mb"] = _vm("VmHWM")
    ray.shutdown()
    return res


def _in_driver(spec: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=ROOT)  # Ray's workers import this checkout too
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--driver", json.dumps(spec)], cwd=ROOT,
                       env=env, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"driver failed: {p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# ---- measurements -----------------------------------------------------------------------------------

def plan_only(path: str, fmt: str) -> dict[str, Any]:
    """The driver's plan of a text input alone (what the driver does before any task runs), in a
    fresh process with ray.data imported, so its VmHWM is the plan's peak plus the imports."""
    code = ("import json,sys,time,ray.data; sys.path.insert(0, sys.argv[3]);"
            "from kotoba_vllm.ray._read import plan_spans;"
            "rss=[l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1];"
            "t=time.perf_counter(); sp=plan_spans(sys.argv[1], sys.argv[2], 256); dt=time.perf_counter()-t;"
            "hwm=[l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1];"
            "print(json.dumps({'rows': sum(s.rows for s in sp), 'spans': len(sp), 'plan_s': dt,"
            "'rss_before_mb': int(rss)/1024, 'peak_rss_mb': int(hwm)/1024}))")
    p = subprocess.run([sys.executable, "-c", code, path, fmt, ROOT], capture_output=True, text=True, check=True,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    r: dict[str, Any] = json.loads(p.stdout)
    r["input_mb"] = os.path.getsize(path) / 1e6
    r["plan_us_per_row"] = r["plan_s"] / r["rows"] * 1e6
    return r


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


def _versions() -> dict[str, str]:
    import importlib.metadata as md
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("ray", "pyarrow", "aiohttp", "httpx", "psutil"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    try:
        out["kotoba-vllm-commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                                   capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    return out


def _to_edn(v: Any) -> Any:
    from kotoba_vllm._edn import kw
    if isinstance(v, dict):
        return {kw("bench/" + k.replace("_", "-")): _to_edn(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_to_edn(x) for x in v]
    return round(v, 4) if isinstance(v, float) else v


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", help=argparse.SUPPRESS)
    ap.add_argument("--only", default="cpu,blocks,plan,full", help="comma list of cpu, blocks, plan, full")
    ap.add_argument("--requests", type=int, default=4000, help="requests for the CPU-per-request runs")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--plan-rows", default="100000,250000,500000,1000000")
    ap.add_argument("--full-rows", type=int, default=100_000, help="rows of each full run (sent to the canned server)")
    ap.add_argument("--full-formats", default="jsonl,edn")
    ap.add_argument("--full-block-rows", type=int, default=1024)
    ap.add_argument("--validation-rows", type=int, default=0,
                    help="also full runs of this many validation-only rows (rejected by the stage, nothing sent)")
    ap.add_argument("--validation-formats", default="jsonl,edn")
    ap.add_argument("--validation-block-rows", type=int, default=4096)
    ap.add_argument("--out", default=None, help="result file (default benchmarks/results/ray-overhead-<time>.edn)")
    args = ap.parse_args()
    if args.driver:
        print(json.dumps(driver(json.loads(args.driver))))
        return
    from canned_server import CannedServer
    from kotoba_vllm._edn import pretty
    only = set(args.only.split(","))
    started = time.gmtime()
    tmp = tempfile.mkdtemp(prefix="ray-bench-in-")
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", started), "machine": {
        "nproc": os.cpu_count(), "load_avg_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        **_versions()}, "notes": [
        "every Ray figure comes from a fresh driver process (ray.init num_cpus=2, object store 300 MB)",
        "ray-total = that driver + every process under it (raylet, GCS, workers), psutil every 0.2 s",
        "answers from benchmarks/canned_server.py in its own process, not counted",
        "2 Ray actors x 0.5 CPU, concurrency per actor as given"]}
    loads: dict[str, float] = {}
    try:
        with CannedServer() as srv:
            if "cpu" in only:
                path = write_input(os.path.join(tmp, "chat.jsonl"), args.requests, "jsonl")
                warm = write_input(os.path.join(tmp, "warm.jsonl"), 400, "jsonl")
                plain = plain_run(path, srv.base_url, args.requests, args.concurrency)
                ray_ = _in_driver({"mode": "cpu", "input": path, "warm": warm, "url": srv.base_url,
                                   "block_rows": 256, "concurrency": args.concurrency})
                plain2 = plain_run(path, srv.base_url, args.requests, args.concurrency)
                res["cpu_per_request"] = {"requests": args.requests, "concurrency": args.concurrency,
                                          "plain_run": plain, "ray": ray_, "plain_run_again": plain2}
                loads["cpu"] = os.getloadavg()[0]
            if "blocks" in only:
                path = write_input(os.path.join(tmp, "invalid.jsonl"), 4096, "invalid-jsonl")
                res["per_block"] = _in_driver({"mode": "blocks", "input": path, "rows": 4096, "url": srv.base_url})
                loads["blocks"] = os.getloadavg()[0]
            if "plan" in only:
                sizes = [int(x) for x in args.plan_rows.split(",")]
                res["plan"] = []
                for fmt in ("jsonl", "edn"):
                    big = write_input(os.path.join(tmp, f"big.{fmt}"), max(sizes), fmt)
                    for n in sizes:
                        path = os.path.join(tmp, f"n{n}.{fmt}")
                        with open(path, "wb") as dst:
                            subprocess.run(["head", "-n", str(n), big], stdout=dst, check=True)
                        res["plan"].append({"format": fmt, **plan_only(path, fmt), "load_1m": os.getloadavg()[0]})
                        os.unlink(path)
                    os.unlink(big)
                loads["plan"] = os.getloadavg()[0]
            if "full" in only:
                res["full"] = []
                for fmt in args.full_formats.split(","):
                    path = write_input(os.path.join(tmp, f"full.{fmt}"), args.full_rows, fmt)
                    r = _in_driver({"mode": "full", "input": path, "url": srv.base_url,
                                    "block_rows": args.full_block_rows, "concurrency": args.concurrency})
                    res["full"].append({"format": fmt, "input_mb": os.path.getsize(path) / 1e6,
                                        "block_rows": args.full_block_rows, **r, "load_1m": os.getloadavg()[0]})
                    os.unlink(path)
                for fmt in args.validation_formats.split(",") if args.validation_rows else ():
                    path = write_input(os.path.join(tmp, f"invalid.{fmt}"), args.validation_rows, f"invalid-{fmt}")
                    r = _in_driver({"mode": "full", "input": path, "url": srv.base_url,
                                    "block_rows": args.validation_block_rows})
                    res["full"].append({"format": f"{fmt} (validation-only: every row rejected, nothing sent)",
                                        "input_mb": os.path.getsize(path) / 1e6,
                                        "block_rows": args.validation_block_rows, **r,
                                        "load_1m": os.getloadavg()[0]})
                    os.unlink(path)
                loads["full"] = os.getloadavg()[0]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res["machine"]["load_avg_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    res["load_1m_after_each"] = loads
    out = args.out or os.path.join(ROOT, "benchmarks", "results",
                                   "ray-overhead-" + time.strftime("%Y-%m-%dT%H%MZ", started) + ".edn")
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(pretty(_to_edn(res)) + "\n")
    print(json.dumps(res, indent=1))
    print(f";; wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
