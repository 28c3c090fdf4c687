"""Ray Data on a real local cluster (two nodes on loopback, capped for a 2-core machine) against two
real llama-servers: one record per input through a server restart and a killed worker actor, and the
servers' own counters equal what the records say was sent."""

from __future__ import annotations

import glob
import json
import os
import re
import threading
import time
from typing import Any, Iterator

import httpx
import pytest

from kotoba_vllm._edn import kw, read_one

ray = pytest.importorskip("ray", reason="the ray extra is not installed") if os.environ.get(
    "KOTOBA_VLLM_REQUIRE_LIVE") != "1" else __import__("ray")

pytestmark = pytest.mark.live

MB = 1024 * 1024
KEY = "sk-kotoba-ray-test-0123456789"  # llama-server is started with it: a worker without it gets 401
N = 2000
BLOCK = 200


def _metric(url: str, name: str = "llamacpp:tokens_predicted_total") -> float:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=5).text
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, text[:500]
    return float(m.group(1))


def _server(port: int | None = None) -> Any:
    from kotoba_vllm.local import LlamaServer
    return LlamaServer(n_ctx=512, parallel=2, threads=1, port=port, extra_args=["--api-key", KEY]).start()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two Ray nodes on loopback, 2 logical CPUs (the requests mostly wait) and 150 MB of object store each. The workers inherit the key
    from this process's environment, the way a user configures it; nothing passes it to Ray."""
    from ray.cluster_utils import Cluster
    import _ray_faults
    os.environ["KOTOBA_VLLM_API_KEY"] = KEY
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 150 * MB})
    c.add_node(num_cpus=2, object_store_memory=150 * MB)
    ray.init(address=c.address, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(_ray_faults)  # workers do not have tests/ on their path
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        os.environ.pop("KOTOBA_VLLM_API_KEY", None)


@pytest.fixture(scope="module")
def servers() -> Iterator[list[Any]]:
    started = [_server(), _server()]
    try:
        yield started
    finally:
        for s in started:  # the restart test replaces one in place
            s.stop()


def _line(i: int) -> str:
    body: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": f"count to {i % 40}"}],
                            "max_tokens": 2, "temperature": 0.0}
    if i % 97 == 5:
        body["frobnicate"] = True  # a field with no EDN meaning: validation, never sent
    if i % 101 == 7:
        body["temperature"] = 7.5  # out of range
    if i == 1234:
        return "{not json"
    return json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})


def _invalid(i: int) -> bool:
    return i % 97 == 5 or i % 101 == 7 or i == 1234


def _rows(out: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq
    rows: list[dict[str, Any]] = []
    for path in sorted(glob.glob(os.path.join(out, "part-*.parquet"))):  # the typed columns
        part = pq.read_table(path).to_pylist()
        idx = [r["request_index"] for r in part]
        lo, hi = map(int, re.findall(r"\d+", os.path.basename(path)))
        assert idx == list(range(lo, hi + 1)), path  # ordered, named by its range, nothing missing
        rows += part
    return rows


def _chaos(conductor: Any, servers: list[Any], log: dict[str, Any]) -> None:
    """Stop server B while nothing is in flight, keep it down while requests flow, restart it on the
    same port, then arm the kill of one actor."""
    def wait_answers(n: int) -> None:
        while ray.get(conductor.state.remote())[1] < n:
            time.sleep(0.05)

    b = servers[1]
    wait_answers(400)
    conductor.close.remote()
    while ray.get(conductor.state.remote())[0] > 0:
        time.sleep(0.02)
    log["b_before_stop"] = _metric(b.base_url)
    port = b.port
    b.stop()
    conductor.reopen.remote()
    wait_answers(ray.get(conductor.state.remote())[1] + 150)
    servers[1] = _server(port)
    log["restarted"] = True
    wait_answers(1100)
    conductor.arm_kill.remote()


def test_two_nodes_a_restarted_server_and_a_killed_actor_still_give_one_record_per_input(
        cluster: Any, servers: list[Any], tmp_path: Any) -> None:
    from _ray_faults import Conductor, FaultyStage
    from kotoba_vllm.pool import PoolConfig
    from kotoba_vllm.ray._driver import run_pipeline

    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    src = tmp_path / "in.jsonl"
    src.write_text("".join(_line(i) + "\n" for i in range(N)))
    out = str(tmp_path / "out")
    base = [_metric(s.base_url) for s in servers]
    conductor = ray.remote(num_cpus=0)(Conductor).options(name="conductor").remote()
    held_file = str(tmp_path / "held.json")
    log: dict[str, Any] = {}
    chaos = threading.Thread(target=_chaos, args=(conductor, servers, log), daemon=True)
    chaos.start()
    pool = PoolConfig(tuple(s.base_url for s in servers), "llamacpp", 1.0)
    stats = run_pipeline(str(src), out, pool=pool, block_rows=BLOCK, actors=2, actor_cpus=0.25, concurrency=4,
                         timeout=30, stage=FaultyStage, output_format="parquet",
                         stage_kwargs={"conductor": "conductor", "held_file": held_file})
    chaos.join(timeout=60)
    assert log.get("restarted") and ray.get(conductor.killed.remote())

    rows = _rows(out)
    assert sorted(r["request_index"] for r in rows) == list(range(N))  # exactly one record per input
    assert stats["rows"] == N and stats["files"] >= N // BLOCK
    by_kind: dict[str, set[int]] = {}
    for r in rows:
        by_kind.setdefault("ok" if r["ok"] else r["error"], set()).add(r["request_index"])
    assert by_kind["validation"] == {i for i in range(N) if _invalid(i)}
    # While B is down or loading its model again, a request the pool sends it (an unmeasured member, taken
    # when A is measured full) ends unreachable (refused) or not-ready (llama-server's 503 while loading)
    assert set(by_kind) <= {"ok", "validation", "unreachable", "not-ready", "admission-rejected"}, by_kind.keys()
    for r in rows:
        rec = read_one(r["record"])
        assert rec[kw("vllm/request-index")] == r["request_index"]
        assert (rec.get(kw("vllm/maybe-sent-twice")) is True) == r["maybe_sent_twice"]
        if r["ok"]:
            assert r["completion_tokens"] >= 1 and r["endpoint_url"] and r["decode_provenance"]
            assert r["request_id"] == f"req-{r['request_index']}"

    # The kill: every request the actor held was answered by a server and resent by the re-executed
    # block, and exactly those records say maybe-sent-twice.
    with open(held_file, encoding="utf-8") as fh:
        held = json.load(fh)
    assert held, "the killed actor held no answers"
    assert {h["index"] for h in held} == {r["request_index"] for r in rows if r["maybe_sent_twice"]}

    # The servers' own counters: every answered record, plus the first execution of each resent one.
    after = [_metric(s.base_url) for s in servers]
    served = (after[0] - base[0]) + (log["b_before_stop"] - base[1]) + after[1]
    recorded = sum(r["completion_tokens"] for r in rows if r["ok"])
    first_sends = sum(h["completion_tokens"] for h in held)
    assert served == recorded + first_sends, (served, recorded, first_sends)

    # The key reached the workers through their environment (the servers demand it) and nothing wrote it down.
    assert "unauthorized" not in json.dumps([r["record"] for r in rows]).lower()
    session = ray._private.worker._global_node.get_session_dir_path()
    for path in glob.glob(os.path.join(session, "logs", "**", "*"), recursive=True) + glob.glob(
            os.path.join(out, "**", "*"), recursive=True):
        if os.path.isfile(path):
            with open(path, "rb") as fh:
                assert KEY.encode() not in fh.read(), path


def _pool_file(tmp_path: Any, servers: list[Any]) -> str:
    path = tmp_path / "pool.edn"
    members = " ".join(f'"{s.base_url}"' for s in servers)
    path.write_text(f"{{:pool/members [{members}] :pool/backend :llamacpp :pool/probe-timeout-s 1.0}}\n")
    return str(path)


CHAT_EDN = '{{:vllm/endpoint :chat :vllm/model "tiny" :vllm/messages [{{:vllm/role :user :vllm/content "n {i}"}}] '\
           ':vllm/sampling {{:vllm/max-tokens 2 :vllm/temperature 0.0}} :vllm/request-id "e{i}"}}'


def test_parquet_in_and_out_and_resume_sends_only_what_has_no_record(cluster: Any, servers: list[Any],
                                                                       tmp_path: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from kotoba_vllm.cli import main

    requests = [CHAT_EDN.format(i=i) for i in range(30)]
    requests[4] = _line(4)  # a batch JSONL line in the same column
    requests[9] = '{:vllm/endpoint :chat :vllm/messages "not a vector"}'
    requests[17] = "{:vllm/endpoint"  # does not read
    src = str(tmp_path / "in.parquet")
    pq.write_table(pa.table({"request": requests, "tag": [f"t{i}" for i in range(30)]}), src, row_group_size=10)
    out = str(tmp_path / "out")
    pool = _pool_file(tmp_path, servers)
    argv = ["run", src, "--ray", "--pool", pool, "-o", out, "--block-rows", "8", "--no-progress"]
    assert main(argv) == 1  # two requests are invalid

    def table() -> Any:
        files = sorted(glob.glob(os.path.join(out, "part-*.parquet")))
        for f in files:
            idx = pq.read_table(f).column("request_index").to_pylist()
            lo, hi = map(int, re.findall(r"\d+", os.path.basename(f)))
            assert idx == list(range(lo, hi + 1))
        return pa.concat_tables([pq.read_table(f) for f in files]).sort_by("request_index")

    t = table()
    assert t.column("request_index").to_pylist() == list(range(30))
    assert t.column("tag").to_pylist() == [f"t{i}" for i in range(30)]  # the input row comes back whole
    assert t.schema.field("ok").type == pa.bool_() and t.schema.field("completion_tokens").type == pa.int64()
    errors = dict(zip(t.column("request_index").to_pylist(), t.column("error").to_pylist()))
    assert {i for i, e in errors.items() if e} == {9, 17}
    assert t.column("request_id").to_pylist()[4] == "req-4"
    summary = read_one(open(os.path.join(out, "summary.edn")).read())
    assert summary[kw("batch/recorded")] == 30 and summary[kw("batch/outcomes")][kw("validation")] == 2
    schema = read_one(open(os.path.join(os.path.dirname(__file__), "..", "schemas", "ray.edn")).read())
    assert set(summary) == set(schema[kw("shape/RaySummary")][kw("schema/keys")])
    # batch_line is made only for JSONL output (a run-batch line per row); Parquet keeps the typed columns
    assert [f"column/{c}" for c in t.column_names if c not in ("request", "tag", "where")] == \
        [k.name for k in schema[kw("shape/RayRow")] if k.name != "column/batch_line"]

    # Lose one part file (its records), then --resume: only those inputs are sent again.
    victim = sorted(glob.glob(os.path.join(out, "part-*.parquet")))[1]
    lost = pq.read_table(victim).column("request_index").to_pylist()
    os.remove(victim)
    before = sum(_metric(s.base_url) for s in servers)
    assert main(argv + ["--resume"]) in (0, 1)
    t = table()
    assert t.column("request_index").to_pylist() == list(range(30))
    summary = read_one(open(os.path.join(out, "summary.edn")).read())
    assert summary[kw("batch/already-done")] == 30 - len(lost)
    assert summary[kw("batch/recorded")] == len(lost)
    resent = t.filter(pa.compute.is_in(t.column("request_index"), pa.array(lost)))
    tokens = sum(n or 0 for n, ok in zip(resent.column("completion_tokens").to_pylist(),
                                         resent.column("ok").to_pylist()) if ok)
    assert sum(_metric(s.base_url) for s in servers) - before == tokens


def test_edn_input_streams_and_edn_output_holds_the_records_run_writes(cluster: Any, servers: list[Any],
                                                                          tmp_path: Any) -> None:
    from kotoba_vllm.cli import main

    forms = [CHAT_EDN.format(i=i) for i in range(12)]
    forms[3] = forms[3].replace(":vllm/temperature 0.0", ":vllm/temperature 9.0")
    forms[8] = '{:vllm/endpoint :chat :vllm/model "tiny" :vllm/nonsense 1 :vllm/messages []}'
    src = tmp_path / "in.edn"
    src.write_text(";; a vector of requests, one per line\n[\n" + "\n".join("  " + f for f in forms) + "\n]\n")
    out = str(tmp_path / "out")
    pool = _pool_file(tmp_path, servers)
    assert main(["run", str(src), "--ray", "--pool", pool, "-o", out, "--format", "edn", "--block-rows", "5",
                 "--no-progress"]) == 1
    plain = str(tmp_path / "plain.edn")
    assert main(["run", str(src), "--pool", pool, "-o", plain, "--no-progress"]) == 1
    ray_lines = [line for f in sorted(glob.glob(os.path.join(out, "part-*.edn"))) for line in open(f)]
    plain_lines = open(plain).read().splitlines(keepends=True)
    assert len(ray_lines) == len(plain_lines) == 12
    for i in (3, 8):  # validation records: the same text, located at the same line and column
        assert ray_lines[i] == plain_lines[i]
        assert f"{src}:{i + 3}:3" in ray_lines[i]
    for r, p in zip(ray_lines, plain_lines):  # answers: the same record shape
        assert set(read_one(r)) == set(read_one(p))


def _kill_a_request_actor_at_a_random_moment(out: str, delay: float, log: dict[str, Any]) -> None:
    """SIGKILL one request actor's process `delay` seconds after the first request was logged as sent:
    wherever that lands (mid-request, between blocks, while writing its intent log, or after the last
    answer), nothing the test checks may depend on it."""
    import psutil
    deadline = time.monotonic() + 60
    intent = os.path.join(out, ".intent")
    while not (os.path.isdir(intent) and os.listdir(intent)) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(delay)
    for p in psutil.process_iter(["cmdline"]):
        if any("MapWorker" in part for part in p.info["cmdline"] or ()):
            p.send_signal(9)
            log["killed"] = p.pid
            return


def test_a_worker_killed_at_a_random_moment_leaves_one_record_per_input_and_flags_explain_the_counters(
        cluster: Any, servers: list[Any], tmp_path: Any) -> None:
    import random

    from kotoba_vllm.pool import PoolConfig
    from kotoba_vllm.ray._driver import run_pipeline

    seed = random.randrange(1 << 30)
    delay = random.Random(seed).uniform(0.0, 3.0)
    n, max_tokens = 160, 2
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"custom_id": f"k{i}", "method": "POST", "url": "/v1/chat/completions",
                                       "body": {"model": "tiny", "max_tokens": max_tokens, "temperature": 0.0,
                                                "messages": [{"role": "user", "content": f"say {i % 30}"}]}})
                           + "\n" for i in range(n)))
    out = str(tmp_path / "out")
    log: dict[str, Any] = {}
    killer = threading.Thread(target=_kill_a_request_actor_at_a_random_moment, args=(out, delay, log), daemon=True)
    before = sum(_metric(s.base_url) for s in servers)
    killer.start()
    stats = run_pipeline(str(src), out, pool=PoolConfig(tuple(s.base_url for s in servers), "llamacpp", 1.0),
                         block_rows=20, actors=2, actor_cpus=0.25, concurrency=4, timeout=30, output_format="parquet")
    killer.join(timeout=60)
    note = f"seed {seed}, kill after {delay:.2f} s, killed pid {log.get('killed')}"
    rows = _rows(out)
    assert sorted(r["request_index"] for r in rows) == list(range(n)), note
    assert stats["rows"] == n and all(r["ok"] for r in rows), note
    # The server counted every recorded answer, and at most one earlier execution of each flagged record
    # (that first execution may have been cut short by the kill, so up to max_tokens more each).
    served = sum(_metric(s.base_url) for s in servers) - before
    recorded = sum(r["completion_tokens"] for r in rows)
    flagged = sum(1 for r in rows if r["maybe_sent_twice"])
    assert recorded <= served <= recorded + flagged * max_tokens, (served, recorded, flagged, note)


# made per send: ids, clocks, timings, and the prefix cache's hits (the second run finds the first one's prefixes)
_GENERATED = {"id", "request_id", "created", "timings", "cached_tokens"}


def _comparable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _comparable(x) for k, x in v.items() if k not in _GENERATED}
    if isinstance(v, list):
        return [_comparable(x) for x in v]
    return v


def test_batch_jsonl_gives_the_same_records_through_run_and_run_ray(cluster: Any, servers: list[Any],
                                                                     tmp_path: Any) -> None:
    from kotoba_vllm.cli import main

    src = tmp_path / "in.jsonl"
    src.write_text("".join(_line(i) + "\n" for i in range(12)))  # lines 5 and 7 are invalid
    out, plain = str(tmp_path / "out"), str(tmp_path / "plain.jsonl")
    base = ["--base-url", servers[0].base_url, "--backend", "llamacpp", "--no-progress"]
    assert main(["run", str(src), "--ray", "-o", out, "--block-rows", "5", *base]) == 1
    assert main(["run", str(src), "-o", plain, *base]) == 1
    ray_records = [json.loads(line) for f in sorted(glob.glob(os.path.join(out, "part-*.jsonl"))) for line in open(f)]
    plain_records = [json.loads(line) for line in open(plain)]
    assert len(ray_records) == len(plain_records) == 12
    assert [r["custom_id"] for r in ray_records] == [f"req-{i}" for i in range(12)]
    for r, p in zip(ray_records, plain_records):  # field by field, only file layout differing
        assert set(r) == set(p) == {"id", "custom_id", "response", "error", "kotoba"}
        assert _comparable(r) == _comparable(p)
    assert [r["error"]["code"] if r["error"] else None for r in ray_records].count("validation") == 2
