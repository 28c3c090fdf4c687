"""Bench output: an EDN map, a readable table and a latency plot — all from a `BenchReport`.

Every row is one answering endpoint at one concurrency level; nothing is summed across
endpoints. `completion_tokens / wall_clock` appears only beside the separated rates, labelled."""

from __future__ import annotations

from typing import Callable, Mapping

from .._edn import Edn, Keyword, kw
from ._metrics import Rate, ServerRates
from ._runner import BenchReport
from ._stats import Dist, Misleading, Pooled, Sample, Summary

MISLEADING_NOTE = ("completion_tokens / wall_clock: prefill, queueing and network sit inside the wall clock; "
                   "not a decode rate")
PROV = "vllm/provenance"


def _k(d: Mapping[str, Edn]) -> dict[Keyword, Edn]:
    return {kw(k): v for k, v in d.items()}


def _dist(d: Dist) -> dict[Keyword, Edn]:
    return _k({"bench/n": d.n, "bench/p50": d.p50, "bench/p90": d.p90, "bench/p99": d.p99, PROV: kw(d.provenance)})


def _pooled(p: Pooled) -> dict[Keyword, Edn]:
    return _k({"vllm/tokens": p.tokens, "vllm/ms": p.ms, "vllm/tokens-per-s": p.tokens_per_s,
               "bench/n": p.n, PROV: kw(p.provenance), "bench/inputs": kw(p.inputs)})


def _pooled_label(p: Pooled) -> str:
    return f"computed from {p.inputs} figures" if p.provenance == "computed" else p.provenance


def _rate(r: Rate) -> dict[Keyword, Edn]:
    return _k({"vllm/tokens": r.tokens, "bench/seconds": r.seconds, "vllm/tokens-per-s": r.tokens_per_s,
               PROV: kw(r.provenance), "bench/rate-source": r.source})


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return round(ours / theirs, 4) if ours is not None and theirs else None


def _server(s: ServerRates | None, row: Summary | None = None) -> dict[Keyword, Edn] | None:
    if s is None:
        return None
    if s.problem is not None:
        return _k({PROV: kw("unavailable"), "bench/problem": s.problem})
    out: dict[str, Edn] = {"bench/source": f"{s.engine} /metrics read before and after the run",
                           "bench/prefill": _rate(s.prefill), "bench/decode": _rate(s.decode)}
    if s.ttft is not None:  # the server's own histogram: arrival -> first token, mean over the run
        out["bench/ttft-ms"] = _k({"bench/mean": s.ttft.ms, "bench/n": s.ttft.n})
    if s.note is not None:
        out["bench/note"] = s.note
    if row is not None:  # bench's pooled rate over the server's, per phase
        out["bench/bench-over-server"] = _k({
            "bench/prefill": _ratio(row.prefill.tokens_per_s, s.prefill.tokens_per_s),
            "bench/decode": _ratio(row.decode.tokens_per_s, s.decode.tokens_per_s)})
    return _k(out)


def _misleading(m: Misleading) -> dict[Keyword, Edn]:
    return _k({"vllm/completion-tokens": m.completion_tokens, "bench/wall-s": m.wall_s,
               "vllm/tokens-per-s": m.tokens_per_s, "bench/note": MISLEADING_NOTE})


def summary_edn(s: Summary) -> dict[Keyword, Edn]:
    return _k({
        "bench/endpoint": s.endpoint, "bench/target": s.target, "bench/concurrency": s.concurrency,
        "bench/requests": s.requests, "bench/ok": s.ok,
        "bench/errors": {kw(k): v for k, v in s.errors.items()},
        "bench/admission-rejections": s.admission_rejections,
        "bench/wall-s": s.wall_s, "bench/request-throughput": s.request_throughput,
        "bench/ttft-ms": _dist(s.ttft_ms), "bench/decode-tokens-per-s": _dist(s.decode_rate),
        "bench/prefill-tokens-per-s": _dist(s.prefill_rate),
        "bench/client-decode-tokens-per-s": _dist(s.client_decode_rate),
        "bench/inter-token-ms": _dist(s.inter_token_ms), "bench/end-to-end-ms": _dist(s.e2e_ms),
        "bench/decode": _pooled(s.decode), "bench/prefill": _pooled(s.prefill),
        "bench/server-metrics": _server(s.server, s),
        "bench/misleading-rate": _misleading(s.misleading)})


def to_edn(report: BenchReport) -> dict[Keyword, Edn]:
    c = report.config
    return _k({
        "bench/started-at": report.started_at,
        "bench/config": _k({"bench/base-urls": list(c.base_urls),
                            "bench/pools": [_k({"bench/label": p.label, "pool/members": list(p.members)})
                                            for p in c.pools],
                            "vllm/backend": kw(c.backend),
                            "bench/concurrency": list(c.concurrency), "bench/requests": c.requests,
                            "vllm/max-tokens": c.max_tokens, "bench/prompts": len(c.prompts),
                            "bench/bust-cache?": c.bust_cache, "vllm/stream": True}),
        "bench/aggregated-across-endpoints?": False,
        "bench/endpoints-differed?": bool(report.differing),
        "bench/differing-endpoints": {t: eps for t, eps in report.differing.items()},
        "bench/results": [summary_edn(s) for s in report.summaries]})


# ------------------------------------------------------------------ the table


def _f(v: float | int | None, nd: int = 1) -> str:
    if v is None:
        return "n/a"
    return f"{v:.{nd}f}" if isinstance(v, float) else str(v)


def _d(d: Dist, nd: int = 1) -> str:
    if d.n == 0:
        return "n/a (unavailable)"
    return f"{_f(d.p50, nd)} / {_f(d.p90, nd)} / {_f(d.p99, nd)}"


def _agree(ours: float | None, theirs: float | None) -> str:
    if ours is None or theirs is None or theirs == 0:
        return ""
    r = ours / theirs
    # Seen on llama.cpp: prefills that share a batch each carry the batch's time in their own
    # timings, while the counter grew by it once. The two then measure different things.
    flag = "  DISAGREE >10%: per-request times vs the server's counter" if abs(r - 1) > 0.10 else ""
    return f"  (bench/server {r:.3f}){flag}"


def render_table(report: BenchReport) -> str:
    lines: list[str] = []
    if report.differing:
        lines.append("!! ANSWERING ENDPOINTS DIFFERED FROM THE TARGETS (rows below are per answering endpoint):")
        pools = {p.label for p in report.config.pools}
        for t, eps in report.differing.items():
            why = "  (a pool: its members answer)" if t in pools else ""
            lines.append(f"!!   target {t} was answered by {', '.join(eps)}{why}")
        for p in report.config.pools:
            idle = [m for m in p.members if m not in report.differing.get(p.label, ())]
            if idle:
                lines.append(f"!!   pool members that answered nothing: {', '.join(idle)}")
        lines.append("")
    lines.append("Per endpoint; never summed across endpoints. Percentiles are p50 / p90 / p99.")
    for s in report.summaries:
        head = f"== {s.endpoint}  concurrency {s.concurrency}"
        if s.endpoint != s.target.rstrip("/"):
            head += f"  (target {s.target})"
        lines.append("")
        lines.append(head)
        errs = ", ".join(f"{k} {v}" for k, v in s.errors.items()) or "none"
        lines.append(f"  requests {s.requests}  ok {s.ok}  errors: {errs}  admission rejections {s.admission_rejections}")
        lines.append(f"  wall {_f(s.wall_s, 3)} s  request throughput {_f(s.request_throughput, 2)} req/s")
        rows = [
            ("TTFT ms", s.ttft_ms, 1),
            ("inter-token ms", s.inter_token_ms, 2),
            ("end-to-end ms", s.e2e_ms, 1),
            ("decode tok/s", s.decode_rate, 1),
            ("prefill tok/s", s.prefill_rate, 1),
            ("decode tok/s seen by client", s.client_decode_rate, 1),
        ]
        sv = s.server
        for name, d, nd in rows:
            line = f"  {name:<30}{_d(d, nd):<34}[{d.provenance}, n={d.n}]"
            if name == "TTFT ms" and sv is not None and not sv.problem and sv.ttft is not None:
                line += f"   server /metrics mean {_f(sv.ttft.ms)} ms (n={sv.ttft.n})"
            lines.append(line)
        sp = sv.prefill.tokens_per_s if sv and not sv.problem else None
        sd = sv.decode.tokens_per_s if sv and not sv.problem else None
        lines.append("  rates over the run (sum tokens / sum time):")
        lines.append(f"    prefill  {_f(s.prefill.tokens_per_s)} tok/s [{_pooled_label(s.prefill)}]"
                     + (f"   server /metrics {_f(sp)} tok/s [{sv.prefill.source}]" if sv and not sv.problem else "")
                     + _agree(s.prefill.tokens_per_s, sp))
        lines.append(f"    decode   {_f(s.decode.tokens_per_s)} tok/s [{_pooled_label(s.decode)}]"
                     + (f"   server /metrics {_f(sd)} tok/s [{sv.decode.source}]" if sv and not sv.problem else "")
                     + _agree(s.decode.tokens_per_s, sd))
        if sv is not None and sv.problem:
            lines.append(f"    server /metrics: unavailable ({sv.problem})")
        elif sv is not None and sv.note:
            lines.append(f"    server /metrics: {sv.note}")
        m = s.misleading
        lines.append(f"    MISLEADING completion_tokens / wall_clock = {_f(m.completion_tokens)} / {_f(m.wall_s, 3)} s"
                     f" = {_f(m.tokens_per_s)} tok/s  <- prefill and queueing sit inside the wall clock;"
                     " not a decode rate")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the plot


def plot(report: BenchReport, path: str) -> None:
    """Latency distributions per endpoint (and concurrency), and the separated rates beside the
    misleading one. The Agg backend: no display needed."""
    import matplotlib  # optional (plot/bench extra) and slow to import: only when plotting
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = [(f"{s.endpoint}\nc={s.concurrency}", s) for s in report.summaries]
    fig, axes = plt.subplots(2, 2, figsize=(max(8, 3.2 * len(by) + 4), 8))
    series: list[tuple[str, Callable[[Summary], list[float | None]]]] = [
              ("TTFT (ms)", lambda s: [x.ttft_ms for x in _ok(report, s)]),
              ("end-to-end (ms)", lambda s: [x.e2e_ms for x in _ok(report, s)]),
              ("inter-token gap (ms)", lambda s: [g for x in _ok(report, s) for g in x.gaps_ms])]
    for ax, (title, get) in zip(axes.flat, series):
        data = [[v for v in get(s) if v is not None] for _, s in by]
        labels = [lab for lab, _ in by]
        present = [(d, lab) for d, lab in zip(data, labels) if d]
        if present:
            ax.boxplot([d for d, _ in present], showfliers=True)
            ax.set_xticks(range(1, len(present) + 1), [lab for _, lab in present])
        for i, (d, lab) in enumerate(zip(data, labels)):
            if not d:
                ax.text(0.5, 0.9 - 0.1 * i, f"{lab.splitlines()[0]}: unavailable", transform=ax.transAxes,
                        ha="center")
        ax.set_title(title + " per endpoint")
        if title.startswith("inter-token"):  # gaps span bunched chunks (~0) to stalls (s): linear near 0
            ax.set_yscale("symlog", linthresh=1.0)
        ax.tick_params(axis="x", labelsize=7)
    ax = axes.flat[3]
    names = ("decode", "prefill", "misleading\ncompl/wall")
    width = 0.8 / max(len(by), 1)
    for i, (lab, s) in enumerate(by):
        vals = [s.decode.tokens_per_s, s.prefill.tokens_per_s, s.misleading.tokens_per_s]
        xs = [j + i * width for j in range(len(names))]
        bars = ax.bar(xs, [v if v else float("nan") for v in vals], width, label=lab.replace("\n", " "))
        for b, v in zip(bars, vals):  # an unmeasured bar is labelled n/a, never drawn as a zero
            x = b.get_x() + b.get_width() / 2
            if v:
                ax.annotate(f"{v:.0f}", (x, v), ha="center", va="bottom", fontsize=7)
            else:
                ax.text(x, 0.02, "n/a", transform=ax.get_xaxis_transform(), ha="center", fontsize=7)
        sv = s.server if s.server is not None and s.server.problem is None else None
        if sv is not None:  # the server's own counters over the same run, for comparison
            ax.scatter(xs[:2], [sv.decode.tokens_per_s or float("nan"), sv.prefill.tokens_per_s or float("nan")],
                       marker="_", s=400,
                       color="black", zorder=3, label="server /metrics" if i == 0 else None)
    ax.set_xticks([j + width * (len(by) - 1) / 2 for j in range(len(names))], names)
    ax.set_yscale("log")
    ax.set_ylabel("tokens/s (log)")
    ax.set_title("separated rates vs the misleading figure")
    ax.legend(fontsize=7)
    fig.suptitle(f"kotoba_vllm bench {report.started_at}  (per endpoint, not aggregated)")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)


def _ok(report: BenchReport, s: Summary) -> list[Sample]:
    return [x for x in report.samples if x.ok and x.concurrency == s.concurrency and x.target == s.target
            and (x.answered_by or x.target) == s.endpoint]
