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
from typing import Callable, Sequence, Union

import numpy as np
import pandas as pd
import pyarrow as pa

from .._client import AsyncClient
from .._errors import AdmissionRejected, ConfigError, KotobaError
from .._model import TEXT_REQUESTS, AnyResponse, StreamDelta
from ..pool import AsyncPool, AsyncPoolOptions, PoolConfig, load_pool_config
from ..batch import BatchEntry, FixedLimit, FlowControl, attempt_of
from ..batch._flow import DEFAULT_HEADROOM, EdnMap
from ..batch._gate import LimiterGate
from ..batch._measured import ProbedCapacity, flow_control_for
from ._intent import IntentLog
from ._rows import (COLUMNS, batch_line, entry_from_row, error_columns, flag_maybe_sent_twice, invalid_columns,
                    ok_columns)


PoolArg = Union[str, PoolConfig, Sequence[str], None]  # a pool file, a config, member URLs
Outcome = Union["tuple[AnyResponse, Sequence[StreamDelta]]", KotobaError]
Attempts = list[EdnMap]
Row = dict[str, object]  # a row's columns (Arrow values)


class UnexpectedError(KotobaError):
    """A failure that is none of the client's typed errors; recorded, never raised to Ray."""

    kind = "unexpected"


class RequestStage:
    """`ds.map_batches(RequestStage, fn_constructor_kwargs={"pool": "pool.edn"}, concurrency=2,
    batch_format="pyarrow")`.

    pool: a pool file path, a `PoolConfig`, or member URLs. base_url: one server instead.
    concurrency: requests in flight per actor, at most (flow control, as `run`'s, keeps fewer when the
    member's measured slots, admission answers or Retry-After say so, and leaves `headroom` slots of each
    member free; a pool keeps a limit per member; `flow_control=False`: always `concurrency`).
    requeue_rejected: as `run --requeue-rejected N`, per actor: a request rejected at admission (it never
    reached the engine) is sent again at most N times, once its member's pause is over or a slot of it
    was seen free; its record keeps every attempt (:vllm/attempts). intent_dir: a directory every worker
    can write (on the output filesystem) for the intent log; without it a re-executed block sends again
    without knowing what its earlier attempt sent.
    """

    def __init__(self, *, pool: PoolArg = None, base_url: str | None = None, backend: str = "auto",
                 concurrency: int = 8, timeout: float | None = None, intent_dir: str | None = None,
                 model: str | None = None, flow_control: bool = True, batch_lines: bool = False,
                 requeue_rejected: int = 0, headroom: int = DEFAULT_HEADROOM) -> None:
        if concurrency < 1:
            raise ConfigError("concurrency must be >= 1")
        if requeue_rejected < 0 or headroom < 0:
            raise ConfigError("requeue_rejected and headroom must be >= 0")
        if requeue_rejected and not flow_control:
            raise ConfigError("requeue_rejected needs flow control (a request is sent again only after its "
                              "member's pause or a slot seen free)")
        self.concurrency, self.timeout, self.intent_dir = concurrency, timeout, intent_dir
        self.requeue = requeue_rejected
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
            self.flow, self._measured = flow_control_for(self.client, concurrency, backend=backend, headroom=headroom)
        self._gate = LimiterGate(self.flow if self.flow is not None else FixedLimit(concurrency))

    @staticmethod
    def _make_client(pool: PoolArg, base_url: str | None, backend: str, timeout: float | None,
                     model: str | None) -> AsyncClient | AsyncPool:
        if pool is None:
            return AsyncClient(base_url, backend=backend, timeout=timeout, model=model)
        if isinstance(pool, str):
            pool = load_pool_config(pool)
        if isinstance(pool, PoolConfig):
            kwargs: AsyncPoolOptions = {"timeout": timeout}
            if backend != "auto":
                kwargs["backend"] = backend
            if model is not None:
                kwargs["model"] = model
            return AsyncPool.from_config(pool, **kwargs)
        urls = list(pool)
        if len(urls) == 1:
            return AsyncClient(urls[0], backend=backend, timeout=timeout, model=model)
        return AsyncPool(urls, backend=backend, timeout=timeout, model=model)

    async def send(self, entry: BatchEntry) -> AnyResponse:
        """One request, one answer (a streamed request is read to its end); raises `KotobaError`. Through a
        pool, to the member flow control admitted it to (each member keeps its own limit)."""
        req = entry.request
        assert req is not None
        client = self.client
        member = self.flow.placed(entry) if self.flow is not None and isinstance(client, AsyncPool) else None
        among = (member,) if member is not None else None
        if getattr(req, "stream", False) and isinstance(req, TEXT_REQUESTS):
            s = await (client.stream(req, timeout=self.timeout, among=among) if isinstance(client, AsyncPool)
                       else client.stream(req, timeout=self.timeout))
            async for _ in s:
                pass
            assert s.response is not None  # read to its end
            return s.response
        if isinstance(client, AsyncPool):
            return await client.send(req, timeout=self.timeout, among=among)
        return await client.send(req, timeout=self.timeout)

    async def _answer(self, e: BatchEntry) -> Outcome:
        """The response and its deltas (none), or the typed error."""
        try:
            return await self.send(e), ()
        except KotobaError as err:
            return err
        except Exception as err:  # a row, not a block failure Ray would retry (and resend)
            return UnexpectedError(f"{type(err).__name__}: {err}")

    async def _attempts(self, e: BatchEntry, log: IntentLog | None) -> tuple[Outcome, Attempts | None]:
        """Send `e` (again after an admission rejection, at most `requeue` times): the last outcome, and every
        attempt when it was rejected at least once."""
        gate = self._gate
        ticket = await gate.enter(e)
        attempts: Attempts | None = None
        while True:
            outcome: Outcome | None = None
            try:
                if log is not None and attempts is None:
                    log.sent(e.index)
                outcome = await self._answer(e)
            finally:
                mark = gate.leave(ticket, outcome)
            if not self.requeue or not (isinstance(outcome, AdmissionRejected) or attempts is not None):
                return outcome, attempts
            attempts = (attempts or []) + [attempt_of(e, outcome)]
            if not isinstance(outcome, AdmissionRejected) or len(attempts) > self.requeue:
                return outcome, attempts
            ticket = await gate.enter(e, mark, again=True)

    async def outcomes(self, entries: Sequence[BatchEntry]) -> list[Row]:
        """The typed columns of every entry, in order; earlier attempts' answers are reused."""
        log = IntentLog(self.intent_dir) if self.intent_dir else None
        unanswered, done = log.earlier(e.index for e in entries) if log else (set(), {})

        async def one(e: BatchEntry) -> Row:
            if e.index in done:
                return done[e.index]
            if not e.sendable:
                cols = invalid_columns(e)
                if self.batch_lines:
                    cols["batch_line"] = batch_line(e, None)
                return cols
            outcome, attempts = await self._attempts(e, log)
            if isinstance(outcome, KotobaError):
                cols = error_columns(e, outcome, attempts)
            else:
                cols = ok_columns(e, outcome[0], attempts)
            if self.batch_lines:
                cols["batch_line"] = batch_line(e, outcome if isinstance(outcome, KotobaError) else outcome[0],
                                                attempts)
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

    def __call__(self, batch: object) -> object:
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


Columns = dict[str, list[object]]
Rebuild = Callable[[Columns], object]


def _rows_of(batch: object) -> tuple[list[Row], Rebuild]:
    """The batch's rows as dicts, and a function that returns the batch with columns added
    (in the batch's own format: pyarrow, pandas or a dict of numpy arrays)."""
    if isinstance(batch, pa.Table):
        table = batch

        def add_arrow(cols: Columns) -> object:
            out = table
            for name, values in cols.items():
                arr = pa.array(values, type=_ARROW[COLUMNS[name]]())
                i = out.schema.get_field_index(name)
                out = out.set_column(i, name, arr) if i >= 0 else out.append_column(name, arr)
            return out
        return table.to_pylist(), add_arrow
    if isinstance(batch, dict):
        arrays = batch
        names = list(arrays)
        columns = [arrays[n].tolist() if hasattr(arrays[n], "tolist") else list(arrays[n]) for n in names]
        rows: list[Row] = [dict(zip(names, vals)) for vals in zip(*columns)] if names else []

        def add_numpy(cols: Columns) -> object:
            out = dict(arrays)
            for name, values in cols.items():
                out[name] = np.array(values, dtype=object if COLUMNS[name] in ("string",) or None in values
                                     else None)
            return out
        return rows, add_numpy
    if isinstance(batch, pd.DataFrame):
        rows, add = _rows_of(pa.Table.from_pandas(batch, preserve_index=False))
        return rows, lambda cols: _to_pandas(add(cols))
    raise ConfigError(f"RequestStage takes pyarrow, pandas or numpy batches, not {type(batch).__name__}")


def _to_pandas(table: object) -> object:
    assert isinstance(table, pa.Table)
    return table.to_pandas()
