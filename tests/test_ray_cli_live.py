"""The README's Ray command on a fresh checkout: a local Ray, a local llama-server, the example file."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kotoba_vllm._edn import kw, read_one

if os.environ.get("KOTOBA_VLLM_REQUIRE_LIVE") != "1":
    pytest.importorskip("ray", reason="the ray extra is not installed")

pytestmark = pytest.mark.live
ROOT = Path(__file__).resolve().parent.parent


def test_run_example_batch_on_ray_with_a_local_server(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("KOTOBA_VLLM_BASE_URL", None)
    proc = subprocess.run([sys.executable, "-m", "kotoba_vllm", "run", "examples/batch.jsonl", "--ray", "--local",
                           "-o", str(out), "--no-progress"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]  # the example's last line is invalid on purpose
    assert "ray batch complete: 4 records" in proc.stderr
    rows = [json.loads(line) for f in sorted(glob.glob(str(out / "part-*.jsonl"))) for line in open(f)]
    # the run-batch lines `run -o x.jsonl` writes
    assert [r["kotoba"]["request_index"] for r in rows] == [0, 1, 2, 3]
    assert [r["error"] is None for r in rows] == [True, True, True, False]
    assert rows[3]["error"]["code"] == "validation" and "frobnicate" in json.dumps(rows[3]["kotoba"]["error"])
    assert rows[0]["custom_id"] == "greet" and rows[0]["kotoba"]["backend"] == "llamacpp"
    assert rows[0]["response"]["status_code"] == 200 and rows[0]["response"]["body"]["choices"]
    summary = read_one((out / "summary.edn").read_text())
    assert summary[kw("batch/outcomes")] == {kw("ok"): 3, kw("validation"): 1}
    assert not (out / ".intent").exists()
