"""The server's own counters, read before and after a run (pure parsing; the runner fetches).

llama.cpp (`--metrics`): `llamacpp:prompt_tokens_total`, `llamacpp:prompt_seconds_total`,
`llamacpp:tokens_predicted_total`, `llamacpp:tokens_predicted_seconds_total` — the same per-request
prompt/predicted times its `timings` report, summed. vLLM: `vllm:prompt_tokens_total`,
`vllm:generation_tokens_total` and the `_sum` of `vllm:request_prefill_time_seconds` /
`vllm:request_decode_time_seconds` (mapping read from vLLM's docs, not verified live here)."""

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
class ServerRates:
    """The server's prefill and decode rates over the run, from counter deltas."""

    engine: str | None
    prefill: Rate
    decode: Rate
    problem: str | None = None  # why the rates are unavailable (nil numbers, never zeros)


NONE = Rate(None, None, None)


def unavailable(problem: str) -> ServerRates:
    return ServerRates(None, NONE, NONE, problem)


def _delta(before: Mapping[str, float], after: Mapping[str, float], tok: str, sec: str) -> Rate:
    dt, ds = after[tok] - before[tok], after[sec] - before[sec]
    return Rate(round(dt, 3), round(ds, 6), round(dt / ds, 3) if ds > 0 else None)


def server_rates(before: Mapping[str, float] | None, after: Mapping[str, float] | None) -> ServerRates:
    if before is None or after is None:
        return unavailable("metrics endpoint not readable before and after the run")
    for engine, pairs in COUNTERS.items():
        names = [n for pair in pairs.values() for n in pair]
        if all(n in before and n in after for n in names):
            rates = {k: _delta(before, after, *pair) for k, pair in pairs.items()}
            if any(r.tokens is not None and r.tokens < 0 for r in rates.values()):
                return unavailable("counters went backwards (server restarted during the run)")
            return ServerRates(engine, rates["prefill"], rates["decode"])
    return unavailable("no known prefill/decode counters in the metrics")
