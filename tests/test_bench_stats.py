"""Pure bench statistics: percentiles, per-endpoint aggregation, the differing-endpoint flag,
unavailable-not-zero, the server cross-check arithmetic, and the rendered outputs."""

from __future__ import annotations

import pytest

from kotoba_vllm._edn import kw, read_one
from kotoba_vllm._errors import AdmissionRejected, RequestTimeout
from kotoba_vllm._model import Figure, Response, Timings, Usage
from kotoba_vllm.bench._metrics import parse_counters, server_rates
from kotoba_vllm.bench._prompts import PromptError, chat, load_prompts, prepared
from kotoba_vllm.bench._report import plot, render_table, to_edn
from kotoba_vllm.bench._runner import BenchConfig, BenchReport
from kotoba_vllm.bench._stats import (Sample, answered_by, differing_endpoints, dist, sample_from_error,
                                     sample_from_response, summarize)

A, B = "http://a:1", "http://b:2"
S, C = "server-reported", "client-measured"


def resp(url: str, *, prefill=(100, 50.0), decode=(20, 400.0), ttft=60.0, gaps=(20.0, 20.0), e2e=500.0,
         completion: int | None = 20) -> Response:
    def fig(p, tm):
        if tm is None:
            return Figure()
        n, ms = tm
        return Figure(provenance=p, tokens=n, ms=ms, tokens_per_s=round(n * 1000 / ms, 3))
    t = Timings(prefill=fig(S, prefill), decode=fig(S, decode),
                ttft=Figure(provenance=C, ms=ttft) if ttft is not None else Figure(),
                inter_token=Figure(provenance=C, tokens=len(gaps), ms=1.0, gaps_ms=gaps) if gaps else Figure(),
                end_to_end=Figure(provenance=C, ms=e2e))
    return Response(text="x", usage=Usage(completion_tokens=completion), endpoint_url=url + "/v1/chat/completions",
                    timings=t)


def sample(url: str, target: str | None = None, conc: int = 1, t0: float = 0.0, **kw_: object) -> Sample:
    return sample_from_response(target or url, conc, t0, t0 + 0.5, resp(url, **kw_))  # type: ignore[arg-type]


def test_percentiles_interpolate_and_empty_is_nil() -> None:
    d = dist([float(x) for x in range(1, 101)])
    assert (d.n, d.p50, d.p90, d.p99) == (100, 50.5, 90.1, 99.01)
    e = dist([])
    assert (e.n, e.p50, e.p90, e.p99, e.provenance) == (0, None, None, None, "unavailable")
    assert dist([7.0]).p99 == 7.0


def test_unmeasured_is_skipped_not_counted_as_zero() -> None:
    d = dist([10.0, None, 30.0], [S, "unavailable", S])
    assert d.n == 2 and d.p50 == 20.0 and d.provenance == S
    samples = [sample(A), sample(A, prefill=None, ttft=None, gaps=())]
    [s] = summarize(samples)
    assert s.prefill_rate.n == 1 and s.prefill_rate.p50 == 2000.0  # not dragged towards 0
    assert s.ttft_ms.n == 1 and s.ttft_ms.p50 == 60.0
    assert s.prefill.tokens == 100 and s.prefill.n == 1


def test_all_unavailable_renders_as_nil_and_n_a() -> None:
    samples = [sample(A, prefill=None, decode=None, ttft=None, gaps=(), completion=None)]
    [s] = summarize(samples)
    assert s.decode.tokens_per_s is None and s.decode.provenance == "unavailable"
    assert s.misleading.tokens_per_s is None  # no completion count: no quotient either
    rep = report(samples)
    edn = to_edn(rep)
    row = edn[kw("bench/results")][0]
    assert row[kw("bench/decode-tokens-per-s")][kw("bench/p50")] is None
    assert row[kw("bench/decode-tokens-per-s")][kw("vllm/provenance")] == kw("unavailable")
    assert "n/a (unavailable)" in render_table(rep)


def test_mixed_provenance_is_said() -> None:
    assert dist([1.0, 2.0], [S, C]).provenance == "mixed"


def test_aggregation_is_per_endpoint_and_concurrency() -> None:
    samples = [sample(A, decode=(10, 100.0)), sample(A, decode=(30, 100.0)),
               sample(B, decode=(10, 1000.0)), sample(A, conc=4, decode=(5, 100.0))]
    rows = {(s.endpoint, s.concurrency): s for s in summarize(samples)}
    assert set(rows) == {(A, 1), (B, 1), (A, 4)}
    a = rows[(A, 1)]
    # a decode span covers the tokens after each request's first (llama.cpp's own rates count so): 9 + 29
    assert a.requests == 2 and a.decode.tokens == 38 and a.decode.ms == 200.0 and a.decode.tokens_per_s == 190.0
    assert (a.decode.provenance, a.decode.inputs) == ("computed", S)  # summed here, from the server's figures
    assert rows[(B, 1)].decode.tokens_per_s == 9.0  # B's slowness never blends into A's row


def test_pooled_rate_is_sum_over_sum_not_mean_of_rates() -> None:
    [s] = summarize([sample(A, decode=(10, 1000.0)), sample(A, decode=(90, 1000.0))])
    assert s.decode.tokens_per_s == 49.0  # (9 + 89) / 2 s
    assert s.decode_rate.p50 == 50.0  # (10 + 90) / 2: the per-request distribution, separately


def test_client_measured_pooled_decode_counts_tokens_after_the_first() -> None:
    """vLLM: decode seen from the stream spans first to last token, i.e. n - 1 tokens."""
    t = Timings(decode=Figure(provenance=C, tokens=11, ms=1000.0, tokens_per_s=10.0))
    s1 = sample_from_response(A, 1, 0.0, 1.0, Response(usage=Usage(completion_tokens=11), endpoint_url=A, timings=t))
    [s] = summarize([s1])
    assert s.decode.tokens == 10 and s.decode.tokens_per_s == 10.0 == s.decode_rate.p50
    assert s.decode.provenance == C


def test_differing_endpoint_flag() -> None:
    same = [sample(A), sample(B)]
    assert differing_endpoints(same) == {}
    routed = [sample(A), sample(B, target=A)]  # a router at A sent one request to B
    assert differing_endpoints(routed) == {A: [A, B]}
    elsewhere = [sample(B, target=A)]
    assert differing_endpoints(elsewhere) == {A: [B]}
    rep = report(routed)
    assert to_edn(rep)[kw("bench/endpoints-differed?")] is True
    assert "ANSWERING ENDPOINTS DIFFERED" in render_table(rep)
    rows = summarize(routed)
    assert {(r.endpoint, r.target) for r in rows} == {(A, A), (B, A)}


def test_answered_by_strips_the_route() -> None:
    assert answered_by(A, A + "/v1/chat/completions") == A
    assert answered_by(A, "http://other:9/v1/chat/completions") == "http://other:9"
    assert answered_by(A, None) is None


def test_errors_by_kind_with_admission_rejections_apart() -> None:
    errs = [sample_from_error(A, 1, 0.0, 0.1, AdmissionRejected("full", reason="all-slots-busy", endpoint=A)),
            sample_from_error(A, 1, 0.0, 0.1, RequestTimeout("slow", phase="read", limit_s=1.0, endpoint=A)),
            sample_from_error(A, 1, 0.0, 0.1, AdmissionRejected("full", reason="all-slots-busy", endpoint=A))]
    [s] = summarize(errs + [sample(A)])
    assert s.admission_rejections == 2 and s.errors == {"timeout": 1} and s.ok == 1
    assert s.ttft_ms.n == 1  # failed requests contribute no latency


def test_misleading_figure_sits_beside_the_separated_rates() -> None:
    """The seed's story: a long prefill inside the wall clock makes decode look ~10x slower."""
    s1 = sample_from_response(A, 1, 0.0, 13.3, resp(A, prefill=(12000, 13_000.0), decode=(16, 300.0), e2e=13_300.0,
                                                           completion=16))
    [s] = summarize([s1])
    assert s.misleading.tokens_per_s == pytest.approx(1.203, rel=1e-3)
    assert s.decode.tokens_per_s == pytest.approx(50.0, rel=1e-3)  # 15 tokens after the first in 300 ms
    table = render_table(report([s1]))
    decode_line = next(line for line in table.splitlines() if line.strip().startswith("decode   "))
    mis_line = next(line for line in table.splitlines() if "MISLEADING" in line)
    assert "50.0" in decode_line and "computed from server-reported" in decode_line and "1.2 tok/s" in mis_line and "not a decode rate" in mis_line
    assert table.index(decode_line) < table.index(mis_line)


METRICS_BEFORE = """# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 100
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 1.0
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 50
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 2.0
"""


def test_server_rates_from_counter_deltas() -> None:
    before = parse_counters(METRICS_BEFORE)
    after = parse_counters(METRICS_BEFORE.replace(" 100\n", " 1100\n").replace(" 1.0\n", " 3.0\n")
                           .replace(" 50\n", " 250\n").replace(" 2.0\n", " 6.0\n"))
    r = server_rates(before, after)
    assert r.engine == "llamacpp" and r.problem is None
    assert r.prefill.tokens_per_s == 500.0 and r.decode.tokens_per_s == 50.0
    assert r.decode.provenance == "computed" and "first token included" in r.decode.source  # no answer count given


def test_llamacpp_decode_counter_loses_one_first_token_per_answer() -> None:
    """llama.cpp's predicted-token counter includes each request's first token (made by the prefill) and it
    exports no request count: with the answers bench read, the decode figure counts decode steps, as the
    server's own per-request rates do, and says so."""
    before = parse_counters(METRICS_BEFORE)
    after = parse_counters(METRICS_BEFORE.replace(" 100\n", " 1100\n").replace(" 1.0\n", " 3.0\n")
                           .replace(" 50\n", " 250\n").replace(" 2.0\n", " 6.0\n"))
    r = server_rates(before, after, answers=8)
    assert (r.decode.tokens, r.decode.seconds, r.decode.tokens_per_s) == (192, 4.0, 48.0)
    assert r.decode.provenance == "computed" and "less one first token per answer (8)" in r.decode.source
    assert r.prefill.tokens == 1000  # prompt tokens have no first-token share


def test_server_rates_unavailable_not_zero() -> None:
    assert server_rates(None, None).decode.tokens_per_s is None
    r = server_rates({"x": 1.0}, {"x": 2.0})
    assert r.problem and r.prefill.tokens_per_s is None
    before = parse_counters(METRICS_BEFORE)
    restarted = {k: 0.0 for k in before}
    assert "backwards" in (server_rates(before, restarted).problem or "")
    same = server_rates(before, before)  # no work in between: tokens 0 over 0 s has no rate
    assert same.decode.tokens == 0 and same.decode.tokens_per_s is None


def test_prompts_file_strings_and_request_maps(tmp_path) -> None:
    p = tmp_path / "p.edn"
    p.write_text('["hello" {:vllm/endpoint :completion :vllm/prompt "Once" :vllm/sampling {:vllm/max-tokens 4}}]')
    reqs = load_prompts(str(p))
    assert [r.endpoint for r in reqs] == ["chat", "completion"]
    out = prepared(reqs[1], base_url=A, max_tokens=32, model=None, nonce="n1")
    assert out.stream is True and out.base_url == A and out.sampling.max_tokens == 4  # the request's own wins
    assert out.prompt.startswith("[n1] ")
    c = prepared(chat("hi"), base_url=B, max_tokens=8, model="m", nonce=None)
    assert c.sampling.max_tokens == 8 and c.model == "m" and c.messages[0].content == "hi"
    bad = tmp_path / "bad.edn"
    bad.write_text('{:vllm/endpoint :embedding :vllm/input "x"}')
    with pytest.raises(PromptError):
        load_prompts(str(bad))


def test_shipped_example_prompts_load() -> None:
    reqs = load_prompts("examples/bench-prompts.edn")
    assert len(reqs) >= 2


def report(samples: list[Sample]) -> BenchReport:
    cfg = BenchConfig(base_urls=tuple(sorted({s.target for s in samples})), prompts=(chat("hi"),))
    return BenchReport(config=cfg, started_at="2026-11-30T00:00:00+00:00", samples=tuple(samples),
                       summaries=tuple(summarize(samples)), server={}, differing=differing_endpoints(samples))


def test_edn_output_reads_back_and_says_it_does_not_aggregate() -> None:
    from kotoba_vllm._edn import dumps
    rep = report([sample(A), sample(B)])
    back = read_one(dumps(to_edn(rep)))
    assert back[kw("bench/aggregated-across-endpoints?")] is False
    assert [r[kw("bench/endpoint")] for r in back[kw("bench/results")]] == [A, B]


def test_plot_writes_a_png(tmp_path) -> None:
    rep = report([sample(A), sample(A, t0=0.1), sample(B, prefill=None)])
    out = tmp_path / "p.png"
    plot(rep, str(out))
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_server_cross_check_is_shown_with_its_ratio_and_a_disagreement_is_flagged() -> None:
    import attrs
    from kotoba_vllm.bench._metrics import Rate, ServerRates
    rep = report([sample(A, prefill=(100, 50.0), decode=(20, 400.0))])
    agree = ServerRates("llamacpp", Rate(100, 0.05, 2000.0), Rate(19, 0.4, 47.5, source="counter deltas less one"))
    rows = tuple(attrs.evolve(s, server=agree) for s in rep.summaries)
    table = render_table(attrs.evolve(rep, summaries=rows))
    assert "server /metrics 2000.0 tok/s [counter deltas]  (bench/server 1.000)" in table and "DISAGREE" not in table
    assert "server /metrics 47.5 tok/s [counter deltas less one]  (bench/server 1.000)" in table
    off = ServerRates("llamacpp", Rate(100, 0.025, 4000.0), Rate(20, 0.4, 47.5))
    rep2 = attrs.evolve(rep, summaries=tuple(attrs.evolve(s, server=off) for s in rep.summaries))
    assert "(bench/server 0.500)  DISAGREE" in render_table(rep2)
    ratio = to_edn(rep2)[kw("bench/results")][0][kw("bench/server-metrics")][kw("bench/bench-over-server")]
    assert ratio[kw("bench/prefill")] == 0.5 and ratio[kw("bench/decode")] == 1.0


def test_server_rates_from_sglang_0_5_23_metrics() -> None:
    """SGLang's own /metrics, recorded before and after the generation exchanges of its cassette set:
    bench finds SGLang's counters and histograms (no "no known counters"), every figure from them."""
    from kotoba_vllm.cassettes import cassette_body, load_cassettes
    probes = {c.name: c for c in load_cassettes("sglang") if c.op == "probe"}
    before = parse_counters(cassette_body(probes["metrics-start"]).decode())
    after = parse_counters(cassette_body(probes["metrics"]).decode())
    r = server_rates(before, after)
    assert r.engine == "sglang" and r.problem is None, r
    # a fresh server creates its token counters on first use: absent before the run means zero
    assert "sglang:generation_tokens_total" not in before
    gen, reqs = after["sglang:generation_tokens_total"], after["sglang:num_requests_total"]
    assert r.decode.tokens == gen - reqs and r.decode.tokens > 0  # one first token per request is prefill's
    assert r.decode.tokens_per_s is not None and r.decode.tokens_per_s > 0
    stage = 'sglang:per_stage_req_latency_seconds_sum{stage="prefill_forward"}'
    assert r.prefill.seconds == round(after[stage] - before[stage], 6) and r.prefill.tokens_per_s is not None
    assert r.prefill.tokens == after["sglang:prompt_tokens_total"]  # no prefix-cache hit: no cached counter yet
    assert "batch" in (r.note or "")  # a shared forward pass counted per request: said, not hidden
