"""The README's performance tables are generated from the committed result file they name, not typed in."""

from __future__ import annotations

import importlib.util
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme_table() -> object:
    spec = importlib.util.spec_from_file_location("readme_table", os.path.join(ROOT, "benchmarks", "readme_table.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_each_readme_table_is_what_its_named_result_file_generates() -> None:
    rt = _readme_table()
    for readme in ("README.md", os.path.join("benchmarks", "README.md")):
        doc = open(os.path.join(ROOT, readme), encoding="utf-8").read()
        block = re.search(re.escape(rt.BEGIN) + r"\n(.*?)\n" + re.escape(rt.END), doc, re.S)  # type: ignore[attr-defined]
        assert block, f"{readme}: no generated performance table"
        names = list(dict.fromkeys(re.findall(r"`benchmarks/results/([^`]+)`", block.group(1))))
        assert names, f"{readme}: the tables do not name their result files"
        paths = [os.path.join(ROOT, "benchmarks", "results", n) for n in names]
        for path in paths:
            assert os.path.exists(path), f"{readme} names {path}, which is not committed"
        assert block.group(1) == rt.sections([(n, rt.load(p)) for n, p in zip(names, paths)]), (  # type: ignore[attr-defined]
            f"{readme}: the tables differ from what benchmarks/readme_table.py makes of {', '.join(names)}; run "
            f"`python benchmarks/readme_table.py {' '.join(os.path.relpath(p, ROOT) for p in paths)} --write`")


def test_sync_table_marks_each_target_from_the_file_ratios() -> None:
    rt = _readme_table()
    result = {"rows": [
        {"scenario": "b. client CPU per request", "server": "canned", "unit": "us",
         "values": {"kotoba": 300.0, "httpx": 600.0, "http.client": 150.0}, "ratios": {"httpx": 0.5}},
        {"scenario": "c. client CPU per streamed chunk", "server": "canned", "unit": "us",
         "values": {"kotoba": 12.5, "httpx": 10.0}, "ratios": {"httpx": 1.25}}]}
    lines = rt.sync_table(result)  # type: ignore[attr-defined]
    cpu = next(line for line in lines if line.startswith("| CPU per request"))
    chunk = next(line for line in lines if line.startswith("| CPU per streamed chunk"))
    assert "| 300.0 | 600.0 | 150.0 | — |" in cpu and "0.50x | <= 1.1x met |" in cpu
    assert "1.25x | <= 1.2x **missed** |" in chunk


def test_tables_from_several_files_name_each_and_paired_rows_mark_their_targets() -> None:
    """A run of some scenarios only leaves the others to an earlier file: each table comes from the first file
    that holds it and names it; the paired and predecessor tables only ever read the first file's batch run."""
    rt = _readme_table()

    def paired(label: str, conc: int, ratio: float, target: float) -> dict[str, object]:
        return {"scenario": f"d. {label} CPU / raw aiohttp's paired by round, conc {conc}", "values": {"kotoba": ratio},
                "targets": {f"aiohttp_max_{target}": ratio <= target}}
    d_only = {"date": "D", "machine": {}, "rows": [
        paired("AsyncClient", 16, 1.04, 1.1), paired("run", 64, 1.75, 1.7),
        {"scenario": "d. AsyncClient CPU per request, conc 16", "ratios": {"aiohttp": 1.2}}]}
    full = {"date": "F", "machine": {}, "rows": [
        paired("AsyncClient", 16, 9.0, 1.1),
        {"scenario": "c. client CPU per streamed chunk", "server": "canned", "unit": "us",
         "values": {"kotoba": 12.5, "httpx": 10.0}, "ratios": {"httpx": 1.25}}]}
    text = rt.sections([("d.edn", d_only), ("full.edn", full)])  # type: ignore[attr-defined]
    assert "| `AsyncClient`, 16 | 1.040x | 1.200x | <= 1.1x met |" in text
    assert "| `run`, 64 | 1.750x | — | <= 1.7x **missed** |" in text
    assert "9.000x" not in text  # the full file's paired row is another run's
    assert "From `benchmarks/results/full.edn` (F):" in text and "1.25x | <= 1.2x **missed** |" in text
    assert "From `benchmarks/results/d.edn`" in text
