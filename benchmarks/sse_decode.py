"""`python benchmarks/sse_decode.py`: the SSE decoder per event and per MiB of one line, beside openai-python's.

Each decoder gets the same bytes in 64 KiB reads (what a socket hands over): (a) 20,000 small chat-chunk
events, (b) one `data:` line of 1, 4, 16 and 32 MiB. CPU time (`time.process_time`), best of 3; on a
shared machine compare the two columns of one run, not runs. The decoder's work is also counted, which is
repeatable anywhere: `SseDecoder.scanned` (bytes looked at) per byte of line stays ~2 whatever the length
(tests/test_hostile_servers.py holds it); before, each read rebuilt and rescanned the line so far.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Callable, Iterator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kotoba_vllm._base_client import SseDecoder  # noqa: E402

MiB = 1024 * 1024
READ = 65536


def reads(data: bytes) -> list[bytes]:
    return [data[i:i + READ] for i in range(0, len(data), READ)]


def ours(pieces: list[bytes]) -> int:
    dec = SseDecoder("bench", max_line=64 * MiB)
    return sum(1 for p in pieces for _ in dec.payloads(p))


def openai_python(pieces: list[bytes]) -> int:
    from openai._streaming import SSEDecoder
    return sum(1 for _ in SSEDecoder().iter_bytes(iter(pieces)))


def best(fn: Callable[[list[bytes]], int], pieces: list[bytes]) -> float:
    out = []
    for _ in range(3):
        t0 = time.process_time()
        fn(pieces)
        out.append(time.process_time() - t0)
    return min(out)


def cases() -> Iterator[tuple[str, list[bytes], float]]:
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": "m",
             "choices": [{"index": 0, "delta": {"content": "tok"}, "finish_reason": None}]}
    events = b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for _ in range(20000))
    yield "20,000 events (per event)", reads(events), 20000
    for n in (1, 4, 16, 32):
        yield f"one {n} MiB line (per MiB)", reads(b"data: " + b"x" * (n * MiB) + b"\n\n"), n


def main() -> None:
    try:
        import openai  # noqa: F401
        peers = {"kotoba": ours, "openai-python": openai_python}
    except ImportError:
        peers = {"kotoba": ours}
    print(f"{'case':32} " + " ".join(f"{p:>16}" for p in peers))
    for name, pieces, per in cases():
        cells = [best(fn, pieces) / per for fn in peers.values()]
        unit = 1e6 if "event" in name else 1e3
        print(f"{name:32} " + " ".join(f"{c * unit:13.2f} {'us' if unit == 1e6 else 'ms'}" for c in cells))


if __name__ == "__main__":
    main()
