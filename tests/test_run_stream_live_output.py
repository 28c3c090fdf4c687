"""`run --stream` on stdout prints a delta while the server is still streaming, not after the end."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

from faultserver import LAST_CHUNK, FaultServer, Seen, Sleep, Step, chat_chunk, sse_event, sse_head

ROOT = Path(__file__).resolve().parent.parent


def _held_open(seen: Seen) -> list[Step]:
    # One delta, then the stream stays open far longer than the test waits for that delta.
    return [sse_head(), sse_event(chat_chunk("He")), Sleep(60), sse_event(chat_chunk("llo", "stop")),
            sse_event("[DONE]"), LAST_CHUNK]


def test_first_delta_is_printed_while_the_stream_is_open(tmp_path: Path) -> None:
    req = tmp_path / "r.edn"
    req.write_text('{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "hi"}]}')
    with FaultServer(_held_open) as server:
        p = subprocess.Popen([sys.executable, "-m", "kotoba_vllm", "run", str(req), "--base-url", server.base_url,
                              "--backend", "openai", "--stream", "--no-progress"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            assert p.stdout is not None
            ready, _, _ = select.select([p.stdout], [], [], 30)
            assert ready, "no delta while the server held the stream open"
            line = p.stdout.readline().decode()
            assert line.startswith('{:vllm/delta "He"'), line
        finally:
            p.kill()
            p.wait()
