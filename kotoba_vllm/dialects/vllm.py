"""vLLM's OpenAI-compatible server (V1 engine).

Facts this table encodes: unknown fields are only logged, so a knob vLLM does not know
must be refused here; the old top-level `guided_*` fields are ignored since v0.12, so
constraints go in `structured_outputs`; V1 has no `best_of`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .._model import Sampling
from .openai import Dialect, schema_json

VLLM_SAMPLING = frozenset({"temperature", "top_p", "top_k", "min_p", "max_tokens", "n", "presence_penalty",
                           "frequency_penalty", "repetition_penalty", "stop", "seed", "logprobs", "guided_json",
                           "guided_regex", "guided_choice"})


class VllmDialect(Dialect):
    name: ClassVar[str] = "vllm"
    routes: ClassVar[dict[str, str]] = {
        "chat": "/v1/chat/completions",
        "completion": "/v1/completions",
        "embedding": "/v1/embeddings",
        "tokenize": "/tokenize",
        "detokenize": "/detokenize",
    }
    health_path: ClassVar[str] = "/health"
    sampling_support: ClassVar[dict[str, frozenset[str]]] = {"chat": VLLM_SAMPLING, "completion": VLLM_SAMPLING}

    def render_structured(self, s: Sampling, ep: str, body: dict[str, Any]) -> None:
        so: dict[str, Any] = {}
        if s.guided_json is not None:
            so["json"] = schema_json(s.guided_json)
        if s.guided_regex is not None:
            so["regex"] = s.guided_regex
        if s.guided_choice is not None:
            so["choice"] = list(s.guided_choice)
        body["structured_outputs"] = so


DIALECT = VllmDialect()
