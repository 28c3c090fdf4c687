"""The server's own counters, read before and after a run (pure parsing; the runner fetches).

llama.cpp (`--metrics`): `llamacpp:prompt_tokens_total`, `llamacpp:prompt_seconds_total`,
`llamacpp:tokens_predicted_total`, `llamacpp:tokens_predicted_seconds_total` — the same per-request
prompt/predicted times its `timings` report, summed. vLLM (names as vLLM 0.33.0's own Prometheus
loggers export them, recorded in tests/cassettes/vllm/metrics*.edn): `vllm:prompt_tokens_total` over
the `_sum` of `vllm:request_prefill_time_seconds` (scheduled -> first token); decode is
`vllm:generation_tokens_total` less one first token per request (`_count`) over the `_sum` of
`vllm:request_decode_time_seconds` (first -> last token); TTFT is the mean of the
`vllm:time_to_first_token_seconds` histogram (arrival -> first token) over the run."""

from __future__ import annotations

from typing import Mapping

import attrs
from prometheus_client.parser import text_string_to_metric_families

# rate name -> (token counter, seconds counter), per engine; first engine whose four are present wins
COUNTERS: dict[str, dict[str, tuple[str, str]]] = {
    "llamacpp": {"prefill": ("llamacpp:prompt_tokens_total", "llamacpp:prompt_seconds_total"),
                 "decode": ("llamacpp:tokens_predicted_total", "llamacpp:tokens_predicted_seconds_total")},
    "vllm": {"prefill": ("vllm:prompt_tokens_total", "vllm:request_prefill_time_seconds_sum"),
             "decode": ("vllm:generation_tokens_total", "vllm:request_decode_time_seconds_sum")},
}
# Decode spans first -> last token: the first token (made by the prefill) is not in it. The count of
# finished requests, per engine, whose first tokens leave the decode token counter.
FIRST_TOKENS: dict[str, str] = {"vllm": "vllm:request_decode_time_seconds_count"}
# The server's own time-to-first-token histogram (seconds): its mean over the run.
TTFT_HISTOGRAM: dict[str, str] = {"vllm": "vllm:time_to_first_token_seconds"}


def parse_counters(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text exposition, summed over label sets, by sample name."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


@attrs.frozen
class Rate:
    tokens: float | None
    seconds: float | None
    tokens_per_s: float | None


@attrs.frozen
class Mean:
    """A histogram's mean over the run (`_sum` / `_count` deltas); ms for times."""

    ms: float | None
    n: int | None


@attrs.frozen
class ServerRates:
    """The server's prefill and decode rates over the run, from counter deltas."""

    engine: str | None
    prefill: Rate
    decode: Rate
    problem: str | None = None  # why the rates are unavailable (nil numbers, never zeros)
    ttft: Mean | None = None  # the server's own TTFT, where it exports one (vLLM)


NONE = Rate(None, None, None)


def unavailable(problem: str) -> ServerRates:
    return ServerRates(None, NONE, NONE, problem)


def _delta(before: Mapping[str, float], after: Mapping[str, float], tok: str, sec: str,
           less: str | None = None) -> Rate:
    dt, ds = after[tok] - before[tok], after[sec] - before[sec]
    if less is not None and less in before and less in after:
        dt -= after[less] - before[less]
    return Rate(round(dt, 3), round(ds, 6), round(dt / ds, 3) if ds > 0 else None)


def _mean_ms(before: Mapping[str, float], after: Mapping[str, float], histogram: str | None) -> Mean | None:
    if histogram is None:
        return None
    s, c = histogram + "_sum", histogram + "_count"
    if not all(k in before and k in after for k in (s, c)):
        return None
    n = int(after[c] - before[c])
    return Mean(round((after[s] - before[s]) * 1000.0 / n, 3) if n > 0 else None, n)


def server_rates(before: Mapping[str, float] | None, after: Mapping[str, float] | None) -> ServerRates:
    if before is None or after is None:
        return unavailable("metrics endpoint not readable before and after the run")
    for engine, pairs in COUNTERS.items():
        names = [n for pair in pairs.values() for n in pair]
        if all(n in before and n in after for n in names):
            rates = {k: _delta(before, after, *pair, less=FIRST_TOKENS.get(engine) if k == "decode" else None)
                     for k, pair in pairs.items()}
            if any(r.tokens is not None and r.tokens < 0 for r in rates.values()):
                return unavailable("counters went backwards (server restarted during the run)")
            return ServerRates(engine, rates["prefill"], rates["decode"],
                               ttft=_mean_ms(before, after, TTFT_HISTOGRAM.get(engine)))
    return unavailable("no known prefill/decode counters in the metrics")
