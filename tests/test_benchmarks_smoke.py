"""The benchmark harness runs end to end (tiny counts) so it cannot rot. No timing is asserted."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kotoba_vllm._edn import kw, read_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")


@pytest.fixture(scope="module")
def canned():
    sys.path.insert(0, BENCH)
    try:
        from canned_server import CannedServer
        with CannedServer(chunks=20) as srv:
            yield srv
    finally:
        sys.path.remove(BENCH)


def test_canned_server_answers_chat_and_streams_through_the_client(canned) -> None:
    from kotoba_vllm import Client

    with Client(canned.base_url, backend="openai", model="canned") as c:
        r = c.chat("hi", max_tokens=4)
        assert r.text == "Hello there, friend." and r.usage.total_tokens == 13
        assert r.endpoint_url == canned.base_url + "/v1/chat/completions"
        with c.stream_chat("hi", max_tokens=30) as s:
            deltas = [d.delta for d in s if d.delta]
        assert len(deltas) == 30 and s.response is not None
        assert s.response.text == "".join(deltas) and s.response.usage.completion_tokens == 30
        assert c.health().ok


def test_harness_prints_ratios_and_writes_edn(tmp_path) -> None:
    r = subprocess.run([sys.executable, os.path.join(BENCH, "run.py"), "--smoke", "--no-llama", "--only", "abcdefh", "--out",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for scenario in ("a. latency", "b. client CPU per request", "c. client CPU per streamed chunk",
                     "d. AsyncClient CPU per request, conc 4", "d. run CPU per request, conc 4",
                     "d. connections at the server, conc 4",
                     "d. AsyncClient CPU / raw aiohttp's paired by round, conc 4",
                     "d. run CPU / raw aiohttp's paired by round, conc 4", "d. run --pool (2 members), conc 4",
                     "d. run --pool time per request, conc 4",
                     "d. heap per open stream", "e. read EDN file",
                     "e. render one response", "f. batch run",
                     "h. flow control CPU per request, never rejects, conc 4",
                     "h. flow control CPU per request, 8 slots + 429, conc 4",
                     "h. flow control CPU per request, 8 slots + 429, conc 4 against a fixed -c 8"):
        assert scenario in r.stdout, scenario
    assert "nproc=" in r.stdout and "x  " in r.stdout  # machine size and ratio columns
    [path] = list(tmp_path.iterdir())
    [form] = read_file(str(path))
    result = form.value
    assert result[kw("bench/machine")][kw("bench/nproc")] == os.cpu_count()
    rows = result[kw("bench/rows")]
    batch = [x for x in rows if x[kw("bench/scenario")].startswith("f. batch run")][0]
    assert batch[kw("bench/note")].count("rc 0/0") == 1  # both batch runs answered every request
    assert all(kw("bench/ratios") in x for x in rows)
    # every contender got every answer right, each in its own process
    throughput = result[kw("bench/throughput")]
    assert throughput and all(t[kw("bench/good-min")] == t[kw("bench/n")] for t in throughput
                              if not t[kw("bench/contender")].startswith(("kotoba-run-slots", "aiohttp-slots")))
    # flow control on and off each ran against both servers, each with its ratio to off in the same round
    flow = {t[kw("bench/contender")]: t for t in throughput if kw("bench/server") in t}
    assert set(flow) == {"kotoba-run-flow-on", "kotoba-run-flow-off", "kotoba-run-flow-off-again", "kotoba-run-slots",
                         "kotoba-run-slots-flow-off", "kotoba-run-slots-flow-off-again", "kotoba-run-slots-fixed",
                         "aiohttp-slots", "aiohttp-slots-fixed"}
    assert flow["kotoba-run-flow-on"][kw("bench/paired-cpu-ratio")] > 0
    assert flow["kotoba-run-slots"][kw("bench/paired-cpu-ratio")] > 0
    assert flow["kotoba-run-slots"][kw("bench/paired-cpu-ratio-to-fixed")] > 0
    assert flow["kotoba-run-slots-fixed"][kw("bench/concurrency")] == 8  # the fixed limit is the slots
    # the floor: raw aiohttp within the slots over raw aiohttp flooding them, paired by round
    assert flow["aiohttp-slots-fixed"][kw("bench/concurrency")] == 8
    assert flow["aiohttp-slots-fixed"][kw("bench/paired-cpu-ratio-to-flood")] > 0
    assert any(x[kw("bench/scenario")].startswith("h. the floor of the pairing") for x in rows)
    pool = [t for t in throughput if t[kw("bench/contender")] == "kotoba-run-pool"]
    assert pool and all(t[kw("bench/paired-cpu-ratio")] > 0 for t in pool)
    assert "paired by round" in r.stdout
    # at 4 in flight the pool group gets a round of its own beyond the one every contender has
    rounds = {t[kw("bench/contender")]: t[kw("bench/rounds")] for t in throughput if t[kw("bench/concurrency")] == 4}
    assert rounds["kotoba-run-pool"] == rounds["kotoba-run-vllm"] == rounds["kotoba-run"] == 2
    assert rounds["aiohttp"] == rounds["kotoba"] == 1


def test_a_ratio_paired_by_round_cancels_the_machine_changing_speed_between_rounds() -> None:
    """Both contenders slow down together in some rounds (this machine's two CPU levels): the ratio of the
    two medians reads whichever levels the medians landed on; the per-round ratio reads the contenders."""
    sys.path.insert(0, BENCH)
    try:
        import _throughput
    finally:
        sys.path.remove(BENCH)
    levels = [1.0, 1.6, 1.6, 1.0, 1.6]  # the machine's speed per round
    base = [{"cpu_s": 0.75 * x, "wall_s": 0.8 * x} for x in levels]
    same_cost = [{"cpu_s": 0.75 * x, "wall_s": 0.8 * x} for x in [1.6, 1.6, 1.6, 1.0, 1.6]]  # one flip off
    p = _throughput.paired(same_cost, base)
    assert p is not None and p["cpu"] == 1.0 and p["throughput"] == 1.0 and p["rounds"] == 5
    dearer = [{"cpu_s": 0.9 * x, "wall_s": 0.96 * x} for x in levels]  # 20% more per request, every round
    p = _throughput.paired(dearer, base)
    assert p is not None and abs(p["cpu"] - 1.2) < 1e-9 and abs(p["throughput"] - 1 / 1.2) < 1e-9
    assert _throughput.paired([{"error": "x"}], base[:1]) is None


def _bench_module(name: str):  # type: ignore[no-untyped-def]
    import importlib
    sys.path.insert(0, BENCH)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(BENCH)


def test_one_in_flight_is_compared_with_the_newest_earlier_full_result_file(tmp_path) -> None:
    """The "no worse than the predecessor" target reads the file written just before this run's, from that
    file's own figures; quick and smoke runs are never a predecessor. Paired by round when both files hold
    that figure, else as ratios of medians; the other reading is in the note and the README's table."""
    from kotoba_vllm._edn import pretty
    run = _bench_module("run")
    readme_table = _bench_module("readme_table")

    def result(kotoba: float, kotoba_run: float, httpx: float, paired: float | None = None) -> str:
        tp = [{"contender": c, "concurrency": 1, "cpu_ms_per_req": v}
              for c, v in (("kotoba", kotoba), ("kotoba-run", kotoba_run), ("httpx", httpx))]
        if paired is not None:
            tp[0]["paired_cpu_ratio_to_httpx"] = paired
        return pretty(run.to_edn_result("d", {"nproc": 2}, [], [], tp)) + "\n"
    (tmp_path / "2026-12-01T002716Z.edn").write_text(result(1.0, 1.4, 2.0, paired=0.51))
    (tmp_path / "2026-11-30T215059Z.edn").write_text(result(9.0, 9.0, 1.0))  # older
    (tmp_path / "2026-12-01T010000Z-quick.edn").write_text(result(9.0, 9.0, 1.0))  # not a full run
    (tmp_path / "2026-12-02T000000Z.edn").write_text(result(9.0, 9.0, 1.0))  # later than this run
    pred = run.predecessor(str(tmp_path), "2026-12-01T030000Z.edn")
    assert pred is not None and pred.endswith("2026-12-01T002716Z.edn")
    now = [{"contender": "kotoba", "concurrency": 1, "cpu_ms_per_req": 1.1, "paired_cpu_ratio_to_httpx": 0.52},
           {"contender": "kotoba-run", "concurrency": 1, "cpu_ms_per_req": 1.3, "paired_cpu_ratio_to_httpx": 0.6},
           {"contender": "httpx", "concurrency": 1, "cpu_ms_per_req": 2.0}]
    rows = run.predecessor_rows(now, pred)
    by = {r["scenario"]: r for r in rows}
    a, b = by["d. AsyncClient CPU / raw httpx's, conc 1"], by["d. run CPU / raw httpx's, conc 1"]
    # AsyncClient: both files paired by round, 0.52x now against 0.51x before: worse
    assert a["values"] == {"kotoba": 0.52, "predecessor": 0.51} and a["targets"] == {"predecessor<=1.0": False}
    assert "0.550x now, 0.500x then" in a["note"] and "2026-12-01T002716Z.edn" in a["note"]
    # run: the predecessor has no paired figure, so medians: 0.65x against 0.70x
    assert abs(b["values"]["kotoba"] - 0.65) < 1e-9 and b["targets"] == {"predecessor<=1.0": True}
    assert "paired by round: 0.600x now, - then" in b["note"]
    assert run.predecessor_rows(now, None) == []
    # the README's table says which file, both readings, and which target was missed
    this = tmp_path / "this.edn"
    this.write_text(pretty(run.to_edn_result("d", {"nproc": 2}, rows, [], now)) + "\n")
    text = "\n".join(readme_table.predecessor_table(readme_table.load(str(this))))
    assert ("| `AsyncClient` | 0.520x | 0.510x (2026-12-01T002716Z.edn) | **missed** | paired by round in both; "
            "ratios of medians: 0.550x now, 0.500x then |") in text
    assert "| `run` | 0.650x | 0.700x (2026-12-01T002716Z.edn) | met | ratios of medians;" in text


def test_instruction_counts_sit_beside_the_predecessor_files_and_a_missing_count_is_never_zero(
        tmp_path, monkeypatch) -> None:
    from kotoba_vllm._edn import pretty
    run = _bench_module("run")
    old = run.instruction_rows({"run at 1 in flight": 1043.6}, None)
    assert old[0]["values"] == {"kotoba": 1043.6, "predecessor": None}
    assert "the predecessor has no count" in old[0]["note"] and old[0]["targets"] == {}
    pred = tmp_path / "2026-12-01T002716Z.edn"
    pred.write_text(pretty(run.to_edn_result("d", {"nproc": 2}, old, [], [])) + "\n")
    [now] = run.instruction_rows({"run at 1 in flight": 990.0}, str(pred))
    assert now["scenario"] == "g. instructions per request, run at 1 in flight"
    assert now["values"] == {"kotoba": 990.0, "predecessor": 1043.6}
    assert abs(now["ratios"]["predecessor"] - 990.0 / 1043.6) < 1e-9 and "no count" not in now["note"]
    readme_table = _bench_module("readme_table")
    this = tmp_path / "this.edn"
    this.write_text(pretty(run.to_edn_result("d", {"nproc": 2}, [now], [], [])) + "\n")
    text = "\n".join(readme_table.instructions_table(readme_table.load(str(this))))
    assert "| run at 1 in flight | 990.0 | 1043.6 | 0.949x |" in text
    # without valgrind nothing is counted and a note says so: no row, no zero
    monkeypatch.setattr(run.shutil, "which", lambda _: None)
    counts, notes = run.instruction_counts(lambda _: None)
    assert counts == {} and notes == ["g not measured: valgrind is not installed"]
    assert run.instruction_rows(counts, str(pred)) == []


def test_instruction_counts_are_summed_per_function_and_the_collector_is_set_apart(tmp_path) -> None:
    """`instructions.py` reads cachegrind's output itself: every function's lines summed, and the cyclic
    collector's share (its module and the containers' traverse walks) kept apart, since whether one collection
    lands between two batch sizes is luck."""
    instructions = _bench_module("instructions")
    out = tmp_path / "cachegrind.out"
    out.write_text("desc: I1 cache: 32768 B, 64 B, 8-way associative\ncmd: python x\nevents: Ir\n"
                   "fl=/src/Python/ceval.c\nfn=_PyEval_EvalFrameDefault\n10 1000\n11 500\n"
                   "fl=/src/Modules/gcmodule.c\nfn=gc_collect_main\n5 300\n"
                   "fl=/src/Objects/dictobject.c\nfn=dict_traverse\n7 40\nfn=insertdict\n9 60\n"
                   "fl=/src/Objects/tupleobject.c\nfn=tupletraverse\n3 7\n"
                   "summary: 1907\n")
    assert instructions.counts(str(out)) == (1907, 347)


def test_the_pool_is_counted_over_two_members_against_one_member_of_the_same_backend(tmp_path) -> None:
    """`instructions.py pool` runs the CLI over both of the canned server's ports, `vllm` the same CLI against
    one of them with the same backend; the pool's probe interval is stretched by valgrind's slowdown, so a
    counted run takes as many probe rounds per request as a real one."""
    instructions = _bench_module("instructions")
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    pool = instructions.argv_for("pool", 10, 256, urls, str(tmp_path))
    one = instructions.argv_for("vllm", 10, 256, urls, str(tmp_path))
    assert pool[pool.index("--backend") + 1] == one[one.index("--backend") + 1] == "vllm"
    assert [pool[i + 1] for i, a in enumerate(pool) if a == "--base-url"] == urls
    assert [one[i + 1] for i, a in enumerate(one) if a == "--base-url"] == urls[:1]
    assert float(pool[pool.index("--capacity-interval") + 1]) > 0.5 and "--capacity-interval" not in one
    assert (tmp_path / "requests-10.edn").read_text().count("\n") == 10
    assert instructions.sizes_for(256) == (1000, 3000) and instructions.sizes_for(1) == (100, 300)
