"""Sample values fed through the code's own `to_edn` for the shapes that have no key table.

Samples cover each branch a converter has (a value or nil, text or base64 bodies, a
failed link, a server that reported or did not), so every key it can write appears.
"""

from __future__ import annotations

from collections import Counter
import attrs

from .._edn import Edn, Keyword, kw
from ..batch._runner import BatchSummary
from ..bench._metrics import Rate, ServerRates
from ..bench._report import summary_edn
from ..bench._stats import Sample, summarize_group
from ..cassettes import Cassette, load_cassettes
from ..capacity import Fetched
from ..distributed import plan, spec_from_edn
from ..server_config import read_config, unmeasured_config


def plan_samples() -> list[dict[Keyword, Edn]]:

    def spec(nodes: int, links: list[dict[Keyword, Edn]], **top: Edn) -> dict[Keyword, Edn]:
        return {kw("dist/model"): {kw("model/id"): "m", kw("model/path"): "/m.gguf", kw("model/layers"): 32,
                                   kw("model/weight-bytes"): 4_000_000_000},
                kw("dist/nodes"): [{kw("node/name"): f"n{i}", kw("node/address"): f"10.0.0.{i + 1}",
                                    kw("node/memory-bytes"): 16_000_000_000, **({kw("node/port"): 50052} if i else {})}
                                   for i in range(nodes)],
                **({kw("dist/links"): links} if links else {}), **{kw(k): v for k, v in top.items()}}

    verified: dict[Keyword, Edn] = {kw("link/from"): "n0", kw("link/to"): "n1", kw("link/method"): kw("receiver-verified"),
                kw("link/mbps"): 933.0, kw("link/bytes"): 67108864, kw("link/ms"): 575.0}
    failed: dict[Keyword, Edn] = {kw("link/from"): "n1", kw("link/to"): "n2", kw("link/method"): kw("receiver-verified"),
              kw("link/failure"): "short transfer"}
    def fleet(roles: bool = False) -> dict[Keyword, Edn]:
        top: dict[str, Edn] = {"dist/context-length": 4096, "dist/slots": 8, "dist/memory-fraction": 0.85,
                               "dist/kv-cache-bytes": 8_000_000_000,
                               "dist/speculative": {kw("speculative/method"): kw("draft"),
                                                    kw("speculative/draft-model"): "/d", kw("speculative/tokens"): 4}}
        raw = spec(2, [], **top)
        model, nodes = raw[kw("dist/model")], raw[kw("dist/nodes")]
        assert isinstance(model, dict) and isinstance(nodes, list)  # as spec() builds them
        model[kw("model/experts")] = 64
        for i, n in enumerate(nodes):
            assert isinstance(n, dict)
            n.update({kw("node/accelerators"): 4, kw("node/accelerator-memory-bytes"): 8_000_000_000,
                      kw("node/serve-port"): 8100 + i, **({kw("node/role"): kw(("prefill", "decode")[i])}
                                                         if roles else {})})
        return raw

    out = []
    for raw, engine in ((spec(1, []), "vllm"), (spec(2, [verified], **{"dist/engine": kw("llamacpp")}), None),
                        (spec(3, [verified, failed]), "sglang"), (fleet(), "vllm"), (fleet(roles=True), "sglang")):
        s, problems = spec_from_edn(raw)
        p, more = plan(s, engine) if s is not None else (None, [])
        assert p is not None, problems + more
        out.append(p.to_edn())
    return out


def cassette_samples() -> list[dict[Keyword, Edn]]:
    """Every cassette in tests/cassettes read and written back, plus the base64 branches."""

    found = load_cassettes()
    out = [c.to_edn() for c in found]
    base = found[0] if found else Cassette(
        name="x", engine="llamacpp", backend="llamacpp", provenance={kw("cassette/how"): kw("derived")},
        call={kw("call/op"): kw("raw")}, method="GET", path="/health", request_body=None, status=200, headers={})
    bad = b"\xe3\x81"  # half a UTF-8 character: stored as base64
    out.append(attrs.evolve(base, request_body=bad, body=bad, chunks=None).to_edn())
    out.append(attrs.evolve(base, request_body=None, body=None, chunks=(b"data: x", bad)).to_edn())
    return out


def batch_samples() -> list[dict[Keyword, Edn]]:

    done = BatchSummary(sent=2, recorded=3, elapsed_s=1.5, output="out.edn")
    done.outcomes.update({"ok": 2, "validation": 1})
    cut = BatchSummary(interrupted=True, stopped_at=7, pending="out.edn.journal", input_error="line 8: not JSON")
    return [done.to_edn(), cut.to_edn()]


def ray_summary_samples() -> list[dict[Keyword, Edn]]:
    from ..ray._summary import summary_edn

    stats = {"outcomes": Counter({"ok": 9, "admission-rejected": 1}), "rows": 10, "sent": 11, "maybe_sent_twice": 1,
             "files": 2}
    return [summary_edn(stats, already_done=0, elapsed_s=2.0, output="out/"),
            summary_edn(dict(stats, outcomes=Counter(), rows=0, sent=0, maybe_sent_twice=0, files=0),
                        already_done=10, elapsed_s=0.0, output="out/")]


def bench_samples() -> list[dict[Keyword, Edn]]:

    ok = Sample(target="http://h:8080", concurrency=1, started=0.0, finished=1.0, answered_by="http://h:8080",
                completion_tokens=8, prefill_tokens=4, prefill_ms=10.0, prefill_rate=400.0,
                prefill_provenance="server-reported", decode_tokens=8, decode_ms=100.0, decode_rate=80.0,
                decode_provenance="server-reported", client_decode_rate=75.0, ttft_ms=12.0, gaps_ms=(12.0, 13.0))
    err = Sample(target="http://h:8080", concurrency=1, started=0.0, finished=0.5, error_kind="timeout")
    row = summarize_group("http://h:8080", "http://h:8080", 1, [ok, err])
    rates = ServerRates("llamacpp", Rate(4.0, 0.01, 400.0), Rate(8.0, 0.1, 80.0))
    return [summary_edn(attrs.evolve(row, server=rates)),
            summary_edn(attrs.evolve(row, server=ServerRates(None, Rate(None, None, None), Rate(None, None, None),
                                                             problem="no /metrics"))),
            summary_edn(summarize_group("http://h:8080", "http://h:8080", 1, []))]


def server_config_samples() -> list[dict[Keyword, Edn]]:
    """Each engine's recorded configuration answers read back, a failed path, and an unreachable server."""
    by_name = {(c.engine, c.path): c for c in load_cassettes() if c.how == "recorded" and c.op in ("probe", "models")}
    paths = {"llamacpp": ("/props", "/slots", "/v1/models"), "sglang": ("/server_info",),
             "vllm": ("/version", "/v1/models", "/metrics")}
    out = []
    for engine, ps in paths.items():
        got = {p: Fetched(p, by_name[(engine, p)].status, by_name[(engine, p)].body or b"", ms=1.0)
               for p in ps if (engine, p) in by_name}
        out.append(read_config(f"http://{engine}:1", engine, got, at="2026-12-01T00:00:00.000Z").to_edn())
    failed = {"/props": Fetched("/props", 501, b"no"), "/slots": Fetched("/slots", error="refused"),
              "/v1/models": Fetched("/v1/models", 200, b'{"data": [{"id": "m"}]}')}
    out.append(read_config("http://x:1", "llamacpp", failed).to_edn())
    out.append(unmeasured_config("http://x:1", None, "backend detection failed", reachable=False).to_edn())
    return out
