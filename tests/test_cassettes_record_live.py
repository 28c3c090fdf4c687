"""Live tier of the contract tests: re-record the llama.cpp set from a real llama-server and
check that it reproduces the committed cassettes (ids, timestamps and timings aside) and that
the fresh recording replays green through both clients."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from _live import unavailable
from kotoba_vllm.cassettes import DEFAULT_ROOT, load_cassettes, read_cassette

ROOT = Path(__file__).resolve().parent.parent


def _have_server() -> bool:
    try:
        from kotoba_vllm import local
        local.llama_server_binary()
        local.tiny_model_path()
    except Exception:  # noqa: BLE001 - any missing piece means no live tier here
        return False
    return True


pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def rerecorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one documented command, run for real into a scratch directory."""
    if not _have_server():
        unavailable("no llama-server here")
    out = tmp_path_factory.mktemp("rec") / "llamacpp"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "record-llamacpp"), str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_rerecording_reproduces_the_committed_set(rerecorded: Path) -> None:
    from kotoba_vllm.cassettes._compare import differences
    old = load_cassettes("llamacpp")
    new = [read_cassette(p) for p in sorted(rerecorded.glob("*.edn"))]
    assert len(new) == len(old) >= 15
    assert differences(old, new) == []
    for c in new:
        assert c.how == "recorded" and c.provenance  # a recording always says so


def test_rerecorded_set_replays_green(rerecorded: Path) -> None:
    from kotoba_vllm.cassettes._replay import replay_async, replay_sync
    import test_cassettes_replay as suite
    for c in load_cassettes("llamacpp", root=rerecorded.parent):
        for out in (replay_sync(c), asyncio.run(replay_async(c))):
            suite.check_sent(c, out)
            exp = suite.E(c, "expect/error")
            if exp is not None:
                suite.check_error(c, out, exp)
            elif c.op == "probe":
                suite.check_probe(c, out)
            else:
                assert out.error is None, (c.name, out.error)
                suite.check_result(c, out)


def test_committed_set_is_where_the_script_writes() -> None:
    assert (DEFAULT_ROOT / "llamacpp").is_dir()
