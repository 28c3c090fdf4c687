"""Pure bench statistics: one `Sample` per request, summarized per (answering endpoint,
concurrency). Nothing is aggregated across endpoints; unmeasured values are skipped, never
counted as zero; `completion_tokens / wall_clock` exists only as the labelled misleading figure."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Iterable, Sequence
from urllib.parse import urlsplit

import attrs

from .._errors import KotobaError
from .._model import Figure, Response
from .._timings import percentiles

if TYPE_CHECKING:  # _metrics is read at run time only where rates exist
    from ._metrics import ServerRates

QS = (50, 90, 99)
UNAVAILABLE = "unavailable"


def origin(url: str) -> str:
    """scheme://host:port of a URL (the part that names a server)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else url.rstrip("/")


def answered_by(target: str, endpoint_url: str | None) -> str | None:
    """The server that answered: the target itself when the answer came from under it."""
    if not endpoint_url:
        return None
    t = target.rstrip("/")
    return t if endpoint_url.startswith(t) else origin(endpoint_url)


@attrs.frozen
class Sample:
    """One request's outcome. Every number is None when it was not measured."""

    target: str
    concurrency: int
    started: float  # perf_counter seconds
    finished: float
    answered_by: str | None = None
    error_kind: str | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    prefill_tokens: int | None = None
    prefill_ms: float | None = None
    prefill_rate: float | None = None
    prefill_provenance: str = UNAVAILABLE
    decode_tokens: int | None = None
    decode_ms: float | None = None
    decode_rate: float | None = None
    decode_provenance: str = UNAVAILABLE
    client_decode_rate: float | None = None  # from the stream's chunk times, whatever the server says
    ttft_ms: float | None = None
    gaps_ms: tuple[float, ...] = ()
    e2e_ms: float | None = None

    @property
    def ok(self) -> bool:
        return self.error_kind is None


def _client_decode(completion: int | None, gaps: Sequence[float]) -> float | None:
    span = sum(gaps)
    if completion is None or completion < 2 or not gaps or span <= 0:
        return None
    return round((completion - 1) * 1000.0 / span, 3)


def sample_from_response(target: str, concurrency: int, started: float, finished: float,
                         resp: Response) -> Sample:
    t = resp.timings
    pre: Figure | None = t.prefill if t else None
    dec: Figure | None = t.decode if t else None
    usage = resp.usage
    completion = usage.completion_tokens if usage and usage.completion_tokens is not None else (
        dec.tokens if dec else None)
    gaps = tuple(t.inter_token.gaps_ms or ()) if t else ()
    # Tokens over the decode span: every engine's span, like the client's, runs from the first token to the
    # last, so it covers n - 1 tokens (the first comes out of the prefill; llama.cpp's own rates count so too).
    dec_tokens = dec.tokens if dec else None
    if dec_tokens is not None:
        dec_tokens = dec_tokens - 1 if dec_tokens > 1 else None
    return Sample(
        target=target, concurrency=concurrency, started=started, finished=finished,
        answered_by=answered_by(target, resp.endpoint_url),
        cached_tokens=t.cached.tokens if t else None,
        completion_tokens=completion,
        prefill_tokens=pre.tokens if pre else None, prefill_ms=pre.ms if pre else None,
        prefill_rate=pre.tokens_per_s if pre else None,
        prefill_provenance=pre.provenance if pre and pre.ms is not None else UNAVAILABLE,
        decode_tokens=dec_tokens, decode_ms=dec.ms if dec else None,
        decode_rate=dec.tokens_per_s if dec else None,
        decode_provenance=dec.provenance if dec and dec.tokens_per_s is not None else UNAVAILABLE,
        client_decode_rate=_client_decode(completion, gaps),
        ttft_ms=t.ttft.ms if t else None, gaps_ms=gaps, e2e_ms=t.end_to_end.ms if t else None)


def sample_from_error(target: str, concurrency: int, started: float, finished: float,
                      exc: BaseException) -> Sample:
    kind = exc.kind if isinstance(exc, KotobaError) else type(exc).__name__
    endpoint = getattr(exc, "endpoint", None)
    return Sample(target=target, concurrency=concurrency, started=started, finished=finished,
                  answered_by=answered_by(target, endpoint) if isinstance(endpoint, str) else None,
                  error_kind=kind)


@attrs.frozen
class Dist:
    """p50/p90/p99 over the samples that measured the value; n counts them."""

    n: int
    p50: float | None
    p90: float | None
    p99: float | None
    provenance: str  # one provenance, "mixed", or "unavailable" when n == 0


def dist(values: Iterable[float | None], provenances: Iterable[str] | None = None) -> Dist:
    xs = [float(v) for v in values if v is not None]
    ps = percentiles(xs, QS)
    provs = {p for p in (provenances or ()) if p != UNAVAILABLE}
    if not xs:
        prov = UNAVAILABLE
    elif provenances is None:
        prov = "client-measured"
    else:
        prov = provs.pop() if len(provs) == 1 else ("mixed" if provs else UNAVAILABLE)
    r = {q: (None if v is None else round(v, 3)) for q, v in ps.items()}
    return Dist(n=len(xs), p50=r[50], p90=r[90], p99=r[99], provenance=prov)


@attrs.frozen
class Pooled:
    """sum(tokens) / sum(ms) over the requests that reported both: comparable with a server's
    own counters (llama.cpp /metrics sums the same per-request times). Worked out here, so its
    provenance is `computed` over server-reported figures (`inputs`); over this client's own clock
    it stays `client-measured`."""

    tokens: int | None
    ms: float | None
    tokens_per_s: float | None
    n: int
    provenance: str
    inputs: str = UNAVAILABLE  # the provenance of the per-request figures summed


def pooled(pairs: Iterable[tuple[int | None, float | None, str]]) -> Pooled:
    tok, ms, n, provs = 0, 0.0, 0, set()
    for t, m, p in pairs:
        if t is None or m is None or p == UNAVAILABLE:
            continue
        tok, ms, n = tok + t, ms + m, n + 1
        provs.add(p)
    if n == 0:
        return Pooled(None, None, None, 0, UNAVAILABLE)
    rate = round(tok * 1000.0 / ms, 3) if ms > 0 else None
    inputs = provs.pop() if len(provs) == 1 else "mixed"
    return Pooled(tok, round(ms, 3), rate, n, "client-measured" if inputs == "client-measured" else "computed", inputs)


@attrs.frozen
class Misleading:
    """completion_tokens / wall_clock: prefill, queueing and the network sit inside the wall clock."""

    completion_tokens: int | None
    wall_s: float | None
    tokens_per_s: float | None


@attrs.frozen
class Summary:
    """One answering endpoint at one concurrency level."""

    endpoint: str
    target: str
    concurrency: int
    requests: int
    ok: int
    errors: dict[str, int]
    admission_rejections: int
    wall_s: float | None
    request_throughput: float | None
    ttft_ms: Dist
    decode_rate: Dist
    prefill_rate: Dist
    client_decode_rate: Dist
    inter_token_ms: Dist
    e2e_ms: Dist
    decode: Pooled
    prefill: Pooled
    misleading: Misleading
    server: ServerRates | None = None  # when the server's own counters were read


def wall_clock(samples: Sequence[Sample]) -> float | None:
    if not samples:
        return None
    return max(s.finished for s in samples) - min(s.started for s in samples)


def summarize_group(endpoint: str, target: str, concurrency: int, samples: Sequence[Sample],
                    wall_s: float | None = None) -> Summary:
    ok = [s for s in samples if s.ok]
    errs = Counter(s.error_kind or "unknown" for s in samples if not s.ok)
    admission = errs.pop("admission-rejected", 0)
    wall = wall_s if wall_s is not None else wall_clock(samples)
    # A request without a count would silently shrink the sum: then there is no quotient at all.
    counts = [s.completion_tokens for s in ok]
    completion = sum(c for c in counts if c is not None) if ok and None not in counts else None
    mis_rate = round(completion / wall, 3) if completion is not None and wall else None
    return Summary(
        endpoint=endpoint, target=target, concurrency=concurrency, requests=len(samples), ok=len(ok),
        errors=dict(sorted(errs.items())), admission_rejections=admission,
        wall_s=None if wall is None else round(wall, 4),
        request_throughput=round(len(ok) / wall, 3) if wall and ok else None,
        ttft_ms=dist(s.ttft_ms for s in ok),
        decode_rate=dist((s.decode_rate for s in ok), (s.decode_provenance for s in ok)),
        prefill_rate=dist((s.prefill_rate for s in ok), (s.prefill_provenance for s in ok)),
        client_decode_rate=dist(s.client_decode_rate for s in ok),
        inter_token_ms=dist(g for s in ok for g in s.gaps_ms),
        e2e_ms=dist(s.e2e_ms for s in ok),
        decode=pooled((s.decode_tokens, s.decode_ms, s.decode_provenance) for s in ok),
        prefill=pooled((s.prefill_tokens, s.prefill_ms, s.prefill_provenance) for s in ok),
        misleading=Misleading(completion, None if wall is None else round(wall, 4), mis_rate))


def summarize(samples: Sequence[Sample]) -> list[Summary]:
    """One summary per (target, answering endpoint, concurrency); errors with no answering
    endpoint stay with their target."""
    groups: dict[tuple[str, str, int], list[Sample]] = {}
    for s in samples:
        groups.setdefault((s.target, s.answered_by or s.target, s.concurrency), []).append(s)
    # The wall clock belongs to the whole target run at that level, not to one answering member.
    walls: dict[tuple[str, int], list[Sample]] = {}
    for s in samples:
        walls.setdefault((s.target, s.concurrency), []).append(s)
    order = {t: i for i, t in enumerate(dict.fromkeys(s.target for s in samples))}  # targets as given
    return [summarize_group(ep, tgt, c, ss, wall_clock(walls[(tgt, c)]))
            for (tgt, ep, c), ss in sorted(groups.items(), key=lambda kv: (kv[0][2], order[kv[0][0]], kv[0][1]))]


def differing_endpoints(samples: Sequence[Sample]) -> dict[str, list[str]]:
    """Targets whose answers came from somewhere else, or from more than one server."""
    by_target: dict[str, set[str]] = {}
    for s in samples:
        if s.answered_by is not None:
            by_target.setdefault(s.target, set()).add(s.answered_by)
    return {t: sorted(eps) for t, eps in sorted(by_target.items())
            if len(eps) > 1 or eps != {t.rstrip("/")}}
