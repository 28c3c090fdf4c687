"""One pure module per engine dialect; `get_dialect(name)` is the only dispatch on backend."""

from __future__ import annotations

from .._errors import ConfigError
from .llamacpp import DIALECT as LLAMACPP
from .openai import DIALECT as OPENAI
from .openai import ChunkStream, Dialect
from .sglang import DIALECT as SGLANG
from .vllm import DIALECT as VLLM
from ._endpoints import register_served
from ._http import HttpRequest, classify_error, parse_retry_after

DIALECTS: dict[str, Dialect] = {d.name: d for d in (VLLM, SGLANG, LLAMACPP, OPENAI)}
register_served({d.name: d.routes for d in DIALECTS.values()})  # refusals name who serves an endpoint


def get_dialect(name: str) -> Dialect:
    try:
        return DIALECTS[name]
    except KeyError:
        raise ConfigError(f"unknown backend {name!r}; expected one of {', '.join(DIALECTS)}") from None


__all__ = ["DIALECTS", "ChunkStream", "Dialect", "HttpRequest", "classify_error", "get_dialect", "parse_retry_after"]
