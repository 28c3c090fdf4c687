"""Typed calls for the pooling-model endpoints and the server-control endpoints, on `Client` (sync) and
`AsyncClient` (async). Each builds a typed request and sends it through the client's one `send`:
validation (an endpoint the engine lacks is refused by name, nothing sent), rendering, typed errors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping, TypeVar, Union

from ._base_client import TimeoutArg
from ._codec import structure_located
from ._errors import KotobaError, ValidationError
from ._problems import Problem
from ._model import (CacheResetRequest, ClassifyRequest, ClassifyResponse, ControlResponse, EmbeddingRequest,
                     LoraAdaptersResponse,
                     LoraListRequest, LoraLoadRequest, LoraScale, LoraScaleRequest, LoraUnloadRequest, PoolingRequest,
                     PoolingResponse, Request, RerankRequest, RerankResponse, ScoreRequest, ScoreResponse,
                     SlotRequest, to_edn)

R = TypeVar("R")
RequestId = Union[str, int, None]  # ours, sent where the engine reads one (:vllm/request-id)
Q = TypeVar("Q", bound=Request)


def checked(req: Q) -> Q:
    """`req` read back through the EDN reader: a keyword argument of the wrong type or value (a task name
    that is no task, a string where a count belongs) is a ValidationError naming its key, as in an EDN file."""
    try:
        edn = to_edn(req)
    except (KotobaError, TypeError, ValueError) as e:
        raise ValidationError([Problem("error", "request/type", f"{req.endpoint} arguments: {e}")]) from None
    back, problems = structure_located(edn, type(req))
    if back is None:
        raise ValidationError(problems)
    return back


def _texts(v: str | Iterable[str]) -> str | tuple[str, ...]:
    return v if isinstance(v, str) else tuple(v)


def embedding_request(input: str | Iterable[str], model: str | None, dimensions: int | None,
                      encoding_format: str | None, request_id: RequestId = None) -> EmbeddingRequest:
    return EmbeddingRequest(input=_texts(input), model=model, dimensions=dimensions, encoding_format=encoding_format,
                            request_id=request_id)


def rerank_request(query: str, documents: Iterable[str], model: str | None, top_n: int | None,
                   request_id: RequestId = None) -> RerankRequest:
    return RerankRequest(query=query, documents=tuple(documents), model=model, top_n=top_n, request_id=request_id)


def score_request(text_1: str | Iterable[str], text_2: str | Iterable[str], model: str | None,
                  request_id: RequestId = None) -> ScoreRequest:
    return ScoreRequest(text_1=_texts(text_1), text_2=_texts(text_2), model=model, request_id=request_id)


def scale_request(scales: Mapping[int, float]) -> LoraScaleRequest:
    return LoraScaleRequest(adapters=tuple(LoraScale(id=i, scale=float(s)) for i, s in scales.items()))


class EndpointCalls:
    """`Client`'s calls; `_typed` is its `send`, checked to answer the expected type."""

    if TYPE_CHECKING:  # the client's own
        def _typed(self, req: Request, cls: type[R], timeout: TimeoutArg) -> R: ...

    def _typed_checked(self, req: Request, cls: type[R], timeout: TimeoutArg) -> R:
        return self._typed(checked(req), cls, timeout)

    def rerank(self, query: str, documents: Iterable[str], *, model: str | None = None, top_n: int | None = None,
               timeout: TimeoutArg = None, request_id: RequestId = None) -> RerankResponse:
        """`/v1/rerank`: the documents, best first (vLLM, SGLang, llama.cpp with `--rerank`)."""
        return self._typed_checked(rerank_request(query, documents, model, top_n, request_id), RerankResponse, timeout)

    def score(self, text_1: str | Iterable[str], text_2: str | Iterable[str], *, model: str | None = None,
              timeout: TimeoutArg = None, request_id: RequestId = None) -> ScoreResponse:
        """vLLM `/score`: one text against many, or pairwise."""
        return self._typed_checked(score_request(text_1, text_2, model, request_id), ScoreResponse, timeout)

    def classify(self, input: str | Iterable[str], *, model: str | None = None,
                 timeout: TimeoutArg = None, request_id: RequestId = None) -> ClassifyResponse:
        """vLLM `/classify`."""
        return self._typed_checked(ClassifyRequest(input=_texts(input), model=model, request_id=request_id),
                                   ClassifyResponse, timeout)

    def pooling(self, input: str | Iterable[str], *, model: str | None = None, task: str | None = None,
                timeout: TimeoutArg = None, request_id: RequestId = None) -> PoolingResponse:
        """vLLM `/pooling`: the pooler's output as the server shapes it."""
        return self._typed_checked(PoolingRequest(input=_texts(input), model=model, task=task, request_id=request_id),
                                   PoolingResponse, timeout)

    def lora_adapters(self, *, timeout: TimeoutArg = None) -> LoraAdaptersResponse:
        return self._typed_checked(LoraListRequest(), LoraAdaptersResponse, timeout)

    def load_lora_adapter(self, name: str, path: str, *, timeout: TimeoutArg = None) -> ControlResponse:
        return self._typed_checked(LoraLoadRequest(lora_name=name, lora_path=path), ControlResponse, timeout)

    def unload_lora_adapter(self, name: str, *, timeout: TimeoutArg = None) -> ControlResponse:
        return self._typed_checked(LoraUnloadRequest(lora_name=name), ControlResponse, timeout)

    def set_lora_scales(self, scales: Mapping[int, float], *, timeout: TimeoutArg = None) -> ControlResponse:
        """llama.cpp: the global scale of adapters loaded at start, by id (0 switches one off)."""
        return self._typed_checked(scale_request(scales), ControlResponse, timeout)

    def reset_prefix_cache(self, *, timeout: TimeoutArg = None) -> ControlResponse:
        """vLLM `/reset_prefix_cache` (VLLM_SERVER_DEV_MODE=1), SGLang `/flush_cache`."""
        return self._typed_checked(CacheResetRequest(), ControlResponse, timeout)

    def slot_save(self, slot_id: int, filename: str, *, timeout: TimeoutArg = None) -> ControlResponse:
        """llama.cpp (`--slot-save-path`): write slot `slot_id`'s cache to `filename` in that directory."""
        return self._typed_checked(SlotRequest(action="save", slot_id=slot_id, filename=filename), ControlResponse, timeout)

    def slot_restore(self, slot_id: int, filename: str, *, timeout: TimeoutArg = None) -> ControlResponse:
        return self._typed_checked(SlotRequest(action="restore", slot_id=slot_id, filename=filename), ControlResponse,
                           timeout)

    def slot_erase(self, slot_id: int, *, timeout: TimeoutArg = None) -> ControlResponse:
        return self._typed_checked(SlotRequest(action="erase", slot_id=slot_id), ControlResponse, timeout)


class AsyncEndpointCalls:
    """`AsyncClient`'s twins of `EndpointCalls`."""

    if TYPE_CHECKING:  # the client's own
        async def _typed(self, req: Request, cls: type[R], timeout: TimeoutArg) -> R: ...

    async def _typed_checked(self, req: Request, cls: type[R], timeout: TimeoutArg) -> R:
        return await self._typed(checked(req), cls, timeout)

    async def rerank(self, query: str, documents: Iterable[str], *, model: str | None = None,
                     top_n: int | None = None, timeout: TimeoutArg = None, request_id: RequestId = None) -> RerankResponse:
        return await self._typed_checked(rerank_request(query, documents, model, top_n, request_id), RerankResponse,
                                         timeout)

    async def score(self, text_1: str | Iterable[str], text_2: str | Iterable[str], *, model: str | None = None,
                    timeout: TimeoutArg = None, request_id: RequestId = None) -> ScoreResponse:
        return await self._typed_checked(score_request(text_1, text_2, model, request_id), ScoreResponse, timeout)

    async def classify(self, input: str | Iterable[str], *, model: str | None = None,
                       timeout: TimeoutArg = None, request_id: RequestId = None) -> ClassifyResponse:
        return await self._typed_checked(ClassifyRequest(input=_texts(input), model=model, request_id=request_id),
                                         ClassifyResponse, timeout)

    async def pooling(self, input: str | Iterable[str], *, model: str | None = None, task: str | None = None,
                      timeout: TimeoutArg = None, request_id: RequestId = None) -> PoolingResponse:
        return await self._typed_checked(PoolingRequest(input=_texts(input), model=model, task=task,
                                                        request_id=request_id), PoolingResponse, timeout)

    async def lora_adapters(self, *, timeout: TimeoutArg = None) -> LoraAdaptersResponse:
        return await self._typed_checked(LoraListRequest(), LoraAdaptersResponse, timeout)

    async def load_lora_adapter(self, name: str, path: str, *, timeout: TimeoutArg = None) -> ControlResponse:
        return await self._typed_checked(LoraLoadRequest(lora_name=name, lora_path=path), ControlResponse, timeout)

    async def unload_lora_adapter(self, name: str, *, timeout: TimeoutArg = None) -> ControlResponse:
        return await self._typed_checked(LoraUnloadRequest(lora_name=name), ControlResponse, timeout)

    async def set_lora_scales(self, scales: Mapping[int, float], *, timeout: TimeoutArg = None) -> ControlResponse:
        return await self._typed_checked(scale_request(scales), ControlResponse, timeout)

    async def reset_prefix_cache(self, *, timeout: TimeoutArg = None) -> ControlResponse:
        return await self._typed_checked(CacheResetRequest(), ControlResponse, timeout)

    async def slot_save(self, slot_id: int, filename: str, *, timeout: TimeoutArg = None) -> ControlResponse:
        return await self._typed_checked(SlotRequest(action="save", slot_id=slot_id, filename=filename), ControlResponse,
                                 timeout)

    async def slot_restore(self, slot_id: int, filename: str, *, timeout: TimeoutArg = None) -> ControlResponse:
        return await self._typed_checked(SlotRequest(action="restore", slot_id=slot_id, filename=filename),
                                 ControlResponse, timeout)

    async def slot_erase(self, slot_id: int, *, timeout: TimeoutArg = None) -> ControlResponse:
        return await self._typed_checked(SlotRequest(action="erase", slot_id=slot_id), ControlResponse, timeout)
