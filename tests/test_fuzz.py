"""Fuzzing: EDN request text (valid, mutated, truncated, random bytes), typed requests through
validate and every engine's render, responses through the parsers, `run` against the fault server,
and the capacity and distributed-plan parsers. Nothing untyped may escape: only `EdnError`,
`StructureError`, `KotobaError` subclasses and `Problem`s, each naming what and where.

Profiles: the default run tries >= 10,000 inputs in total (counted, printed at the end of the
module); `KOTOBA_VLLM_FUZZ=long` (or `-m slow`) runs every target 20x longer.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import pathlib
import tempfile
from typing import Any, Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _live import long_selected
from _strategies import edn_values, json_like, request_maps
from faultserver import FaultServer
from kotoba_vllm import _errors as E
from kotoba_vllm._base_client import BaseClient, StreamRun
from kotoba_vllm._codec import StructureError
from kotoba_vllm._edn import EdnError, Keyword, dumps, kw, read_file, read_forms
from kotoba_vllm._problems import Problem
from kotoba_vllm._requests import request_from_edn
from kotoba_vllm._validate import validate
from kotoba_vllm.dialects import DIALECTS, get_dialect

ROOT = pathlib.Path(__file__).parent.parent
TYPED = (EdnError, StructureError, E.KotobaError)
ENGINES = ("vllm", "sglang", "llamacpp", "openai")
LONG_FACTOR = 20
TRIED: collections.Counter[str] = collections.Counter()
# target -> examples in the default profile (sum >= 10,000; cheap pure targets take thousands)
BUDGET = {
    "edn-random-text": 4500, "edn-mutated-text": 2000, "edn-random-bytes": 300, "request-maps": 1200,
    "typed-render": 250, "response-parse": 800, "stream-chunks": 600, "capacity": 600, "plan": 400,
    "cli-run": 25, "timings": 400,
}


def fuzz(name: str, strategy: st.SearchStrategy[Any]) -> Callable[[Callable[[Any], None]], Any]:
    """A default-profile test and a long-profile twin (marked slow: deselected unless asked for)."""

    def deco(fn: Callable[[Any], None]) -> Any:
        @pytest.mark.parametrize("profile", ["default", pytest.param("long", marks=pytest.mark.slow)])
        def test(profile: str, request: pytest.FixtureRequest) -> None:
            n = BUDGET[name] * (LONG_FACTOR if profile == "long" else 1)

            @settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck))
            @given(strategy)
            def run(x: Any) -> None:
                TRIED[name] += 1
                fn(x)

            run()

        test.__name__ = fn.__name__
        return test

    return deco


@pytest.fixture(scope="module", autouse=True)
def _report_counts(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    total = sum(TRIED.values())
    line = f"fuzz: {total} inputs tried, 0 untyped exceptions: " + \
           ", ".join(f"{k} {v}" for k, v in sorted(TRIED.items()))
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    if cache is not None:
        cache.set("kotoba_vllm/fuzz_counts", dict(TRIED))
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capman = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capman is not None:
        with capman.global_and_fixture_disabled():  # shown in the run's output, not swallowed by capture
            reporter.write_line("")
            reporter.write_line(line)
    if set(TRIED) == set(BUDGET):  # the whole module ran: the CI budget holds
        assert total >= 10_000, line


# ------------------------------------------------------------------ "names what and where"


def named_problem(p: Problem, *, located: bool = False) -> None:
    assert isinstance(p, Problem) and p.msg and p.code and p.severity in ("error", "warn")
    # what: the field; only a top-level problem without a form may lack one, and then its message
    # names the offending value itself (not a map / a non-keyword key)
    assert p.field is not None or p.where is not None or p.code in ("request/type", "edn/non-keyword-key"), \
        f"names no field or place: {p}"
    if located:
        assert p.where is not None and ":" in p.where, f"problem from a located form has no place: {p}"
    p.to_edn()


def named_error(e: BaseException) -> None:
    if isinstance(e, EdnError):
        assert e.msg and e.source and e.line >= 1 and e.column >= 1, repr(e)
        e.to_edn()
    elif isinstance(e, StructureError):
        assert e.problems
        for p in e.problems:
            named_problem(p)
    elif isinstance(e, E.ValidationError):
        assert e.problems
        for p in e.problems:
            named_problem(p)
        e.to_edn()
    else:
        assert isinstance(e, E.KotobaError) and e.message, repr(e)
        assert e.endpoint, f"{type(e).__name__} names no endpoint: {e!r}"
        dumps(e.to_edn())


# ------------------------------------------------------------------ EDN text

EDN_ALPHABET = list('{}[]()#:"\\ ;,\n^@~`\'_!?*+-./<>=&%$|') + list("abcdehilmnoprstuvxyzNT0123456789eE")
RICH = """
{:vllm/endpoint :completion :vllm/model "m" :vllm/prompt [1 2 3] :vllm/stream true :vllm/request-id 7
 :vllm/sampling {:vllm/temperature 2.0 :vllm/top-p 0.5 :vllm/top-k -1 :vllm/min-p 0.1 :vllm/max-tokens 1 :vllm/n 2
                 :vllm/best-of 3 :vllm/presence-penalty -2.0 :vllm/frequency-penalty 1.5 :vllm/repetition-penalty 1.1
                 :vllm/stop ["a" "b"] :vllm/seed 1 :vllm/logprobs 2 :vllm/guided-regex "[a-z]+"}
 :llamacpp/cache-prompt true :llamacpp/id-slot 0}
{:vllm/endpoint :generate :vllm/prompt "p" :vllm/sampling {:vllm/guided-json "{\\"type\\": \\"object\\"}"}
 :sglang/return-logprob true}
{:vllm/endpoint :embedding :vllm/input ["a" "b"] :vllm/base-url "http://localhost:8000"}
{:vllm/endpoint :tokenize :vllm/text "hello" :vllm/add-special false}
{:vllm/endpoint :detokenize :vllm/tokens [1 2 3]}
{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content [{:vllm/type :text :vllm/text "hi"}
  {:vllm/type :image-url :vllm/url "http://x/y.png" :vllm/detail "low"}]}] :vllm/tool-choice "auto"
 :vllm/sampling {:vllm/logprobs true :vllm/stop "\\n"}}
"""
SEEDS = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "examples").glob("*.edn"))] + [RICH]
SEED_MAPS = [f.value for t in SEEDS for f in read_forms(t) if isinstance(f.value, dict)]
edn_ish_text = st.text(alphabet=st.sampled_from(EDN_ALPHABET), max_size=60)
any_text = st.text(max_size=60)


def _mutate(text: str, ops: list[tuple[int, float, str]]) -> str:
    for op, at, s in ops:
        i = int(at * len(text))
        if op == 0:  # truncate
            text = text[:i]
        elif op == 1:  # insert
            text = text[:i] + s + text[i:]
        elif op == 2:  # delete a span
            text = text[:i] + text[i + 1 + len(s):]
        elif op == 3:  # duplicate a span
            text = text[:i] + text[i:i + 8] + text[i:]
        else:  # replace one character
            text = text[:i] + (s[:1] or "#") + text[i + 1:]
    return text


_ops = st.lists(st.tuples(st.integers(0, 4), st.floats(0, 1), edn_ish_text | any_text), min_size=1, max_size=4)
# Seeds are fixed texts and maps: drawing the shared `request_maps` costs ~24 ms an example,
# mutating a seed well under 1 ms, so the budget buys far more inputs this way.
seed_texts = st.one_of(st.sampled_from(SEEDS), st.sampled_from(SEED_MAPS).map(dumps))
mutated_text = st.builds(_mutate, seed_texts, _ops)


def check_text(text: str) -> None:
    try:
        forms = list(read_forms(text, "fuzz.edn"))
    except EdnError as e:
        named_error(e)
        return
    for f in forms:
        req, problems = request_from_edn(f.value, f)
        for p in problems:
            named_problem(p, located=True)
        if req is not None:
            check_typed(req)


# Deep nesting: Python's own stack gives out near 300 levels; the reader must say so, located.
deep_text = st.builds(lambda n, o, c: o * n + c * n, st.integers(50, 3000),
                      st.sampled_from(["[", "(", "{:a ", "#_", "#inst ", "#{", "^:m "]),
                      st.sampled_from(["]", ")", "}", "1"]))


@fuzz("edn-random-text", edn_ish_text | any_text | deep_text)
def test_edn_reader_random_text(text: str) -> None:
    check_text(text)


@fuzz("edn-mutated-text", mutated_text)
def test_edn_mutated_and_truncated_requests(text: str) -> None:
    check_text(text)


_BYTES_DIR = tempfile.mkdtemp(prefix="kotoba-fuzz-")


@fuzz("edn-random-bytes", st.binary(max_size=80) | st.builds(lambda t, i: t.encode()[:i] + b"\xff" + t.encode()[i:],
                                                             st.sampled_from(SEEDS), st.integers(0, 400)))
def test_edn_file_random_bytes(raw: bytes) -> None:
    path = os.path.join(_BYTES_DIR, "fuzz.edn")
    with open(path, "wb") as fh:
        fh.write(raw)
    try:
        forms = read_file(path)
    except EdnError as e:
        named_error(e)
        return
    for f in forms:
        req, problems = request_from_edn(f.value, f)
        for p in problems:
            named_problem(p)


# ------------------------------------------------------------------ request maps -> typed -> validate -> render


def test_a_nested_non_keyword_key_is_named_by_its_enclosing_key() -> None:
    m = {kw("vllm/endpoint"): kw("chat"), kw("vllm/messages"): [{"role": "user"}]}
    _, problems = request_from_edn(m)
    assert [(p.code, p.field) for p in problems if p.code == "edn/non-keyword-key"] == \
        [("edn/non-keyword-key", "vllm/messages")]

# Cheap replacement values (the recursive `edn_values` costs more to draw than the code under test)
wild = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
                 st.sampled_from([math.nan, math.inf, -math.inf, 10**30, -1, 0, "", kw("user"), kw("vllm/tool"),
                                  [], {}, [1, "a"], {kw("a"): 1}, {"a": [1.5]}, [{kw("vllm/role"): kw("user")}],
                                  frozenset([1]), (1, 2)]))


def _positions(v: Any, out: list[tuple[Any, Any]]) -> None:
    if isinstance(v, dict):
        for k in list(v):
            out.append((v, k))
            _positions(v[k], out)
    elif isinstance(v, list):
        for i in range(len(v)):
            out.append((v, i))
            _positions(v[i], out)


def _mutate_map(m: dict[Keyword, Any], ops: list[tuple[int, int, Any]]) -> Any:
    m = _thaw(m)
    for op, at, value in ops:
        pos: list[tuple[Any, Any]] = []
        _positions(m, pos)
        if not pos:
            return m
        container, key = pos[at % len(pos)]
        value = _thaw(value)  # a fresh copy: a shared sampled [] must never end up inside itself
        if op == 0:
            container[key] = value
        elif op == 1 and isinstance(container, dict):
            del container[key]
        elif isinstance(container, dict):
            container[kw(f"vllm/fuzz-{at}") if op == 2 else kw(f"llamacpp/fuzz-{at}")] = value
    return m


def _thaw(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _thaw(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_thaw(x) for x in v]
    return v


mutated_maps = st.builds(_mutate_map, st.sampled_from(SEED_MAPS),
                         st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1000), wild), max_size=3))


def check_typed(req: Any) -> None:
    """Validate for every engine; where it passes, render must give a JSON body httpx can send."""
    for backend in ENGINES:
        problems = validate(req, backend)
        for p in problems:
            named_problem(p)
        if any(p.is_error for p in problems):
            continue
        http = get_dialect(backend).render(req)
        assert http.path.startswith("/") and http.method in ("GET", "POST")
        if http.body is not None:  # httpx encodes with allow_nan=False: a NaN here would crash the send
            json.dumps(http.body, allow_nan=False)


@fuzz("request-maps", mutated_maps | wild)
def test_request_maps_to_typed(m: Any) -> None:
    req, problems = request_from_edn(m)
    for p in problems:
        named_problem(p)
    if req is None:
        assert any(p.is_error for p in problems)
        return
    check_typed(req)


@fuzz("typed-render", request_maps)
def test_valid_requests_render_for_every_engine(m: Any) -> None:
    req, problems = request_from_edn(m)
    for p in problems:
        named_problem(p)
    if req is not None:
        check_typed(req)
        # the client's own entry point raises only ValidationError
        client = BaseClient("http://127.0.0.1:9", backend="vllm")
        try:
            client._plan(client._to_request(m), "vllm")
        except E.ValidationError as e:
            named_error(e)


# ------------------------------------------------------------------ responses -> parsers (no server needed)

# Numbers no server should send but some do: Python's json reads NaN/Infinity, and a huge or negative
# count must never reach int() or a rate unchecked.
BAD_NUMBERS = st.sampled_from([math.nan, math.inf, -math.inf, -1, -1.5, 10**30, -10**30, 1e308, 2**64])
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
                           | BAD_NUMBERS,
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(
                               st.sampled_from(["choices", "message", "delta", "content", "text", "index", "usage",
                                                "finish_reason", "error", "tool_calls", "function", "timings",
                                                "data", "tokens", "meta_info", "object", "code", "id"]) | st.text(
                                   max_size=5), c, max_size=4), max_leaves=8)
CHAT = {kw("vllm/endpoint"): kw("chat"), kw("vllm/messages"): [{kw("vllm/role"): kw("user"),
                                                                   kw("vllm/content"): "hi"}]}
ENDPOINT_MAPS = {
    "chat": CHAT,
    "completion": {kw("vllm/endpoint"): kw("completion"), kw("vllm/prompt"): "hi"},
    "generate": {kw("vllm/endpoint"): kw("generate"), kw("vllm/prompt"): "hi"},
    "embedding": {kw("vllm/endpoint"): kw("embedding"), kw("vllm/input"): "hi"},
    "tokenize": {kw("vllm/endpoint"): kw("tokenize"), kw("vllm/text"): "hi"},
    "detokenize": {kw("vllm/endpoint"): kw("detokenize"), kw("vllm/tokens"): [1, 2]},
}


def _plans() -> list[Any]:
    out = []
    for backend in sorted(DIALECTS):
        client = BaseClient("http://127.0.0.1:9", backend=backend)
        for m in ENDPOINT_MAPS.values():
            req = client._to_request(m)
            if not any(p.is_error for p in validate(req, backend)):
                out.append(client._plan(req, backend))
    return out


PLANS = _plans()
bodies = st.one_of(json_values.map(lambda v: json.dumps(v).encode()), st.binary(max_size=40),
                   st.integers(500, 100_000).map(lambda n: b"[" * n + b"]" * n),
                   json_values.map(lambda v: json.dumps({"choices": [v]}).encode()))


@dataclasses.dataclass
class _Reply:
    status_code: int
    headers: dict[str, str]
    content: bytes


@fuzz("response-parse", st.tuples(st.sampled_from(PLANS), st.sampled_from([200, 200, 200, 400, 429, 500, 503]),
                                  bodies))
def test_any_answer_is_typed(case: tuple[Any, int, bytes]) -> None:
    plan, status, raw = case
    client = BaseClient(plan.base_url, backend=plan.dialect.name)
    try:
        client._finish(plan, _Reply(status, {"retry-after": "1"}, raw), 0.0, None)
    except TYPED as e:
        named_error(e)


stream_plans = [p for p in PLANS if p.request.endpoint in ("chat", "completion", "generate")]
chunks = st.lists(st.one_of(json_values.map(json.dumps), st.text(max_size=20), st.just("[DONE]"),
                            json_values.map(lambda v: json.dumps({"choices": [{"delta": v, "index": 0}]}))),
                  max_size=5)


@fuzz("stream-chunks", st.tuples(st.sampled_from(stream_plans), chunks, st.sampled_from([None, None, "error"])))
def test_any_stream_chunk_is_typed(case: tuple[Any, list[str], str | None]) -> None:
    plan, datas, event = case
    run = StreamRun(plan)
    try:
        for d in datas:
            run.on_data(d, event)
        run.on_end()
    except TYPED as e:
        named_error(e)


# ------------------------------------------------------------------ capacity and plan parsers

from kotoba_vllm import capacity  # noqa: E402
PROM_LINES = st.sampled_from([
    "llamacpp:requests_processing 1", "llamacpp:requests_deferred 0", "vllm:num_requests_running 2",
    'vllm:num_requests_waiting{model_name="m"} 3', "vllm:kv_cache_usage_perc 0.5", "sglang:num_running_reqs 1",
    "sglang:num_queue_reqs 0", "sglang:token_usage 0.1", "# TYPE x gauge", "# HELP x y", "x{a=\"b\" 1", "garbage",
    "vllm:num_requests_running NaN", "vllm:num_requests_running{tp_rank=\"1\"} 4", ""])
# Every gauge a verdict reads, with every value no server can mean (the NaN gauge that crashed `capacity`).
GAUGE_NAMES = ["llamacpp:requests_processing", "llamacpp:requests_deferred", "vllm:num_requests_running",
               "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "sglang:num_running_reqs",
               "sglang:num_queue_reqs", "sglang:token_usage"]
BAD_GAUGES = st.builds(lambda n, v: f"{n} {v}", st.sampled_from(GAUGE_NAMES),
                       st.sampled_from(["NaN", "+Inf", "-Inf", "-1", "1e308", "0", "1", "2"]))
PROM_LINES = PROM_LINES | BAD_GAUGES
prom_text = st.lists(PROM_LINES | st.text(max_size=12), max_size=6).map(lambda ls: "\n".join(ls).encode())
probe_bodies = st.one_of(prom_text, json_values.map(lambda v: json.dumps(v).encode()), st.binary(max_size=30),
                         st.lists(st.fixed_dictionaries({}, optional={"is_processing": st.booleans() | json_values}),
                                  max_size=3).map(lambda v: json.dumps(v).encode()),
                         st.fixed_dictionaries({}, optional={"total_slots": json_values,
                                                             "max_running_requests": json_values,
                                                             "server_load": json_values}).map(
                             lambda v: json.dumps(v).encode()))
fetched = st.builds(capacity.Fetched, path=st.sampled_from(sorted({p for ps in capacity.PROBE_PATHS.values()
                                                                   for p in ps})),
                    status=st.none() | st.sampled_from([200, 200, 200, 404, 500, 503]), body=probe_bodies,
                    error=st.none() | st.none() | st.just("connect refused"), ms=st.none() | st.floats(0, 100))


@fuzz("capacity", st.tuples(st.sampled_from([*capacity.PROBE_PATHS, None, "bogus"]), st.lists(fetched, max_size=4)))
def test_capacity_answers_from_any_probe(case: tuple[str | None, list[Any]]) -> None:
    backend, got = case
    answer = capacity.capacity_answer("http://127.0.0.1:9", backend, {f.path: f for f in got}, at="t")
    assert answer.verdict in capacity.VERDICTS
    edn = answer.to_edn()
    dumps(edn)
    if answer.verdict == capacity.UNMEASURED:  # unmeasured is never empty: it says why
        assert answer.enforced is False and answer.reason, answer
    pool = capacity.merge_pool_capacity([answer], at="t")
    capacity.demote_busy_endpoints(["http://127.0.0.1:9", "http://127.0.0.1:10"], [answer])
    dumps(pool.to_edn())
    assert_sane_numbers(edn)


def assert_sane_numbers(v: Any, where: str = "") -> None:
    """Every number we derived from a server is finite and non-negative."""
    if isinstance(v, bool) or v is None:
        return
    if isinstance(v, (int, float)):
        assert math.isfinite(v) and v >= 0, f"{where} = {v}"
    elif isinstance(v, dict):
        for k, x in v.items():
            assert_sane_numbers(x, f"{where} {k}")
    elif isinstance(v, (list, tuple)):
        for x in v:
            assert_sane_numbers(x, where)


from kotoba_vllm._model import Usage, to_edn  # noqa: E402
from kotoba_vllm._timings import ClientClock, build_timings, llamacpp_server_timings, sglang_server_timings  # noqa: E402

TIMING_KEYS = ["prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "cache_n", "prompt_tokens",
               "completion_tokens", "cached_tokens", "prefill_launch_latency", "decode_throughput"]
timing_objects = st.dictionaries(st.sampled_from(TIMING_KEYS), json_values | BAD_NUMBERS, max_size=6)
usages = st.none() | st.builds(Usage, prompt_tokens=st.none() | st.integers(0, 10**6),
                               completion_tokens=st.none() | st.integers(0, 10**6),
                               cached_tokens=st.none() | st.integers(0, 10**6))


@fuzz("timings", st.tuples(timing_objects, st.sampled_from(["llamacpp", "sglang"]), usages))
def test_timings_from_any_server_numbers(case: tuple[dict[str, Any], str, Any]) -> None:
    obj, engine, usage = case
    parse = llamacpp_server_timings if engine == "llamacpp" else sglang_server_timings
    timings = build_timings(parse(obj), usage, ClientClock(sent=0.0, first_token=0.1, last_token=0.3, done=0.4,
                                                          token_times=(0.1, 0.2, 0.3)))
    edn = to_edn(timings)
    dumps(edn)
    json.dumps(_plain(edn), allow_nan=False)  # the batch JSONL writer refuses NaN: none may get there
    assert_sane_numbers(edn)


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)


from kotoba_vllm import distributed as dist  # noqa: E402

DIST_SEEDS = [next(read_forms(p.read_text(encoding="utf-8"), str(p))).value
              for p in sorted((ROOT / "examples" / "distributed").glob("*.edn"))]
mutated_specs = st.builds(_mutate_map, st.sampled_from(DIST_SEEDS),
                          st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1000), wild), max_size=4))


@fuzz("plan", st.tuples(mutated_specs | wild, st.sampled_from([None, "vllm", "sglang", "llamacpp"])))
def test_plan_from_any_spec(case: tuple[Any, str | None]) -> None:
    raw, engine = case
    text = dumps(raw)
    form = next(read_forms(text, "spec.edn"), None)
    spec, problems = dist.spec_from_edn(form.value if form else raw, form)
    for p in problems:
        named_problem(p)
    if spec is None:
        return
    p, more = dist.plan(spec, engine)
    for q in more:
        named_problem(q)
    if p is not None:
        dist.shell_lines(dist.emit(p))


# ------------------------------------------------------------------ run (the CLI) against the fault server


@pytest.fixture(scope="module")
def canned() -> Iterator[FaultServer]:
    with FaultServer() as srv:
        yield srv


def test_cli_run_on_fuzzed_files(canned: FaultServer, request: pytest.FixtureRequest,
                                 tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kotoba_vllm._edn import read_all
    from kotoba_vllm.cli import main

    n = BUDGET["cli-run"] * (LONG_FACTOR if long_selected(request.config) else 1)
    path = tmp_path / "req.edn"

    @settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(request_maps.map(dumps), mutated_text, mutated_maps.map(dumps)))
    def run(text: str) -> None:
        TRIED["cli-run"] += 1
        text = text.replace("http://localhost:8000", canned.base_url)  # the strategies' base URL: ours
        path.write_text(text, encoding="utf-8")
        capsys.readouterr()
        rc = main(["run", str(path), "--base-url", canned.base_url, "-b", "vllm", "--timeout", "5"])
        out, err = capsys.readouterr()
        assert rc in (0, 1, 2), rc
        if rc == 2:  # unreadable EDN: one located line on stderr
            assert err.startswith("error: ") and "req.edn:" in err
            return
        for record in read_all(out):  # every line is EDN: a response, a delta, or a typed error map
            assert isinstance(record, dict)

    run()
