"""Live: the commands the emitter produces for a two-node loopback llama.cpp RPC plan,
run exactly as emitted, answer a greedy chat with the same text as one llama-server."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import httpx
import pytest

from _live import unavailable
from kotoba_vllm._edn import kw
from kotoba_vllm.distributed import emit, plan, spec_from_edn

pytestmark = pytest.mark.live

PROMPT = [{"role": "user", "content": "Hello world, what is EDN?"}]
SAMPLING = {"temperature": 0.0, "max_tokens": 8, "seed": 7}


def _binaries() -> dict[str, str]:
    from kotoba_vllm import local
    try:
        return {"llama-server": local.llama_server_binary(), "rpc-server": local.rpc_server_binary()}
    except Exception as e:  # not built, or built without RPC
        unavailable(f"llama.cpp with RPC not available: {e}")


def _wait_tcp(port: int, procs: list[subprocess.Popen[bytes]], timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(p.poll() is not None for p in procs):
            raise AssertionError("a launched command exited early")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"port {port} never opened")


def _wait_health(url: str, procs: list[subprocess.Popen[bytes]], timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(p.poll() is not None for p in procs):
            raise AssertionError("a launched command exited early")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} never became healthy")


def _chat(base_url: str, model: str) -> str:
    from kotoba_vllm import Client  # the SDK, as the issue asks

    with Client(base_url, backend="llamacpp") as client:
        return client.chat(PROMPT, model=model, **SAMPLING).text or ""


def test_two_node_rpc_plan_equals_single_node(tmp_path) -> None:
    bins = _binaries()
    from kotoba_vllm.local import LlamaServer, free_port, tiny_model_path

    model = str(tiny_model_path())
    size = os.path.getsize(model)
    rpc_ports, http_port = [free_port(), free_port()], free_port()
    raw = {kw("dist/model"): {kw("model/id"): "tiny", kw("model/path"): model, kw("model/layers"): 4,
                              kw("model/weight-bytes"): size},
           kw("dist/nodes"): [{kw("node/name"): name, kw("node/address"): "127.0.0.1",
                               kw("node/memory-bytes"): 2 * 10**9, kw("node/os-reserve-bytes"): 10**9,
                               kw("node/port"): port} for name, port in zip(("head", "worker"), rpc_ports)],
           kw("dist/engine"): kw("llamacpp"), kw("dist/port"): http_port}
    spec, problems = spec_from_edn(raw)
    assert spec is not None, problems
    p, problems = plan(spec)
    assert p is not None, problems
    cmds = emit(p, bins)
    assert [c.role for c in cmds] == ["rpc-server", "rpc-server", "server"]
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for i, c in enumerate(cmds):
            log = open(tmp_path / f"{i}-{c.role}.log", "wb")
            logs.append(log)
            procs.append(subprocess.Popen(list(c.argv), env={**os.environ, **dict(c.env)},
                                          stdout=log, stderr=subprocess.STDOUT))
            if c.role == "rpc-server":
                _wait_tcp(int(c.argv[c.argv.index("-p") + 1]), procs)
        base = f"http://127.0.0.1:{http_port}"
        _wait_health(base, procs)
        distributed = _chat(base, "tiny")
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs:
            log.close()
    with LlamaServer(model_path=model) as single:
        alone = _chat(single.base_url, "tiny")
    assert distributed and distributed == alone, (distributed, alone)
