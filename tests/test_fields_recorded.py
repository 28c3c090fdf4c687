"""Issue 31's request fields as vLLM 0.33.0's and SGLang 0.5.23's own serving layers read them
(tests/cassettes/vllm-fields, tests/cassettes/sglang-fields: `scripts/record-vllm --only fields`,
`scripts/record-sglang --only fields`, engine core / scheduler faked).

Each cassette carries `:cassette/engine-received`: what the serving layer handed the faked engine for
that exchange (vLLM's EngineCoreRequest and SamplingParams, SGLang's TokenizedGenerateReqInput and
SamplingParams). So a replay that sends the recorded body, from EDN and from keyword arguments, sync
and async, shows the engines' own code read every field the SDK put on the wire. Offline.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

import httpx
import pytest
import respx

from kotoba_vllm import AsyncClient, Client
from kotoba_vllm._edn import kw
from kotoba_vllm.cassettes import Cassette, load_cassettes, request_json
from kotoba_vllm.cassettes._replay import Outcome, http_response, replay_async, replay_sync, sent_json

SETS = {"vllm": {c.name: c for c in load_cassettes("vllm-fields")},
        "sglang": {c.name: c for c in load_cassettes("sglang-fields")}}
ENGINES = [e for e in SETS if SETS[e]]
FIELD_SETS = [(e, n) for e in ENGINES for n in sorted(SETS[e]) if "-fields" in n]
MODES = ["sync", "async"]
BASE = "http://fields.invalid:8000"


def cassette(engine: str, name: str) -> Cassette:
    assert name in SETS[engine], f"no recorded {engine}-fields/{name}: run scripts/record-{engine} --only fields"
    return SETS[engine][name]


def received(c: Cassette) -> dict[str, Any]:
    """The one engine request the serving layer made of this exchange."""
    assert c.engine_received is not None and len(c.engine_received) == 1, (c.id, c.engine_received)
    one = c.engine_received[0]
    assert isinstance(one, dict)
    return one


def ours(c: Cassette) -> str:
    rid = c.call[kw("call/request")][kw("vllm/request-id")]
    assert isinstance(rid, str)
    return rid


def replay(c: Cassette, mode: str) -> Outcome:
    return replay_sync(c) if mode == "sync" else asyncio.run(replay_async(c))


def test_both_serving_layers_were_recorded_with_the_engine_faked() -> None:
    assert set(ENGINES) == {"vllm", "sglang"}, "record both: scripts/record-vllm / record-sglang --only fields"
    for engine, version in (("vllm", "0.33.0"), ("sglang", "0.5.23")):
        for c in SETS[engine].values():
            prov = {k.name: v for k, v in c.provenance.items()}
            assert c.how == "recorded" and c.engine == engine and version in prov["cassette/engine-version"], c.id
            assert prov["cassette/date"].startswith("20"), c.id
            faked = prov.get("cassette/simulated", "") + prov["cassette/source"]
            assert ("engine core only" if engine == "vllm" else "the scheduler process only") in faked, c.id
            if c.status >= 400:  # refused by the serving layer itself: nothing reached the engine
                assert c.engine_received == (), c.id
            else:
                assert c.engine_received, f"{c.id}: what the engine was handed is missing"


# ---------------------------------------------------------------- from EDN: the serving layer read each field


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("engine,name", FIELD_SETS)
def test_the_serving_layer_handed_the_engine_every_field(engine: str, name: str, mode: str) -> None:
    c = cassette(engine, name)
    out = replay(c, mode)
    assert out.error is None, out.error
    assert sent_json(out) == [request_json(c)]  # the EDN request renders the recorded body
    assert out.sent_headers[0].get("x-request-id") == ours(c)
    got, sp = received(c), received(c)["sampling_params"]
    assert got["priority"] == 5 and got["cache_salt"] == "salt-" + ours(c).removeprefix("kotoba-")
    assert sp["ignore_eos"] is True and sp["max_tokens" if engine == "vllm" else "max_new_tokens"] == 8
    assert sp["min_tokens" if engine == "vllm" else "min_new_tokens"] == 6
    assert {int(k): float(v) for k, v in sp["logit_bias"].items()} == {5: 10.0}
    if engine == "vllm":  # OpenAIServing* prefixes our id (completions add the prompt's index), AsyncLLM suffixes it
        external = f"chatcmpl-{ours(c)}" if name.startswith("chat") else f"cmpl-{ours(c)}-0"
        assert got["external_req_id"] == external and got["request_id"].startswith(external + "-")
    else:
        assert got["rid"] == ours(c)
    r = out.result
    assert r.request_id == ours(c)
    # ignore_eos: the engine's stop check (kept by the fake) ran to max_tokens
    assert r.usage.completion_tokens == 8 and r.finish_reason == "length"
    if engine == "vllm":  # --enable-request-id-headers: vLLM's answer names our id
        assert r.server_request_id == ours(c) and c.headers["x-request-id"] == ours(c)


# ---------------------------------------------------------------- from keyword arguments: the same wire


FIELD_KWARGS: dict[str, Any] = dict(min_tokens=6, ignore_eos=True, logit_bias={5: 10}, priority=5)


def _kwargs_call(c: Cassette) -> Callable[[Any], Any]:
    """The cassette's request made with keyword arguments (engine names), as a user writes it."""
    req = c.call[kw("call/request")]
    endpoint, stream = req[kw("vllm/endpoint")].name, bool(req.get(kw("vllm/stream")))
    args = dict(model="kotoba-tiny", temperature=0.0, max_tokens=8, request_id=ours(c), **FIELD_KWARGS,
                cache_salt=req[kw("vllm/cache-salt")])
    if endpoint == "chat":
        return lambda cl: (cl.stream_chat if stream else cl.chat)("Hello there, world.", **args)
    native = endpoint == "generate"
    return lambda cl: (cl.stream_completion if stream else cl.completion)("one, two, three, four, five",
                                                                          native=native, **args)


def _drain_sync(x: Any) -> Any:
    if hasattr(x, "until_done"):
        with x as s:
            return s.until_done()
    return x


async def _drain_async(x: Any) -> Any:
    x = await x
    if hasattr(x, "__aiter__"):
        async with x as s:
            async for _ in s:
                pass
        return s.response
    return x


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("engine,name", FIELD_SETS)
def test_keyword_arguments_send_what_the_serving_layer_read(engine: str, name: str, mode: str) -> None:
    c = cassette(engine, name)
    call = _kwargs_call(c)
    with respx.mock(assert_all_mocked=True) as router:
        route = router.route(method=c.method, url=BASE + c.path).mock(side_effect=lambda _: http_response(c))
        if mode == "sync":
            with httpx.Client() as http, Client(BASE, backend=engine, http_client=http) as client:
                r = _drain_sync(call(client))
        else:
            async def go() -> Any:
                async with httpx.AsyncClient() as http, AsyncClient(BASE, backend=engine, http_client=http) as cl:
                    return await _drain_async(call(cl))
            r = asyncio.run(go())
        [sent] = route.calls
    assert json.loads(sent.request.content) == request_json(c)
    assert sent.request.headers["x-request-id"] == ours(c)
    assert r.request_id == ours(c) and r.usage.completion_tokens == 8


# ---------------------------------------------------------------- chat_template_kwargs and extra_body


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("engine", ENGINES)
def test_chat_template_kwargs_reach_the_template(engine: str, mode: str) -> None:
    """`{:enable_thinking false}` makes both recording models' templates pre-fill an empty think span, so
    the serving layer's own rendering handed the engine a longer prompt for the same messages."""
    with_kwargs, without = cassette(engine, "chat-template-kwargs"), cassette(engine, "chat-template-kwargs-absent")
    assert request_json(with_kwargs)["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in request_json(without)
    assert received(with_kwargs)["prompt_tokens"] > received(without)["prompt_tokens"]
    a, b = replay(with_kwargs, mode), replay(without, mode)
    assert a.error is None and b.error is None
    assert a.result.usage.prompt_tokens == received(with_kwargs)["prompt_tokens"]
    assert a.result.usage.prompt_tokens > b.result.usage.prompt_tokens
    edn = with_kwargs.call[kw("call/request")][kw("vllm/chat-template-kwargs")]
    assert edn == {kw("enable_thinking"): False}  # written in EDN, sent as the engine names it


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("engine", ENGINES)
def test_extra_body_keys_reach_the_engine_unchecked(engine: str, mode: str) -> None:
    c = cassette(engine, "extra-body")
    out = replay(c, mode)
    assert out.error is None and sent_json(out) == [request_json(c)]
    sp = received(c)["sampling_params"]
    assert sp["min_tokens" if engine == "vllm" else "min_new_tokens"] == 5 and sp["ignore_eos"] is True
    assert out.result.usage.completion_tokens == 8  # ignore_eos: to max_tokens


def test_the_pass_through_warns_per_unchecked_key() -> None:
    from kotoba_vllm._requests import request_from_edn
    from kotoba_vllm._validate import validate
    for engine in ENGINES:
        req, problems = request_from_edn(cassette(engine, "extra-body").call[kw("call/request")])
        assert req is not None and not problems
        warns = [p for p in validate(req, engine) if p.severity == "warn"]
        assert [(w.code, w.field) for w in warns] == [("request/unchecked", "vllm/extra-body")] * 2, warns
        assert "'min_tokens'" in warns[0].msg and "'ignore_eos'" in warns[1].msg
