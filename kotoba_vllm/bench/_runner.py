"""The bench run: an async shell (`run_async`) and a sync one (`run`) over the pure stats.

For each concurrency level and each target in turn (never two targets at once, so one server's
load cannot move another's numbers): read the server's /metrics, send the requests streamed
with at most `concurrency` in flight, read /metrics again."""

from __future__ import annotations

import asyncio
import datetime as _dt
import sys
import time
import uuid
from typing import Sequence

import attrs
import httpx
from tqdm import tqdm

from .._client import AsyncClient
from .._errors import KotobaError
from .._model import TokenizeRequest
from ..pool import AsyncPool
from ._metrics import ServerRates, parse_counters, server_rates, unavailable
from ._prompts import BenchRequest, chat, long_text, prepared
from ._stats import Sample, Summary, differing_endpoints, sample_from_error, sample_from_response, summarize


@attrs.frozen
class PoolTarget:
    """A pool measured as one target: each request goes to the member the pool admits it to,
    and every row of the report is one member (the answering endpoints differ by design)."""

    label: str
    members: tuple[str, ...]
    backend: str = "auto"
    probe_timeout_s: float | None = None


@attrs.frozen
class BenchConfig:
    base_urls: tuple[str, ...]
    prompts: tuple[BenchRequest, ...]
    backend: str = "auto"
    concurrency: tuple[int, ...] = (1,)
    requests: int = 8  # per target per concurrency level
    max_tokens: int | None = 32
    model: str | None = None
    timeout_s: float = 300.0
    warmup: int = 1
    bust_cache: bool = True
    read_metrics: bool = True
    pools: tuple[PoolTarget, ...] = ()

    @property
    def targets(self) -> tuple[str, ...]:
        return self.base_urls + tuple(p.label for p in self.pools)


@attrs.frozen
class BenchReport:
    config: BenchConfig
    started_at: str
    samples: tuple[Sample, ...]
    summaries: tuple[Summary, ...]
    # (target, server, concurrency) -> that server's own counters over that target's run
    server: dict[tuple[str, str, int], ServerRates]
    differing: dict[str, list[str]]


async def _read_metrics(http: httpx.AsyncClient, base: str) -> dict[str, float] | None:
    try:
        r = await http.get(base.rstrip("/") + "/metrics", timeout=10.0)
        if r.status_code != 200:
            return None
        return parse_counters(r.text)
    except (httpx.HTTPError, ValueError):
        return None


async def _one(sender: AsyncClient | AsyncPool, req: BenchRequest, target: str, conc: int) -> Sample:
    """One streamed request. TTFT and end-to-end are taken on bench's own clock from before the
    call, so a pool's admission probe counts (it is latency the caller sees)."""
    started = time.perf_counter()
    first: float | None = None
    try:
        stream = await sender.stream(req)
        async for d in stream:
            if first is None and (d.delta or d.reasoning):
                first = time.perf_counter()
        resp = stream.response
        assert resp is not None
        done = time.perf_counter()
        s = sample_from_response(target, conc, started, done, resp)
        return attrs.evolve(s, ttft_ms=None if first is None else round((first - started) * 1000.0, 3),
                            e2e_ms=round((done - started) * 1000.0, 3))
    except (KotobaError, httpx.HTTPError, asyncio.TimeoutError) as e:
        return sample_from_error(target, conc, started, time.perf_counter(), e)


async def long_prompt(client: AsyncClient, base: str, tokens: int) -> BenchRequest:
    """A user message of about `tokens` tokens, sized with the server's tokenizer when it has one."""
    words = max(tokens // 3, 1)
    try:
        n = len((await client.send(_tokenize(base, long_text(words)))).tokens)
        if n > 0:
            words = max(int(words * tokens / n), 1)
    except (KotobaError, httpx.HTTPError, AttributeError):
        pass  # no tokenizer route: the word count stands; the server reports the real token count
    return chat(long_text(words))


def _tokenize(base: str, text: str) -> TokenizeRequest:
    return TokenizeRequest(text=text, base_url=base)


async def run_async(config: BenchConfig, *, progress: bool = True) -> BenchReport:
    started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    samples: list[Sample] = []
    server: dict[tuple[str, str, int], ServerRates] = {}
    total = len(config.concurrency) * len(config.targets) * config.requests
    run_id = uuid.uuid4().hex[:8]
    first = config.base_urls[0] if config.base_urls else config.pools[0].members[0]
    pools = {p.label: AsyncPool(p.members, backend=p.backend, timeout=config.timeout_s,
                                probe_timeout=p.probe_timeout_s, model=config.model) for p in config.pools}
    members = {p.label: p.members for p in config.pools}
    try:
        async with AsyncClient(first, backend=config.backend, timeout=config.timeout_s) as client, \
                httpx.AsyncClient() as http:

            def request(target: str, i: int, nonce: str | None) -> BenchRequest:
                return prepared(config.prompts[i % len(config.prompts)],
                                base_url=None if target in pools else target, max_tokens=config.max_tokens,
                                model=config.model, nonce=nonce)

            for target in config.targets:  # warm up: load, detect the engine; not measured
                for i in range(config.warmup):
                    await _one(pools.get(target, client), request(target, i, f"warm {run_id} {i}"), target, 0)
            bar = tqdm(total=total, file=sys.stderr, disable=not progress, unit="req", dynamic_ncols=True)
            try:
                for conc in config.concurrency:
                    for target in config.targets:
                        bar.set_description(f"{target} c={conc}")
                        servers = members.get(target, (target,))
                        before = {u: await _read_metrics(http, u) for u in servers} if config.read_metrics else {}
                        sem = asyncio.Semaphore(conc)
                        sender = pools.get(target, client)

                        async def go(i: int, target: str = target, conc: int = conc,
                                     sender: AsyncClient | AsyncPool = sender) -> Sample:
                            req = request(target, i, f"{run_id} {conc} {i}" if config.bust_cache else None)
                            async with sem:
                                s = await _one(sender, req, target, conc)
                            bar.update(1)
                            return s

                        batch = await asyncio.gather(*(go(i) for i in range(config.requests)))
                        samples.extend(batch)
                        for u in servers:
                            server[(target, u, conc)] = server_rates(before[u], await _read_metrics(http, u),
                                                                     _answers_from(batch, u)) \
                                if config.read_metrics else unavailable("not read (--no-metrics)")
            finally:
                bar.close()
    finally:
        for p in pools.values():
            await p.aclose()
    # The counters describe a row only when that row's endpoint is the server they were read from.
    summaries = [attrs.evolve(s, server=server.get((s.target, s.endpoint, s.concurrency))) for s in summarize(samples)]
    return BenchReport(config=config, started_at=started_at, samples=tuple(samples), summaries=tuple(summaries),
                       server=server, differing=differing_endpoints(samples))


def _answers_from(batch: Sequence[Sample], server: str) -> int:
    """Answers with tokens that `server` gave in this batch: each had a first token its counter includes."""
    u = server.rstrip("/")
    return sum(1 for s in batch if s.ok and (s.answered_by or "").rstrip("/") == u and (s.completion_tokens or 0) > 0)


def run(config: BenchConfig, *, progress: bool = True) -> BenchReport:
    return asyncio.run(run_async(config, progress=progress))


def build_prompts(prompts: Sequence[BenchRequest], long_tokens: int | None, base: str, backend: str) -> list[BenchRequest]:
    """Add a long prompt (sized against `base`) to the workload when asked."""
    out = list(prompts)
    if long_tokens:
        async def size() -> BenchRequest:
            async with AsyncClient(base, backend=backend) as c:
                return await long_prompt(c, base, long_tokens)
        out.append(asyncio.run(size()))
    return out
