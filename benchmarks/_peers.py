"""One contender of the batch-throughput scenario, in its own process:

    python benchmarks/_peers.py NAME URL[,URL2] CONCURRENCY N

sends N chat requests with CONCURRENCY in flight and prints one JSON line: good answers (the
exact canned text), wall seconds, CPU seconds of this process and its children during the run
(imports and start-up excluded), and per-request latencies' p50/p99 in ms.

Each peer is written the way its own documentation shows, with its connection limit equal to
the concurrency. Workers pull from one shared iterator, so every contender keeps exactly
CONCURRENCY requests in flight.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from typing import Any, Awaitable, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.environ.get("KOTOBA_BENCH_TREE") or os.path.dirname(HERE)]  # instructions.py --tree

EXPECT = "Hello there, friend."
MODEL = "canned"
Call = Callable[[list[dict[str, str]]], Awaitable[str]]


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Say hi {i}"}]


def cpu_now() -> float:
    # getrusage, not os.times(): microseconds instead of 10 ms ticks (at 1 in flight a run is ~0.5 s of CPU,
    # so a tick was ~2% of it)
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


async def workers(call: Call, conc: int, n: int) -> tuple[list[str], list[float]]:
    it = iter(range(n))
    texts: list[str] = []
    lat: list[float] = []

    async def worker() -> None:
        for i in it:
            t = time.perf_counter()
            try:
                texts.append(await call(messages(i)))
            except Exception as e:  # noqa: BLE001 - counted as a bad answer
                texts.append(f"error: {type(e).__name__}: {e}")
            lat.append(time.perf_counter() - t)

    await asyncio.gather(*(worker() for _ in range(conc)))
    return texts, lat


# ------------------------------------------------------------------ contenders: (setup, call, close)


async def aiohttp_peer(url: str, conc: int, refusals: bool = False) -> tuple[Call, Callable[[], Awaitable[Any]]]:
    """Raw aiohttp; `refusals`: a 429 is taken as an answer (its text "429") instead of failing on it, the client
    with no bookkeeping at all against scenario h's member that refuses beyond its slots."""
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc))
    chat = url + "/v1/chat/completions"

    async def call(msgs: list[dict[str, str]]) -> str:
        async with session.post(chat, json={"model": MODEL, "messages": msgs, "max_tokens": 4}) as r:
            data = await r.json()
        if refusals and r.status == 429:
            return "429"
        return data["choices"][0]["message"]["content"]  # type: ignore[no-any-return]
    return call, session.close


async def httpx_peer(url: str, conc: int, module: str = "httpx") -> tuple[Call, Callable[[], Awaitable[Any]]]:
    import importlib

    hx: Any = importlib.import_module(module)
    client = hx.AsyncClient(limits=hx.Limits(max_connections=conc, max_keepalive_connections=conc), timeout=60)
    chat = url + "/v1/chat/completions"

    async def call(msgs: list[dict[str, str]]) -> str:
        r = await client.post(chat, json={"model": MODEL, "messages": msgs, "max_tokens": 4})
        return r.json()["choices"][0]["message"]["content"]  # type: ignore[no-any-return]
    return call, client.aclose


async def openai_peer(url: str, conc: int) -> tuple[Call, Callable[[], Awaitable[Any]]]:
    import importlib

    import openai

    # openai documents `http_client=DefaultAsyncHttpxClient(...)` for transport settings; its base is
    # httpx2's AsyncClient in 3.x (httpx's before), so the Limits come from the same package.
    base = openai.DefaultAsyncHttpxClient.__mro__[1]
    hx: Any = importlib.import_module(base.__module__.split(".")[0])
    http = openai.DefaultAsyncHttpxClient(limits=hx.Limits(max_connections=conc, max_keepalive_connections=conc))
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, http_client=http)

    async def call(msgs: list[dict[str, str]]) -> str:
        r = await client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4)  # type: ignore[arg-type]
        return r.choices[0].message.content or ""
    return call, client.close


async def flexllm_peer(url: str, conc: int) -> tuple[Call, Callable[[], Awaitable[Any]]]:
    from flexllm import LLMClient

    # concurrency_limit = the concurrency; max_qps raised from its default (1000) so it is not the limit
    client = LLMClient(model=MODEL, base_url=url + "/v1", api_key="x", concurrency_limit=conc, max_qps=10**6)

    async def call(msgs: list[dict[str, str]]) -> str:
        r = await client.chat(msgs, max_tokens=4)
        return r.content or ""

    async def close() -> None:
        await client.aclose() if hasattr(client, "aclose") else None
    return call, close


async def kotoba_peer(url: str, conc: int) -> tuple[Call, Callable[[], Awaitable[Any]]]:
    from kotoba_vllm import AsyncClient

    client = AsyncClient(url, backend="openai", model=MODEL, timeout=60.0)

    async def call(msgs: list[dict[str, str]]) -> str:
        return (await client.chat(msgs, max_tokens=4)).text or ""
    return call, client.aclose


async def kotoba_stream_peer(url: str, conc: int) -> tuple[Call, Callable[[], Awaitable[Any]]]:
    """`AsyncClient.stream_chat`, read to its end (4 content chunks and a usage chunk per request)."""
    from kotoba_vllm import AsyncClient

    client = AsyncClient(url, backend="openai", model=MODEL, timeout=60.0)

    async def call(msgs: list[dict[str, str]]) -> str:
        resp = await (await client.stream_chat(msgs, max_tokens=4)).until_done()
        return EXPECT if resp.text == "tok0 tok1 tok2 end" else resp.text or ""
    return call, client.aclose


def run_sync(url: str, n: int) -> dict[str, Any]:
    """The sync `Client`, one request at a time (what `kotoba-sync` runs; CONCURRENCY is ignored)."""
    from kotoba_vllm import Client

    with Client(url, backend="openai", model=MODEL, timeout=60.0) as client:
        for i in range(min(n, 40)):  # connect and warm up, outside the clock
            client.chat(messages(i), max_tokens=4)
        texts, lat = [], []
        c0, t0 = cpu_now(), time.perf_counter()
        for i in range(n):
            t = time.perf_counter()
            texts.append(client.chat(messages(i), max_tokens=4).text or "")
            lat.append(time.perf_counter() - t)
        return summary(texts, lat, time.perf_counter() - t0, cpu_now() - c0)


async def kotoba_httpx_peer(url: str, conc: int) -> tuple[Call, Callable[[], Awaitable[Any]]]:
    import httpx

    from kotoba_vllm import AsyncClient

    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=conc, max_keepalive_connections=conc), timeout=60)
    client = AsyncClient(url, backend="openai", model=MODEL, http_client=http)

    async def call(msgs: list[dict[str, str]]) -> str:
        return (await client.chat(msgs, max_tokens=4)).text or ""

    async def close() -> None:
        await http.aclose()
    return call, close


async def kotoba_httpcore2_peer(url: str, conc: int) -> tuple[Call, Callable[[], Awaitable[Any]]]:
    """Measured option, not shipped: httpx's API over httpcore2's fixed pool (an httpx transport)."""
    import httpcore2
    import httpx

    from kotoba_vllm import AsyncClient

    class Httpcore2Transport(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self.pool = httpcore2.AsyncConnectionPool(max_connections=conc, max_keepalive_connections=conc)

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            req = httpcore2.Request(request.method, httpcore2.URL(scheme=request.url.raw_scheme,
                                                                  host=request.url.raw_host, port=request.url.port,
                                                                  target=request.url.raw_path),
                                    headers=request.headers.raw, content=request.stream,
                                    extensions=request.extensions)
            resp = await self.pool.handle_async_request(req)
            return httpx.Response(resp.status, headers=resp.headers, stream=_Body(resp),
                                  extensions=resp.extensions)

        async def aclose(self) -> None:
            await self.pool.aclose()

    class _Body(httpx.AsyncByteStream):
        def __init__(self, resp: Any) -> None:
            self.resp = resp

        async def __aiter__(self) -> Any:
            async for part in self.resp.aiter_stream():
                yield part

        async def aclose(self) -> None:
            await self.resp.aclose()

    http = httpx.AsyncClient(transport=Httpcore2Transport(), timeout=60)
    client = AsyncClient(url, backend="openai", model=MODEL, http_client=http)

    async def call(msgs: list[dict[str, str]]) -> str:
        return (await client.chat(msgs, max_tokens=4)).text or ""
    return call, http.aclose


async def kotoba_httpx2_peer(url: str, conc: int) -> tuple[Call, Callable[[], Awaitable[Any]]]:
    """Measured option, not shipped: httpx2 wholesale (its exception types are not httpx's)."""
    import httpx2

    from kotoba_vllm import AsyncClient

    http = httpx2.AsyncClient(limits=httpx2.Limits(max_connections=conc, max_keepalive_connections=conc), timeout=60)
    client = AsyncClient(url, backend="openai", model=MODEL, http_client=http)  # type: ignore[arg-type]

    async def call(msgs: list[dict[str, str]]) -> str:
        return (await client.chat(msgs, max_tokens=4)).text or ""
    return call, http.aclose


PEERS = {"aiohttp": aiohttp_peer, "aiohttp-slots": lambda u, c: aiohttp_peer(u, c, refusals=True), "httpx": httpx_peer,
         "httpx2": lambda u, c: httpx_peer(u, c, "httpx2"), "openai": openai_peer, "flexllm": flexllm_peer,
         "kotoba": kotoba_peer, "kotoba-stream": kotoba_stream_peer, "kotoba-httpx": kotoba_httpx_peer, "kotoba-httpcore2": kotoba_httpcore2_peer,
         "kotoba-httpx2": kotoba_httpx2_peer}


async def run_peer(name: str, url: str, conc: int, n: int) -> dict[str, Any]:
    call, close = await PEERS[name](url, conc)
    await workers(call, min(conc, 8), min(n, 40))  # connect and warm up, outside the clock
    c0, t0 = cpu_now(), time.perf_counter()
    texts, lat = await workers(call, conc, n)
    wall, cpu = time.perf_counter() - t0, cpu_now() - c0
    await close()
    return summary(texts, lat, wall, cpu)


def summary(texts: list[str], lat: list[float], wall: float, cpu: float) -> dict[str, Any]:
    lat = sorted(lat)

    def q(p: float) -> float | None:
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3 if lat else None
    bad = [t for t in texts if t != EXPECT]
    return {"n": len(texts), "good": len(texts) - len(bad), "first_bad": bad[0][:200] if bad else None,
            "wall_s": wall, "cpu_s": cpu, "p50_ms": q(0.5), "p99_ms": q(0.99)}


def run_cli(urls: list[str], conc: int, n: int, backend: str, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """`python -m kotoba_vllm run` on N requests, in this process (its own CPU counted the same way)."""
    from kotoba_vllm._edn import kw, read_all
    from kotoba_vllm.cli import main

    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "reqs.edn"), os.path.join(d, "out.edn")

        def write(k: int) -> None:
            with open(src, "w") as fh:
                for i in range(k):
                    fh.write('{:vllm/endpoint :chat :vllm/model "canned" :vllm/sampling {:vllm/max-tokens 4} '
                             f':vllm/messages [{{:vllm/role :user :vllm/content "Say hi {i}"}}]}}\n')

        argv = ["run", src, "--backend", backend, "--concurrency", str(conc), "--output", out, "--no-progress",
                *extra]
        for u in urls:
            argv += ["--base-url", u]
        import kotoba_vllm.batch  # noqa: F401 - imports outside the clock; no warm-up run: `run` makes its
        import kotoba_vllm.cli.run  # noqa: F401 - own client, so its connections are the ones counted
        write(n)
        c0, t0 = cpu_now(), time.perf_counter()
        rc = quiet(lambda: main(argv))
        wall, cpu = time.perf_counter() - t0, cpu_now() - c0
        forms = read_all(open(out, encoding="utf-8").read())
    texts = [f.get(kw("vllm/text")) if isinstance(f, dict) else None for f in forms]
    lat = [ms / 1e3 for f in forms if isinstance(f, dict) for ms in [_e2e_ms(f)] if ms is not None]
    out_ = summary([t if isinstance(t, str) else repr(t)[:200] for t in texts], lat, wall, cpu)
    out_["rc"] = rc
    return out_


def _e2e_ms(f: dict[Any, Any]) -> float | None:
    from kotoba_vllm._edn import kw
    t = f.get(kw("vllm/timings"))
    e = t.get(kw("vllm/end-to-end")) if isinstance(t, dict) else None
    ms = e.get(kw("vllm/ms")) if isinstance(e, dict) else None
    return float(ms) if isinstance(ms, (int, float)) else None


def quiet(fn: Callable[[], Any]) -> Any:
    import contextlib
    import io
    with contextlib.redirect_stderr(io.StringIO()):
        return fn()


def main() -> None:
    name, urls, conc, n = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
    if name in ("kotoba-run", "kotoba-run-flow-on"):  # flow control is on by default
        res = run_cli(urls, conc, n, "openai")
    elif name == "kotoba-run-pool":
        res = run_cli(urls, conc, n, "vllm")  # vLLM's probes (/metrics, /load) are asked of every member
    elif name == "kotoba-sync":
        res = run_sync(urls[0], n)
    elif name == "kotoba-run-vllm":
        res = run_cli(urls[:1], conc, n, "vllm")  # one member, the pool's dialect: the pool with no pool
    elif name.startswith("kotoba-run-flow-off"):  # "-again": the same twice, the A/A pair of scenario h
        res = run_cli(urls, conc, n, "openai", ("--flow-control", "off"))
    elif name == "kotoba-run-slots":  # flow control reads llama.cpp's /slots of a member that answers 429
        res = run_cli(urls, conc, n, "llamacpp")
    elif name == "kotoba-run-slots-headroom-0":  # the same, leaving no slot free for other clients
        res = run_cli(urls, conc, n, "llamacpp", ("--headroom", "0"))
    elif name == "kotoba-run-slots-fixed":  # a fixed -c (the slots, passed as conc) against the same member
        res = run_cli(urls, conc, n, "llamacpp", ("--flow-control", "off"))
    elif name.startswith("kotoba-run-slots-flow-off"):
        res = run_cli(urls, conc, n, "llamacpp", ("--flow-control", "off"))
    elif name in ("kotoba-run-asyncio", "kotoba-run-uvloop"):  # `run` on each loop it can own
        res = run_cli(urls, conc, n, "openai", ("--loop", name.rsplit("-", 1)[1]))
    elif name == "aiohttp-uvloop":  # raw aiohttp on uvloop: the floor `run --loop uvloop` is read against
        import uvloop
        loop = uvloop.new_event_loop()
        try:
            res = loop.run_until_complete(run_peer("aiohttp", urls[0], conc, n))
        finally:
            loop.close()
    elif name.startswith("aiohttp-slots"):  # "-fixed": the same at -c the slots (scenario h's floor)
        res = asyncio.run(run_peer("aiohttp-slots", urls[0], conc, n))
    else:
        res = asyncio.run(run_peer(name, urls[0], conc, n))
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
