"""Ray Data readers that number every request. EDN and JSONL are planned on the driver as byte
spans of `block_rows` requests (one streaming pass, see _spans.py); each span is one read task and
one block, numbered from the span's first index, so nothing is repartitioned. Parquet splits by
row group, numbered from the file's metadata.

Rows: `request_index`, `request` (EDN text or the JSONL line), `where` ("file:line:column");
Parquet rows keep their own columns and must hold a `request` column or the batch JSONL columns.
`skip` (a sorted array of indices that already have a record) leaves those rows out: `--resume`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, Iterator, Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._errors import ConfigError
from ._rows import INDEX, REQUEST, WHERE
from ._spans import Span, plan_edn, plan_jsonl, read_edn_span, read_jsonl_span

if TYPE_CHECKING:  # the ray extra; without it these are Any, as pyarrow always is (no types)
    from numpy.typing import NDArray
    from ray.data import Dataset
    from ray.data.block import BlockMetadata
    from ray.data.context import DataContext
    from ray.data.datasource import Datasource, ReadTask

    Indices = Optional[NDArray[np.int64]]  # sorted request indices (--resume), or none

FORMATS = ("edn", "jsonl", "parquet")


def detect_input_format(path: str, fmt: str | None = None) -> str:
    if fmt and fmt != "auto":
        return fmt
    if path.endswith(".parquet"):
        return "parquet"
    return "jsonl" if path.endswith((".jsonl", ".ndjson")) else "edn"


def _skip_within(skip: Indices, first: int, rows: int) -> Indices:
    """The part of the sorted `skip` array that falls in [first, first + rows): a read task carries
    only its own share, never the whole --resume list."""
    if skip is None or len(skip) == 0:
        return None
    lo, hi = np.searchsorted(skip, [first, first + rows])
    return skip[lo:hi]


def _span_block(path: str, fmt: str, span: Span, skip: Indices) -> Iterator[pa.Table]:
    """One block: the span's requests, numbered from its first index, minus those in `skip`."""
    rows = list(read_edn_span(path, span) if fmt == "edn" else read_jsonl_span(path, span))
    if len(rows) != span.rows:  # the plan and the read cut the same bytes with the same scanner
        raise ConfigError(f"{path}: bytes {span.start}-{span.end} held {len(rows)} requests where the "
                          f"plan counted {span.rows}: did the file change during the run?")
    index = np.arange(span.first, span.first + span.rows, dtype=np.int64)
    keep = np.ones(len(rows), dtype=bool) if skip is None else ~np.isin(index, skip)
    yield pa.table({INDEX: pa.array(index[keep]),
                    REQUEST: [r[0] for r, k in zip(rows, keep) if k],
                    WHERE: [r[1] for r, k in zip(rows, keep) if k]})


def _parquet_blocks(path: str, groups: list[int], first: int, block_rows: int, skip: Indices) -> Iterator[pa.Table]:
    f = pq.ParquetFile(path)
    start = first
    for g in groups:
        table = f.read_row_group(g)
        n = table.num_rows
        index = np.arange(start, start + n, dtype=np.int64)
        start += n
        if INDEX in table.column_names:
            table = table.drop_columns([INDEX])
        table = table.add_column(0, INDEX, pa.array(index))
        if skip is not None and len(skip):
            table = table.filter(pa.array(~np.isin(index, skip)))
        for off in range(0, table.num_rows, block_rows):
            yield table.slice(off, block_rows)


def plan_spans(path: str, fmt: str, block_rows: int) -> list[Span]:
    """The byte spans of a text input, planned by one streaming pass on the driver."""
    return list(plan_edn(path, block_rows) if fmt == "edn" else plan_jsonl(path, block_rows))


def request_datasource(path: str, fmt: str | None = None, *, block_rows: int = 256,
                       skip: Indices = None) -> Datasource:
    """A `ray.data.Datasource` for a request file (use with `ray.data.read_datasource`). EDN and JSONL
    are planned here, on the driver (`EdnError` for a file whose shape is broken): one read task
    and one block per `block_rows` requests, each numbered on its own."""
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    kind = detect_input_format(path, fmt)
    if kind not in FORMATS:
        raise ConfigError(f"input format must be one of {', '.join(FORMATS)}")
    if block_rows < 1:
        raise ConfigError("block_rows must be >= 1")
    spans = plan_spans(path, kind, block_rows) if kind != "parquet" else []

    def _parquet_task(groups: list[int], first: int, mine: Indices) -> Callable[[], Iterator[pa.Table]]:
        return lambda: _parquet_blocks(path, groups, first, block_rows, mine)

    def _span_task(span: Span, mine: Indices) -> Callable[[], Iterator[pa.Table]]:
        return lambda: _span_block(path, kind, span, mine)

    def _meta(rows: int | None, size: int | None) -> BlockMetadata:
        return BlockMetadata(num_rows=rows, size_bytes=size, exec_stats=None, input_files=(path,))

    class RequestFile(Datasource):  # type: ignore[misc, unused-ignore]  # Any without the ray extra
        def get_name(self) -> str:
            return f"Requests({kind})"

        def estimate_inmemory_data_size(self) -> int | None:
            return os.path.getsize(path)

        def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                           data_context: DataContext | None = None) -> list[ReadTask]:
            if kind != "parquet":
                tasks: list[ReadTask] = []
                for span in spans:
                    mine = _skip_within(skip, span.first, span.rows)
                    left = span.rows - (0 if mine is None else len(mine))
                    if left:  # a span wholly done by an earlier run needs no task
                        tasks.append(ReadTask(_span_task(span, mine), _meta(left, span.end - span.start)))
                return tasks
            md = pq.ParquetFile(path).metadata
            tasks, first = [], 0
            per_task = max(1, -(-md.num_row_groups // max(1, parallelism)))
            for lo in range(0, md.num_row_groups, per_task):
                groups = list(range(lo, min(lo + per_task, md.num_row_groups)))
                n = sum(md.row_group(g).num_rows for g in groups)
                tasks.append(ReadTask(_parquet_task(groups, first, _skip_within(skip, first, n)), _meta(n, None)))
                first += n
            return tasks

    return RequestFile()  # type: ignore[no-untyped-call, unused-ignore]  # ray's Datasource.__init__ is untyped


def read_requests(path: str, fmt: str | None = None, *, block_rows: int = 256, skip: Indices = None,
                  read_cpus: float = 0.25) -> Dataset:
    """`ray.data.Dataset` of numbered requests from an EDN, JSONL or Parquet file: blocks of
    `block_rows` adjacent requests (Parquet: of at most `block_rows`, within a row group)."""
    import ray.data
    # Reading is light: a quarter CPU, so a small node with request actors on it can still read.
    ds: Dataset = ray.data.read_datasource(request_datasource(path, fmt, block_rows=block_rows, skip=skip),
                                           num_cpus=read_cpus)
    if detect_input_format(path, fmt) != "parquet":
        return ds  # a task per span, a block per task: already cut and numbered
    return ds.repartition(target_num_rows_per_block=block_rows, strict=True)
