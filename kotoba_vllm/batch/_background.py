"""`run --background`: a batch sent at a priority that lets interactive requests overtake it.

The engines disagree on direction, so the value is per dialect: vLLM (started with
`--scheduling-policy priority`) runs lower values first; SGLang (started with
`--enable-priority-scheduling`) runs higher values first by default. Interactive requests carry
no priority (0), so the batch goes behind them. llama.cpp and plain OpenAI-compatible servers
schedule no priority: nothing is added. A request that names its own `:vllm/priority` keeps it.
"""

from __future__ import annotations

import attrs

from .._model import Request

PRIORITY_KEY = "vllm/priority"
BACKGROUND_PRIORITY: dict[str, int] = {"vllm": 10, "sglang": -10}


def background(req: Request, backend: str) -> Request:
    """`req` at the background priority of `backend`'s dialect (unchanged where the engine has none)."""
    value = BACKGROUND_PRIORITY.get(backend)
    if value is None or PRIORITY_KEY in req.extras:
        return req
    return attrs.evolve(req, extras={**req.extras, PRIORITY_KEY: value})
