"""The server's own counters, read before and after a run (pure parsing; the runner fetches).

llama.cpp (`--metrics`): `llamacpp:prompt_tokens_total`, `llamacpp:prompt_seconds_total`,
`llamacpp:tokens_predicted_total`, `llamacpp:tokens_predicted_seconds_total` — the same per-request
prompt/predicted times its `timings` report, summed. Its predicted-token counter includes each request's
first token, which comes out of the prefill (its own rates count n - 1 decode steps per request, and it
exports no request count): bench takes one token per answer it read from that server off it. Its rate
gauges (`llamacpp:predicted_tokens_seconds`) are not used: each scrape resets their window, and a pool's
capacity probes scrape /metrics during the run. vLLM (names as vLLM 0.33.0's own Prometheus
loggers export them, recorded in tests/cassettes/vllm/metrics*.edn): `vllm:prompt_tokens_total` over
the `_sum` of `vllm:request_prefill_time_seconds` (scheduled -> first token); decode is
`vllm:generation_tokens_total` less one first token per request (`vllm:request_decode_time_seconds_count`)
over the `_sum` of `vllm:request_decode_time_seconds` (first -> last token); TTFT is the mean of the
`vllm:time_to_first_token_seconds` histogram (arrival -> first token) over the run.
SGLang 0.5.23 (`--enable-metrics`, names seen on its real serving layer): prefill is
`sglang:prompt_tokens_total` minus `sglang:cached_tokens_total` over the `prefill_forward` stage of
`sglang:per_stage_req_latency_seconds` — each request observes the forward pass of its whole
*batch*, so the sum counts a shared pass once per request (a per-request rate, below the server's
batch throughput); decode is `sglang:generation_tokens_total` minus one first token per request
(`sglang:num_requests_total`) over `sglang:e2e_request_latency_seconds` minus
`sglang:time_to_first_token_seconds` (sums of per-request spans)."""

from __future__ import annotations

from typing import Mapping

import attrs
from prometheus_client.parser import text_string_to_metric_families

# A figure is a signed sum of samples: ((+1, "a"), (-1, "b")) is a - b.
Terms = tuple[tuple[int, str], ...]


def _one(name: str) -> Terms:
    return ((1, name),)


# rate name -> (tokens, seconds), per engine; the first engine whose samples are all present wins
COUNTERS: dict[str, dict[str, tuple[Terms, Terms]]] = {
    "llamacpp": {"prefill": (_one("llamacpp:prompt_tokens_total"), _one("llamacpp:prompt_seconds_total")),
                 "decode": (_one("llamacpp:tokens_predicted_total"),
                            _one("llamacpp:tokens_predicted_seconds_total"))},
    "vllm": {"prefill": (_one("vllm:prompt_tokens_total"), _one("vllm:request_prefill_time_seconds_sum")),
             # decode spans first -> last token: each request's first token (made by the prefill) is not in it
             "decode": (((1, "vllm:generation_tokens_total"), (-1, "vllm:request_decode_time_seconds_count")),
                        _one("vllm:request_decode_time_seconds_sum"))},
    "sglang": {"prefill": (((1, "sglang:prompt_tokens_total"), (-1, "sglang:cached_tokens_total")),
                           _one('sglang:per_stage_req_latency_seconds_sum{stage="prefill_forward"}')),
               "decode": (((1, "sglang:generation_tokens_total"), (-1, "sglang:num_requests_total")),
                          ((1, "sglang:e2e_request_latency_seconds_sum"),
                           (-1, "sglang:time_to_first_token_seconds_sum")))},
}
# Engines whose decode token counter includes each request's first token and that export no request count:
# bench subtracts one per answer it read from the server.
FIRST_TOKEN_COUNTED = frozenset({"llamacpp"})
# The server's own time-to-first-token histogram (seconds), where bench compares its mean over the run.
TTFT_HISTOGRAM: dict[str, str] = {"vllm": "vllm:time_to_first_token_seconds"}
# Counters a server creates on first use (prometheus labels): absent means zero, not unknown. SGLang
# shows no `cached_tokens_total` before a prefix-cache hit.
ZERO_UNTIL_USED = frozenset({"sglang:cached_tokens_total"})
# What each engine's figures are, where that is not plain per-request time.
NOTES = {"sglang": "prefill seconds are the batch's forward pass, counted once per request in it: a per-request "
                   "rate, not the server's batch throughput"}
# Labels whose value splits a sample into figures of different meaning (SGLang's request stages).
SPLIT_LABELS = ("stage",)


def parse_counters(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text exposition, summed over label sets, by sample name."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
            for label in SPLIT_LABELS:  # also by the label's value: `name{stage="prefill_forward"}`
                if label in s.labels:
                    key = f'{s.name}{{{label}="{s.labels[label]}"}}'
                    out[key] = out.get(key, 0.0) + float(s.value)
    return out


@attrs.frozen
class Rate:
    """Token and second deltas over the run and their quotient, worked out here from the server's
    counters (`source` says how)."""

    tokens: float | None
    seconds: float | None
    tokens_per_s: float | None
    provenance: str = "computed"
    source: str = "counter deltas"


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
    note: str | None = None  # what the figures are, where that is not plain per-request time
    ttft: Mean | None = None  # the server's own TTFT, where it exports one (vLLM)


NONE = Rate(None, None, None, "unavailable", "none")


def unavailable(problem: str) -> ServerRates:
    return ServerRates(None, NONE, NONE, problem)


def _sum(snapshot: Mapping[str, float], terms: Terms) -> float:
    return sum(sign * snapshot.get(name, 0.0) for sign, name in terms)


def _delta(before: Mapping[str, float], after: Mapping[str, float], tok: Terms, sec: Terms) -> Rate:
    dt, ds = _sum(after, tok) - _sum(before, tok), _sum(after, sec) - _sum(before, sec)
    return Rate(round(dt, 3), round(ds, 6), round(dt / ds, 3) if ds > 0 and dt >= 0 else None)


def _mean_ms(before: Mapping[str, float], after: Mapping[str, float], histogram: str | None) -> Mean | None:
    if histogram is None:
        return None
    s, c = histogram + "_sum", histogram + "_count"
    if not all(k in before and k in after for k in (s, c)):
        return None
    n = int(after[c] - before[c])
    return Mean(round((after[s] - before[s]) * 1000.0 / n, 3) if n > 0 else None, n)


def _less_first_tokens(r: Rate, answers: int | None) -> Rate:
    if answers is None or r.tokens is None or r.seconds is None:
        return attrs.evolve(r, source="counter deltas (each request's first token included)")
    steps = r.tokens - answers
    rate = round(steps / r.seconds, 3) if r.seconds > 0 and steps >= 0 else None
    return Rate(round(steps, 3), r.seconds, rate, source=f"counter deltas less one first token per answer ({answers})")


def server_rates(before: Mapping[str, float] | None, after: Mapping[str, float] | None,
                 answers: int | None = None) -> ServerRates:
    """`answers`: how many answers bench read from this server between the two reads (see FIRST_TOKEN_COUNTED)."""
    if before is None or after is None:
        return unavailable("metrics endpoint not readable before and after the run")
    for engine, pairs in COUNTERS.items():
        names = [n for pair in pairs.values() for terms in pair for _, n in terms]
        # After the run every figure exists (or is one a server only creates on first use); before it, a
        # counter not created yet is zero: a fresh server's first run is measurable too.
        if all(n in after or n in ZERO_UNTIL_USED for n in names):
            if any(after.get(n, 0.0) < before.get(n, 0.0) for n in names):
                return unavailable("counters went backwards (server restarted during the run)")
            rates = {k: _delta(before, after, *pair) for k, pair in pairs.items()}
            if engine in FIRST_TOKEN_COUNTED:
                rates["decode"] = _less_first_tokens(rates["decode"], answers)
            return ServerRates(engine, rates["prefill"], rates["decode"], note=NOTES.get(engine),
                               ttft=_mean_ms(before, after, TTFT_HISTOGRAM.get(engine)))
    return unavailable("no known prefill/decode counters in the metrics")
