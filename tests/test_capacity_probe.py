"""The probe shells (sync and async) and the `capacity` CLI against mocked servers (respx)."""

from __future__ import annotations

import io
from contextlib import redirect_stdout
from typing import Any

import httpx
import respx

from kotoba_vllm import kw, read_forms
from kotoba_vllm.capacity import (ALL_SLOTS_BUSY, SLOT_AVAILABLE, UNMEASURED, aprobe_pool, probe_capacity,
                                  probe_pool)
from kotoba_vllm.cli import main

from faultserver import FaultServer, Seen, Step, refused_url, reply

from test_capacity_parse import (LLAMACPP_METRICS_BUSY, LLAMACPP_METRICS_IDLE, LLAMACPP_PROPS, LLAMACPP_SLOTS_BUSY,
                                 LLAMACPP_SLOTS_IDLE, SGLANG_METRICS, SGLANG_SERVER_INFO, VLLM_METRICS)

L, V, S = "http://llama.test:8080", "http://vllm.test:8000", "http://sglang.test:30000"


def mock_engines(m: respx.MockRouter, llama_busy: bool = False) -> None:
    m.get(L + "/slots").respond(200, content=LLAMACPP_SLOTS_BUSY if llama_busy else LLAMACPP_SLOTS_IDLE)
    m.get(L + "/metrics").respond(200, text=LLAMACPP_METRICS_BUSY if llama_busy else LLAMACPP_METRICS_IDLE)
    m.get(L + "/props").respond(200, content=LLAMACPP_PROPS)
    for p in ("/server_info", "/get_server_info", "/version"):
        m.get(L + p).respond(404)
    m.get(V + "/metrics").respond(200, text=VLLM_METRICS)
    m.get(V + "/load").respond(404)
    m.get(V + "/props").respond(404)
    m.get(V + "/server_info").respond(404)
    m.get(V + "/get_server_info").respond(404)
    m.get(V + "/version").respond(200, json={"version": "0.11.0"})
    m.get(S + "/metrics").respond(200, text=SGLANG_METRICS)
    m.get(S + "/props").respond(404)
    m.get(S + "/version").respond(404)
    m.get(S + "/server_info").respond(200, content=SGLANG_SERVER_INFO)
    m.get(S + "/get_server_info").respond(200, content=SGLANG_SERVER_INFO)


def test_auto_detects_each_engine_and_asks_every_member() -> None:
    with respx.mock(assert_all_called=False) as m:
        mock_engines(m)
        pool = probe_pool([L, V, S])
    by = {a.endpoint: a for a in pool.members}
    assert (by[L].backend, by[L].verdict) == ("llamacpp", SLOT_AVAILABLE)
    assert (by[V].backend, by[V].verdict) == ("vllm", SLOT_AVAILABLE)
    assert (by[S].backend, by[S].verdict) == ("sglang", ALL_SLOTS_BUSY)
    assert (pool.measured_available, pool.measured_busy, pool.unmeasured) == (2, 1, 0) and pool.enforced


def test_http_error_and_timeout_are_unmeasured_with_reason() -> None:
    with respx.mock(assert_all_called=False) as m:
        m.get(L + "/slots").mock(side_effect=httpx.ReadTimeout("slow"))
        m.get(L + "/metrics").mock(side_effect=httpx.ReadTimeout("slow"))
        m.get(L + "/props").mock(side_effect=httpx.ReadTimeout("slow"))
        a = probe_capacity(L, "llamacpp")
    assert a.verdict == UNMEASURED and "timed out" in (a.reason or "") and a.slots is None


def test_probes_carry_the_api_key_header() -> None:
    with respx.mock(assert_all_called=False) as m:
        mock_engines(m)
        probe_capacity(L, "llamacpp", headers={"authorization": "Bearer k"})
        assert all(c.request.headers.get("authorization") == "Bearer k" for c in m.calls)


async def test_async_probe_matches_sync() -> None:
    with respx.mock(assert_all_called=False) as m:
        mock_engines(m, llama_busy=True)
        sync = probe_pool([L, V, S], ["llamacpp", "vllm", "sglang"])
        asynced = await aprobe_pool([L, V, S], ["llamacpp", "vllm", "sglang"])
    assert [a.verdict for a in asynced.members] == [a.verdict for a in sync.members] == [
        ALL_SLOTS_BUSY, SLOT_AVAILABLE, ALL_SLOTS_BUSY]
    assert asynced.verdict == SLOT_AVAILABLE


def engines_on_loopback(llama_busy: bool = False) -> tuple[FaultServer, FaultServer, FaultServer]:
    """The same three engines as `mock_engines`, on real sockets (the CLI probes over http.client)."""
    def serve(routes: dict[str, tuple[int, bytes]]) -> FaultServer:
        def script(seen: Seen) -> list[Step]:
            status, body = routes.get(seen.path, (404, b"{}"))
            return reply(body, status)
        return FaultServer(script).start()

    def b(x: str | bytes) -> bytes:
        return x if isinstance(x, bytes) else x.encode()

    llama = serve({"/slots": (200, b(LLAMACPP_SLOTS_BUSY if llama_busy else LLAMACPP_SLOTS_IDLE)),
                   "/metrics": (200, b(LLAMACPP_METRICS_BUSY if llama_busy else LLAMACPP_METRICS_IDLE)),
                   "/props": (200, b(LLAMACPP_PROPS))})
    vllm = serve({"/metrics": (200, b(VLLM_METRICS)), "/version": (200, b'{"version": "0.11.0"}')})
    sglang = serve({"/metrics": (200, b(SGLANG_METRICS)), "/server_info": (200, b(SGLANG_SERVER_INFO)),
                    "/get_server_info": (200, b(SGLANG_SERVER_INFO))})
    return llama, vllm, sglang


def run_cli(*argv: str) -> tuple[int, list[Any]]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(["capacity", *argv])
    return rc, [f.value for f in read_forms(buf.getvalue())]


def test_cli_prints_each_member_then_the_pool_and_exit_status_says_the_verdict(tmp_path: Any) -> None:
    servers = engines_on_loopback(llama_busy=True)
    try:
        rc, forms = run_cli(servers[0].base_url, servers[2].base_url, "--backend", "auto")
    finally:
        for srv in servers:
            srv.stop()
    assert rc == 1 and len(forms) == 3
    assert [f[kw("capacity/verdict")] for f in forms] == [kw(ALL_SLOTS_BUSY)] * 3
    assert forms[2][kw("capacity/measured-busy")] == 2
    servers = engines_on_loopback()
    pool_file = tmp_path / "pool.edn"
    pool_file.write_text('{:pool/members ["%s" "%s"] :pool/backend :llamacpp}' % (servers[0].base_url, refused_url()))
    try:
        rc, forms = run_cli("--pool", str(pool_file))
    finally:
        for srv in servers:
            srv.stop()
    assert rc == 0 and forms[1][kw("capacity/verdict")] == kw(UNMEASURED)
    assert forms[2][kw("capacity/unmeasured")] == 1 and forms[2][kw("capacity/enforced?")] is False


def test_cli_usage_errors() -> None:
    assert run_cli()[0] == 2
