"""vLLM's OpenAI-compatible server (V1 engine).

Facts this table encodes: unknown fields are only logged, so a knob vLLM does not know
must be refused here; the old top-level `guided_*` fields are ignored since v0.12, so
constraints go in `structured_outputs`; V1 has no `best_of`. n > 1 with greedy sampling is
refused by vLLM 0.33.0 (HTTP 400 "n must be 1 when using greedy sampling, got 2."), so it is
refused here before sending; with temperature unset the model's generation config decides.
"""

from __future__ import annotations

from typing import ClassVar

from .._model import Request, Sampling
from .._problems import Problem
from ._endpoints import POOLING_ENDPOINTS
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
        # pooling models (a reranker / *ForSequenceClassification, or --convert); /score and /classify as named
        "rerank": "/v1/rerank",
        "score": "/score",
        "classify": "/classify",
        "pooling": "/pooling",
        # adapters in /v1/models have a parent; loading needs --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1
        "lora-list": "/v1/models",
        "lora-load": "/v1/load_lora_adapter",
        "lora-unload": "/v1/unload_lora_adapter",
        "cache-reset": "/reset_prefix_cache",  # registered only with VLLM_SERVER_DEV_MODE=1
    }
    health_path: ClassVar[str] = "/health"
    # the content part types its chat parser takes (read from its code)
    part_types: ClassVar[frozenset[str]] = frozenset({"text", "image-url", "audio-url", "video-url",
                                                     "input-audio", "image-embeds"})
    request_id_field: ClassVar[str | None] = "request_id"  # vLLM reads X-Request-Id first, then this
    # every pooling request model has it too (PoolingBasicRequestMixin, vLLM 0.32.0 and 0.33.0)
    request_id_endpoints: ClassVar[frozenset[str]] = Dialect.request_id_endpoints | POOLING_ENDPOINTS
    sampling_support: ClassVar[dict[str, frozenset[str]]] = {"chat": VLLM_SAMPLING, "completion": VLLM_SAMPLING}

    def problems(self, req: Request) -> list[Problem]:
        out = super().problems(req)
        s: Sampling | None = getattr(req, "sampling", None)
        if s is None or s.n is None or s.n <= 1:
            return out
        if s.temperature == 0:
            out.append(Problem("error", "sampling/greedy-n", f"vLLM refuses n={s.n} with greedy sampling "
                               "(:vllm/temperature 0): use n 1, or a temperature above 0",
                               field="vllm/temperature", engine=self.name))
        elif s.top_k == 1:
            out.append(Problem("error", "sampling/greedy-n", f"n={s.n} with :vllm/top-k 1 samples greedily: "
                               "every choice would be the same; use n 1, or top-k above 1",
                               field="vllm/top-k", engine=self.name))
        elif s.temperature is None:
            out.append(Problem("warn", "sampling/greedy-n", f"n={s.n} without :vllm/temperature: the model's "
                               "generation config decides; vLLM refuses n > 1 if that is greedy",
                               field="vllm/temperature", engine=self.name))
        return out

    def render_structured(self, s: Sampling, ep: str, body: dict[str, object]) -> None:
        so: dict[str, object] = {}
        if s.guided_json is not None:
            so["json"] = schema_json(s.guided_json)
        if s.guided_regex is not None:
            so["regex"] = s.guided_regex
        if s.guided_choice is not None:
            so["choice"] = list(s.guided_choice)
        body["structured_outputs"] = so


DIALECT = VllmDialect()
