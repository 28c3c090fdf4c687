"""EDN request files and response rendering: kotoba_vllm._edn against `edn_format` alone."""

from __future__ import annotations

import time
from typing import Any, Callable

import edn_format

from kotoba_vllm._edn import dumps, read_forms
from kotoba_vllm._model import to_edn
from kotoba_vllm._requests import request_from_edn

LINE = ('{:vllm/endpoint :chat :vllm/model "canned" :vllm/messages [{:vllm/role :user :vllm/content "Say hi %d"}]'
        ' :vllm/sampling {:vllm/max-tokens 4 :vllm/temperature 0.0} :vllm/request-id %d}\n')


def request_text(n: int) -> str:
    return "".join(LINE % (i, i) for i in range(n))


def _best(fn: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def sample_response() -> Any:
    """A typed chat response as the client builds it (no server needed: the dialect is pure)."""
    from kotoba_vllm._model import ChatRequest, Message
    from kotoba_vllm._timings import ClientClock
    from kotoba_vllm.dialects import get_dialect

    obj = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1_700_000_000, "model": "canned",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there, friend."},
                        "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}}
    req = ChatRequest(messages=(Message(role="user", content="Say hi"),), request_id=7)
    return get_dialect("openai").parse(req, obj, "http://127.0.0.1:1/v1/chat/completions",
                                       ClientClock(sent=0.0, done=0.004))


def edn_rows(sizes: tuple[int, ...], edn_format_max: int) -> list[dict[str, Any]]:
    """Seconds per request file read/write at each size; `edn_format` only up to `edn_format_max`
    requests (it is slow: beyond that its time is not measured, and the row says so)."""
    rows: list[dict[str, Any]] = []
    for n in sizes:
        text = request_text(n)
        rep = 3 if n <= 1000 else 1
        k_read = _best(lambda: [f.value for f in read_forms(text)], rep)
        k_typed = _best(lambda: [request_from_edn(f.value, f) for f in read_forms(text)], rep)
        e_read = _best(lambda: edn_format.loads_all(text), rep) if n <= edn_format_max else None
        values = [f.value for f in read_forms(text)]
        k_write = _best(lambda: "\n".join(dumps(v) for v in values), rep)
        e_write = _best(lambda: "\n".join(edn_format.dumps(v) for v in values), rep)
        rows.append({"n": n, "read_s": k_read, "read_typed_s": k_typed, "edn_format_read_s": e_read,
                     "write_s": k_write, "edn_format_write_s": e_write})
    return rows


def render_row(n: int = 2000) -> dict[str, float]:
    """Microseconds to turn one typed response into EDN text."""
    resp = sample_response()
    k = _best(lambda: [dumps(to_edn(resp)) for _ in range(n)], 3) / n * 1e6
    e = _best(lambda: [edn_format.dumps(to_edn(resp)) for _ in range(n)], 3) / n * 1e6
    conv = _best(lambda: [to_edn(resp) for _ in range(n)], 3) / n * 1e6
    return {"kotoba_us": k, "edn_format_us": e, "to_edn_us": conv}
