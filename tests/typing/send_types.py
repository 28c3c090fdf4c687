"""Type-checked, never run: what a user's editor and mypy see. `tests/test_types.py` runs mypy
on this file and compares every `reveal_type` with the `# revealed:` comment on its line."""

from __future__ import annotations

from typing import Mapping

from kotoba_vllm import (AsyncClient, AsyncPool, ChatRequest, Client, CompletionRequest, DetokenizeRequest, Edn,
                         EdnMap, EmbeddingRequest, Keyword, Message, Pool, TokenizeRequest, kw, read_forms)

chat = ChatRequest(messages=(Message(role="user", content="hi"),))
tokenize = TokenizeRequest(text="hi")
edn_map: EdnMap = {kw("vllm/endpoint"): kw("chat"), kw("vllm/messages"): [{kw("vllm/role"): kw("user")}]}


def sync_client(c: Client) -> None:
    reveal_type(c.send(chat))  # revealed: kotoba_vllm._model.Response
    reveal_type(c.send(tokenize))  # revealed: kotoba_vllm._model.TokenizeResponse
    reveal_type(c.send(DetokenizeRequest(tokens=(1, 2))))  # revealed: kotoba_vllm._model.DetokenizeResponse
    reveal_type(c.send(EmbeddingRequest(input="hi")))  # revealed: kotoba_vllm._model.EmbeddingResponse
    reveal_type(c.send(CompletionRequest(prompt="hi")))  # revealed: kotoba_vllm._model.Response
    reveal_type(c.send(edn_map))  # revealed: kotoba_vllm._model.Response | kotoba_vllm._model.EmbeddingResponse | kotoba_vllm._model.TokenizeResponse | kotoba_vllm._model.DetokenizeResponse | kotoba_vllm._model.RerankResponse | kotoba_vllm._model.ScoreResponse | kotoba_vllm._model.ClassifyResponse | kotoba_vllm._model.PoolingResponse | kotoba_vllm._model.LoraAdaptersResponse | kotoba_vllm._model.ControlResponse
    reveal_type(c.chat("hi"))  # revealed: kotoba_vllm._model.Response
    reveal_type(c.tokenize("hi"))  # revealed: kotoba_vllm._model.TokenizeResponse
    reveal_type(c.rerank("q", ["a"]))  # revealed: kotoba_vllm._model.RerankResponse
    reveal_type(c.slot_erase(0))  # revealed: kotoba_vllm._model.ControlResponse
    reveal_type(c.stream(chat).until_done())  # revealed: kotoba_vllm._model.Response


async def async_client(c: AsyncClient) -> None:
    reveal_type(await c.send(chat))  # revealed: kotoba_vllm._model.Response
    reveal_type(await c.send(tokenize))  # revealed: kotoba_vllm._model.TokenizeResponse
    reveal_type(await c.chat("hi"))  # revealed: kotoba_vllm._model.Response
    reveal_type(await c.score("a", ["b"]))  # revealed: kotoba_vllm._model.ScoreResponse
    reveal_type(await c.lora_adapters())  # revealed: kotoba_vllm._model.LoraAdaptersResponse
    reveal_type(await (await c.stream(chat)).until_done())  # revealed: kotoba_vllm._model.Response


def pool(p: Pool) -> None:
    reveal_type(p.send(chat))  # revealed: kotoba_vllm._model.Response
    reveal_type(p.send(tokenize))  # revealed: kotoba_vllm._model.TokenizeResponse
    reveal_type(p.send(chat, conversation="c1"))  # revealed: kotoba_vllm._model.Response
    reveal_type(p.stream(chat).until_done())  # revealed: kotoba_vllm._model.Response


async def async_pool(p: AsyncPool) -> None:
    reveal_type(await p.send(chat))  # revealed: kotoba_vllm._model.Response
    reveal_type(await p.send(tokenize))  # revealed: kotoba_vllm._model.TokenizeResponse


def edn_values(text: str) -> None:
    value = next(read_forms(text)).value
    reveal_type(value)  # revealed: Edn
    nested: Edn = {kw("a"): [1, 2.5, "x", None, {kw("b"): frozenset({kw("c")})}]}
    reveal_type(nested)  # revealed: Edn
    # Values built as ordinary Python collections are EDN without a cast (read-only protocols).
    words: list[str] = ["a", "b"]
    counts: dict[Keyword, int] = {kw("n"): 1}
    as_edn: list[Edn] = [words, counts, (1, 2), frozenset({kw("x")})]
    if isinstance(value, Mapping):  # narrowing by the protocol keeps the value type (by dict gives Any)
        model = value.get(kw("vllm/model"))
        if isinstance(model, str):
            reveal_type(model)  # revealed: str
