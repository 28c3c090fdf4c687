"""The cheaper per-chunk pieces of a stream (sixth round) answer exactly what the plain code did."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from kotoba_vllm._base_client import SseDecoder
from kotoba_vllm._model import StreamDelta, stream_delta, to_edn
from kotoba_vllm._timings import gaps_ms


def reference_gaps(times: list[float]) -> tuple[float, ...]:
    return tuple(round((b - a) * 1000.0, 3) for a, b in zip(times, times[1:]))


INSTANT = st.floats(0, 1e7, allow_nan=False, allow_infinity=False)
# gaps of a whole number of microseconds plus about half of one: where a shortcut would round the wrong way
NEAR_HALF = st.tuples(st.integers(0, 10**9), st.sampled_from([0.4999999, 0.5, 0.5000001, 0.49, 0.51, 0.0]))


@settings(max_examples=500, deadline=None)
@given(st.lists(INSTANT, max_size=20), st.lists(NEAR_HALF, max_size=20), st.floats(0, 1e6))
def test_inter_token_gaps_are_rounded_exactly_as_round_does(instants, near_half, start) -> None:
    times = sorted(instants)
    assert gaps_ms(times) == reference_gaps(times)
    t, stamped = start, [start]
    for us, frac in near_half:
        t += (us + frac) / 1e6
        stamped.append(t)
    got, want = gaps_ms(stamped), reference_gaps(stamped)
    assert got == want and [x.hex() for x in got] == [x.hex() for x in want]


def test_inter_token_gaps_of_chunks_read_together_are_zero() -> None:
    assert gaps_ms([1.5, 1.5, 1.5, 1.5000123456]) == (0.0, 0.0, 0.012)
    assert gaps_ms([]) == gaps_ms([2.0]) == ()


FIELD = st.one_of(st.none(), st.text(max_size=5), st.integers(-2, 2**70))


@given(st.text(), st.one_of(st.none(), st.text()), st.one_of(st.none(), st.integers()), FIELD, FIELD, FIELD)
def test_stream_delta_builds_the_same_value_as_the_class(delta, finish, index, reasoning, tools, logprobs) -> None:
    fast = stream_delta(delta, finish, index, reasoning, tools, logprobs)
    plain = StreamDelta(delta=delta, finish_reason=finish, index=index, reasoning=reasoning, tool_calls=tools,
                        logprobs=logprobs)
    assert type(fast) is StreamDelta
    assert fast == plain and hash(fast) == hash(plain) and repr(fast) == repr(plain)
    assert attrs.asdict(fast) == attrs.asdict(plain)
    assert to_edn(fast) == to_edn(plain)
    assert stream_delta("a", None, 0) == StreamDelta(delta="a", index=0)
    # still frozen
    try:
        fast.delta = "x"  # type: ignore[misc]
    except attrs.exceptions.FrozenInstanceError:
        pass
    else:  # pragma: no cover
        raise AssertionError("a StreamDelta must stay frozen")


def test_one_line_events_and_the_rest_mixed_in_one_read() -> None:
    dec = SseDecoder()
    raw = (b"data: a\n\nevent: error\ndata: b\n\ndata: c\ndata: d\n\n: note\ndata: e\n\ndata: \n\n"
           b"data:f\n\ndata: g\n")
    assert dec.feed(raw) == [(None, "a"), ("error", "b"), (None, "c\nd"), (None, "e"), (None, ""), (None, "f")]
    assert dec.feed(b"\ndata: h\n\n") == [(None, "g"), (None, "h")]
