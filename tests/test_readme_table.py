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
        name = re.search(r"From `benchmarks/results/([^`]+)`", block.group(1))
        assert name, f"{readme}: the table does not name its result file"
        path = os.path.join(ROOT, "benchmarks", "results", name.group(1))
        assert os.path.exists(path), f"{readme} names {path}, which is not committed"
        assert block.group(1) == rt.tables(rt.load(path), name.group(1)), (  # type: ignore[attr-defined]
            f"{readme}: the table differs from what benchmarks/readme_table.py makes of {name.group(1)}; "
            f"run `python benchmarks/readme_table.py {os.path.relpath(path, ROOT)} --write`")


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
