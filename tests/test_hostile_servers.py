"""Broken and hostile servers, tried as a user would: every path ends within its deadline, in bounded memory,
with a typed error or a correct answer.

Each misbehaving server runs on loopback (tests/faultserver.py, in this process); each client runs in its own
process (tests/_hostile_child.py) under an RLIMIT_AS ceiling and a wall cap, so a hang or a memory blow-up
is a failure here, not a stuck suite. Bodies are small, with proportionally small limits (a 1 MiB limit
against a 256 MiB gzip bomb), so the tier takes seconds.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from faultserver import LAST_CHUNK, FaultServer, Seen, Sleep, Step, chat_answer, chat_chunk, chunk, head, reply, \
    sse_event, sse_head, sse_stream

import kotoba_vllm
from kotoba_vllm._base_client import DEFAULT_DEADLINE_S, DEFAULT_STREAM_IDLE_S, SseDecoder
from kotoba_vllm._wire_core import DEFAULT_MAX_BYTES, PROBE_MAX_BYTES

CHILD = Path(__file__).with_name("_hostile_child.py")
ROOT = Path(kotoba_vllm.__file__).parent.parent
MiB = 1024 * 1024
AS_CEILING = 1536 * MiB  # address space: the interpreter, aiohttp and threads fit; a 256 MiB inflate on top fails
WALL_S = 30.0
SMALL = 1 * MiB  # the limit the cases run with: 1/64 of the default, bodies scaled alike


def run_child(spec: dict[str, Any], wall_s: float = WALL_S, *, body_limit: int | None = None,
              meanwhile: Callable[["subprocess.Popen[str]"], None] | None = None) -> dict[str, Any]:
    """Run one client case in a child process; `body_limit` is the largest body it may hold (the spec's own
    `max_response_bytes`, or SMALL, unless given); `meanwhile(child)` runs here while the child does."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (AS_CEILING, AS_CEILING))

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(CHILD.parent)])}
    p = subprocess.Popen([sys.executable, str(CHILD), json.dumps(spec)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=limit, env=env)
    try:
        if meanwhile is not None:
            meanwhile(p)
        stdout, stderr = p.communicate(timeout=wall_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail(f"{spec['path']} hung: no end within the {wall_s} s wall cap")
    except BaseException:  # `meanwhile` failed: no child outlives the test
        p.kill()
        p.communicate()
        raise
    assert p.returncode == 0, f"{spec['path']} crashed (exit {p.returncode}):\n{stderr[-3000:]}"
    last = stdout.rstrip("\n").rpartition("\n")[2]  # the child's one JSON line (split on newlines only)
    try:
        out: dict[str, Any] = json.loads(last)
    except ValueError:
        pytest.fail(f"{spec['path']}: the child's last line is no JSON ({len(stdout)} characters of stdout): "
                    f"{last[:300]!r} ... {last[-300:]!r}; stderr: {stderr[-1500:]}")
    grown = (out["rss_peak_kb"] - out["rss_before_kb"]) * 1024
    limit_bytes = body_limit or spec.get("client", {}).get("max_response_bytes", SMALL)
    assert grown <= 3 * limit_bytes + 24 * MiB, f"{spec['path']} grew {grown / MiB:.0f} MiB (limit {limit_bytes})"
    return out


# ------------------------------------------------------------------ the servers (scripts for FaultServer)


def trickle(seen: Seen) -> Iterator[Step]:
    """A whole answer promised, one byte every 0.2 s."""
    body = json.dumps(chat_answer("slow")).encode()
    yield head(200, [("content-type", "application/json")], length=len(body))
    for b in body:
        yield Sleep(0.2)
        yield bytes([b])


def heartbeats(seen: Seen) -> Iterator[Step]:
    """An event stream of `: ping` comments every 50 ms, and never a data event."""
    yield sse_head()
    while True:
        yield chunk(b": ping\n\n")
        yield Sleep(0.05)


def one_token_then_heartbeats(seen: Seen) -> Iterator[Step]:
    yield sse_head()
    yield sse_event(chat_chunk("first"))
    while True:
        yield chunk(b": ping\n\n")
        yield Sleep(0.05)


def steady_tokens(seen: Seen) -> Iterator[Step]:
    """An engine decoding: a token every 10 ms, for ever."""
    yield sse_head()
    while True:
        yield sse_event(chat_chunk("t"))
        yield Sleep(0.01)


def long_prefill(seen: Seen) -> Iterator[Step]:
    """1.5 s of heartbeats before the first token (a prefill), then a whole stream."""
    yield sse_head()
    for _ in range(30):
        yield chunk(b": ping\n\n")
        yield Sleep(0.05)
    yield from sse_stream(["after ", "prefill"])[1:]


def big_json(n: int, *, length: bool) -> Any:
    def script(seen: Seen) -> Iterator[Step]:
        pad = b"x" * n
        body = json.dumps(chat_answer("")).encode().replace(b'"content": ""', b'"content": "' + pad + b'"')
        if length:
            yield head(200, [("content-type", "application/json")], length=len(body)) + body
        else:
            yield head(200, [("content-type", "application/json")], chunked=True)
            for i in range(0, len(body), 65536):
                yield chunk(body[i:i + 65536])
            yield LAST_CHUNK
    return script


def _bomb(inflated: int) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = b"0" * MiB
    return b"".join([c.compress(zeros) for _ in range(inflated // MiB)] + [c.flush()])


BOMB = _bomb(256 * MiB)  # ~250 KiB on the wire


def gzip_bomb(seen: Seen) -> list[Step]:
    return [head(200, [("content-type", "application/json"), ("content-encoding", "gzip")], length=len(BOMB)) + BOMB]


def long_sse_line(seen: Seen) -> Iterator[Step]:
    yield sse_head()
    yield chunk(b"data: ")
    for _ in range(64):
        yield chunk(b"x" * 65536)
    yield LAST_CHUNK


def redirect(with_body: bool) -> Any:
    def script(seen: Seen) -> list[Step]:
        body = json.dumps(chat_answer("from the redirect")).encode() if with_body else b""
        return [head(307, [("location", "http://127.0.0.1:9/elsewhere"), ("content-type", "application/json")],
                     length=len(body)) + body]
    return script


def _spec(path: str, url: str, **extra: Any) -> dict[str, Any]:
    client = {"max_response_bytes": SMALL, **extra.pop("client", {})}
    return {"path": path, "url": url, "client": client, **extra}


SYNC_ASYNC = ["client", "async"]


# ------------------------------------------------------------------ the defaults exist


def test_the_defaults_bound_every_call() -> None:
    """A user who passes nothing is protected: every limit has a finite default (docs/trust.md)."""
    c = kotoba_vllm.Client("http://127.0.0.1:9", backend="vllm")
    assert c.deadline_s == DEFAULT_DEADLINE_S == 600.0
    assert c.stream_idle_s == DEFAULT_STREAM_IDLE_S == 120.0
    assert c.max_response_bytes == DEFAULT_MAX_BYTES == 64 * MiB
    assert c.probe_max_bytes == PROBE_MAX_BYTES and c.max_sse_line == 16 * MiB
    c.close()


# ------------------------------------------------------------------ deadlines


@pytest.mark.parametrize("path", SYNC_ASYNC)
def test_a_trickling_answer_ends_at_the_deadline(path: str) -> None:
    with FaultServer(trickle) as srv:
        out = run_child(_spec(path, srv.base_url, client={"timeout": 10, "deadline": 1.0}))
        assert srv.wait_idle(5) == 0  # the client closed the connection: the engine can abort
    assert out["kind"] == "timeout" and out["phase"] == "total", out
    assert out["elapsed_s"] < 3


@pytest.mark.parametrize("path", SYNC_ASYNC)
def test_a_heartbeat_only_stream_ends_at_the_deadline(path: str) -> None:
    with FaultServer(heartbeats) as srv:
        out = run_child(_spec(path, srv.base_url, call="stream", client={"timeout": 5, "deadline": 1.0,
                                                                         "stream_idle_s": 0.3}))
        assert srv.wait_idle(5) == 0
    # heartbeats never start the idle limit (no data event yet): the whole deadline ends it
    assert out["kind"] == "timeout" and out["phase"] == "total", out
    assert out["elapsed_s"] < 3


@pytest.mark.parametrize("path", SYNC_ASYNC)
def test_a_client_run_only_after_its_deadline_hands_over_nothing_that_came_meanwhile(path: str) -> None:
    """A busy machine can leave the client's process unscheduled across its deadline (seen beside vLLM's CPU
    engine: seconds). When it runs again, the tokens that piled up in the socket meanwhile are not handed
    over as deltas: the deadline has passed, the stream ends, and the connection closes."""
    deadline_s, stopped_s = 0.6, 1.2

    def stopped_across_the_deadline(child: "subprocess.Popen[str]") -> None:
        t = time.monotonic()
        while not srv.seen and time.monotonic() - t < 10:  # the request is out: the deadline runs
            time.sleep(0.01)
        time.sleep(0.2)
        os.kill(child.pid, signal.SIGSTOP)
        try:
            time.sleep(stopped_s)
        finally:
            os.kill(child.pid, signal.SIGCONT)

    with FaultServer(steady_tokens) as srv:
        out = run_child(_spec(path, srv.base_url, call="stream", client={"deadline": deadline_s}),
                        meanwhile=stopped_across_the_deadline)
        assert srv.wait_idle(5) == 0
    assert out["kind"] == "timeout" and out["phase"] == "total", out
    assert out["delta_s"], out  # tokens came before the stop
    late = [t for t in out["delta_s"] if t > deadline_s + 0.3]
    assert not late, f"{len(late)} deltas handed over after the {deadline_s} s deadline, the first at {late[0]} s"
    assert out["elapsed_s"] >= 0.2 + stopped_s  # it really was stopped past its deadline


@pytest.mark.parametrize("path", SYNC_ASYNC)
def test_heartbeats_after_a_token_end_at_the_idle_limit(path: str) -> None:
    with FaultServer(one_token_then_heartbeats) as srv:
        out = run_child(_spec(path, srv.base_url, call="stream", client={"deadline": 20, "stream_idle_s": 0.5}))
        assert srv.wait_idle(5) == 0
    assert out["kind"] == "timeout" and out["phase"] == "idle", out
    assert out["elapsed_s"] < 3


@pytest.mark.parametrize("path", SYNC_ASYNC)
def test_a_long_prefill_is_not_idleness(path: str) -> None:
    with FaultServer(long_prefill) as srv:
        out = run_child(_spec(path, srv.base_url, call="stream", client={"deadline": 20, "stream_idle_s": 0.5}))
    assert out["ok"] == "after prefill", out


# ------------------------------------------------------------------ sizes


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "chunked"])
@pytest.mark.parametrize("path", SYNC_ASYNC)
def test_an_answer_past_the_size_limit_is_refused(path: str, length: bool) -> None:
    with FaultServer(big_json(8 * MiB, length=length)) as srv:
        out = run_child(_spec(path, srv.base_url))
        assert srv.wait_idle(5) == 0
    assert out["kind"] == "too-large" and out["what"] == "received", out
    assert str(SMALL) in out["message"] and srv.base_url in out["message"]


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "chunked"])
@pytest.mark.parametrize("path", SYNC_ASYNC)
def test_an_answer_under_the_limit_passes(path: str, length: bool) -> None:
    """Both ways of reading a body: sent as is with its length (read whole, the length its bound), or through
    the bounded decoder (chunked): the same answer."""
    with FaultServer(big_json(SMALL // 2, length=length)) as srv:
        out = run_child(_spec(path, srv.base_url))
    assert out["kind"] is None and len(out["ok"]) == SMALL // 2, out


@pytest.mark.parametrize("path", SYNC_ASYNC)
def test_a_gzip_bomb_stops_at_the_limit(path: str) -> None:
    with FaultServer(gzip_bomb) as srv:
        out = run_child(_spec(path, srv.base_url))
        assert srv.wait_idle(5) == 0
    assert out["kind"] == "too-large" and out["what"] == "decoded", out


@pytest.mark.parametrize("path", SYNC_ASYNC)
def test_a_gzip_bomb_on_the_default_settings_stops_at_the_default_limit(path: str) -> None:
    """No limit passed: 512 MiB inflated from ~0.5 MiB on the wire stops at the default 64 MiB, in bounded memory."""
    bomb = _bomb(8 * DEFAULT_MAX_BYTES)

    def script(seen: Seen) -> list[Step]:
        return [head(200, [("content-type", "application/json"), ("content-encoding", "gzip")],
                     length=len(bomb)) + bomb]

    with FaultServer(script) as srv:
        out = run_child({"path": path, "url": srv.base_url, "client": {}}, body_limit=DEFAULT_MAX_BYTES)
        assert srv.wait_idle(5) == 0
    assert out["kind"] == "too-large" and out["what"] == "decoded", out


@pytest.mark.parametrize("path", SYNC_ASYNC)
def test_an_answer_past_the_default_limit_is_refused_on_the_default_settings(path: str) -> None:
    with FaultServer(big_json(2 * DEFAULT_MAX_BYTES, length=False)) as srv:
        out = run_child({"path": path, "url": srv.base_url, "client": {}}, body_limit=DEFAULT_MAX_BYTES)
    assert out["kind"] == "too-large", out


@pytest.mark.parametrize("path", SYNC_ASYNC)
def test_an_endless_sse_line_stops_at_the_line_limit(path: str) -> None:
    with FaultServer(long_sse_line) as srv:
        out = run_child(_spec(path, srv.base_url, call="stream", client={"max_response_bytes": 16 * MiB},
                              attrs={"max_sse_line": 256 * 1024}))
        assert srv.wait_idle(5) == 0
    assert out["kind"] == "too-large" and out["what"] == "sse-line", out


def test_the_sse_line_limit() -> None:
    dec = SseDecoder("http://x", max_line=1000)
    with pytest.raises(kotoba_vllm.ResponseTooLarge) as ei:
        for _ in range(10):
            list(dec.payloads(b"data: " + b"x" * 200))
    assert ei.value.what == "sse-line" and ei.value.limit_bytes == 1000


# ------------------------------------------------------------------ redirects


@pytest.mark.parametrize("with_body", [True, False], ids=["answer-shaped body", "empty"])
@pytest.mark.parametrize("path", SYNC_ASYNC)
def test_a_redirect_is_an_error_naming_status_and_location(path: str, with_body: bool) -> None:
    with FaultServer(redirect(with_body)) as srv:
        out = run_child(_spec(path, srv.base_url))
    assert out["kind"] == "redirect" and "307" in out["message"] and "http://127.0.0.1:9/elsewhere" in out["message"]


# ------------------------------------------------------------------ linear SSE decoding


def test_sse_decoding_is_linear_in_the_line_length() -> None:
    """Bytes looked at per byte of line stay constant from a 1 MiB line to a 32 MiB one (it was quadratic:
    each read rebuilt and rescanned the line so far)."""
    def scanned_per_byte(n: int) -> float:
        dec = SseDecoder("http://x", max_line=64 * MiB)
        piece = b"x" * 65536
        list(dec.payloads(b"data: "))
        for _ in range(n // len(piece)):
            list(dec.payloads(piece))
        events = list(dec.payloads(b"\n\n"))
        assert len(events) == 1 and len(events[0][1]) == n
        return dec.scanned / n

    small, big = scanned_per_byte(1 * MiB), scanned_per_byte(32 * MiB)
    assert small <= 3 and big <= 3 and abs(big - small) < 0.1, (small, big)


# ------------------------------------------------------------------ pools, capacity, detection

VLLM_IDLE = b'vllm:num_requests_running{model_name="m"} 0\nvllm:num_requests_waiting{model_name="m"} 0\n'


def healthy(seen: Seen) -> list[Step]:
    if seen.path == "/metrics":
        return [head(200, [("content-type", "text/plain")], length=len(VLLM_IDLE)) + VLLM_IDLE]
    return reply(chat_answer("healthy"))


def trickle_everything(seen: Seen) -> Iterator[Step]:
    """`/metrics` (and anything else) one byte every 0.5 s, forever."""
    yield head(200, [("content-type", "text/plain")], chunked=True)
    while True:
        yield chunk(b"v")
        yield Sleep(0.5)


def bomb_everything(seen: Seen) -> list[Step]:
    return [head(200, [("content-type", "text/plain"), ("content-encoding", "gzip")], length=len(BOMB)) + BOMB]


class Members:
    """Three members on loopback: healthy, trickling, bombing."""

    def __enter__(self) -> list[str]:
        self.servers = [FaultServer(healthy).start(), FaultServer(trickle_everything).start(),
                        FaultServer(bomb_everything).start()]
        return [s.base_url for s in self.servers]

    def __exit__(self, *exc: Any) -> None:
        for s in self.servers:
            s.stop()


@pytest.mark.parametrize("path", ["pool", "apool"])
def test_a_pool_answers_from_its_healthy_member(path: str) -> None:
    with Members() as urls:
        out = run_child({"path": path, "members": urls, "client": {"max_response_bytes": SMALL}})
    assert out["ok"] == "healthy", out
    assert out["elapsed_s"] < 6  # one probe round, bounded by the probe deadline (2 s), then the answer


def test_capacity_names_each_bad_member_and_ends_by_the_probe_deadline() -> None:
    with Members() as urls:
        out = run_child({"path": "capacity", "members": urls, "client": {"max_response_bytes": PROBE_MAX_BYTES},
                         "capture": True})
    got = json.loads(out["ok"])
    assert got["exit"] == 0, out  # the healthy member has a free slot
    trickler, bomber = got["out"].splitlines()[1:3]
    assert "probe deadline" in trickler and "passed the size limit" in bomber, got["out"]
    assert out["elapsed_s"] < 6


def test_run_over_a_pool_answers_every_request_from_the_healthy_member() -> None:
    """The issue's case: 200 requests of `run --pool` over healthy, trickling and bombing members."""
    with Members() as urls:
        pool = f'{{:pool/members [{" ".join(json.dumps(u) for u in urls)}] :pool/backend :vllm}}'
        out = run_child({"path": "run", "n": 200, "pool": pool, "args": ["--timeout", "10"],
                         "client": {"max_response_bytes": DEFAULT_MAX_BYTES}}, wall_s=90)
    got = json.loads(out["ok"])
    records = got["records"]
    assert len(records) == 200 and got["exit"] == 0, out
    answered_by = {r["kotoba"].get("endpoint_url") for r in records}
    assert answered_by == {urls[0] + "/v1/chat/completions"}, answered_by


@pytest.mark.parametrize("path", SYNC_ASYNC)
def test_backend_detection_against_a_trickling_server_ends_at_its_deadline(path: str) -> None:
    with FaultServer(trickle_everything) as srv:
        out = run_child({"path": path, "url": srv.base_url, "backend": "auto", "call": "detect",
                         "client": {"max_response_bytes": SMALL}})
    assert out["kind"] == "timeout" and out["phase"] == "total", out
    assert out["elapsed_s"] < 8  # detection's whole deadline: 5 s over every probe


@pytest.mark.parametrize("path", SYNC_ASYNC)
def test_backend_detection_against_a_bomb_is_bounded(path: str) -> None:
    with FaultServer(bomb_everything) as srv:
        out = run_child({"path": path, "url": srv.base_url, "backend": "auto", "call": "detect",
                         "client": {"max_response_bytes": SMALL}})
    assert out["ok"] == "openai", out  # every probe refused at the size limit: none named an engine


# ------------------------------------------------------------------ the small ones


def test_a_10000_digit_integer_is_refused_by_field_and_the_rest_kept() -> None:
    body = json.dumps(chat_answer("kept")).replace('"prompt_tokens": 3', '"prompt_tokens": ' + "9" * 10000)

    with FaultServer(lambda seen: reply(body)) as srv, kotoba_vllm.Client(srv.base_url, backend="vllm") as c:
        r = c.chat([{"role": "user", "content": "hi"}])
    assert r.text == "kept"
    assert r.extras["kotoba/refused"] == ["usage.prompt_tokens: an integer of 10000 digits, refused"]


def test_duplicate_metrics_series_make_a_member_unmeasured_never_a_sum() -> None:
    from kotoba_vllm.capacity import UNMEASURED
    from kotoba_vllm.capacity._parse import Fetched
    from kotoba_vllm.capacity._verdict import capacity_answer

    twice = VLLM_IDLE + b'vllm:num_requests_waiting{model_name="m"} 0\n'
    a = capacity_answer("http://m", "vllm", {"/metrics": Fetched("/metrics", status=200, body=twice, ms=1.0)}, None)
    assert a.verdict == UNMEASURED and "duplicate series" in (a.reason or ""), a.reason
    other_model = VLLM_IDLE + b'vllm:num_requests_waiting{model_name="n"} 0\n'  # a second model: summed, as before
    b = capacity_answer("http://m", "vllm", {"/metrics": Fetched("/metrics", status=200, body=other_model, ms=1.0)},
                        None)
    assert b.verdict != UNMEASURED


@pytest.mark.parametrize("depth", [150, 100_000])
def test_a_deeply_nested_jsonl_line_gets_the_edn_readers_problem(depth: int) -> None:
    from kotoba_vllm.batch._jsonl import line_to_entry

    line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "m", "messages": [], "x": None}}).replace("null", "[" * depth + "]" * depth)
    entry = line_to_entry(0, line, "in.jsonl", 7)
    assert [p.msg for p in entry.problems] == ["nested deeper than 100 levels"]
    assert entry.problems[0].where == "in.jsonl:7:1"


@pytest.mark.parametrize("path", ["client", "async", "run"])
def test_a_big_answer_costs_a_small_multiple_of_its_size(path: str) -> None:
    """A 24 MiB answer, under the default limit: the client's peak memory over the same call with a tiny
    answer is a small multiple of the answer - measured 3.0x for the clients and for `run` (openai-python:
    3.2x), where `run` was 5.0x before its record was written in pieces - never the 7-8x it was."""
    size = 24 * MiB

    def grown(n: int) -> int:
        with FaultServer(big_json(n, length=True)) as srv:
            out = run_child({"path": path, "url": srv.base_url, "client": {"max_response_bytes": DEFAULT_MAX_BYTES},
                             "args": ["--base-url", srv.base_url]}, wall_s=60)
        assert out["kind"] is None, out
        return (out["rss_peak_kb"] - out["rss_before_kb"]) * 1024

    multiple = (grown(size) - grown(1024)) / size
    # Peak RSS moves with allocator and collector timing: 3.0x here run after run, 3.6x once in a CI run (Client)
    assert multiple <= 4.0, f"{path}: {multiple:.1f}x the answer"


def test_a_requests_own_deadline_in_edn() -> None:
    def req(deadline: str) -> Any:
        text = ('{:vllm/endpoint :chat :vllm/deadline-s %s :vllm/messages [{:vllm/role :user :vllm/content "x"}]}'
                % deadline)
        return next(iter(kotoba_vllm.read_forms(text))).value

    with FaultServer(trickle) as srv, kotoba_vllm.Client(srv.base_url, backend="vllm", timeout=10) as c:
        with pytest.raises(kotoba_vllm.RequestTimeout) as ei:
            c.send(req("0.8"))
        with pytest.raises(kotoba_vllm.ValidationError) as bad:
            c.send(req("-1"))
    assert ei.value.phase == "total" and ei.value.limit_s == pytest.approx(0.8, abs=0.01)
    assert bad.value.problems[0].field == "vllm/deadline-s"


# ------------------------------------------------------------------ the endpoints other issues added


@pytest.mark.parametrize("server", ["trickle", "bomb"])
@pytest.mark.parametrize("path", SYNC_ASYNC)
def test_server_config_is_bounded_like_a_capacity_probe(path: str, server: str) -> None:
    script = trickle_everything if server == "trickle" else bomb_everything
    with FaultServer(script) as srv:
        out = run_child({"path": path, "url": srv.base_url, "call": "server_config",
                         "client": {"max_response_bytes": SMALL}})
    assert out["kind"] is None and out["ok"].startswith("measured=False"), out
    assert ("probe deadline" if server == "trickle" else "size limit") in out["ok"], out
    assert out["elapsed_s"] < 9  # server_config's probe deadline: its 1 s connect + 5 s read


@pytest.mark.parametrize("path", SYNC_ASYNC)
def test_rerank_against_a_bomb_is_refused_at_the_limit(path: str) -> None:
    with FaultServer(gzip_bomb) as srv:
        out = run_child({"path": path, "url": srv.base_url, "call": "rerank", "client": {"max_response_bytes": SMALL}})
    assert out["kind"] == "too-large" and out["what"] == "decoded", out
