"""`python benchmarks/llama_build_speed.py --other PATH/llama-server`: the shipped portable llama-server against
another build (e.g. a `-DGGML_NATIVE=ON` one) on the same models, decode and prefill as llama.cpp reports them.

Rounds alternate the two binaries (A B B A ...), each a fresh server with one thread, greedy, a fixed prompt;
per answer the server's own `timings.predicted_per_second` and `prompt_per_second` are kept as reported.
Writes benchmarks/results/llama-build-speed-<stamp>.edn.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from kotoba_vllm import Client, kw  # noqa: E402
from kotoba_vllm._edn import dumps  # noqa: E402
from kotoba_vllm.local import GEMMA3_270M, TINY, LlamaServer, llama_server_binary  # noqa: E402

PROMPT = [{"role": "user", "content": "Describe a lighthouse on a stormy night, in detail, for a travel guide."}]


def one_round(binary: str, model: str, answers: int, max_tokens: int) -> list[dict[str, float]]:
    os.environ["KOTOBA_VLLM_LLAMA_SERVER"] = binary
    out = []
    with LlamaServer(model=model, threads=1, n_ctx=1024, startup_timeout=120) as server:
        with Client(server.base_url, backend="llamacpp", timeout=300.0) as c:
            c.chat(PROMPT, max_tokens=4, temperature=0.0)  # warm: load pages, first graph
            for i in range(answers):
                r = c.chat([{"role": "user", "content": f"{i}. {PROMPT[0]['content']}"}], max_tokens=max_tokens,
                           temperature=0.0, ignore_eos=True)
                t = r.extras.get("llamacpp/timings") or {}
                out.append({"decode": float(t[kw("predicted_per_second")]),
                            "prefill": float(t[kw("prompt_per_second")])})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--other", required=True, help="the other llama-server binary")
    ap.add_argument("--label", default="native (-DGGML_NATIVE=ON)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per binary and model (default 4)")
    ap.add_argument("--answers", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--models", default=f"{TINY},{GEMMA3_270M}")
    args = ap.parse_args()
    shipped = llama_server_binary()
    builds = {"portable (shipped)": shipped, args.label: args.other}
    result: dict[Any, Any] = {kw("date"): _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                              kw("binaries"): builds, kw("threads"): 1, kw("max-tokens"): args.max_tokens,
                              kw("load-average-start"): round(os.getloadavg()[0], 2), kw("models"): {}}
    for model in args.models.split(","):
        samples: dict[str, list[dict[str, float]]] = {b: [] for b in builds}
        order = [b for i in range(args.rounds) for b in (list(builds) if i % 2 == 0 else list(builds)[::-1])]
        for b in order:
            samples[b] += one_round(builds[b], model, args.answers, args.max_tokens)
            print(f"{model} {b}: decode {samples[b][-1]['decode']:.1f} tok/s", file=sys.stderr, flush=True)
        per = {b: {kw("decode-tokens-per-s-median"): round(statistics.median(x["decode"] for x in s), 1),
                   kw("decode-tokens-per-s-min"): round(min(x["decode"] for x in s), 1),
                   kw("decode-tokens-per-s-max"): round(max(x["decode"] for x in s), 1),
                   kw("prefill-tokens-per-s-median"): round(statistics.median(x["prefill"] for x in s), 1),
                   kw("answers"): len(s)} for b, s in samples.items()}
        a, b = (per[k][kw("decode-tokens-per-s-median")] for k in builds)
        per[kw("portable-over-other-decode")] = round(a / b, 3)
        result[kw("models")][model] = per
    result[kw("load-average-end")] = round(os.getloadavg()[0], 2)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H%M%SZ")
    path = HERE / "results" / f"llama-build-speed-{stamp}.edn"
    path.write_text(dumps(result) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
