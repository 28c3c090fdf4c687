"""llama-server reports a failure inside a stream as a non-standard `error: {...}` SSE line.
It must surface as a typed error with the text received so far, sync and async."""

from __future__ import annotations

import httpx
import pytest
import respx

from kotoba_vllm import AsyncClient, Client, ServerFailure
from kotoba_vllm._base_client import SseDecoder

BODY = (b'data: {"content":"ab","stop":false}\n\n'
        b'error: {"code":500,"message":"boom","type":"server_error"}\n\n')


def test_decoder_keeps_error_field_as_error_event() -> None:
    events = SseDecoder().feed(BODY)
    assert events[-1] == ("error", '{"code":500,"message":"boom","type":"server_error"}')


def _mock(m: respx.MockRouter) -> None:
    m.post("/completion").mock(return_value=httpx.Response(
        200, headers={"content-type": "text/event-stream"}, stream=httpx.ByteStream(BODY)))


def test_sync_stream_error_line_is_typed() -> None:
    with respx.mock(base_url="http://s") as m:
        _mock(m)
        with pytest.raises(ServerFailure) as info:
            client = Client("http://s", backend="llamacpp", http_client=httpx.Client())  # respx: httpx only
            client.stream_completion("x", native=True).until_done()
    assert info.value.message == "boom"
    assert info.value.partial_text == "ab"


async def test_async_stream_error_line_is_typed() -> None:
    with respx.mock(base_url="http://s") as m:
        _mock(m)
        client = AsyncClient("http://s", backend="llamacpp", http_client=httpx.AsyncClient())  # respx: httpx only
        stream = await client.stream_completion("x", native=True)
        with pytest.raises(ServerFailure) as info:
            await stream.until_done()
    assert info.value.partial_text == "ab"


def test_openai_style_v1_base_url_is_accepted() -> None:
    with respx.mock(base_url="http://s") as m:
        route = m.post("/v1/chat/completions").respond(200, json={
            "id": "c", "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                    "finish_reason": "stop"}]})
        r = Client("http://s/v1/", backend="openai", http_client=httpx.Client()).chat("hello")  # respx: httpx
    assert route.call_count == 1 and r.text == "hi"
    assert r.endpoint_url == "http://s/v1/chat/completions"
