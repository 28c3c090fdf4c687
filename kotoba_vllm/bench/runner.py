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
from typing import Any, Sequence

import attrs
import httpx
from tqdm import tqdm

from .._client import AsyncClient
from .._errors import KotobaError
from .metrics import ServerRates, parse_counters, server_rates, unavailable
from .prompts import BenchRequest, chat, long_text, prepared
from .stats import Sample, Summary, differing_endpoints, sample_from_error, sample_from_response, summarize


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


@attrs.frozen
class BenchReport:
    config: BenchConfig
    started_at: str
    samples: tuple[Sample, ...]
    summaries: tuple[Summary, ...]
    server: dict[tuple[str, int], ServerRates]
    differing: dict[str, list[str]]


async def _read_metrics(http: httpx.AsyncClient, base: str) -> dict[str, float] | None:
    try:
        r = await http.get(base.rstrip("/") + "/metrics", timeout=10.0)
        if r.status_code != 200:
            return None
        return parse_counters(r.text)
    except (httpx.HTTPError, ValueError):
        return None


async def _one(client: AsyncClient, req: BenchRequest, target: str, conc: int) -> Sample:
    started = time.perf_counter()
    try:
        stream = await client.stream(req)
        async for _ in stream:
            pass
        resp = stream.response
        assert resp is not None
        return sample_from_response(target, conc, started, time.perf_counter(), resp)
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


def _tokenize(base: str, text: str) -> Any:
    from .._model import TokenizeRequest
    return TokenizeRequest(text=text, base_url=base)


async def run_async(config: BenchConfig, *, progress: bool = True) -> BenchReport:
    started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    samples: list[Sample] = []
    server: dict[tuple[str, int], ServerRates] = {}
    total = len(config.concurrency) * len(config.base_urls) * config.requests
    run_id = uuid.uuid4().hex[:8]
    async with AsyncClient(config.base_urls[0], backend=config.backend, timeout=config.timeout_s) as client, \
            httpx.AsyncClient() as http:
        for target in config.base_urls:  # warm up: load, detect the engine; not measured
            for i in range(config.warmup):
                await _one(client, prepared(config.prompts[i % len(config.prompts)], base_url=target,
                                            max_tokens=config.max_tokens, model=config.model,
                                            nonce=f"warm {run_id} {i}"), target, 0)
        bar = tqdm(total=total, file=sys.stderr, disable=not progress, unit="req", dynamic_ncols=True)
        try:
            for conc in config.concurrency:
                for target in config.base_urls:
                    bar.set_description(f"{target} c={conc}")
                    before = await _read_metrics(http, target) if config.read_metrics else None
                    sem = asyncio.Semaphore(conc)

                    async def go(i: int, target: str = target, conc: int = conc) -> Sample:
                        req = prepared(config.prompts[i % len(config.prompts)], base_url=target,
                                       max_tokens=config.max_tokens, model=config.model,
                                       nonce=f"{run_id} {conc} {i}" if config.bust_cache else None)
                        async with sem:
                            s = await _one(client, req, target, conc)
                        bar.update(1)
                        return s

                    got = await asyncio.gather(*(go(i) for i in range(config.requests)))
                    samples.extend(got)
                    after = await _read_metrics(http, target) if config.read_metrics else None
                    server[(target, conc)] = server_rates(before, after) if config.read_metrics \
                        else unavailable("not read (--no-metrics)")
        finally:
            bar.close()
    summaries = []
    for s in summarize(samples):
        rates = server.get((s.target, s.concurrency))
        # The counters are the target's: they describe this row only when the target answered.
        summaries.append(attrs.evolve(s, server=rates if s.endpoint == s.target.rstrip("/") else None))
    return BenchReport(config=config, started_at=started_at, samples=tuple(samples), summaries=tuple(summaries),
                       server=server, differing=differing_endpoints(samples))


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
