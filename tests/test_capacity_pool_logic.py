"""merge-pool-capacity, demote-busy-endpoints and the admission choice: pure, property-tested."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kotoba_vllm.capacity import (ALL_SLOTS_BUSY, SLOT_AVAILABLE, UNMEASURED, CapacityAnswer, Slots, admit,
                                  demote_busy_endpoints, merge_pool_capacity, unmeasured)


def answer(url: str, verdict: str) -> CapacityAnswer:
    if verdict == UNMEASURED:
        return unmeasured(url, "llamacpp", "connection refused")
    busy = verdict == ALL_SLOTS_BUSY
    return CapacityAnswer(endpoint=url, verdict=verdict, enforced=True, backend="llamacpp",
                          slots=Slots(total=1, busy=int(busy), idle=int(not busy)))


verdicts = st.sampled_from([SLOT_AVAILABLE, ALL_SLOTS_BUSY, UNMEASURED])
pools = st.lists(verdicts, max_size=8).map(
    lambda vs: [answer(f"http://h{i}:8080", v) for i, v in enumerate(vs)])


@given(pools)
def test_demote_is_a_stable_partition_and_never_reorders_the_rest(members: list[CapacityAnswer]) -> None:
    urls = [a.endpoint for a in members]
    out = demote_busy_endpoints(urls, members)
    busy = {a.endpoint for a in members if a.verdict == ALL_SLOTS_BUSY}
    assert sorted(out) == sorted(urls)
    assert [u for u in out if u not in busy] == [u for u in urls if u not in busy]
    assert [u for u in out if u in busy] == [u for u in urls if u in busy]
    assert out == [u for u in urls if u not in busy] + [u for u in urls if u in busy]
    if not busy:
        assert out == urls  # nothing measured busy: the leader stays the leader


@given(pools)
def test_demote_accepts_a_mapping_and_members_without_answers_stay_put(members: list[CapacityAnswer]) -> None:
    urls = [a.endpoint for a in members] + ["http://new:8080"]
    out = demote_busy_endpoints(urls, {a.endpoint: a for a in members})
    assert out.index("http://new:8080") <= len([a for a in members if a.verdict != ALL_SLOTS_BUSY])


def test_demote_example_keeps_leader_behind_only_when_busy() -> None:
    a, b, c = "http://a", "http://b", "http://c"
    ans = [answer(a, ALL_SLOTS_BUSY), answer(b, UNMEASURED), answer(c, SLOT_AVAILABLE)]
    assert demote_busy_endpoints([a, b, c], ans) == [b, c, a]
    assert demote_busy_endpoints([c, b, a], ans) == [c, b, a]


@given(pools)
def test_merge_counts_are_kept_apart(members: list[CapacityAnswer]) -> None:
    pool = merge_pool_capacity(members)
    n_av = sum(a.verdict == SLOT_AVAILABLE for a in members)
    n_busy = sum(a.verdict == ALL_SLOTS_BUSY for a in members)
    n_un = sum(a.verdict == UNMEASURED for a in members)
    assert (pool.measured_available, pool.measured_busy, pool.unmeasured) == (n_av, n_busy, n_un)
    assert pool.members == tuple(members)
    if n_av:
        assert pool.verdict == SLOT_AVAILABLE
    elif n_un or not members:
        assert pool.verdict == UNMEASURED  # never "available" on the strength of an unmeasured member
    else:
        assert pool.verdict == ALL_SLOTS_BUSY
    assert pool.enforced == (bool(members) and n_un == 0)


def test_unmeasured_members_are_not_empty_capacity() -> None:
    """The seed's bug: one head refused the connection, was read as room, 8 requests queued."""
    pool = merge_pool_capacity([answer("http://a", ALL_SLOTS_BUSY), answer("http://b", UNMEASURED)])
    assert pool.verdict == UNMEASURED and pool.measured_available == 0 and pool.unmeasured == 1
    assert not pool.enforced


@given(pools, st.none() | st.integers(0, 8))
def test_admit_never_picks_a_busy_member_and_refuses_only_when_all_are_busy(
        members: list[CapacityAnswer], aff_index: int | None) -> None:
    urls = [a.endpoint for a in members]
    aff = urls[aff_index] if aff_index is not None and aff_index < len(urls) else None
    adm = admit(urls, members, aff)
    by = {a.endpoint: a for a in members}
    if members and all(a.verdict == ALL_SLOTS_BUSY for a in members):
        assert adm.member is None
        return
    if not members:
        return
    assert adm.member is not None and by[adm.member].verdict != ALL_SLOTS_BUSY
    available = [u for u in urls if by[u].verdict == SLOT_AVAILABLE]
    if aff is not None and by[aff].verdict == SLOT_AVAILABLE:
        assert adm.member == aff and adm.enforced
    elif available:
        assert adm.member == available[0] and adm.enforced
    else:
        assert by[adm.member].verdict == UNMEASURED and not adm.enforced


def test_admit_moves_a_conversation_off_a_busy_member_and_says_why() -> None:
    a, b = "http://a", "http://b"
    adm = admit([a, b], [answer(a, ALL_SLOTS_BUSY), answer(b, SLOT_AVAILABLE)], affinity=a)
    assert adm.member == b and "moved off http://a" in adm.why


@given(pools, st.none() | st.integers(0, 8), st.lists(st.integers(0, 3), min_size=8, max_size=8),
       st.lists(st.booleans(), min_size=8, max_size=8))
def test_the_views_decision_is_admits_for_the_same_round_in_flight_and_freed_members(
        members: list[CapacityAnswer], aff_index: int | None, loads: list[int], finished: list[bool]) -> None:
    from kotoba_vllm.capacity._view import CapacityView

    urls = [a.endpoint for a in members]
    aff = urls[aff_index] if aff_index is not None and aff_index < len(urls) else None
    view = CapacityView(urls)
    snapshot = merge_pool_capacity(members)
    view.record(snapshot, started=10.0)
    for u, n, done in zip(urls, loads, finished):
        for _ in range(n):
            view.begin(u)
        if done:
            view.end(u, now=11.0)  # finished one of ours after the round started: a freed slot
    for _ in range(2):  # the second decision reads the round the view already sorted
        expected = admit(urls, members, aff, inflight=view.inflight, freed=view.freed(), sent=view.sent)
        assert view.decide(snapshot, aff) == expected


def _answer_with_reach(url: str, verdict: str, reached: bool) -> CapacityAnswer:
    if verdict == UNMEASURED:  # a closed port (reached false) or an HTTP answer it could not read
        return unmeasured(url, "vllm", "404" if reached else "connection refused", reachable=reached)
    return answer(url, verdict)


@given(st.lists(st.tuples(verdicts, st.booleans()), min_size=1, max_size=6),
       st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["send", "finish", "finish-late"])), max_size=30))
def test_every_decision_in_a_stream_of_sends_and_finishes_is_admits(
        states: list[tuple[str, bool]], steps: list[tuple[int, str]]) -> None:
    """The view's counts and its per-round reading give the same member and reason as `admit`
    given the same counts, request after request (closed ports and freed slots included)."""
    from kotoba_vllm.capacity._view import CapacityView

    members = [_answer_with_reach(f"http://h{i}:8080", v, r) for i, (v, r) in enumerate(states)]
    urls = [a.endpoint for a in members]
    view = CapacityView(urls)
    snapshot = merge_pool_capacity(members)
    view.record(snapshot, started=10.0)
    for i, what in steps:
        u = urls[i % len(urls)]
        if what == "send":
            adm = view.decide(snapshot, None)
            assert adm == admit(urls, members, None, inflight=view.inflight, freed=view.freed(), sent=view.sent)
            if adm.member is not None:
                view.begin(adm.member)
        elif view.inflight[u]:
            view.end(u, now=11.0 if what == "finish-late" else 9.0)
    assert all(n >= 0 for n in view.inflight.values())


@given(st.lists(st.text(max_size=6), min_size=1, max_size=5))
def test_a_chat_goes_to_the_member_of_its_longest_earlier_turn_never_of_itself(texts: list[str]) -> None:
    from kotoba_vllm import ChatRequest, Message
    from kotoba_vllm.capacity._affinity import Affinity

    def chat(n: int) -> ChatRequest:
        return ChatRequest(messages=tuple(Message(role="user", content=t) for t in texts[:n]))
    aff = Affinity()
    for n in range(len(texts), 0, -1):  # the turn of n messages was served by member m<n>
        aff.remember(chat(n), f"m{n}")
    whole = len(texts)
    assert aff.lookup(chat(whole)) == (f"m{whole - 1}" if whole >= 2 else None)
