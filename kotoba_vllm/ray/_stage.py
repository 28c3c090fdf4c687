"""`RequestStage`: the callable class `Dataset.map_batches` runs in each worker actor.

Each actor owns one event loop and one `AsyncPool` (or `AsyncClient`); a batch's requests go out
at most `concurrency` at a time. Every row comes back with its outcome: admission rejections,
validation problems and transport failures are rows, never exceptions, so Ray never retries a
block because of an answer. The API key is read by the client inside the worker from
KOTOBA_VLLM_API_KEY, as everywhere else; it is never an argument of the stage.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from .._client import AsyncClient
from .._errors import ConfigError, KotobaError
from ..pool import AsyncPool, PoolConfig, load_pool_config
from ..batch import BatchEntry, FixedLimit, FlowControl
from ..batch._gate import LimiterGate
from ..batch._measured import ProbedCapacity, flow_control_for
from ._intent import IntentLog
from ._rows import (COLUMNS, batch_line, entry_from_row, error_columns, flag_maybe_sent_twice, invalid_columns,
                    ok_columns)


class UnexpectedError(KotobaError):
    """A failure that is none of the client's typed errors; recorded, never raised to Ray."""

    kind = "unexpected"


class RequestStage:
    """`ds.map_batches(RequestStage, fn_constructor_kwargs={"pool": "pool.edn"}, concurrency=2,
    batch_format="pyarrow")`.

    pool: a pool file path, a `PoolConfig`, or member URLs. base_url: one server instead.
    concurrency: requests in flight per actor, at most (flow control, as `run`'s, keeps fewer when the
    member's measured slots, admission answers or Retry-After say so; `flow_control=False`: always
    `concurrency`). intent_dir: a directory every worker can write
    (on the output filesystem) for the intent log; without it a re-executed block sends again
    without knowing what its earlier attempt sent.
    """

    def __init__(self, *, pool: Any = None, base_url: str | None = None, backend: str = "auto",
                 concurrency: int = 8, timeout: float | None = None, intent_dir: str | None = None,
                 model: str | None = None, flow_control: bool = True, batch_lines: bool = False) -> None:
        if concurrency < 1:
            raise ConfigError("concurrency must be >= 1")
        self.concurrency, self.timeout, self.intent_dir = concurrency, timeout, intent_dir
        self.batch_lines = batch_lines  # also make each row's run-batch JSONL line (JSONL output)
        # Ray may call a map actor from several threads at once: one loop in its own thread serves
        # every batch, so the client's connections and the in-flight bound are the actor's, not a batch's.
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kotoba-ray-loop", daemon=True)
        self._thread.start()
        self.client = self._make_client(pool, base_url, backend, timeout, model)
        # flow control per actor (as `run`'s): at most `concurrency` in flight, fewer when the member says so
        self.flow: FlowControl | None = None
        self._measured: ProbedCapacity | None = None
        if flow_control:
            self.flow, self._measured = flow_control_for(self.client, concurrency, backend=backend)
        self._gate = LimiterGate(self.flow if self.flow is not None else FixedLimit(concurrency))

    @staticmethod
    def _make_client(pool: Any, base_url: str | None, backend: str, timeout: float | None,
                     model: str | None) -> Any:
        if pool is None:
            return AsyncClient(base_url, backend=backend, timeout=timeout, model=model)
        if isinstance(pool, str):
            pool = load_pool_config(pool)
        if isinstance(pool, PoolConfig):
            kwargs: dict[str, Any] = {"timeout": timeout}
            if backend != "auto":
                kwargs["backend"] = backend
            if model is not None:
                kwargs["model"] = model
            return AsyncPool.from_config(pool, **kwargs)
        urls = list(pool)
        if len(urls) == 1:
            return AsyncClient(urls[0], backend=backend, timeout=timeout, model=model)
        return AsyncPool(urls, backend=backend, timeout=timeout, model=model)

    async def send(self, entry: BatchEntry) -> Any:
        """One request, one answer (a streamed request is read to its end); raises `KotobaError`."""
        req = entry.request
        assert req is not None
        if getattr(req, "stream", False):
            s = await self.client.stream(req, timeout=self.timeout)
            async for _ in s:
                pass
            return s.response
        return await self.client.send(req, timeout=self.timeout)

    async def _answer(self, e: BatchEntry) -> tuple[Any, dict[str, Any]]:
        """The outcome (the response or the typed error) and its columns."""
        try:
            resp = await self.send(e)
        except KotobaError as err:
            return err, error_columns(e, err)
        except Exception as err:  # a row, not a block failure Ray would retry (and resend)
            unexpected = UnexpectedError(f"{type(err).__name__}: {err}")
            return unexpected, error_columns(e, unexpected)
        return (resp, []), ok_columns(e, resp)

    async def outcomes(self, entries: Sequence[BatchEntry]) -> list[dict[str, Any]]:
        """The typed columns of every entry, in order; earlier attempts' answers are reused."""
        log = IntentLog(self.intent_dir) if self.intent_dir else None
        unanswered, done = log.earlier(e.index for e in entries) if log else (set(), {})
        gate = self._gate

        async def one(e: BatchEntry) -> dict[str, Any]:
            if e.index in done:
                return done[e.index]
            if not e.sendable:
                cols = invalid_columns(e)
                if self.batch_lines:
                    cols["batch_line"] = batch_line(e, None)
                return cols
            ticket = await gate.enter(e)
            outcome: Any = None
            try:
                if log is not None:
                    log.sent(e.index)
                outcome, cols = await self._answer(e)
            finally:
                gate.leave(ticket, outcome)
            if self.batch_lines:
                cols["batch_line"] = batch_line(e, outcome if isinstance(outcome, KotobaError) else outcome[0])
            if e.index in unanswered:
                cols = flag_maybe_sent_twice(cols)
            if log is not None:
                log.done(e.index, cols)
            return cols

        try:
            return list(await asyncio.gather(*(one(e) for e in entries)))
        finally:
            if log is not None:
                log.close()

    def __call__(self, batch: Any) -> Any:
        rows, rebuild = _rows_of(batch)
        entries = [entry_from_row(r) for r in rows]
        outcomes = asyncio.run_coroutine_threadsafe(self.outcomes(entries), self._loop).result()
        return rebuild({name: [o[name] for o in outcomes] for name in COLUMNS})

    def close(self) -> None:
        if self._loop.is_closed():
            return
        if self._measured is not None:
            asyncio.run_coroutine_threadsafe(self._measured.aclose(), self._loop).result()
        close = getattr(self.client, "aclose", None)
        if close is not None:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


_ARROW = {"string": pa.string, "bool": pa.bool_, "int64": pa.int64, "float64": pa.float64}


def _rows_of(batch: Any) -> tuple[list[dict[str, Any]], Any]:
    """The batch's rows as dicts, and a function that returns the batch with columns added
    (in the batch's own format: pyarrow, pandas or a dict of numpy arrays)."""
    if isinstance(batch, pa.Table):
        def add_arrow(cols: dict[str, list[Any]]) -> Any:
            out = batch
            for name, values in cols.items():
                arr = pa.array(values, type=_ARROW[COLUMNS[name]]())
                i = out.schema.get_field_index(name)
                out = out.set_column(i, name, arr) if i >= 0 else out.append_column(name, arr)
            return out
        return batch.to_pylist(), add_arrow
    if isinstance(batch, dict):
        names = list(batch)
        columns = [batch[n].tolist() if hasattr(batch[n], "tolist") else list(batch[n]) for n in names]
        rows = [dict(zip(names, vals)) for vals in zip(*columns)] if names else []

        def add_numpy(cols: dict[str, list[Any]]) -> Any:
            out = dict(batch)
            for name, values in cols.items():
                out[name] = np.array(values, dtype=object if COLUMNS[name] in ("string",) or None in values
                                     else None)
            return out
        return rows, add_numpy
    if isinstance(batch, pd.DataFrame):
        table = pa.Table.from_pandas(batch, preserve_index=False)
        rows, add = _rows_of(table)
        return rows, lambda cols: add(cols).to_pandas()
    raise ConfigError(f"RequestStage takes pyarrow, pandas or numpy batches, not {type(batch).__name__}")
