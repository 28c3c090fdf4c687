"""Rerank, score, classify, pooling, embeddings options, LoRA and cache control: what each engine is sent,
what is refused before anything is sent (naming endpoint, engine, and the file:line:column of the key), and
how answers are read. The engines' answers themselves are replayed from cassettes (test_cassettes_replay.py)
and met live (test_endpoints_live.py)."""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any

import attrs
import httpx
import pytest

from kotoba_vllm import AsyncClient, Client, ValidationError, kw
from kotoba_vllm._edn import read_forms
from kotoba_vllm._model import (CacheResetRequest, ClassifyRequest, EmbeddingRequest, LoraListRequest,
                                LoraLoadRequest, LoraScale, LoraScaleRequest, LoraUnloadRequest, PoolingRequest,
                                RerankRequest, ScoreRequest, SlotRequest, from_edn, to_edn)
from kotoba_vllm._requests import locate_problems, request_from_edn, request_to_edn
from kotoba_vllm._validate import validate
from kotoba_vllm.dialects import get_dialect
from kotoba_vllm.dialects._endpoints import SERVED_BY, decode_base64_floats

ENGINES = ("vllm", "sglang", "llamacpp", "openai")
# endpoint -> the engines that serve it (read from each engine's own router: vLLM's api_router modules,
# SGLang's http_server.py, llama.cpp's server.cpp of the build we ship)
SERVED = {
    "rerank": {"vllm", "sglang", "llamacpp"},
    "score": {"vllm"}, "classify": {"vllm"}, "pooling": {"vllm"},
    "lora-list": {"vllm", "sglang", "llamacpp"}, "lora-load": {"vllm", "sglang"}, "lora-unload": {"vllm", "sglang"},
    "lora-scale": {"llamacpp"}, "cache-reset": {"vllm", "sglang"}, "slot": {"llamacpp"},
}
SAMPLES = {
    "rerank": RerankRequest(query="q", documents=("a", "b"), top_n=1, model="m"),
    "score": ScoreRequest(text_1="q", text_2=("a", "b"), model="m"),
    "classify": ClassifyRequest(input=("a", "b"), model="m"),
    "pooling": PoolingRequest(input="a", task="token-embed", model="m"),
    "lora-list": LoraListRequest(),
    "lora-load": LoraLoadRequest(lora_name="sql", lora_path="/adapters/sql"),
    "lora-unload": LoraUnloadRequest(lora_name="sql"),
    "lora-scale": LoraScaleRequest(adapters=(LoraScale(id=0, scale=0.5),)),
    "cache-reset": CacheResetRequest(),
    "slot": SlotRequest(action="save", slot_id=1, filename="s1.bin"),
}


def wire(engine: str, req: Any) -> tuple[str, str, Any]:
    assert [p for p in validate(req, engine) if p.is_error] == []
    h = get_dialect(engine).render(req)
    return h.method, h.path, h.body


def test_who_serves_what_is_the_dialects_own_routes() -> None:
    assert {ep: set(SERVED_BY.get(ep, ())) for ep in SERVED} == SERVED


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_rerank_body_is_the_same_on_every_engine(engine: str) -> None:
    # vLLM RerankRequest{query, documents, top_n}; llama.cpp post_rerank reads query, documents, top_n
    assert wire(engine, SAMPLES["rerank"]) == ("POST", "/v1/rerank",
                                                {"model": "m", "query": "q", "documents": ["a", "b"], "top_n": 1})


def test_sglang_rerank_ranks_everything_so_top_n_is_refused() -> None:
    # SGLang's V1RerankReqInput (serving_rerank.py) has query and documents only, and ignores other fields
    [p] = [p for p in validate(SAMPLES["rerank"], "sglang") if p.is_error]
    assert p.field == "vllm/top-n" and p.engine == "sglang"
    req = RerankRequest(query="q", documents=("a", "b"), model="m")
    assert wire("sglang", req) == ("POST", "/v1/rerank", {"model": "m", "query": "q", "documents": ["a", "b"]})


def test_vllm_score_classify_pooling_bodies() -> None:
    assert wire("vllm", SAMPLES["score"]) == ("POST", "/score", {"model": "m", "text_1": "q", "text_2": ["a", "b"]})
    assert wire("vllm", SAMPLES["classify"]) == ("POST", "/classify", {"model": "m", "input": ["a", "b"]})
    assert wire("vllm", SAMPLES["pooling"]) == ("POST", "/pooling", {"model": "m", "input": "a",
                                                                     "task": "token_embed"})


def test_control_calls_per_engine() -> None:
    assert wire("vllm", SAMPLES["lora-list"]) == ("GET", "/v1/models", None)
    assert wire("vllm", SAMPLES["lora-load"]) == ("POST", "/v1/load_lora_adapter",
                                                  {"lora_name": "sql", "lora_path": "/adapters/sql"})
    assert wire("vllm", SAMPLES["lora-unload"]) == ("POST", "/v1/unload_lora_adapter", {"lora_name": "sql"})
    assert wire("vllm", SAMPLES["cache-reset"]) == ("POST", "/reset_prefix_cache", {})
    assert wire("sglang", SAMPLES["lora-load"]) == ("POST", "/load_lora_adapter",
                                                    {"lora_name": "sql", "lora_path": "/adapters/sql"})
    assert wire("sglang", SAMPLES["lora-unload"]) == ("POST", "/unload_lora_adapter", {"lora_name": "sql"})
    assert wire("sglang", SAMPLES["cache-reset"]) == ("POST", "/flush_cache", {})
    assert wire("llamacpp", SAMPLES["lora-list"]) == ("GET", "/lora-adapters", None)
    assert wire("llamacpp", SAMPLES["lora-scale"]) == ("POST", "/lora-adapters", [{"id": 0, "scale": 0.5}])
    assert wire("llamacpp", SAMPLES["slot"]) == ("POST", "/slots/1?action=save", {"filename": "s1.bin"})
    assert wire("llamacpp", SlotRequest(action="erase", slot_id=0)) == ("POST", "/slots/0?action=erase", {})


@pytest.mark.parametrize("endpoint", sorted(SERVED))
@pytest.mark.parametrize("engine", ENGINES)
def test_an_endpoint_an_engine_lacks_is_refused_by_name(endpoint: str, engine: str) -> None:
    errors = [p for p in validate(SAMPLES[endpoint], engine) if p.is_error]
    if engine in SERVED[endpoint]:
        assert errors == [] or (engine, endpoint) == ("sglang", "rerank")  # its top_n: below
        return
    [p] = errors
    assert p.code == "engine/endpoint" and p.engine == engine and p.field == "vllm/endpoint"
    assert f"{engine} has no {endpoint} endpoint" in p.msg
    assert all(e in p.msg for e in SERVED[endpoint])  # and who does serve it


def test_refusals_say_what_to_use_instead() -> None:
    [p] = validate(SAMPLES["lora-load"], "llamacpp")
    assert "--lora" in p.msg and ":lora-scale" in p.msg
    [p] = validate(SAMPLES["cache-reset"], "llamacpp")
    assert ":vllm/action :erase" in p.msg


class Counting(httpx.MockTransport):
    def __init__(self) -> None:
        self.calls = 0
        super().__init__(self._answer)

    def _answer(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        return httpx.Response(500)


@pytest.mark.parametrize("engine,call", [
    ("llamacpp", lambda c: c.score("a", ["b"])), ("sglang", lambda c: c.classify("x")),
    ("openai", lambda c: c.rerank("q", ["a"])), ("llamacpp", lambda c: c.reset_prefix_cache()),
    ("vllm", lambda c: c.slot_erase(0)), ("llamacpp", lambda c: c.load_lora_adapter("a", "/p")),
    ("sglang", lambda c: c.set_lora_scales({0: 1.0})), ("vllm", lambda c: c.pooling("x", task="nope")),
    ("llamacpp", lambda c: c.embeddings("x", dimensions=8)), ("llamacpp", lambda c: c.slot_save(0, "../x")),
    ("vllm", lambda c: c.rerank("q", [])), ("vllm", lambda c: c.embeddings("x", encoding_format="binary")),
])
def test_refused_calls_send_nothing_sync_and_async(engine: str, call: Any) -> None:
    sync_t, async_t = Counting(), Counting()
    with Client("http://127.0.0.1:9", backend=engine, http_client=httpx.Client(transport=sync_t)) as c:
        with pytest.raises(ValidationError):
            call(c)

    async def go() -> None:
        async with AsyncClient("http://127.0.0.1:9", backend=engine,
                               http_client=httpx.AsyncClient(transport=async_t)) as a:
            with pytest.raises(ValidationError):
                await call(a)

    asyncio.run(go())
    assert sync_t.calls == async_t.calls == 0


# ------------------------------------------------------------------ EDN: shapes, located problems


def test_every_new_request_round_trips_through_edn() -> None:
    for req in [*SAMPLES.values(), EmbeddingRequest(input="x", dimensions=8, encoding_format="base64")]:
        edn = request_to_edn(req)
        back, problems = request_from_edn(edn)
        assert problems == [] and back == req
        assert from_edn(to_edn(req), type(req)) == req


BAD = [
    ('{:vllm/endpoint :rerank\n :vllm/query "q"\n :vllm/documents ["a" 2]}', "request/type", "vllm/documents", 3),
    ('{:vllm/endpoint :rerank\n :vllm/query "q" :vllm/documents ["a"]\n :vllm/top-n "2"}', "request/type",
     "vllm/top-n", 3),
    ('{:vllm/endpoint :score\n :vllm/text-1 "a"\n :vllm/txt-2 "b"}', "request/unknown-key", "vllm/txt-2", 3),
    ('{:vllm/endpoint :pooling\n :vllm/input "a"\n :vllm/task :embedd}', "request/type", "vllm/task", 3),
    ('{:vllm/endpoint :embedding\n :vllm/input "a"\n :vllm/encoding-format :binary}', "request/type",
     "vllm/encoding-format", 3),
    ('{:vllm/endpoint :slot\n :vllm/action :flush :vllm/slot-id 0}', "request/type", "vllm/action", 2),
    ('{:vllm/endpoint :lora-scale\n :vllm/adapters [{:vllm/id 0\n   :vllm/scale "half"}]}', "request/type",
     "vllm/scale", 3),
    ('{:vllm/endpoint :lora-load\n :vllm/lora-name "x"}', "request/missing-key", "vllm/lora-path", 1),
]


@pytest.mark.parametrize("text,code,field,line", BAD)
def test_bad_input_is_a_problem_naming_file_line_column_and_key(text: str, code: str, field: str,
                                                                line: int) -> None:
    [f] = read_forms(text, "bad.edn")
    req, problems = request_from_edn(f.value, f)
    assert req is None
    hits = [p for p in problems if p.code == code and p.field == field]
    assert hits, problems
    assert hits[0].where is not None and hits[0].where.startswith(f"bad.edn:{line}:")


ENGINE_BAD = [
    ('{:vllm/endpoint :rerank :vllm/query "q"\n :vllm/documents ["a"]\n :vllm/top-n 0}', "vllm", "vllm/top-n", 3),
    ('{:vllm/endpoint :embedding :vllm/input "a"\n :vllm/dimensions 16}', "llamacpp", "vllm/dimensions", 2),
    ('{:vllm/endpoint :embedding :vllm/input "a"\n :vllm/encoding-format :base64}', "sglang",
     "vllm/encoding-format", 2),
    ('{:vllm/endpoint :slot :vllm/action :save\n :vllm/slot-id 0\n :vllm/filename "a/b"}', "llamacpp",
     "vllm/filename", 3),
    ('{:vllm/endpoint :score\n :vllm/text-1 "a" :vllm/text-2 "b"}', "llamacpp", "vllm/endpoint", 1),
]


@pytest.mark.parametrize("text,engine,field,line", ENGINE_BAD)
def test_engine_side_problems_are_located_too(text: str, engine: str, field: str, line: int) -> None:
    [f] = read_forms(text, "req.edn")
    req, problems = request_from_edn(f.value, f)
    assert req is not None and problems == []
    located = [p for p in locate_problems(validate(req, engine), f) if p.is_error]
    assert [p.field for p in located] == [field], located
    assert located[0].where is not None and located[0].where.startswith(f"req.edn:{line}:")


def test_embedding_options_per_engine() -> None:
    both = EmbeddingRequest(input="x", dimensions=8, encoding_format="base64")
    assert wire("vllm", both)[2] == {"input": "x", "dimensions": 8, "encoding_format": "base64"}
    assert wire("openai", both)[2] == {"input": "x", "dimensions": 8, "encoding_format": "base64"}
    assert wire("llamacpp", EmbeddingRequest(input="x", encoding_format="base64"))[2] == {
        "input": "x", "encoding_format": "base64"}
    # asking for the default is never ignored, so no engine refuses it
    assert [p for p in validate(EmbeddingRequest(input="x", encoding_format="float"), "sglang") if p.is_error] == []


# ------------------------------------------------------------------ answers


def test_base64_embeddings_decode_to_the_floats_that_were_encoded() -> None:
    floats = [0.5, -1.25, 3.0e-8, 1.0e30]
    text = base64.b64encode(struct.pack("<4f", *floats)).decode()
    assert decode_base64_floats(text) == pytest.approx(floats, rel=1e-6)
    obj = {"data": [{"index": 1, "embedding": text}, {"index": 0, "embedding": [1.0, 2.0]}]}
    resp = get_dialect("vllm").parse(EmbeddingRequest(input=["a", "b"], encoding_format="base64"), obj)
    assert resp.embeddings[0] == (1.0, 2.0) and resp.embeddings[1] == pytest.approx(floats, rel=1e-6)


def test_broken_base64_is_a_protocol_error() -> None:
    from kotoba_vllm import ProtocolError
    with pytest.raises(ProtocolError):
        decode_base64_floats("not base64!")
    with pytest.raises(ProtocolError):
        decode_base64_floats(base64.b64encode(b"abc").decode())  # 3 bytes: no whole float32


def test_rerank_answers_of_both_shapes_read_alike() -> None:
    req = SAMPLES["rerank"]
    vllm = {"id": "rerank-1", "model": "m", "usage": {"prompt_tokens": 9, "total_tokens": 9},
            "results": [{"index": 1, "document": {"text": "b"}, "relevance_score": 0.9},
                        {"index": 0, "document": {"text": "a"}, "relevance_score": 0.1}]}
    sglang = [{"score": 0.9, "document": "b", "index": 1, "meta_info": {}},
              {"score": 0.1, "document": "a", "index": 0, "meta_info": {}}]
    a, b = get_dialect("vllm").parse(req, vllm), get_dialect("sglang").parse(req, sglang)
    assert [(r.index, r.score, r.document) for r in a.results] == [(1, 0.9, "b"), (0, 0.1, "a")]
    assert [(r.index, r.score, r.document) for r in b.results] == [(1, 0.9, "b"), (0, 0.1, "a")]
    assert a.usage is not None and a.usage.prompt_tokens == 9 and a.id == "rerank-1"


def test_control_answers_in_words_or_json() -> None:
    d = get_dialect("sglang")
    done = d.parse(SAMPLES["cache-reset"], "Cache flushed.\nPlease check backend logs for more details.\n")
    assert done.ok and done.message is not None and done.message.startswith("Cache flushed.")
    failed = d.parse(SAMPLES["lora-load"], {"success": False, "error_message": "no such adapter",
                                            "loaded_adapters": {}})
    assert not failed.ok and failed.message == "no such adapter"
    assert failed.detail == {kw("success"): False, kw("error_message"): "no such adapter", kw("loaded_adapters"): {}}


# ------------------------------------------------------------------ request ids on the pooling family

# engine -> endpoint -> the body field its request model reads the id from (None: it has none, the header alone).
# vLLM 0.32.0/0.33.0: every pooling request has request_id (PoolingBasicRequestMixin); SGLang 0.5.23:
# EmbeddingRequest has rid, V1RerankReqInput nothing; llama.cpp reads no id.
ID_FIELDS = {
    "vllm": {"rerank": "request_id", "score": "request_id", "classify": "request_id", "pooling": "request_id",
             "embedding": "request_id"},
    "sglang": {"rerank": None, "embedding": "rid"},
    "llamacpp": {"rerank": None, "embedding": None},
}
WITH_ID = {"embedding": EmbeddingRequest(input="a", model="m"),
           **{ep: SAMPLES[ep] for ep in ("rerank", "score", "classify", "pooling")}}


@pytest.mark.parametrize("engine,endpoint", [(e, ep) for e, eps in ID_FIELDS.items() for ep in eps])
def test_the_request_id_goes_where_each_engine_reads_it(engine: str, endpoint: str) -> None:
    req = WITH_ID[endpoint]
    if engine == "sglang" and endpoint == "rerank":
        req = RerankRequest(query="q", documents=("a",), model="m")  # SGLang ranks everything: no top_n
    h = get_dialect(engine).render(attrs.evolve(req, request_id="rid-1"))
    id_field = ID_FIELDS[engine][endpoint]
    carried = {k: v for k, v in h.body.items() if v == "rid-1"}
    assert carried == ({id_field: "rid-1"} if id_field else {})
    assert h.headers["x-request-id"] == "rid-1"  # vLLM reads the header first; the others pass it to proxies


def _echo_pooling(seen: Any) -> Any:
    """Answers as vLLM does with --enable-request-id-headers: the id sent back in the header, and in the body id."""
    from faultserver import reply
    rid = seen.headers.get("x-request-id", "made-here")
    body = seen.json() or {}
    answers = {
        "/v1/rerank": {"id": f"score-{rid}", "results": [{"index": 0, "relevance_score": 0.5}]},
        "/score": {"id": f"score-{rid}", "data": [{"index": 0, "score": 0.5}]},
        "/classify": {"id": f"classify-{rid}", "data": [{"index": 0, "probs": [1.0], "num_classes": 1}]},
        "/pooling": {"id": f"pooling-{rid}", "data": [{"index": 0, "data": [0.5]}]},
        "/v1/embeddings": {"id": f"embd-{rid}", "data": [{"index": 0, "embedding": [0.5]}]},
    }
    assert body.get("request_id") == rid
    return reply(answers[seen.path], headers=[("x-request-id", rid)])


POOLING_CALLS = {
    "rerank": lambda c, rid: c.rerank("q", ["a"], request_id=rid),
    "score": lambda c, rid: c.score("q", ["a"], request_id=rid),
    "classify": lambda c, rid: c.classify("a", request_id=rid),
    "pooling": lambda c, rid: c.pooling("a", request_id=rid),
    "embedding": lambda c, rid: c.embeddings("a", request_id=rid),
}


def test_the_servers_id_comes_back_on_every_pooling_answer_sync_and_async() -> None:
    from faultserver import FaultServer

    async def go(url: str) -> list[Any]:
        async with AsyncClient(url, backend="vllm") as a:
            return [await call(a, f"a-{ep}") for ep, call in POOLING_CALLS.items()]

    with FaultServer(_echo_pooling) as srv:
        with Client(srv.base_url, backend="vllm") as c:
            answers = [call(c, f"s-{ep}") for ep, call in POOLING_CALLS.items()]
        answers += asyncio.run(go(srv.base_url))
        assert len(srv.seen) == 2 * len(POOLING_CALLS)
    for mode, r in zip(["s"] * 5 + ["a"] * 5, answers):
        ours = r.request_id
        assert ours.startswith(mode + "-") and r.server_request_id == ours and r.id.endswith("-" + ours)
        assert to_edn(r)[kw("vllm/server-request-id")] == ours


def test_a_pass_through_body_on_a_json_array_body_is_refused_by_name() -> None:
    # llama.cpp's LoRA scales are a JSON array: an :vllm/extra-body key has no object to go into
    req = LoraScaleRequest(adapters=(LoraScale(id=0, scale=0.5),), extras={"vllm/extra-body": {kw("a"): 1}})
    with pytest.raises(ValidationError, match="has no JSON object to go into") as e:
        get_dialect("llamacpp").render(req)
    assert e.value.problems[0].field == "vllm/extra-body"
