"""Issue 3 note: what `Client` costs over plain httpx, side by side in one run.

    python benchmarks/latency_vs_httpx.py [--base-url URL] [-n 200] [--streams 1000]

Without --base-url a local llama-server (tiny random GGUF, 2 slots) is started. For each of
`n` rounds one 4-token chat goes through `kotoba_vllm.Client` and one through a plain
`httpx.Client` (same JSON body, same keep-alive pool), in alternating order so drift and
warm-up hit both alike. Per request: wall time (perf_counter) and client CPU
(process_time; the server is another process). Prints an EDN map with medians and p90s.

`--streams N` also runs N sequential streaming chats through plain httpx and through
`Client`, counting failures (DESIGN §7: stale keep-alive connections) and `Client`'s
resends onto a fresh connection.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kotoba_vllm import Client, kw, pretty  # noqa: E402
from kotoba_vllm import _base_client, _client  # noqa: E402

BODY = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round((len(s) - 1) * q)))]


def _stats(wall: list[float], cpu: list[float]) -> dict[Any, Any]:
    return {kw("bench/requests"): len(wall),
            kw("bench/median-ms"): round(statistics.median(wall) * 1e3, 3),
            kw("bench/p90-ms"): round(_pct(wall, 0.9) * 1e3, 3),
            kw("bench/cpu-median-ms"): round(statistics.median(cpu) * 1e3, 3),
            kw("bench/cpu-p90-ms"): round(_pct(cpu, 0.9) * 1e3, 3)}


def _timed(fn: Callable[[], Any], wall: list[float], cpu: list[float]) -> None:
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    wall.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)


def latency(base: str, n: int, warmup: int) -> dict[Any, Any]:
    url = base + "/v1/chat/completions"
    with Client(base, backend="llamacpp", timeout=30.0) as kc, httpx.Client(timeout=30.0) as hc:
        def via_client() -> None:
            r = kc.chat("hello", max_tokens=4)
            assert r.text is not None

        def via_httpx() -> None:
            r = hc.post(url, json=BODY)
            r.raise_for_status()
            assert r.json()["choices"][0]["message"] is not None

        for _ in range(warmup):
            via_client()
            via_httpx()
        k_wall: list[float] = []
        k_cpu: list[float] = []
        h_wall: list[float] = []
        h_cpu: list[float] = []
        for i in range(n):
            pair = [(via_client, k_wall, k_cpu), (via_httpx, h_wall, h_cpu)]
            for fn, w, c in (pair if i % 2 == 0 else pair[::-1]):
                _timed(fn, w, c)
    k, h = _stats(k_wall, k_cpu), _stats(h_wall, h_cpu)
    return {kw("bench/client"): k, kw("bench/httpx"): h,
            kw("bench/client-minus-httpx-median-ms"): round(k[kw("bench/median-ms")] - h[kw("bench/median-ms")], 3),
            kw("bench/client-minus-httpx-cpu-ms"): round(k[kw("bench/cpu-median-ms")]
                                                         - h[kw("bench/cpu-median-ms")], 3)}


def streams(base: str, n: int) -> dict[Any, Any]:
    url = base + "/v1/chat/completions"
    body = {**BODY, "stream": True}
    plain_failures: list[str] = []
    with httpx.Client(timeout=30.0) as hc:
        for _ in range(n):
            try:
                with hc.stream("POST", url, json=body) as r:
                    for _line in r.iter_lines():
                        pass
            except httpx.HTTPError as e:
                plain_failures.append(f"{type(e).__name__}: {e}")
    resends = 0
    real = _base_client.may_resend

    def counting(exc: BaseException, attempt: Any) -> bool:
        nonlocal resends
        ok = real(exc, attempt)
        resends += ok
        return ok

    _client.may_resend = counting  # type: ignore[assignment]
    client_failures: list[str] = []
    try:
        with Client(base, backend="llamacpp", timeout=30.0) as kc:
            for _ in range(n):
                try:
                    kc.stream_chat("hello", max_tokens=4).until_done()
                except Exception as e:  # noqa: BLE001 - counted
                    client_failures.append(f"{type(e).__name__}: {e}")
    finally:
        _client.may_resend = real  # type: ignore[assignment]
    return {kw("bench/streams"): n,
            kw("bench/httpx-failed"): len(plain_failures),
            kw("bench/httpx-first-failure"): plain_failures[0] if plain_failures else None,
            kw("bench/client-failed"): len(client_failures),
            kw("bench/client-resends"): resends}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url")
    ap.add_argument("-n", type=int, default=200, help="rounds (one request per client each)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--streams", type=int, default=0, help="also compare N sequential streams")
    args = ap.parse_args()
    server = None
    base = args.base_url
    if base is None:
        from kotoba_vllm.local import LlamaServer, build_string
        server = LlamaServer(n_ctx=2048, parallel=2).start()
        base = server.base_url
        print(f";; local llama-server {build_string()} at {base}", file=sys.stderr)
    try:
        out: dict[Any, Any] = {kw("bench/endpoint"): base + "/v1/chat/completions",
                               kw("bench/what"): "4-token chat; Client vs plain httpx interleaved in one run"}
        out.update(latency(base, args.n, args.warmup))
        if args.streams:
            out.update(streams(base, args.streams))
        print(pretty(out))
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
