"""An honest live tier. Under KOTOBA_VLLM_REQUIRE_LIVE=1 (CI) a live test never skips: a missing
server, binary or package fails it. Long profiles (`slow`) are deselected unless asked for,
never skipped. Loaded by tests/conftest.py; usable as a plugin (`-p _live`) on its own."""

from __future__ import annotations

import os
from typing import NoReturn

import httpx
import pytest

REQUIRE_LIVE = os.environ.get("KOTOBA_VLLM_REQUIRE_LIVE") == "1"
# Setting any of these to "long" selects the slow profiles, as `-m slow` does.
LONG_ENV = ("KOTOBA_VLLM_FUZZ", "KOTOBA_VLLM_HYGIENE", "KOTOBA_VLLM_LONG")
# For live tests that read a loaded server's verdict, not a probe's deadline: the 1.5 s default read
# timeout gives `capacity-unmeasured` whenever this 2-vCPU VM leaves the test process or the server
# unscheduled for longer: beside vLLM's decoding CPU engine, a 20 ms sleep woke up to 10 s late.
PATIENT_PROBE_SECONDS = 60.0
PATIENT_PROBE = httpx.Timeout(PATIENT_PROBE_SECONDS)
PATIENT_PROBE_S = str(PATIENT_PROBE_SECONDS)  # the same, for the CLI's --timeout


def unavailable(reason: str) -> NoReturn:
    """The live tier cannot run here: a failure when it is required, else a skip."""
    if REQUIRE_LIVE:
        pytest.fail(f"KOTOBA_VLLM_REQUIRE_LIVE=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def long_selected(config: pytest.Config) -> bool:
    expr = config.getoption("markexpr") or ""
    return ("slow" in expr and "not slow" not in expr) or any(os.environ.get(v) == "long" for v in LONG_ENV)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if long_selected(config):
        return
    slow = [i for i in items if i.get_closest_marker("slow") is not None]
    if slow:
        items[:] = [i for i in items if i.get_closest_marker("slow") is None]
        config.hook.pytest_deselected(items=slow)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    rep = outcome.get_result()
    if REQUIRE_LIVE and rep.skipped and not hasattr(rep, "wasxfail") and item.get_closest_marker("live"):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"live test skipped under KOTOBA_VLLM_REQUIRE_LIVE=1 (CI never skips the live tier): {reason}"


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if REQUIRE_LIVE and report.skipped:  # a whole module skipped at import: its live tests never ran
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"module skipped under KOTOBA_VLLM_REQUIRE_LIVE=1: {reason}"
