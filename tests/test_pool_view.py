"""The pool's shared capacity view: one probe round per interval shared by every request in
flight, the pool's own in-flight counts, the all-busy refusal within the staleness bound,
independent requests spread, conversations kept."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from typing import Any

import httpx
import pytest
import respx
from hypothesis import given, settings
from hypothesis import strategies as st

from faultserver import FaultServer, Seen, Sleep, Step, chat_answer, reply
from kotoba_vllm import AdmissionRejected, ChatRequest, Message
from kotoba_vllm.capacity import ALL_SLOTS_BUSY, SLOT_AVAILABLE, UNMEASURED, CapacityAnswer, merge_pool_capacity
from kotoba_vllm.capacity._verdict import PROBE_PATHS
from kotoba_vllm.capacity._view import CapacityView
from kotoba_vllm.pool import AsyncPool, Pool

A, B = "http://a.test:8080", "http://b.test:8080"
BUSY_SLOTS = json.dumps([{"id": 0, "n_ctx": 2048, "is_processing": True, "id_task": 7}])
IDLE_SLOTS = json.dumps([{"id": 0, "n_ctx": 2048, "is_processing": False}])
METRICS = ("# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing {p}\n"
           "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 0\n")
PROPS = json.dumps({"total_slots": 1, "default_generation_settings": {"n_ctx": 2048}})


def cap(**verdicts: str) -> Any:
    urls = {"a": A, "b": B}
    return merge_pool_capacity([CapacityAnswer(urls[k], v, v != UNMEASURED) for k, v in verdicts.items()])


def test_independent_requests_spread_by_in_flight_count() -> None:
    view = CapacityView([A, B])
    view.record(cap(a=UNMEASURED, b=UNMEASURED), started=0.0)
    picks = []
    for _ in range(6):
        adm = view.decide(view.snapshot, None)  # type: ignore[arg-type]
        assert adm.member is not None and adm.enforced is False
        view.begin(adm.member)
        picks.append(adm.member)
    assert picks == [A, B, A, B, A, B]
    view.end(A, 1.0)
    assert view.decide(view.snapshot, None).member == A  # type: ignore[arg-type]


def test_the_pools_take_counts_what_it_admits_so_the_next_request_goes_where_fewest_are_in_flight() -> None:
    # `take` is what a pool's send calls: decide and count in one call; a member still holding one of our
    # requests is passed over for one that finished its own, though both were sent as many
    view = CapacityView([A, B])
    view.record(cap(a=UNMEASURED, b=UNMEASURED), started=0.0)
    assert [view.take(view.snapshot, None).member for _ in range(2)] == [A, B]  # type: ignore[arg-type]
    assert view.inflight == {A: 1, B: 1} and view.sent == {A: 1, B: 1}
    view.end(B, 1.0)
    assert view.take(view.snapshot, None).member == B  # type: ignore[arg-type]
    assert view.inflight == {A: 1, B: 1} and view.sent == {A: 1, B: 2}


def test_one_at_a_time_still_alternates() -> None:
    view = CapacityView([A, B])
    view.record(cap(a=UNMEASURED, b=UNMEASURED), started=0.0)
    picks = []
    for i in range(4):
        member = view.decide(view.snapshot, None).member  # type: ignore[arg-type]
        assert member is not None
        view.begin(member), view.end(member, 1.0 + i)
        picks.append(member)
    assert picks == [A, B, A, B]


def test_free_members_share_by_in_flight_and_the_conversation_keeps_its_member() -> None:
    view = CapacityView([A, B])
    view.record(cap(a=SLOT_AVAILABLE, b=SLOT_AVAILABLE), started=0.0)
    view.begin(B), view.begin(B)
    assert view.decide(view.snapshot, None).member == A  # type: ignore[arg-type]
    adm = view.decide(view.snapshot, B)  # type: ignore[arg-type]
    assert adm.member == B and "affinity" in adm.why


def test_all_busy_is_refused_until_one_of_ours_finishes_or_the_view_is_stale() -> None:
    view = CapacityView([A, B], interval_s=0.5)
    view.record(cap(a=ALL_SLOTS_BUSY, b=ALL_SLOTS_BUSY), started=10.0)
    assert view.fresh(10.4) and view.decide(view.snapshot, None).member is None  # type: ignore[arg-type]
    view.end(B, 9.0)  # finished before the round started: the measurement already saw it
    assert view.decide(view.snapshot, None).member is None  # type: ignore[arg-type]
    view.end(B, 10.2)  # finished after: a slot we held is free again
    adm = view.decide(view.snapshot, None)  # type: ignore[arg-type]
    assert adm.member == B and adm.enforced
    assert not view.fresh(10.6)  # older than the bound: the next request takes a new round


def test_a_late_older_round_never_replaces_a_newer_one() -> None:
    view = CapacityView([A, B])
    view.record(cap(a=SLOT_AVAILABLE, b=SLOT_AVAILABLE), started=5.0)
    view.record(cap(a=ALL_SLOTS_BUSY, b=ALL_SLOTS_BUSY), started=4.0)
    assert view.snapshot is not None and view.snapshot.measured_available == 2 and view.started == 5.0


def test_the_same_request_again_is_independent_but_a_next_turn_is_not() -> None:
    from kotoba_vllm.capacity._affinity import Affinity

    aff = Affinity()
    first = ChatRequest(messages=(Message(role="user", content="hi"),))
    aff.remember(first, B)
    assert aff.lookup(first) is None  # a repeat spreads like any independent request
    nxt = ChatRequest(messages=first.messages + (Message(role="assistant", content="yo"),
                                                 Message(role="user", content="more")))
    assert aff.lookup(nxt) == B


def _members(m: respx.MockRouter, state: str) -> dict[str, respx.Route]:
    busy = state == "busy"
    routes = {}
    for base in (A, B):
        routes[base + "/slots"] = m.get(base + "/slots").respond(200, text=BUSY_SLOTS if busy else IDLE_SLOTS)
        m.get(base + "/metrics").respond(200, text=METRICS.format(p=int(busy)))
        m.get(base + "/props").respond(200, text=PROPS)
        routes[base] = m.post(base + "/v1/chat/completions").respond(200, json=chat_answer("hi"))
    return routes


def test_sync_pool_refuses_within_the_bound_without_probing_again() -> None:
    with respx.mock(assert_all_called=False) as m, Pool([A, B], backend="llamacpp", capacity_interval_s=30,
                                                           http_client=httpx.Client()) as pool:
        r = _members(m, "busy")
        for _ in range(3):
            with pytest.raises(AdmissionRejected) as err:
                pool.chat("hello")
            assert err.value.sent is False
        assert r[A + "/slots"].call_count == 1 and r[B + "/slots"].call_count == 1  # one round for all three
        assert r[A].call_count == 0 and r[B].call_count == 0  # nothing sent


def _member_script(delay: float) -> Any:
    def script(seen: Seen) -> list[Step]:
        if seen.method == "GET":
            return reply({"error": "not found"}, 404)  # vLLM's /metrics and /load off: unmeasured
        return [Sleep(delay), *reply(chat_answer("Hello"))]
    return script


def test_async_pool_shares_one_probe_round_and_spreads_unmeasured_members() -> None:
    n, conc = 120, 16

    async def go(urls: list[str]) -> list[Any]:
        async with AsyncPool(urls, backend="vllm", capacity_interval_s=60) as pool:
            sem = asyncio.Semaphore(conc)

            async def one(i: int) -> Any:
                async with sem:
                    return await pool.chat(f"independent {i}")
            out = await asyncio.gather(*(one(i) for i in range(n)))
            assert pool.view.rounds == 1
            return out

    with FaultServer(_member_script(0.01)) as a, FaultServer(_member_script(0.01)) as b:
        t = time.perf_counter()
        results = asyncio.run(asyncio.wait_for(go([a.base_url, b.base_url]), 60))
        assert time.perf_counter() - t < 60
        probes = sum(1 for s in a.seen + b.seen if s.method == "GET")
        posts = Counter(r.extras["pool/member"] for r in results)
    # one round (vLLM's probe paths of each member), shared by all 120 requests
    assert probes == 2 * len(PROBE_PATHS["vllm"])
    assert all(r.text == "Hello" and r.extras["capacity/enforced?"] is False for r in results)
    assert 0.4 <= posts[a.base_url] / n <= 0.6, posts


def test_requests_during_a_slow_round_read_the_previous_round_within_the_bound() -> None:
    def slow_probes(seen: Seen) -> list[Step]:
        if seen.method == "GET":
            return [Sleep(0.4), *reply({"error": "not found"}, 404)]  # unmeasured, slowly
        return reply(chat_answer("Hello"))

    async def go(urls: list[str]) -> tuple[float, int, int]:
        async with AsyncPool(urls, backend="vllm", capacity_interval_s=0.05, probe_timeout=1.0) as pool:
            await pool.chat("first")  # no round yet: it waits for one
            await asyncio.sleep(0.1)  # now older than the interval, well within interval + probe timeout
            t = time.perf_counter()
            r = await pool.chat("second")  # starts the next round and does not wait for it
            took = time.perf_counter() - t
            rounds_then = pool.view.rounds
            await asyncio.sleep(0.6)
            assert r.text == "Hello"
            return took, rounds_then, pool.view.rounds

    with FaultServer(slow_probes) as a, FaultServer(slow_probes) as b:
        took, rounds_then, rounds_after = asyncio.run(asyncio.wait_for(go([a.base_url, b.base_url]), 30))
    assert took < 0.3, took  # answered from the previous round, not after the 0.4 s probes
    assert rounds_then == 1 and rounds_after == 2  # the second round ran meanwhile and was recorded


def test_the_capacity_interval_comes_from_the_pool_file_and_the_run_flag_wins(tmp_path: Any) -> None:
    from kotoba_vllm.cli import main
    from kotoba_vllm.pool import load_pool_config

    reqs = tmp_path / "reqs.edn"
    reqs.write_text("".join(f'{{:vllm/endpoint :chat :vllm/messages [{{:vllm/role :user :vllm/content "q{i}"}}]}}\n'
                            for i in range(3)))
    with FaultServer(_member_script(0.0)) as a, FaultServer(_member_script(0.0)) as b:
        pool_file = tmp_path / "pool.edn"
        pool_file.write_text(f'{{:pool/members ["{a.base_url}" "{b.base_url}"] :pool/backend :vllm '
                             f':pool/capacity-interval-s 60}}')
        assert load_pool_config(str(pool_file)).capacity_interval_s == 60.0

        def probes_for(*flags: str) -> int:
            before = sum(1 for s in a.seen + b.seen if s.method == "GET")
            rc = main(["run", str(reqs), "--pool", str(pool_file), "--concurrency", "1", "--no-progress",
                       "--output", str(tmp_path / "out.edn"), *flags])
            assert rc == 0
            return sum(1 for s in a.seen + b.seen if s.method == "GET") - before
        one_round = 2 * len(PROBE_PATHS["vllm"])
        assert probes_for() == one_round  # 60 s from the file: one round for all three requests
        assert probes_for("--capacity-interval", "0") == 3 * one_round  # the flag wins: a round per request


@pytest.mark.parametrize("value", ["-1", "\"0.5\"", "true", "##NaN", "##Inf"])
def test_a_bad_capacity_interval_in_a_pool_file_names_the_file_and_the_key(tmp_path: Any, value: str) -> None:
    from kotoba_vllm.pool import load_pool_config

    p = tmp_path / "pool.edn"
    p.write_text(f'{{:pool/members ["http://a:8000"] :pool/capacity-interval-s {value}}}')
    with pytest.raises(ValueError, match=r"pool\.edn:1:1: :pool/capacity-interval-s must be a number of seconds"):
        load_pool_config(str(p))


def test_run_refuses_a_negative_capacity_interval(tmp_path: Any, capsys: Any) -> None:
    from kotoba_vllm.cli import main

    reqs = tmp_path / "reqs.edn"
    reqs.write_text('{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "q"}]}\n')
    assert main(["run", str(reqs), "--base-url", "http://a:1", "--base-url", "http://b:1",
                 "--capacity-interval", "-1"]) == 2
    assert "--capacity-interval must be a number of seconds >= 0" in capsys.readouterr().err


def test_a_completion_that_extends_an_earlier_prompt_goes_back_to_its_member() -> None:
    from kotoba_vllm import CompletionRequest
    from kotoba_vllm.capacity._affinity import PROMPT_BLOCK, Affinity

    aff = Affinity()
    doc = "".join(f"line {i}\n" for i in range(200))  # several 256-character blocks
    aff.remember(CompletionRequest(prompt=doc), B)
    aff.remember(CompletionRequest(prompt="short"), A)
    assert aff.lookup(CompletionRequest(prompt="short")) is None  # the same prompt again spreads
    assert aff.lookup(CompletionRequest(prompt=doc + "continue")) == B  # it extends the served prompt
    # a prompt sharing only the first whole blocks still finds the member holding those blocks
    assert aff.lookup(CompletionRequest(prompt=doc[:2 * PROMPT_BLOCK] + "a different ending")) == B
    assert aff.lookup(CompletionRequest(prompt="something else entirely " * 20)) is None
    assert aff.lookup(CompletionRequest(prompt=[1, 2, 3])) is None


def test_async_probes_go_over_the_callers_httpx_client_when_one_is_given() -> None:
    import httpx

    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url}")
        if request.method == "GET":
            return httpx.Response(404, json={"error": "not found"})
        return httpx.Response(200, json=chat_answer("Hello"))

    async def go() -> None:
        http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        async with AsyncPool([A, B], backend="vllm", http_client=http, capacity_interval_s=60) as pool:
            r = await pool.chat("hi")
            assert r.text == "Hello" and r.extras["capacity/enforced?"] is False
        assert not http.is_closed  # the caller's client is the caller's to close
        await http.aclose()

    asyncio.run(go())
    probes = [s for s in seen if s.startswith("GET")]
    assert sorted(probes) == sorted(f"GET {u}{p}" for u in (A, B) for p in PROBE_PATHS["vllm"])
    assert sum(s.startswith("POST") for s in seen) == 1


def test_async_probes_without_a_callers_client_go_over_aiohttp_and_reuse_their_connection() -> None:
    async def go(urls: list[str]) -> tuple[str, int]:
        async with AsyncPool(urls, backend="vllm", capacity_interval_s=0) as pool:
            for i in range(3):  # a round before every request: three rounds
                await pool.chat(f"q{i}")
            return pool.clients[urls[0]].transport, pool.view.rounds

    with FaultServer(_member_script(0.0)) as a, FaultServer(_member_script(0.0)) as b:
        transport, rounds = asyncio.run(asyncio.wait_for(go([a.base_url, b.base_url]), 30))
        probes = [s for s in a.seen + b.seen if s.method == "GET"]
        agents = {s.headers.get("user-agent", "") for s in probes}
        conns = {s.conn for s in a.seen if s.method == "GET"}
    assert transport == "aiohttp" and rounds == 3
    assert len(probes) == 3 * 2 * len(PROBE_PATHS["vllm"])
    assert all(a.startswith("kotoba-vllm") for a in agents), agents  # the pool's own headers
    assert len(conns) == 1  # kept alive between rounds


def test_sync_pool_probes_over_its_own_wire_with_the_key_and_keeps_the_connection() -> None:
    # like its members' requests, the sync pool's probes go over http.client (not httpx): a real
    # loopback server sees them, with the pool's key, one kept-alive connection for several rounds
    with FaultServer(_member_script(0.0)) as srv:
        with Pool([srv.base_url], backend="vllm", api_key="sk-probe", capacity_interval_s=0) as pool:
            for _ in range(3):
                pool.chat("hello")
        probes = [s for s in srv.seen if s.method == "GET"]
        assert [s.path for s in probes] == ["/metrics"] * 3  # one round before each request (interval 0)
        assert {s.headers.get("authorization") for s in probes} == {"Bearer sk-probe"}
        assert len({s.conn for s in probes}) == 1  # kept alive between rounds


MEMBERS = ("http://m0.test:8080", "http://m1.test:8080", "http://m2.test:8080/")
STATES = (SLOT_AVAILABLE, ALL_SLOTS_BUSY, "unmeasured-reachable", "unmeasured-closed", "no answer")


def answer(member: str, state: str) -> CapacityAnswer | None:
    if state == "no answer":
        return None
    if state.startswith("unmeasured"):
        return CapacityAnswer(member, UNMEASURED, False, reachable=state.endswith("reachable"))
    return CapacityAnswer(member, state, True)


AMONG = (None, (MEMBERS[0],), (MEMBERS[2],), (MEMBERS[1], MEMBERS[2]), (MEMBERS[2], MEMBERS[0]), MEMBERS)


@given(states=st.lists(st.sampled_from(STATES), min_size=3, max_size=3),
       steps=st.lists(st.tuples(st.sampled_from(("take", "end")), st.integers(0, 2),
                                st.sampled_from((None, *MEMBERS)), st.sampled_from(AMONG)), max_size=12))
@settings(max_examples=300, deadline=None)
def test_the_views_decision_is_admit_in_order_at_every_step(states: list[str], steps: list[Any]) -> None:
    """The view's per-round shortcut (candidates read once, admissions made once, also among some members
    only) decides exactly as the general rule does for the same round, counts and freed members, with and
    without a conversation; and `admits` says whether that decision would choose a member."""
    from kotoba_vllm.capacity._verdict import admit_in_order, answers_by_endpoint, demote_busy_endpoints
    answers = [a for m, s in zip(MEMBERS, states) if (a := answer(m, s)) is not None]
    round_ = merge_pool_capacity(answers)
    view = CapacityView(MEMBERS)
    view.record(round_, started=0.0)
    by = answers_by_endpoint(round_.members)
    for now, (op, i, affinity, among) in enumerate(steps, 1):
        if op == "end":
            view.end(MEMBERS[i], float(now))
            continue
        freed = {m.rstrip("/") for m in view.freed()}
        order = [m for m in demote_busy_endpoints(MEMBERS, by) if among is None or m in among]
        want = admit_in_order(order, by, affinity, inflight=dict(view.inflight), freed=freed, sent=dict(view.sent))
        no_conversation = admit_in_order(order, by, None, inflight=dict(view.inflight), freed=freed,
                                         sent=dict(view.sent))
        assert view.admits(round_, MEMBERS if among is None else among) is (no_conversation.member is not None)
        assert view.take(round_, affinity, among) == want
