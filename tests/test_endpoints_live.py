"""Live tier: rerank, embeddings options, LoRA adapters and slot save/restore/erase against real llama-servers
(the tiny models of kotoba_vllm/cassettes/_endpoint_sets.py), sync and async; and the CLI verbs.

Two servers for the module: the tiny Qwen3-architecture reranker with `--rerank`, and the tiny llama model
with `--embeddings --pooling mean --lora ADAPTER --slot-save-path DIR`. Both start in about a second."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from kotoba_vllm import AsyncClient, BadRequest, Client, ServerError, ValidationError
from kotoba_vllm._edn import kw, read_all

pytestmark = pytest.mark.live
ROOT = Path(__file__).resolve().parent.parent
DOCS = ["the cat sat on the mat", "EDN is a data format", "hello world"]


def _started(make):  # type: ignore[no-untyped-def]
    from _live import unavailable
    from kotoba_vllm.local import LocalServerError
    try:
        return make().start()
    except LocalServerError as e:
        unavailable(f"no llama-server here: {e}")


@pytest.fixture(scope="module")
def rerank_url() -> Iterator[str]:
    from kotoba_vllm.cassettes._endpoint_sets import rerank_server
    srv = _started(rerank_server)
    yield srv.base_url
    srv.stop()


@pytest.fixture(scope="module")
def slot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def control_url(slot_dir: Path) -> Iterator[str]:
    from kotoba_vllm.cassettes._endpoint_sets import control_server
    srv = _started(lambda: control_server(slot_dir))
    yield srv.base_url
    srv.stop()


def test_rerank_ranks_every_document_best_first(rerank_url: str) -> None:
    with Client(rerank_url, backend="llamacpp", timeout=60) as c:
        r = c.rerank("what is EDN", DOCS)
        top = c.rerank("what is EDN", DOCS, top_n=2)
    assert sorted(x.index for x in r.results) == [0, 1, 2]
    scores = [x.score for x in r.results]
    assert scores == sorted(scores, reverse=True) and all(math.isfinite(s) for s in scores)
    # the head is real: a softmax over two labels, so each score is a probability, and they differ per document
    assert all(0.0 < s < 1.0 for s in scores) and len(set(scores)) == 3
    assert [x.index for x in top.results] == [x.index for x in r.results][:2]
    assert r.backend == "llamacpp" and r.endpoint_url == rerank_url + "/v1/rerank"
    assert r.usage is not None and r.usage.prompt_tokens is not None and r.usage.prompt_tokens > 0


def test_rerank_async_gives_the_same_answer(rerank_url: str) -> None:
    async def go() -> list[tuple[int, float]]:
        async with AsyncClient(rerank_url, backend="auto", timeout=60) as a:
            r = await a.rerank("what is EDN", DOCS)
        return [(x.index, x.score) for x in r.results]

    with Client(rerank_url, backend="llamacpp", timeout=60) as c:
        sync = [(x.index, x.score) for x in c.rerank("what is EDN", DOCS).results]
    assert asyncio.run(go()) == sync


def test_rerank_on_a_server_without_rerank_is_its_own_typed_refusal(control_url: str) -> None:
    with Client(control_url, backend="llamacpp", timeout=60) as c, pytest.raises(ServerError) as ei:
        c.rerank("q", ["a"])
    assert ei.value.status == 501 and "--reranking" in ei.value.message


def test_embeddings_base64_decodes_to_the_float_answer(control_url: str) -> None:
    with Client(control_url, backend="llamacpp", timeout=60) as c:
        floats = c.embeddings(["Hello", "world"])
        b64 = c.embeddings(["Hello", "world"], encoding_format="base64")
        with pytest.raises(ValidationError) as ei:
            c.embeddings("Hello", dimensions=16)  # llama.cpp has no dimensions: refused, nothing sent
    assert [p.field for p in ei.value.problems] == ["vllm/dimensions"]
    assert len(b64.embeddings) == 2 and len(b64.embeddings[0]) == len(floats.embeddings[0]) == 64
    for a, b in zip(floats.embeddings, b64.embeddings):
        assert b == pytest.approx(a, rel=1e-6, abs=1e-7)  # float32 bytes vs JSON's shortest decimal


def test_lora_list_and_scale(control_url: str) -> None:
    with Client(control_url, backend="llamacpp", timeout=60) as c:
        before = c.lora_adapters()
        done = c.set_lora_scales({0: 0.25})
        after = c.lora_adapters()
        c.set_lora_scales({0: 1.0})
        with pytest.raises(ValidationError):
            c.load_lora_adapter("x", "/x")  # llama.cpp loads adapters only at start
    [a] = before.adapters
    assert a.id == 0 and a.path is not None and a.path.endswith(".gguf") and a.scale == 1.0
    assert done.ok and done.endpoint == "lora-scale"
    assert after.adapters[0].scale == 0.25


def test_slot_save_erase_restore(control_url: str, slot_dir: Path) -> None:
    with Client(control_url, backend="llamacpp", timeout=60) as c:
        c.chat("Say hello.", max_tokens=4, temperature=0.0, extras={"llamacpp/id-slot": 0})
        saved = c.slot_save(0, "live.bin")
        erased = c.slot_erase(0)
        restored = c.slot_restore(0, "live.bin")
        with pytest.raises(BadRequest):
            c.slot_restore(0, "never-saved.bin")
        with pytest.raises(ValidationError):
            c.slot_save(0, "../outside.bin")  # refused here: never reaches the server
    assert saved.ok and (slot_dir / "live.bin").is_file()
    n_saved = saved.detail[kw("n_saved")]
    assert n_saved > 0 and erased.detail[kw("n_erased")] == n_saved
    assert restored.detail[kw("n_restored")] == n_saved


def test_slot_restore_brings_the_cache_back(control_url: str) -> None:
    """By effect, not by a 200: after an erase the same prompt is evaluated from nothing; after a restore
    llama.cpp's own counter (timings.cache_n, our cached tokens) says the prompt came from the restored slot."""
    prompt = "Once upon a time there was a small model"
    with Client(control_url, backend="llamacpp", timeout=60) as c:
        def cached() -> int | None:
            r = c.completion(prompt, native=True, max_tokens=1, temperature=0.0,
                             extras={"llamacpp/id-slot": 0, "llamacpp/cache-prompt": True})
            return r.usage.cached_tokens if r.usage is not None else None

        cached()  # fills slot 0
        warm = cached()
        c.slot_save(0, "effect.bin")
        c.slot_erase(0)
        cold = cached()
        c.slot_erase(0)
        c.slot_restore(0, "effect.bin")
        restored = cached()
    assert warm is not None and warm > 0 and cold == 0 and restored == warm


def test_run_sends_rerank_and_slot_requests_from_edn(rerank_url: str, tmp_path: Path) -> None:
    f = tmp_path / "requests.edn"
    f.write_text('{:vllm/endpoint :rerank :vllm/query "what is EDN"\n'
                 ' :vllm/documents ["a cat" "EDN is data" "hello"] :vllm/top-n 2}\n'
                 '{:vllm/endpoint :score :vllm/text-1 "a" :vllm/text-2 "b"}\n'
                 '{:vllm/endpoint :rerank :vllm/query "q"\n :vllm/documents ["a" 7]}\n')
    p = cli("run", str(f), "--base-url", rerank_url, "--no-progress")
    ok, refused, bad = read_all(p.stdout)
    assert [r[kw("vllm/index")] for r in ok[kw("vllm/results")]] and len(ok[kw("vllm/results")]) == 2
    assert refused[kw("vllm/error")] == kw("validation")
    assert "llamacpp has no score endpoint" in refused[kw("vllm/problems")][0][kw("vllm/msg")]
    [problem] = bad[kw("vllm/problems")]
    assert problem[kw("vllm/field")] == kw("vllm/documents") and problem[kw("vllm/where")] == f"{f}:5:2"  # the key


def test_record_cli_records_the_rerank_set(rerank_url: str, tmp_path: Path) -> None:
    p = cli("record", "--base-url", rerank_url, "--engine", "llamacpp", "--set", "rerank", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert sorted(x.stem for x in tmp_path.glob("*.edn")) == ["rerank", "rerank-top-n", "slot-save-unsupported"]


def test_slot_calls_async(control_url: str, slot_dir: Path) -> None:
    async def go() -> tuple[int, int]:
        async with AsyncClient(control_url, backend="llamacpp", timeout=60) as a:
            await a.chat("Say hello.", max_tokens=4, temperature=0.0, extras={"llamacpp/id-slot": 0})
            saved = await a.slot_save(0, "async.bin")
            await a.slot_erase(0)
            restored = await a.slot_restore(0, "async.bin")
            scales = await a.lora_adapters()
        assert scales.adapters
        return saved.detail[kw("n_saved")], restored.detail[kw("n_restored")]

    n_saved, n_restored = asyncio.run(go())
    assert n_saved == n_restored > 0 and (slot_dir / "async.bin").is_file()


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kotoba_vllm", *argv], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_cli_verbs(control_url: str, rerank_url: str) -> None:
    listed = cli("lora", "list", "--base-url", control_url)
    assert listed.returncode == 0, listed.stderr
    [resp] = read_all(listed.stdout)
    assert resp[kw("vllm/adapters")][0][kw("vllm/id")] == 0
    erase = cli("cache", "erase", "--slot", "0", "--base-url", control_url)
    assert erase.returncode == 0, erase.stderr
    [resp] = read_all(erase.stdout)
    assert resp[kw("vllm/ok")] is True and resp[kw("vllm/endpoint")] == kw("slot")
    refused = cli("cache", "reset", "--base-url", control_url, "--backend", "llamacpp")
    assert refused.returncode == 2 and "llamacpp has no cache-reset endpoint" in refused.stderr
    server_says_no = cli("cache", "save", "--slot", "0", "--filename", "x.bin", "--base-url", rerank_url)
    assert server_says_no.returncode == 1 and "--slot-save-path" in server_says_no.stdout
