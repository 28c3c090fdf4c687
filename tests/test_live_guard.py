"""The live tier cannot pass without running: under KOTOBA_VLLM_REQUIRE_LIVE=1 a skipped `live`
test fails the run, and long profiles are deselected by marker, never skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

SAMPLE = '''
import pytest

pytestmark = pytest.mark.live

needs = pytest.mark.skipif(True, reason="decided at collection time")


def test_skips_at_run_time():
    pytest.skip("no server here")


@needs
def test_skips_by_mark():
    pass


def test_runs():
    pass


@pytest.mark.slow
def test_long_profile():
    pass
'''


def _pytest(tmp: Path, require_live: bool, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp / "test_sample.py").write_text(SAMPLE, encoding="utf-8")
    (tmp / "pytest.ini").write_text("[pytest]\nmarkers =\n  live: l\n  slow: s\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("KOTOBA_VLLM_REQUIRE_LIVE", "KOTOBA_VLLM_FUZZ",
                                                            "KOTOBA_VLLM_HYGIENE", "KOTOBA_VLLM_LONG")}
    if require_live:
        env["KOTOBA_VLLM_REQUIRE_LIVE"] = "1"
    env["PYTHONPATH"] = str(TESTS) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "_live", "-p", "no:cacheprovider", "-rA",
                           "-c", str(tmp / "pytest.ini"), "--rootdir", str(tmp), str(tmp), *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_a_skipped_live_test_fails_when_the_live_tier_is_required(tmp_path: Path) -> None:
    p = _pytest(tmp_path, True)
    assert p.returncode == 1, p.stdout
    assert "1 failed, 1 passed, 1 deselected, 1 error" in p.stdout, p.stdout  # the mark's skip fails at setup
    assert "KOTOBA_VLLM_REQUIRE_LIVE=1" in p.stdout and "no server here" in p.stdout
    assert "decided at collection time" in p.stdout


def test_without_the_requirement_they_skip_and_the_long_profile_is_deselected(tmp_path: Path) -> None:
    p = _pytest(tmp_path, False)
    assert p.returncode == 0, p.stdout
    assert "1 passed, 2 skipped, 1 deselected" in p.stdout, p.stdout


def test_asking_for_slow_selects_the_long_profile(tmp_path: Path) -> None:
    p = _pytest(tmp_path, False, "-m", "slow")
    assert p.returncode == 0 and "1 passed, 3 deselected" in p.stdout, p.stdout


def test_no_test_module_importorskips_our_own_package() -> None:
    import re
    own = re.compile(r"importorskip\(\s*[\"']kotoba_vllm")
    for f in sorted(TESTS.glob("*.py")):
        if f.name != Path(__file__).name:
            assert not own.search(f.read_text(encoding="utf-8")), f"{f.name}: an import bug would become a skip"
