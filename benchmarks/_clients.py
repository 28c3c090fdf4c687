"""The contenders, each as the minimal code a user would write against one server.

Every function does one whole exchange (send, read, decode) so they are comparable:
raw httpx (the ratio base the targets name), raw `http.client` (the practical sync floor,
written the way its documentation shows), kotoba_vllm on its default wire, kotoba_vllm on a
caller's httpx client, openai-python (`max_retries=0`; its default is 2 retries with backoff,
which costs nothing on the success path measured here).
"""

from __future__ import annotations

import http.client
import json
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit

import httpx

MESSAGES = [{"role": "user", "content": "Say hi"}]
LIMITS = httpx.Limits(max_connections=256, max_keepalive_connections=64, keepalive_expiry=5.0)

Sync = Callable[[], Any]
Async = Callable[[], Awaitable[Any]]


def no_trace_client(base_url: str, model: str, backend: str) -> Any:
    """kotoba's Client on a caller's httpx client minus the per-request httpx trace hook (the stale
    keep-alive rule's evidence there): measurement only, to price the hook; it never resends."""
    from kotoba_vllm import Client

    class NoTrace(Client):
        def _send(self, plan: Any, timeout: httpx.Timeout, stream: bool, deadline_s: float | None = None) -> Any:
            return self._wire.send(plan.http.method, plan.url, json=plan.http.body, timeout=timeout, stream=stream,
                                   deadline_s=deadline_s)

    return NoTrace(base_url, backend=backend, model=model, timeout=60.0,
                   http_client=httpx.Client(limits=LIMITS, timeout=60.0))


class SyncSet:
    """Sync clients bound to one server: `.chat[name]()` and `.stream[name]()` -> chunk count."""

    def __init__(self, base_url: str, model: str, max_tokens: int = 4, stream_tokens: int = 1000,
                 backend: str = "openai") -> None:
        import openai

        from kotoba_vllm import Client

        self.base_url, self.model = base_url, model
        self.raw = httpx.Client(limits=LIMITS, timeout=60.0)
        self.kotoba = Client(base_url, backend=backend, model=model, timeout=60.0)
        assert self.kotoba.transport == "stdlib"
        self.kotoba_httpx = Client(base_url, backend=backend, model=model, timeout=60.0,
                                   http_client=httpx.Client(limits=LIMITS, timeout=60.0))
        u = urlsplit(base_url)
        self.hc = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=60.0)
        self.openai = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=60.0)
        url = base_url + "/v1/chat/completions"
        body = {"model": model, "messages": MESSAGES, "max_tokens": max_tokens}
        sbody = {"model": model, "messages": MESSAGES, "max_tokens": stream_tokens, "stream": True,
                 "stream_options": {"include_usage": True}}

        def raw_chat() -> Any:
            return self.raw.post(url, json=body).json()["choices"][0]["message"]["content"]

        def kotoba_chat() -> Any:
            return self.kotoba.chat(MESSAGES, max_tokens=max_tokens).text

        def kotoba_httpx_chat() -> Any:
            return self.kotoba_httpx.chat(MESSAGES, max_tokens=max_tokens).text

        path = urlsplit(url).path
        hc_headers = {"Content-Type": "application/json"}

        def hc_post(payload: Any) -> http.client.HTTPResponse:
            data = json.dumps(payload).encode()
            try:
                self.hc.request("POST", path, body=data, headers=hc_headers)
                return self.hc.getresponse()
            except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
                self.hc.close()  # the server closed the idle connection; http.client reconnects when closed
                self.hc.request("POST", path, body=data, headers=hc_headers)
                return self.hc.getresponse()

        def hc_chat() -> Any:
            return json.loads(hc_post(body).read())["choices"][0]["message"]["content"]

        def openai_chat() -> Any:
            return self.openai.chat.completions.create(model=model, messages=MESSAGES,  # type: ignore[arg-type]
                                                       max_tokens=max_tokens).choices[0].message.content

        def raw_stream() -> int:
            n = 0
            with self.raw.stream("POST", url, json=sbody) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        obj = json.loads(line[6:])
                        for c in obj["choices"]:
                            if c["delta"].get("content"):
                                n += 1
            return n

        def kotoba_stream() -> int:
            n = 0
            with self.kotoba.stream_chat(MESSAGES, max_tokens=stream_tokens) as s:
                for d in s:
                    if d.delta:
                        n += 1
            return n

        def kotoba_httpx_stream() -> int:
            n = 0
            with self.kotoba_httpx.stream_chat(MESSAGES, max_tokens=stream_tokens) as s:
                for d in s:
                    if d.delta:
                        n += 1
            return n

        def hc_stream() -> int:
            n = 0
            with hc_post(sbody) as r:
                # bytes as they arrive, split into lines (iterating the response line by line costs 1.6x
                # this: http.client reads each line through Python-level peek/read over the chunked framing)
                rest = b""
                while data := r.read1(65536):
                    *lines, rest = (rest + data).split(b"\n")
                    for line in lines:
                        if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                            obj = json.loads(line[6:])
                            for c in obj["choices"]:
                                if c["delta"].get("content"):
                                    n += 1
            return n

        def openai_stream() -> int:
            n = 0
            for chunk in self.openai.chat.completions.create(  # type: ignore[call-overload]
                    model=model, messages=MESSAGES, max_tokens=stream_tokens, stream=True,
                    stream_options={"include_usage": True}):
                if chunk.choices and chunk.choices[0].delta.content:
                    n += 1
            return n

        self.notrace = no_trace_client(base_url, model, backend)
        self.chat: dict[str, Sync] = {"httpx": raw_chat, "http.client": hc_chat, "kotoba": kotoba_chat,
                                      "kotoba-httpx": kotoba_httpx_chat, "openai": openai_chat}
        self.trace_pair: dict[str, Sync] = {  # both on a caller's httpx client: the hook is httpx's evidence
            "kotoba": kotoba_httpx_chat, "no-trace": lambda: self.notrace.chat(MESSAGES, max_tokens=max_tokens).text}
        self.stream: dict[str, Sync] = {"httpx": raw_stream, "http.client": hc_stream, "kotoba": kotoba_stream,
                                        "kotoba-httpx": kotoba_httpx_stream, "openai": openai_stream}

    def close(self) -> None:
        self.raw.close()
        self.hc.close()
        self.kotoba.close()
        self.kotoba_httpx.close()
        self.notrace.close()
        self.openai.close()


class AsyncSet:
    """Async twins; `.open_stream[name]()` opens a stream, reads one delta and returns a closer."""

    def __init__(self, base_url: str, model: str, max_tokens: int = 4, stream_tokens: int = 1000) -> None:
        import openai

        from kotoba_vllm import AsyncClient

        self.raw = httpx.AsyncClient(limits=LIMITS, timeout=60.0)
        self.kotoba = AsyncClient(base_url, backend="openai", model=model, timeout=60.0)
        self.openai = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=60.0)
        url = base_url + "/v1/chat/completions"
        body = {"model": model, "messages": MESSAGES, "max_tokens": max_tokens}
        sbody = {"model": model, "messages": MESSAGES, "max_tokens": stream_tokens, "stream": True,
                 "stream_options": {"include_usage": True}}

        async def raw_chat() -> Any:
            r = await self.raw.post(url, json=body)
            return r.json()["choices"][0]["message"]["content"]

        async def kotoba_chat() -> Any:
            return (await self.kotoba.chat(MESSAGES, max_tokens=max_tokens)).text

        async def openai_chat() -> Any:
            r = await self.openai.chat.completions.create(model=model, messages=MESSAGES,  # type: ignore[arg-type]
                                                          max_tokens=max_tokens)
            return r.choices[0].message.content

        async def raw_open() -> Callable[[], Awaitable[None]]:
            req = self.raw.build_request("POST", url, json=sbody)
            r = await self.raw.send(req, stream=True)
            lines = r.aiter_lines()
            async for line in lines:
                if line.startswith("data: "):
                    json.loads(line[6:])
                    break
            return r.aclose

        async def kotoba_open() -> Callable[[], Awaitable[None]]:
            s = await self.kotoba.stream_chat(MESSAGES, max_tokens=stream_tokens)
            it = s.__aiter__()
            await it.__anext__()

            async def close() -> None:
                await it.aclose()
                await s.aclose()
            return close

        async def openai_open() -> Callable[[], Awaitable[None]]:
            s = await self.openai.chat.completions.create(  # type: ignore[call-overload]
                model=model, messages=MESSAGES, max_tokens=stream_tokens, stream=True,
                stream_options={"include_usage": True})
            it = s.__aiter__()
            await it.__anext__()
            return s.close  # type: ignore[no-any-return]

        self.chat: dict[str, Async] = {"httpx": raw_chat, "kotoba": kotoba_chat, "openai": openai_chat}
        self.open_stream: dict[str, Callable[[], Awaitable[Callable[[], Awaitable[None]]]]] = {
            "httpx": raw_open, "kotoba": kotoba_open, "openai": openai_open}

    async def aclose(self) -> None:
        await self.raw.aclose()
        await self.kotoba.aclose()
        await self.openai.close()
