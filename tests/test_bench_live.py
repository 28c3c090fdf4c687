"""`python -m kotoba_vllm bench` against real llama-servers: one CLI run over two servers with a
long prompt, then its EDN report, table and plot are checked (few requests, small max_tokens)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from kotoba_vllm._edn import kw, read_one

pytestmark = pytest.mark.live
ROOT = Path(__file__).resolve().parents[1]


def K(m: Any, *keys: str) -> Any:
    for k in keys:
        m = m[kw(k)]
    return m


@pytest.fixture(scope="module")
def second_server() -> Iterator[str]:
    from conftest import _start
    srv = _start(n_ctx=2048, parallel=1)
    yield srv.base_url
    srv.stop()


@pytest.fixture(scope="module")
def bench_run(llama_url: str, second_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench")
    edn, png = out / "bench.edn", out / "bench.png"
    # ~600 prompt tokens (the fixture's slots hold 1024): prefill dominates each request
    cmd = [sys.executable, "-m", "kotoba_vllm", "bench", "--base-url", llama_url, "--base-url", second_server,
           "--long-prompt-tokens", "600", "--requests", "3", "--max-tokens", "12", "--concurrency", "1",
           "--output", str(edn), "--plot", str(png)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    return {"edn": read_one(edn.read_text()), "table": p.stdout, "stderr": p.stderr, "png": png,
            "urls": (llama_url, second_server)}


def rows(run: dict[str, Any]) -> dict[str, Any]:
    return {K(r, "bench/endpoint"): r for r in K(run["edn"], "bench/results")}


def test_rates_agree_with_the_servers_own_metrics(bench_run: dict[str, Any]) -> None:
    for url, r in rows(bench_run).items():
        sm = K(r, "bench/server-metrics")
        for phase in ("prefill", "decode"):
            ours = K(r, f"bench/{phase}", "vllm/tokens-per-s")
            theirs = K(sm, f"bench/{phase}", "vllm/tokens-per-s")
            # both sides are worked out here: ours from the answers' figures, theirs from /metrics deltas
            assert K(sm, f"bench/{phase}", "vllm/provenance") == kw("computed"), sm
            assert K(r, f"bench/{phase}", "vllm/provenance") == kw("computed"), r
            assert ours and theirs, (url, phase)
            assert abs(ours / theirs - 1) <= 0.10, (url, phase, ours, theirs)
        # the same tokens, counted twice: decode leaves out each answer's first token on both sides
        for phase in ("prefill", "decode"):
            assert K(r, f"bench/{phase}", "vllm/tokens") == K(sm, f"bench/{phase}", "vllm/tokens"), (phase, r, sm)
        assert "less one first token per answer (3)" in K(sm, "bench/decode", "bench/rate-source")


def test_two_servers_are_reported_separately(bench_run: dict[str, Any]) -> None:
    rs = rows(bench_run)
    assert set(rs) == {u.rstrip("/") for u in bench_run["urls"]}
    assert K(bench_run["edn"], "bench/aggregated-across-endpoints?") is False
    assert K(bench_run["edn"], "bench/endpoints-differed?") is False
    for url in rs:
        assert f"== {url}  concurrency 1" in bench_run["table"]
        assert K(rs[url], "bench/ok") == 3


def test_long_prompt_shows_separated_rates_beside_the_misleading_one(bench_run: dict[str, Any]) -> None:
    for r in rows(bench_run).values():
        assert K(r, "bench/prefill", "vllm/tokens") >= 3 * 400  # the long prompt was really prefilled
        decode = K(r, "bench/decode", "vllm/tokens-per-s")
        misleading = K(r, "bench/misleading-rate", "vllm/tokens-per-s")
        # one request at a time: prefill sits inside the wall clock, so the quotient reads slower
        assert misleading < decode
        assert "not a decode rate" in K(r, "bench/misleading-rate", "bench/note")
    table = bench_run["table"]
    for block in table.split("\n== ")[1:]:
        assert "prefill  " in block and "decode   " in block and "MISLEADING completion_tokens / wall_clock" in block


def test_progress_bar_on_stderr_and_plot_is_a_png(bench_run: dict[str, Any]) -> None:
    assert "req" in bench_run["stderr"]  # tqdm's bar
    data = bench_run["png"].read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_pool_run_is_reported_per_answering_member(llama_url: str, second_server: str, tmp_path: Path) -> None:
    pool = tmp_path / "pool.edn"
    pool.write_text(f'{{:pool/members ["{llama_url}" "{second_server}"] :pool/backend :llamacpp}}')
    edn = tmp_path / "pool-bench.edn"
    p = subprocess.run([sys.executable, "-m", "kotoba_vllm", "bench", "--pool", str(pool), "--requests", "3",
                        "--max-tokens", "8", "--output", str(edn), "-q"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    report = read_one(edn.read_text())
    members = {llama_url.rstrip("/"), second_server.rstrip("/")}
    assert K(report, "bench/endpoints-differed?") is True  # a pool target is answered by its members
    assert "ANSWERING ENDPOINTS DIFFERED" in p.stdout
    rs = K(report, "bench/results")
    assert rs and {K(r, "bench/endpoint") for r in rs} <= members
    assert sum(K(r, "bench/ok") for r in rs) == 3
    for r in rs:
        assert K(r, "bench/target") == f"pool {pool}"
        assert K(r, "bench/server-metrics", "bench/decode", "vllm/provenance") == kw("computed")
