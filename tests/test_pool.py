"""`Pool` / `AsyncPool` against mocked members (respx): early refusal sends nothing,
unmeasured is admitted but not enforced, a 429 is surfaced (never retried elsewhere),
conversations stay on their member. Tests that change a member's state between calls probe
before every request (`capacity_interval_s=0`); the shared view is tested in test_pool_view.py."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import respx

from kotoba_vllm import AdmissionRejected, ChatRequest, Message, dumps, kw
from kotoba_vllm.pool import AsyncPool, Pool, load_pool_config, pool_config_from_edn

A, B = "http://a.test:8080", "http://b.test:8080"
CHAT = "/v1/chat/completions"
EVERY = {"backend": "llamacpp", "capacity_interval_s": 0}  # probe before every request: state changes between calls
IDLE_SLOTS = json.dumps([{"id": 0, "n_ctx": 2048, "speculative": False, "is_processing": False}])
BUSY_SLOTS = json.dumps([{"id": 0, "n_ctx": 2048, "speculative": False, "is_processing": True, "id_task": 7}])
METRICS = ("# HELP llamacpp:requests_processing Number of requests processing\n"
           "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing {p}\n"
           "# HELP llamacpp:requests_deferred Number of requests deferred\n"
           "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 0\n")
PROPS = json.dumps({"total_slots": 1, "default_generation_settings": {"n_ctx": 2048}})


def reply(text: str = "hi") -> dict[str, object]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "tiny",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}


def member(m: respx.MockRouter, base: str, state: str) -> respx.Route:
    """Mock one llama.cpp member: state "idle", "busy", "down" (connection refused) or
    "no-slots" (started without --slots or --metrics: HTTP 501). Returns its POST route."""
    if state == "down":
        for p in ("/slots", "/metrics", "/props"):
            m.get(base + p).mock(side_effect=httpx.ConnectError("[Errno 111] Connection refused"))
    elif state == "no-slots":
        for p in ("/slots", "/metrics"):
            m.get(base + p).respond(501, json={"error": {"code": 501, "message": "not supported"}})
        m.get(base + "/props").respond(200, text=PROPS)
    else:
        busy = state == "busy"
        m.get(base + "/slots").respond(200, text=BUSY_SLOTS if busy else IDLE_SLOTS)
        m.get(base + "/metrics").respond(200, text=METRICS.format(p=int(busy)))
        m.get(base + "/props").respond(200, text=PROPS)
    return m.post(base + CHAT).respond(200, json=reply(f"from {base}"))


def turn(*texts: str) -> ChatRequest:
    roles = ["user", "assistant"]
    return ChatRequest(messages=tuple(Message(role=roles[i % 2], content=t) for i, t in enumerate(texts)))


def test_all_members_busy_raises_before_sending_anything() -> None:
    with respx.mock(assert_all_called=False) as m, Pool([A, B], **EVERY, http_client=httpx.Client()) as pool:
        posts = [member(m, A, "busy"), member(m, B, "busy")]
        with pytest.raises(AdmissionRejected) as err:
            pool.chat("hello", request_id="busy-1")
        assert [p.call_count for p in posts] == [0, 0]
    e = err.value
    assert e.reason == "all-slots-busy" and e.sent is False and e.status is None
    text = dumps(e.to_edn())
    assert ":vllm/error :admission-rejected" in text and ":vllm/sent? false" in text
    # whose request it was; no engine dialect is named, since none sent it
    assert ':vllm/request-id "busy-1"' in text and ":vllm/backend" not in text
    assert ":capacity/measured-busy 2" in text and ":capacity/verdict :all-slots-busy" in text


def test_busy_leader_is_skipped_and_the_answer_names_its_member() -> None:
    with respx.mock(assert_all_called=False) as m, Pool([A, B], **EVERY, http_client=httpx.Client()) as pool:
        post_a, post_b = member(m, A, "busy"), member(m, B, "idle")
        r = pool.chat("hello")
    assert (post_a.call_count, post_b.call_count) == (0, 1)
    assert r.text == f"from {B}" and r.endpoint_url == B + CHAT
    assert r.extras["pool/member"] == B and r.extras["capacity/enforced?"] is True
    assert r.extras["capacity/verdict"] == kw("slot-available")
    assert pool.last_capacity is not None and pool.last_capacity.measured_busy == 1


def test_unmeasured_pool_admits_and_says_not_enforced() -> None:
    with respx.mock(assert_all_called=False) as m, Pool([A, B], **EVERY, http_client=httpx.Client()) as pool:
        post_a, post_b = member(m, A, "no-slots"), member(m, B, "busy")
        r = pool.chat("hello")
    assert (post_a.call_count, post_b.call_count) == (1, 0)
    assert r.extras["capacity/enforced?"] is False and r.extras["pool/member"] == A
    assert r.extras["capacity/verdict"] == kw("capacity-unmeasured")


def test_measured_free_member_wins_over_an_unreachable_leader() -> None:
    with respx.mock(assert_all_called=False) as m, Pool([A, B], **EVERY, http_client=httpx.Client()) as pool:
        post_a, post_b = member(m, A, "down"), member(m, B, "idle")
        r = pool.chat("hello")
        cap = pool.last_capacity
    assert (post_a.call_count, post_b.call_count) == (0, 1) and r.extras["capacity/enforced?"] is True
    assert cap is not None and (cap.measured_available, cap.unmeasured) == (1, 1)


def test_429_from_the_chosen_member_is_surfaced_not_retried_elsewhere() -> None:
    with respx.mock(assert_all_called=False) as m, Pool([A, B], **EVERY, http_client=httpx.Client()) as pool:
        member(m, A, "idle")
        post_b = member(m, B, "idle")
        post_a = m.post(A + CHAT).respond(429, headers={"retry-after": "3"},
                                          json={"error": {"code": 429, "message": "slots full"}})
        with pytest.raises(AdmissionRejected) as err:
            pool.chat("hello")
    assert (post_a.call_count, post_b.call_count) == (1, 0)
    e = err.value
    assert e.sent is True and e.status == 429 and e.retry_after_s == 3 and e.endpoint == A + CHAT
    assert e.capacity is not None  # the pool's view at the time rides along


def test_second_turn_returns_to_the_member_that_served_the_first() -> None:
    with respx.mock(assert_all_called=False) as m, Pool([A, B], **EVERY, http_client=httpx.Client()) as pool:
        member(m, A, "busy")
        post_b = member(m, B, "idle")
        first = pool.send(turn("my name is Ada"))
        assert first.extras["pool/member"] == B
        m.routes.clear()
        post_a, post_b = member(m, A, "idle"), member(m, B, "idle")
        # without affinity the idle leader A would get it; the prefix says B served this conversation
        second = pool.send(turn("my name is Ada", first.text or "", "what is my name?"))
        assert second.extras["pool/member"] == B and "affinity" in second.extras["pool/why"]
        assert (post_a.call_count, post_b.call_count) == (0, 1)
        other = pool.send(turn("an unrelated conversation"))
        assert other.extras["pool/member"] == A


def test_explicit_conversation_key_and_moving_off_a_busy_member() -> None:
    with respx.mock(assert_all_called=False) as m, Pool([A, B], **EVERY, http_client=httpx.Client()) as pool:
        member(m, A, "busy"), member(m, B, "idle")
        assert pool.chat("x", conversation="c-1").extras["pool/member"] == B
        m.routes.clear()
        member(m, A, "idle"), member(m, B, "idle")
        assert pool.chat("different text", conversation="c-1").extras["pool/member"] == B
        m.routes.clear()
        member(m, A, "idle"), member(m, B, "busy")
        moved = pool.chat("third", conversation="c-1")
        assert moved.extras["pool/member"] == A and "moved off" in moved.extras["pool/why"]


def test_a_request_base_url_cannot_bypass_admission() -> None:
    req = ChatRequest(messages=(Message(role="user", content="hi"),), base_url="http://elsewhere:1")
    with respx.mock(assert_all_called=False) as m, Pool([A, B], **EVERY, http_client=httpx.Client()) as pool:
        member(m, A, "busy"), member(m, B, "busy")
        with pytest.raises(AdmissionRejected):
            pool.send(req)


def test_pool_stream_names_member_and_keeps_affinity() -> None:
    sse = ('data: {"choices":[{"index":0,"delta":{"content":"he"},"finish_reason":null}]}\n\n'
           'data: {"choices":[{"index":0,"delta":{"content":"y"},"finish_reason":"stop"}]}\n\n'
           'data: [DONE]\n\n')
    with respx.mock(assert_all_called=False) as m, Pool([A, B], **EVERY, http_client=httpx.Client()) as pool:
        member(m, A, "busy"), member(m, B, "idle")
        m.post(B + CHAT).respond(200, text=sse, headers={"content-type": "text/event-stream"})
        with pool.stream(turn("stream me")) as s:
            text = "".join(d.delta for d in s)
        assert text == "hey" and s.member == B
        assert s.response.extras["pool/member"] == B and s.response.text == "hey"
        assert pool.affinity.lookup(turn("stream me", "hey", "more")) == B


def test_edn_request_map_goes_through_the_pool() -> None:
    req = {kw("vllm/endpoint"): kw("chat"),
           kw("vllm/messages"): [{kw("vllm/role"): kw("user"), kw("vllm/content"): "hi"}]}
    with respx.mock(assert_all_called=False) as m, Pool([A], backend="llamacpp", http_client=httpx.Client()) as pool:
        member(m, A, "idle")
        assert pool.send(req).extras["pool/member"] == A


async def test_async_pool_refuses_when_all_busy_and_routes_otherwise() -> None:
    async with AsyncPool([A, B], **EVERY, http_client=httpx.AsyncClient()) as pool:
        with respx.mock(assert_all_called=False) as m:
            posts = [member(m, A, "busy"), member(m, B, "busy")]
            with pytest.raises(AdmissionRejected) as err:
                await pool.chat("hello")
            assert err.value.sent is False and [p.call_count for p in posts] == [0, 0]
        with respx.mock(assert_all_called=False) as m:
            member(m, A, "down"), member(m, B, "no-slots")
            r = await pool.chat("hello")
            assert r.extras["pool/member"] == B and r.extras["capacity/enforced?"] is False
            cap = await pool.capacity()
            assert (cap.measured_available, cap.measured_busy, cap.unmeasured) == (0, 0, 2)


async def test_async_pool_conversation_affinity() -> None:
    async with AsyncPool([A, B], **EVERY, http_client=httpx.AsyncClient()) as pool:
        with respx.mock(assert_all_called=False) as m:
            member(m, A, "busy"), member(m, B, "idle")
            assert (await pool.send(turn("t1"), conversation="z")).extras["pool/member"] == B
        with respx.mock(assert_all_called=False) as m:
            member(m, A, "idle"), member(m, B, "idle")
            assert (await pool.send(turn("t1", "x", "t2"))).extras["pool/member"] == B


def test_auto_backend_is_detected_once_by_the_probe() -> None:
    with respx.mock(assert_all_called=False) as m, Pool([A], backend="auto", http_client=httpx.Client()) as pool:
        props = m.get(A + "/props").respond(200, text=PROPS)
        m.get(A + "/slots").respond(200, text=IDLE_SLOTS)
        m.get(A + "/metrics").respond(200, text=METRICS.format(p=0))
        for p in ("/server_info", "/get_server_info", "/version"):
            m.get(A + p).respond(404)
        m.post(A + CHAT).respond(200, json=reply())
        pool.chat("one")
        pool.chat("two")
        # detection (1) + one capacity round shared by both requests (1); the member client never re-detects
        assert props.call_count == 2
        assert pool.clients[A].backend == "llamacpp" or pool.clients[A]._detected[A] == "llamacpp"


def test_pool_config_from_edn_and_the_example_file() -> None:
    cfg = load_pool_config(str(Path(__file__).parent.parent / "examples" / "pool.edn"))
    assert len(cfg.members) >= 2 and cfg.backend == "llamacpp"
    with pytest.raises(ValueError, match="pool/members"):
        pool_config_from_edn({kw("pool/members"): []})
    with pytest.raises(ValueError, match="unknown key"):
        pool_config_from_edn({kw("pool/members"): [A], kw("pool/api-key"): "secret"})
    with pytest.raises(ValueError, match="duplicate"):
        Pool([A, A + "/v1"])
