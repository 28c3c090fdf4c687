"""Numbers from servers are checked before use: NaN, infinities, negatives, huge values and
wrong types leave a member unmeasured with the reason, and never crash a parser."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from faultserver import FaultServer, Seen, Step, ok, reply
from kotoba_vllm._edn import kw, read_all
from kotoba_vllm._model import Usage
from kotoba_vllm._timings import ClientClock, build_timings, llamacpp_server_timings, sglang_server_timings
from kotoba_vllm.capacity import UNMEASURED, Fetched, capacity_answer
from kotoba_vllm.cli import main
from kotoba_vllm.dialects import get_dialect
from kotoba_vllm.dialects._http import parse_retry_after

ROOT = Path(__file__).resolve().parent.parent
BAD = ["NaN", "+Inf", "-Inf", "-1", "1e300"]


def llamacpp_with(processing: str, *, slots: bool = False) -> Callable[[Seen], list[Step]]:
    """A llama-server-shaped fault server whose /metrics gauge reads `processing`; chat answers normally."""
    def script(seen: Seen) -> list[Step]:
        if seen.path == "/metrics":
            return reply(f"llamacpp:requests_processing {processing}\nllamacpp:requests_deferred 0\n", 200,
                         [("content-type", "text/plain")])
        if seen.path == "/slots":
            return reply([{"id": 0, "is_processing": False}]) if slots else reply({"error": "no slots"}, 501)
        if seen.path == "/props":
            return reply({"total_slots": 2, "default_generation_settings": {}})
        return ok(seen)
    return script


@pytest.fixture(params=BAD)
def bad_member(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    with FaultServer(llamacpp_with(request.param)) as srv:
        yield srv.base_url, request.param


def test_capacity_cli_says_unmeasured_with_the_reason_exit_3_no_traceback(bad_member: tuple[str, str]) -> None:
    url, value = bad_member
    p = subprocess.run([sys.executable, "-m", "kotoba_vllm", "capacity", url, "-b", "llamacpp"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 3, p.stderr
    assert "Traceback" not in p.stderr and "Error" not in p.stderr
    member, pool = read_all(p.stdout)
    assert member[kw("capacity/verdict")] == kw(UNMEASURED) and pool[kw("capacity/verdict")] == kw(UNMEASURED)
    reason = member[kw("capacity/reason")]
    assert "llamacpp:requests_processing" in reason and "not a count a server can report" in reason


def test_run_through_a_pool_with_such_a_member_answers_every_input(bad_member: tuple[str, str], tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = bad_member
    pool = tmp_path / "pool.edn"
    pool.write_text('{:pool/members ["%s"] :pool/backend :llamacpp}' % url, encoding="utf-8")
    reqs = tmp_path / "in.edn"
    reqs.write_text("".join('{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "q%d"}]}\n' % i
                            for i in range(3)), encoding="utf-8")
    code = main(["run", str(reqs), "--pool", str(pool), "--no-progress", "--timeout", "10"])
    out, err = capsys.readouterr()
    records = read_all(out)
    assert code == 0, err
    assert [r[kw("vllm/request-index")] for r in records] == [0, 1, 2]
    assert all(r[kw("vllm/text")] == "Hello" for r in records)


def fetched(path: str, body: str | bytes) -> Fetched:
    return Fetched(path, status=200, body=body.encode() if isinstance(body, str) else body, ms=1.0)


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("engine, metrics", [
    ("vllm", "vllm:num_requests_running 1\nvllm:num_requests_waiting {v}\n"),
    ("vllm", "vllm:num_requests_running {v}\nvllm:num_requests_waiting 0\n"),
    ("vllm", "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc {v}\n"),
    ("sglang", "sglang:num_running_reqs {v}\nsglang:num_queue_reqs 0\n"),
    ("sglang", "sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\nsglang:token_usage {v}\n"),
    ("llamacpp", "llamacpp:requests_processing 0\nllamacpp:requests_deferred {v}\n"),
])
def test_every_verdict_leaves_a_member_with_a_bad_gauge_unmeasured(engine: str, metrics: str, value: str) -> None:
    got = {"/metrics": fetched("/metrics", metrics.format(v=value))}
    if engine == "llamacpp":
        got["/slots"] = fetched("/slots", '[{"is_processing": false}]')
    a = capacity_answer("http://m:1", engine, got, "t")
    assert a.verdict == UNMEASURED and not a.enforced and a.reason and a.reachable is True


@pytest.mark.parametrize("body", ['{"total_slots": 1e400}', '{"total_slots": 100000000000000000000}',
                                  '{"total_slots": NaN}', '{"total_slots": -2}', '{"total_slots": "2"}'])
def test_props_total_slots_must_be_a_sane_count(body: str) -> None:
    got = {"/slots": Fetched("/slots", status=501, body=b"{}", ms=1.0), "/props": fetched("/props", body),
           "/metrics": fetched("/metrics", "llamacpp:requests_processing 0\n")}
    a = capacity_answer("http://m:1", "llamacpp", got, "t")
    assert a.verdict == UNMEASURED and "total_slots" in (a.reason or "")


def test_a_negative_or_infinite_server_load_is_ignored_not_trusted() -> None:
    got = {"/metrics": fetched("/metrics", "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"),
           "/load": fetched("/load", '{"server_load": -5}')}
    a = capacity_answer("http://m:1", "vllm", got, "t")
    assert a.measured and a.queue is not None and a.queue.server_load is None


WILD: list[Any] = [math.nan, math.inf, -math.inf, -1, 10**30, 1e308, "12", True, None, [1], {"a": 1}]


@pytest.mark.parametrize("value", WILD, ids=repr)
def test_timings_are_total_over_wild_server_numbers(value: Any) -> None:
    clock = ClientClock(sent=0.0, first_token=0.1, last_token=0.5, done=0.6, token_times=(0.1, 0.3, 0.5))
    for t in (llamacpp_server_timings({k: value for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms",
                                                          "cache_n", "prompt_per_second", "predicted_per_second")}),
              sglang_server_timings({k: value for k in ("prompt_tokens", "completion_tokens", "cached_tokens",
                                                        "prefill_launch_latency", "decode_throughput")})):
        assert t is not None
        for f in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "cached_n", "prompt_per_s", "predicted_per_s"):
            v = getattr(t, f)
            assert v is None or (math.isfinite(v) and v >= 0), (f, v)
        timings = build_timings(t, Usage(prompt_tokens=3, completion_tokens=2), clock)
        for fig in (timings.prefill, timings.decode, timings.cached):
            for n in (fig.tokens, fig.ms, fig.tokens_per_s):
                assert n is None or (math.isfinite(n) and n >= 0)


@pytest.mark.parametrize("value", WILD, ids=repr)
def test_usage_counts_are_total_over_wild_server_numbers(value: Any) -> None:
    u = get_dialect("vllm").parse_usage({"prompt_tokens": value, "completion_tokens": value, "total_tokens": value})
    for n in (u.prompt_tokens, u.completion_tokens, u.total_tokens) if u is not None else ():
        assert n is None or (isinstance(n, int) and 0 <= n <= 2**53)


@pytest.mark.parametrize("header", ["inf", "nan", "-1", "1e400"])
def test_retry_after_must_be_a_finite_wait(header: str) -> None:
    assert parse_retry_after(header) is None
