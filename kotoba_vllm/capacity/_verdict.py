"""Pure verdicts: fetched probe answers in, a `CapacityAnswer` out; pool merge, demotion
and the admission choice. No I/O, no clock (the shell passes `at`).

The rules come from the seed's router:
- unreachable, timed out, HTTP error or unparsable -> :capacity-unmeasured with the
  reason, and no numbers (an unmeasured member is never an empty one);
- merge asks every member and keeps measured-available, measured-busy and unmeasured
  apart;
- demotion moves measured-busy members behind and leaves every other member where it
  was (re-ordering splits llama.cpp's prefix cache).
"""

from __future__ import annotations

from typing import Callable, Collection, Iterable, Mapping, Sequence

import attrs

from .._errors import BadNumber, Unparsable
from ._answer import (ALL_SLOTS_BUSY, SLOT_AVAILABLE, UNMEASURED, CapacityAnswer, Evidence, PoolCapacity, Queue,
                      Slots)
from ._parse import (Fetched, MetricSum, count, failure, llamacpp_slots, llamacpp_total_slots,
                     prometheus, sglang_max_running, vllm_load)

# Which paths each engine's probe asks, all at once. Table as data: adding an engine is a
# row here and a verdict function below.
PROBE_PATHS: dict[str, tuple[str, ...]] = {
    "llamacpp": ("/slots", "/metrics", "/props"),
    "vllm": ("/metrics",),
    "sglang": ("/metrics", "/server_info", "/get_server_info"),
    "openai": (),
}
# vLLM's `/load` answers {"server_load": 0} whenever --enable-server-load-tracking is off (the
# default): a reader cannot tell "off" from "idle". It is asked, and its number kept, only when
# the user declares the server tracks load.
VLLM_LOAD = "/load"


def probe_paths(backend: str, load_tracked: bool = False) -> tuple[str, ...]:
    """The paths one member's probe asks; `/load` only for a vLLM declared to track load."""
    paths = PROBE_PATHS.get(backend, ())
    return paths + (VLLM_LOAD,) if load_tracked and backend == "vllm" else paths

LLAMACPP_PROCESSING = "llamacpp:requests_processing"
LLAMACPP_DEFERRED = "llamacpp:requests_deferred"
VLLM_RUNNING = "vllm:num_requests_running"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # current, then pre-V1 name
SGLANG_RUNNING = "sglang:num_running_reqs"
SGLANG_QUEUE = "sglang:num_queue_reqs"
SGLANG_TOKEN_USAGE = "sglang:token_usage"


def unmeasured(endpoint: str, backend: str | None, reason: str, *, at: str | None = None,
               probes: Sequence[str] = (), reachable: bool | None = None) -> CapacityAnswer:
    return CapacityAnswer(endpoint=endpoint, backend=backend, verdict=UNMEASURED, enforced=False,
                          evidence=Evidence(probes=tuple(probes) or None, at=at), reason=reason,
                          reachable=reachable)


def _series_note(sums: Iterable[MetricSum]) -> tuple[int | None, str | None]:
    most = max((s.series for s in sums), default=0)
    if most > 1:
        return most, f"summed over {most} label sets (several models/engines behind one /metrics)"
    return (most or None), None


def _read(got: Mapping[str, Fetched], path: str, reasons: list[str]) -> Fetched | None:
    f = got.get(path)
    if f is None:
        reasons.append(f"GET {path}: not asked")
        return None
    why = failure(f)
    if why is not None:
        reasons.append(why)
        return None
    return f


def _metrics(got: Mapping[str, Fetched], names: Sequence[str], reasons: list[str]) -> dict[str, MetricSum] | None:
    f = _read(got, "/metrics", reasons)
    if f is None:
        return None
    try:
        return prometheus(f, names)
    except BadNumber:
        raise  # not a missing reading: a wrong one, and the member is unmeasured (see capacity_answer)
    except Unparsable as e:
        reasons.append(str(e))
        return None


def _need(sums: Mapping[str, MetricSum], names: Sequence[str], reasons: list[str]) -> bool:
    missing = [n for n in names if n not in sums]
    if missing:
        reasons.append(f"GET /metrics: no {', '.join(missing)}")
    return not missing


def llamacpp_verdict(endpoint: str, got: Mapping[str, Fetched], at: str | None) -> CapacityAnswer:
    """`/slots` is the reading (busy = `is_processing`); `/metrics` adds requests already
    deferred (a waiting queue means no slot is free for us); without `/slots` (started
    without `--slots`: HTTP 501) `/props` total_slots and `/metrics` requests_processing
    stand in. Anything less is unmeasured."""
    reasons: list[str] = []
    probes = tuple(got)
    sums = _metrics(got, (LLAMACPP_PROCESSING, LLAMACPP_DEFERRED), reasons)
    deferred = count(LLAMACPP_DEFERRED, sums[LLAMACPP_DEFERRED]) if sums and LLAMACPP_DEFERRED in sums else None
    total = busy = None
    probe: Fetched | None = None
    note = None
    slots_f = _read(got, "/slots", reasons)
    if slots_f is not None:
        try:
            total, busy = llamacpp_slots(slots_f)
            probe = slots_f
        except Unparsable as e:
            reasons.append(str(e))
    if total is None:
        props_f = _read(got, "/props", reasons)
        if props_f is not None and sums is not None and _need(sums, (LLAMACPP_PROCESSING,), reasons):
            try:
                total = llamacpp_total_slots(props_f)
                busy = min(count(LLAMACPP_PROCESSING, sums[LLAMACPP_PROCESSING]), total)
                probe = got["/metrics"]
                note = "no /slots: total from /props total_slots, busy from /metrics requests_processing"
            except Unparsable as e:
                reasons.append(str(e))
    if total is None or busy is None or probe is None:
        return unmeasured(endpoint, "llamacpp", "; ".join(reasons), at=at, probes=probes)
    idle = total - busy
    full = idle == 0 or bool(deferred)
    series = sums[LLAMACPP_DEFERRED].series if sums and LLAMACPP_DEFERRED in sums else None
    if deferred and idle:
        note = (note + "; " if note else "") + f"{deferred} request(s) deferred: queued although a slot reads idle"
    return CapacityAnswer(endpoint=endpoint, backend="llamacpp", verdict=ALL_SLOTS_BUSY if full else SLOT_AVAILABLE,
                          enforced=True, slots=Slots(total=total, busy=busy, idle=idle, deferred=deferred),
                          evidence=Evidence(probe=probe.path, probes=probes, at=at, ms=probe.ms,
                                            series=series, note=note))


def vllm_verdict(endpoint: str, got: Mapping[str, Fetched], at: str | None) -> CapacityAnswer:
    """Continuous batching: a request waiting in the scheduler queue means a new one
    waits too -> busy. Running requests alone are not busy."""
    reasons: list[str] = []
    probes = tuple(got)
    sums = _metrics(got, (VLLM_RUNNING, VLLM_WAITING, *VLLM_KV), reasons)
    if sums is None or not _need(sums, (VLLM_RUNNING, VLLM_WAITING), reasons):
        return unmeasured(endpoint, "vllm", "; ".join(reasons), at=at, probes=probes)
    kv = next((sums[n] for n in VLLM_KV if n in sums), None)
    load, note = None, None
    load_f = got.get(VLLM_LOAD)
    if load_f is not None:  # asked only when the user declared --enable-server-load-tracking
        try:
            why = failure(load_f)
            if why is not None:
                raise Unparsable(why)
            load = vllm_load(load_f)
        except Unparsable as e:
            note = f"server load declared tracked, but unread: {e}"  # the metrics already decided
    running, waiting = count(VLLM_RUNNING, sums[VLLM_RUNNING]), count(VLLM_WAITING, sums[VLLM_WAITING])
    kv_usage = None
    if kv is not None:
        kv_usage = kv.value / kv.series  # a fraction per engine: the mean, not the sum
    series, series_note = _series_note([sums[VLLM_RUNNING], sums[VLLM_WAITING]])
    note = "; ".join(n for n in (series_note, note) if n) or None
    return CapacityAnswer(endpoint=endpoint, backend="vllm", verdict=ALL_SLOTS_BUSY if waiting else SLOT_AVAILABLE,
                          enforced=True, queue=Queue(running=running, waiting=waiting, kv_cache_usage=kv_usage,
                                                     server_load=load),
                          evidence=Evidence(probe="/metrics", probes=probes, at=at, ms=got["/metrics"].ms,
                                            series=series, note=note))


def sglang_verdict(endpoint: str, got: Mapping[str, Fetched], at: str | None) -> CapacityAnswer:
    """Busy when requests are queued, or when running reaches the server's
    `max_running_requests` (from its server-info endpoint, when it answers)."""
    reasons: list[str] = []
    probes = tuple(got)
    sums = _metrics(got, (SGLANG_RUNNING, SGLANG_QUEUE, SGLANG_TOKEN_USAGE), reasons)
    if sums is None or not _need(sums, (SGLANG_RUNNING, SGLANG_QUEUE), reasons):
        return unmeasured(endpoint, "sglang", "; ".join(reasons), at=at, probes=probes)
    max_running = None
    for path in ("/server_info", "/get_server_info"):
        f = got.get(path)
        if f is not None and failure(f) is None:
            try:
                max_running = sglang_max_running(f)
            except Unparsable:
                continue
            if max_running is not None:
                break
    running, waiting = count(SGLANG_RUNNING, sums[SGLANG_RUNNING]), count(SGLANG_QUEUE, sums[SGLANG_QUEUE])
    usage = sums.get(SGLANG_TOKEN_USAGE)
    full = waiting > 0 or (max_running is not None and running >= max_running)
    series, note = _series_note([sums[SGLANG_RUNNING], sums[SGLANG_QUEUE]])
    return CapacityAnswer(endpoint=endpoint, backend="sglang", verdict=ALL_SLOTS_BUSY if full else SLOT_AVAILABLE,
                          enforced=True,
                          queue=Queue(running=running, waiting=waiting, max_running=max_running,
                                      kv_cache_usage=None if usage is None else usage.value / usage.series),
                          evidence=Evidence(probe="/metrics", probes=probes, at=at, ms=got["/metrics"].ms,
                                            series=series, note=note))


VERDICT_FNS: dict[str, Callable[[str, Mapping[str, Fetched], str | None], CapacityAnswer]] = {
    "llamacpp": llamacpp_verdict,
    "vllm": vllm_verdict,
    "sglang": sglang_verdict,
}


def capacity_answer(endpoint: str, backend: str | None, got: Mapping[str, Fetched],
                    at: str | None = None) -> CapacityAnswer:
    """The one entry point: which engine, what its probes returned -> the answer."""
    fn = VERDICT_FNS.get(backend or "")
    errors = {f.error for f in got.values()}
    if got and None not in errors and len(errors) == 1:
        # Every probe failed the same way (the port is closed): say it once.
        return unmeasured(endpoint, backend, f"{errors.pop()} (asked {', '.join(got)})", at=at, probes=tuple(got),
                          reachable=False)
    if fn is None:
        return unmeasured(endpoint, backend, f"no capacity probe for backend {backend or 'unknown'}: "
                          "an OpenAI-compatible server does not publish its slots", at=at, probes=tuple(got))
    try:
        out = fn(endpoint.rstrip("/"), got, at)
    except BadNumber as e:
        return unmeasured(endpoint, backend, str(e), at=at, probes=tuple(got), reachable=True)
    except Exception as e:  # a capacity answer is always an answer: a parser bug leaves the member unmeasured
        return unmeasured(endpoint, backend, f"could not read the probes: {type(e).__name__}: {e}", at=at,
                          probes=tuple(got), reachable=any(f.error is None for f in got.values()))
    if not out.measured:
        out = attrs.evolve(out, reachable=any(f.error is None for f in got.values()))
    return out


# ------------------------------------------------------------------ the pool


def merge_pool_capacity(answers: Sequence[CapacityAnswer], at: str | None = None) -> PoolCapacity:
    """Every member's answer in pool order, with the three counts kept apart.
    Unmeasured members never count as available: the pool is :slot-available only
    when some member was *measured* available."""
    members = tuple(answers)
    avail = sum(a.available for a in members)
    busy = sum(a.busy for a in members)
    unknown = sum(not a.measured for a in members)
    if avail:
        verdict = SLOT_AVAILABLE
    elif unknown or not members:
        verdict = UNMEASURED
    else:
        verdict = ALL_SLOTS_BUSY
    return PoolCapacity(members=members, verdict=verdict, enforced=bool(members) and unknown == 0,
                        measured_available=avail, measured_busy=busy, unmeasured=unknown, at=at)


def answers_by_endpoint(answers: Mapping[str, CapacityAnswer] | Iterable[CapacityAnswer]) -> dict[str, CapacityAnswer]:
    if isinstance(answers, Mapping):
        return {k.rstrip("/"): v for k, v in answers.items()}
    return {a.endpoint.rstrip("/"): a for a in answers}


def demote_busy_endpoints(endpoints: Sequence[str],
                          answers: Mapping[str, CapacityAnswer] | Iterable[CapacityAnswer]) -> list[str]:
    """Stable partition: measured-busy members go behind, in their own order; every
    other member (available, unmeasured, or without an answer) keeps its order. Nothing
    is sorted, so the leader stays the leader while it has room."""
    by = answers_by_endpoint(answers)

    def is_busy(e: str) -> bool:
        a = by.get(e.rstrip("/"))
        return a is not None and a.busy

    return [e for e in endpoints if not is_busy(e)] + [e for e in endpoints if is_busy(e)]


UNMEASURED_WHY = "capacity unmeasured: admitted without enforcement"


def _state(a: CapacityAnswer | None) -> str:
    return "no answer" if a is None else a.verdict


@attrs.frozen(cache_hash=True)  # a pool looks up the extras it writes for an admission by it
class Admission:
    """Where a request goes (None: refused, nothing sent) and why."""

    member: str | None
    why: str
    enforced: bool


def admit(endpoints: Sequence[str], answers: Mapping[str, CapacityAnswer] | Iterable[CapacityAnswer],
          affinity: str | None = None, *, inflight: Mapping[str, int] | None = None,
          freed: Collection[str] = (), sent: Mapping[str, int] | None = None) -> Admission:
    """Pick the member for one request, in the demoted order.

    `inflight`: the caller's own requests in flight per member; among equally eligible
    members the one with the fewest wins, then the one sent fewest so far (`sent`), then
    pool order — so independent requests spread, one at a time or many. `freed`: members measured busy that have finished one of the caller's requests
    since that measurement — a slot was freed, so they count as available again.

    1. The conversation's member, while it is available (its prefix cache).
    2. Else the available member with the fewest requests in flight.
    3. Else, if some member is unmeasured, the conversation's member when it is one of
       them, else the unmeasured one with the fewest in flight among those whose probes got
       any HTTP answer (else among all unmeasured): admitted, but not enforced.
    4. Else every member is measured busy and none has freed a slot since: refused,
       nothing is sent."""
    by = answers_by_endpoint(answers)
    return admit_in_order(demote_busy_endpoints(endpoints, by), by, affinity, inflight=inflight,
                          freed={e.rstrip("/") for e in freed}, sent=sent)


def admit_in_order(order: Sequence[str], by: Mapping[str, CapacityAnswer], affinity: str | None = None, *,
                   inflight: Mapping[str, int] | None = None, freed: Collection[str] = (),
                   sent: Mapping[str, int] | None = None) -> Admission:
    """`admit` for a round already read: `order` is `demote_busy_endpoints`' answer and `by` the
    answers by endpoint without a trailing slash (a pool computes both once per round, not per
    request); `freed` holds endpoints without a trailing slash."""
    load = inflight or {}
    total = sent or {}
    aff = affinity.rstrip("/") if affinity else None
    aff_member = next((e for e in order if e.rstrip("/") == aff), None)
    if aff_member is not None and _available(by.get(aff_member.rstrip("/")), aff_member, freed):
        return Admission(aff_member, "conversation affinity: its member has a free slot", True)
    cands, measured = candidates(order, by, freed)
    if not cands:
        return Admission(None, "all-slots-busy: every member was measured busy", True)
    if not measured and aff_member is not None and not _measured(by.get(aff_member.rstrip("/"))):
        return independent_admission(aff_member, 0, False)  # unmeasured: the conversation stays put
    e = least_loaded(cands, load, total)
    adm = independent_admission(e, load.get(e, 0), measured)
    if measured and aff_member is not None and aff_member != e:
        return Admission(e, f"{adm.why} (conversation moved off {aff_member}: "
                            f"{_state(by.get(aff_member.rstrip('/')))})", True)
    return adm


def _available(a: CapacityAnswer | None, endpoint: str, freed: Collection[str]) -> bool:
    """Measured free, or measured busy with a slot of ours freed since (`freed`: without trailing slash)."""
    return a is not None and (a.available or (a.busy and endpoint.rstrip("/") in freed))


def _measured(a: CapacityAnswer | None) -> bool:
    return a is not None and a.measured


def candidates(order: Sequence[str], by: Mapping[str, CapacityAnswer],
               freed: Collection[str] = ()) -> tuple[tuple[str, ...], bool]:
    """The members a request without a conversation chooses among (in `order`), and whether they were
    measured free: the available ones; else the unmeasured ones whose probes got any HTTP answer, else
    every unmeasured one; none when every member was measured busy and none freed a slot since."""
    answers = [(e, by.get(e.rstrip("/"))) for e in order]
    free = tuple(e for e, a in answers if _available(a, e, freed))
    if free:
        return free, True
    unknown = [(e, a) for e, a in answers if not _measured(a)]
    answered = tuple(e for e, a in unknown if a is not None and a.reachable is not False)
    return answered or tuple(e for e, _ in unknown), False


def least_loaded(cands: Sequence[str], inflight: Mapping[str, int], sent: Mapping[str, int]) -> str:
    """The candidate with the fewest requests in flight, then the fewest sent so far, then the first."""
    pick = cands[0]
    load, total = inflight.get(pick, 0), sent.get(pick, 0)
    for e in cands[1:]:
        n = inflight.get(e, 0)
        if n < load or (n == load and sent.get(e, 0) < total):
            pick, load, total = e, n, sent.get(e, 0)
    return pick


def independent_admission(member: str, load: int, measured: bool) -> Admission:
    """Why `member` (with `load` of our requests in flight) was chosen among the `candidates`."""
    if not measured:
        return Admission(member, UNMEASURED_WHY, False)
    why = "first member with a measured free slot" if load == 0 else \
        f"measured free slot, fewest requests in flight ({load})"
    return Admission(member, why, True)
