"""DESIGN §5 as pure functions: server-reported figures first, client-measured where the
server is silent, `:unavailable` (nil numbers) where neither knows. Never
`completion_tokens / wall_clock` as a decode rate: prefill sits inside the wall clock.

A `:server-reported` figure holds the server's own numbers exactly as it sent them (seconds become
milliseconds, nothing else): a rate the server reports is taken, never re-derived from its counts
(llama.cpp divides by n - 1 decode steps, and versions differ in how they count). A number worked
out here from the server's numbers makes its figure `:computed`, naming those inputs."""

from __future__ import annotations

import math
from typing import Sequence

import attrs

from ._memo import BoundedMemo
from ._model import UNAVAILABLE, Figure, Timings, Usage

SERVER, COMPUTED, CLIENT = "server-reported", "computed", "client-measured"


@attrs.frozen
class ServerTimings:
    """What an engine reported about one request (any field may be missing)."""

    prompt_n: int | None = None
    prompt_ms: float | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None
    cached_n: int | None = None
    # The engine's own rates (llama.cpp `prompt_per_second` / `predicted_per_second`, SGLang `decode_throughput`).
    prompt_per_s: float | None = None
    predicted_per_s: float | None = None
    # The server fields `prompt_n` / `prompt_ms` were worked out from; None when they are the server's own numbers.
    prompt_from: tuple[str, ...] | None = None
    # The server fields a decode span follows from, when the engine reports a rate but no duration.
    predicted_from: tuple[str, ...] | None = None
    # The prompt time is the span of the forward pass of the request's *batch* (SGLang): no
    # per-request rate may be computed from it.
    prompt_ms_is_batch: bool = False
    queue_ms: float | None = None  # time the request waited in the server's queue
    ttft_ms: float | None = None  # server-side arrival -> first token
    e2e_ms: float | None = None  # server-side arrival -> finish


# Not frozen: built once per request and never changed after; a frozen attrs class sets each field
# through `object.__setattr__`, twice the cost of this one's plain slot stores.
@attrs.define
class ClientClock:
    """Client-side instants (perf_counter seconds) of one exchange."""

    sent: float
    first_token: float | None = None
    last_token: float | None = None
    done: float | None = None
    token_times: tuple[float, ...] = ()


def _rate(n: int | None, ms: float | None) -> float | None:
    if n is None or ms is None or not ms > 0:
        return None
    try:
        rate = n * 1000.0 / ms
    except OverflowError:
        return None
    return round(rate, 3) if math.isfinite(rate) else None


def gaps_ms(times: Sequence[float]) -> tuple[float, ...]:
    """The gaps between consecutive instants (s) in ms, each exactly `round(gap_ms, 3)`, at a fifth of its cost
    (a stream has one per token): `round(x, 3)` goes through a decimal string; an integer count of
    microseconds is the same number unless the product sits within float error of a half, where it is used."""
    out = []
    for a, b in zip(times, times[1:]):
        ms = (b - a) * 1000.0
        us = ms * 1000.0
        n = round(us)
        out.append(n / 1000.0 if 0.0 <= us < 1e12 and -0.49 < us - n < 0.49 else round(ms, 3))
    return tuple(out)


def _fig(provenance: str, tokens: int | None = None, ms: float | None = None,
         rate: float | None = None, gaps: tuple[float, ...] | None = None) -> Figure:
    if tokens is None and ms is None and rate is None and gaps is None:
        return UNAVAILABLE
    return Figure(provenance=provenance, tokens=tokens, ms=None if ms is None else round(ms, 3),
                  tokens_per_s=rate, gaps_ms=gaps)


def _reported(tokens: int | None = None, ms: float | None = None, rate: float | None = None) -> Figure:
    """The server's own numbers, unrounded."""
    if tokens is None and ms is None and rate is None:
        return UNAVAILABLE
    return Figure(provenance=SERVER, tokens=tokens, ms=ms, tokens_per_s=rate)


def _computed(inputs: tuple[str, ...], tokens: int | None = None, ms: float | None = None,
              rate: float | None = None) -> Figure:
    if tokens is None and ms is None and rate is None:
        return UNAVAILABLE
    return Figure(provenance=COMPUTED, tokens=tokens, ms=None if ms is None else round(ms, 3), tokens_per_s=rate,
                  computed_from=inputs)


# Past these a server figure is garbage, not a measurement (and a float could not hold it exactly).
MAX_TOKENS = 2**53
MAX_FIGURE = 1e15


def server_count(v: object) -> int | None:
    """A token count a server reported: a whole number in range, else unknown (None)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not (math.isfinite(v) and v.is_integer()):
        return None
    return int(v) if 0 <= v <= MAX_TOKENS else None


def server_figure(v: object) -> float | None:
    """A duration or rate a server reported: finite, non-negative and plausible, else unknown (None)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        x = float(v)
    except OverflowError:
        return None
    return x if math.isfinite(x) and 0 <= x <= MAX_FIGURE else None


def llamacpp_server_timings(t: object) -> ServerTimings | None:
    """llama.cpp's `timings` object (`prompt_n`, `prompt_ms`, `prompt_per_second`, `predicted_n`,
    `predicted_ms`, `predicted_per_second`, `cache_n`). Its rates are its own: `predicted_per_second` is
    (predicted_n - 1) / predicted_ms, since the first token comes out of the prefill; 0.0 means
    "not known" (llama.cpp's own comment), so it reads as no rate."""
    if not isinstance(t, dict):
        return None
    return ServerTimings(prompt_n=server_count(t.get("prompt_n")), prompt_ms=server_figure(t.get("prompt_ms")),
                         prompt_per_s=server_figure(t.get("prompt_per_second")) or None,
                         predicted_n=server_count(t.get("predicted_n")),
                         predicted_ms=server_figure(t.get("predicted_ms")),
                         predicted_per_s=server_figure(t.get("predicted_per_second")) or None,
                         cached_n=server_count(t.get("cache_n")))


def sglang_server_timings(meta: object) -> ServerTimings | None:
    """SGLang 0.5.23 `meta_info` (keys seen on its real serving layer): `prompt_tokens`,
    `completion_tokens`, `cached_tokens` and `e2e_latency` (s; on the final chunk of a stream) always;
    with `--enable-metrics` also `queue_time` (s), `first_token_latency` (s), `decode_throughput`
    (tokens/s over the request's own first-token-to-finish span) and the realtime stamps
    `forward_entry_time` / `prefill_finished_time` of the prefill forward pass of the request's
    *batch*: a duration, never a per-request rate."""
    if not isinstance(meta, dict):
        return None

    def ms(k: str) -> float | None:
        v = server_figure(meta.get(k))
        return v * 1000.0 if v is not None else None

    prompt, cached = server_count(meta.get("prompt_tokens")), server_count(meta.get("cached_tokens"))
    subtracted = prompt is not None and cached is not None and 0 < cached <= prompt
    computed = prompt - cached if subtracted and prompt is not None and cached is not None else prompt
    entered = server_figure(meta.get("forward_entry_time"))
    prefilled = server_figure(meta.get("prefill_finished_time"))
    prefill_ms = (prefilled - entered) * 1000.0 if entered and prefilled and prefilled >= entered else None
    inputs = (("meta_info.prompt_tokens", "meta_info.cached_tokens") if subtracted else ()) + (
        ("meta_info.forward_entry_time", "meta_info.prefill_finished_time") if prefill_ms is not None else ())
    rate = server_figure(meta.get("decode_throughput"))
    return ServerTimings(prompt_n=computed, prompt_ms=prefill_ms, prompt_ms_is_batch=prefill_ms is not None,
                         prompt_from=inputs or None,
                         predicted_n=server_count(meta.get("completion_tokens")), cached_n=cached,
                         predicted_per_s=rate if rate else None,
                         predicted_from=("meta_info.completion_tokens", "meta_info.decode_throughput"),
                         queue_ms=ms("queue_time"), ttft_ms=ms("first_token_latency"), e2e_ms=ms("e2e_latency"))


_NO_SERVER = ServerTimings()
# Token-count-only figures repeat (the same few counts across a batch) and are frozen: one instance each.
_COUNTS: BoundedMemo[int, Figure] = BoundedMemo(4096)


def _count(n: int) -> Figure:
    f = _COUNTS.get(n)
    return f if f is not None else _COUNTS.keep(n, Figure(provenance=SERVER, tokens=n))


def build_timings(server: ServerTimings | None, usage: Usage | None, clock: ClientClock | None) -> Timings:
    if server is None and clock is not None and clock.first_token is None and clock.done is not None \
            and not clock.token_times:
        return _whole_answer_timings(usage, clock.done - clock.sent)
    s = server or _NO_SERVER
    completion_n = s.predicted_n if s.predicted_n is not None else (usage.completion_tokens if usage else None)

    if s.prompt_ms is not None:
        rate = None if s.prompt_ms_is_batch else s.prompt_per_s  # a batch's pass gives no per-request rate
        prefill = (_computed(s.prompt_from, s.prompt_n, s.prompt_ms, rate) if s.prompt_from
                   else _reported(s.prompt_n, s.prompt_ms, rate))
    elif s.prompt_n is not None:  # a token count without a time: no rate claimed
        prefill = _computed(s.prompt_from, s.prompt_n) if s.prompt_from else _count(s.prompt_n)
    else:
        prefill = _usage_prefill(usage)

    if s.predicted_ms is not None:
        decode = _reported(s.predicted_n, s.predicted_ms, s.predicted_per_s)
    elif s.predicted_per_s is not None:
        # The engine's rate covers the tokens after the first: its span follows from it (worked out here).
        span = (completion_n - 1) * 1000.0 / s.predicted_per_s if completion_n is not None and completion_n > 1 else None
        span = span if span is not None and math.isfinite(span) else None  # a vanishing rate gives no span
        decode = (_reported(completion_n, None, s.predicted_per_s) if span is None
                  else _computed(s.predicted_from or ("predicted_per_s",), completion_n, span, s.predicted_per_s))
    elif clock and clock.first_token is not None and clock.last_token is not None \
            and clock.last_token > clock.first_token:  # one chunk: no span was measured, not a zero one
        # Decode seen from the client: first to last token, over the tokens after the first
        # (the first token's time belongs to prefill). Without a token count: the span, no rate.
        span_ms = (clock.last_token - clock.first_token) * 1000.0
        rate = _rate(completion_n - 1, span_ms) if completion_n is not None and completion_n > 1 else None
        decode = _fig(CLIENT, completion_n, span_ms, rate)
    elif completion_n is not None:
        decode = _count(completion_n)
    else:
        decode = UNAVAILABLE

    cached_n = s.cached_n if s.cached_n is not None else (usage.cached_tokens if usage else None)
    cached = _count(cached_n) if cached_n is not None else UNAVAILABLE

    ttft = inter = e2e = UNAVAILABLE
    if clock is not None:
        if clock.first_token is not None:
            ttft = _fig(CLIENT, ms=(clock.first_token - clock.sent) * 1000.0)
        if len(clock.token_times) >= 2:
            gaps = gaps_ms(clock.token_times)
            inter = _fig(CLIENT, tokens=len(gaps), ms=round(sum(gaps) / len(gaps), 3), gaps=gaps)
        if clock.done is not None:
            e2e = _fig(CLIENT, ms=(clock.done - clock.sent) * 1000.0)
    if s.ttft_ms is not None:
        ttft = _reported(ms=s.ttft_ms)
    if s.e2e_ms is not None:
        e2e = _reported(ms=s.e2e_ms)
    queue = _reported(ms=s.queue_ms) if s.queue_ms is not None else UNAVAILABLE
    return Timings(prefill=prefill, decode=decode, cached=cached, ttft=ttft, inter_token=inter, end_to_end=e2e,
                   queue=queue)


_USAGE_PREFILL = ("usage.prompt_tokens", "usage.prompt_tokens_details.cached_tokens")


def _usage_prefill(usage: Usage | None) -> Figure:
    """Prefill tokens are the ones the server computed: usage's prompt count includes the cached prefix,
    so with a cache hit the count is worked out here (prompt - cached), and labelled so."""
    if usage is None or usage.prompt_tokens is None:
        return UNAVAILABLE
    cached = usage.cached_tokens or 0
    if not cached:
        return _count(usage.prompt_tokens)
    if cached > usage.prompt_tokens:  # more cached than prompted: the counts disagree
        return UNAVAILABLE
    return _computed(_USAGE_PREFILL, usage.prompt_tokens - cached)


def _whole_answer_timings(usage: Usage | None, wall_s: float) -> Timings:
    """`build_timings` for the most common answer, read whole with no server figures (OpenAI-style, vLLM):
    token counts from usage, end-to-end from the client clock, the rest unavailable."""
    decode = cached = UNAVAILABLE
    prefill = _usage_prefill(usage)
    if usage is not None:
        if usage.completion_tokens is not None:
            decode = _count(usage.completion_tokens)
        if usage.cached_tokens is not None:
            cached = _count(usage.cached_tokens)
    return Timings(prefill=prefill, decode=decode, cached=cached,
                   end_to_end=Figure(provenance=CLIENT, ms=round(wall_s * 1000.0, 3)))


def misleading_rate(completion_tokens: int | None, wall_ms: float | None) -> float | None:
    """completion_tokens / wall clock — only ever shown beside the separated rates, labelled."""
    return _rate(completion_tokens, wall_ms)


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 90, 99)) -> dict[float, float | None]:
    if not values:
        return {q: None for q in qs}
    xs = sorted(values)
    out: dict[float, float | None] = {}
    for q in qs:
        pos = (len(xs) - 1) * q / 100.0
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        out[q] = xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
    return out
