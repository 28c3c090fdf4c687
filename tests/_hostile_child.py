"""One hostile-server case, run in its own process (tests/test_hostile_servers.py starts it under an
RLIMIT_AS ceiling and a wall cap): make one call on one path, print what happened as one JSON line.

    python tests/_hostile_child.py '{"path": "client", "url": "...", "call": "chat", "client": {...}}'

Printed: {"ok": answer text or null, "kind": error kind or null, "phase", "what", "message",
"elapsed_s", "rss_before_kb", "rss_peak_kb", "delta_s" (call "stream": when each delta reached the caller)}.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import resource
import sys
import tempfile
import time
from typing import Any

from kotoba_vllm import AsyncClient, AsyncPool, Client, KotobaError, Pool
from kotoba_vllm.cli import main as cli_main

MSGS = [{"role": "user", "content": "hi"}]
PEAK_KB = [0]  # the peak when the call ended, if reading its output back would raise it
DELTA_S: list[float] = []  # call "stream": when each delta reached the caller, seconds after the call began


def _rss_kb() -> int:
    """This process's peak resident memory (VmHWM: ru_maxrss would carry the parent's peak across exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _sync(spec: dict[str, Any]) -> str:
    kwargs = spec.get("client", {})
    call = spec.get("call", "chat")
    if spec["path"] == "pool":
        with Pool(spec["members"], backend=spec.get("backend", "vllm"), **kwargs) as pool:
            return pool.chat(MSGS).text
    with Client(spec["url"], backend=spec.get("backend", "vllm"), **kwargs) as c:
        for k, v in spec.get("attrs", {}).items():
            setattr(c, k, v)
        if call == "detect":
            return c.detect_backend()
        if call == "server_config":
            cfg = c.server_config()
            return f"measured={cfg.measured} reason={cfg.reason}"
        if call == "rerank":
            return str(c.rerank("q", ["a", "b"]))
        if call == "stream":
            t0 = time.monotonic()
            with c.stream_chat(MSGS) as s:
                for _ in s:
                    DELTA_S.append(time.monotonic() - t0)
                assert s.response is not None
                return s.response.text
        return c.chat(MSGS).text


async def _async(spec: dict[str, Any]) -> str:
    kwargs = spec.get("client", {})
    call = spec.get("call", "chat")
    if spec["path"] == "apool":
        async with AsyncPool(spec["members"], backend=spec.get("backend", "vllm"), **kwargs) as pool:
            return (await pool.chat(MSGS)).text
    async with AsyncClient(spec["url"], backend=spec.get("backend", "vllm"), **kwargs) as c:
        for k, v in spec.get("attrs", {}).items():
            setattr(c, k, v)
        if call == "detect":
            return await c.detect_backend()
        if call == "server_config":
            cfg = await c.server_config()
            return f"measured={cfg.measured} reason={cfg.reason}"
        if call == "rerank":
            return str(await c.rerank("q", ["a", "b"]))
        if call == "stream":
            t0 = time.monotonic()
            s = await c.stream_chat(MSGS)
            async for _ in s:
                DELTA_S.append(time.monotonic() - t0)
            assert s.response is not None
            return s.response.text
        return (await c.chat(MSGS)).text


def _cli(spec: dict[str, Any]) -> str:
    """`run` or `capacity` in this process; the output file's records (or the exit status) as the answer."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.jsonl")
        if spec["path"] == "capacity":
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                code = cli_main(["capacity", *spec["members"], "--backend", spec.get("backend", "vllm"),
                                 *spec.get("args", [])])
            return json.dumps({"exit": code, "out": buf.getvalue()})
        inp = os.path.join(d, "in.jsonl")
        pool_args: list[str] = []
        if "pool" in spec:
            with open(os.path.join(d, "pool.edn"), "w") as f:
                f.write(spec["pool"])
            pool_args = ["--pool", os.path.join(d, "pool.edn")]
        with open(inp, "w") as f:
            for i in range(spec.get("n", 1)):
                f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                                    "body": {"model": "m", "messages": MSGS}}) + "\n")
        code = cli_main(["run", inp, "-o", out, "--no-progress", "--backend", spec.get("backend", "vllm"),
                         *pool_args, *spec.get("args", [])])
        PEAK_KB[0] = _rss_kb()  # before the records are read back here
        with open(out) as f:
            return json.dumps({"exit": code, "records": [json.loads(line) for line in f]})


def main() -> None:
    spec = json.loads(sys.argv[1])
    before = _rss_kb()
    t0 = time.monotonic()
    out: dict[str, Any] = {"ok": None, "kind": None, "phase": None, "what": None, "message": None}
    try:
        if spec["path"] == "openai":  # the peer, measured beside us (benchmarks only)
            import openai
            oc = openai.OpenAI(base_url=spec["url"] + "/v1", api_key="x", max_retries=0, timeout=30)
            out["ok"] = oc.chat.completions.create(model="m", messages=MSGS).choices[0].message.content  # type: ignore
        elif spec["path"] in ("client", "pool"):
            out["ok"] = _sync(spec)
        elif spec["path"] in ("async", "apool"):
            out["ok"] = asyncio.run(_async(spec))
        else:
            out["ok"] = _cli(spec)
    except KotobaError as e:
        out.update(kind=e.kind, phase=getattr(e, "phase", None), what=getattr(e, "what", None), message=e.message)
    out.update(elapsed_s=round(time.monotonic() - t0, 3), rss_before_kb=before, rss_peak_kb=PEAK_KB[0] or _rss_kb(),
               delta_s=[round(t, 3) for t in DELTA_S])
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
