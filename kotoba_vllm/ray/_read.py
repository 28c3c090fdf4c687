"""Ray Data readers that number every request: EDN and JSONL stream through one read task (one
chunk and one form in memory at a time, blocks of `block_rows` going downstream as they fill);
Parquet splits by row group, numbered from the file's metadata.

Rows: `request_index`, `request` (EDN text or the JSONL line), `where` ("file:line:column");
Parquet rows keep their own columns and must hold a `request` column or the batch JSONL columns.
`skip` (a sorted array of indices that already have a record) leaves those rows out: `--resume`.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._edn import EdnError, dumps
from .._errors import ConfigError
from ..batch import FormStream, read_located
from ._rows import INDEX, REQUEST, WHERE

FORMATS = ("edn", "jsonl", "parquet")


def detect_input_format(path: str, fmt: str | None = None) -> str:
    if fmt and fmt != "auto":
        return fmt
    if path.endswith(".parquet"):
        return "parquet"
    return "jsonl" if path.endswith((".jsonl", ".ndjson")) else "edn"


def _edn_rows(path: str) -> Iterator[tuple[str, str]]:
    """(form text, where) per request form, without reading the file whole."""
    with open(path, encoding="utf-8", newline="") as fh:
        for seg, line, col in FormStream(fh, path, recover=True).segments():
            try:
                forms = list(read_located(seg, path, line, col))
            except EdnError:
                forms = None  # the stage reads it again and records the located syntax problem
            if forms is None or len(forms) == 1:
                yield seg, f"{path}:{line}:{col}"
            else:  # several atoms cut as one segment (rare): one row each
                for f in forms:
                    yield dumps(f.value), f.where


def _jsonl_rows(path: str) -> Iterator[tuple[str, str]]:
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():  # blank lines are not requests (as vLLM's reader does)
                yield line.rstrip("\r\n"), f"{path}:{lineno}:1"


def _skipped(skip: Any, index: int) -> bool:
    if skip is None or len(skip) == 0:
        return False
    pos = int(np.searchsorted(skip, index))
    return pos < len(skip) and int(skip[pos]) == index


def _text_blocks(path: str, fmt: str, block_rows: int, skip: Any) -> Iterator[Any]:
    rows = _edn_rows(path) if fmt == "edn" else _jsonl_rows(path)
    idx: list[int] = []
    req: list[str] = []
    where: list[str] = []
    for i, (text, at) in enumerate(rows):
        if _skipped(skip, i):
            continue
        idx.append(i)
        req.append(text)
        where.append(at)
        if len(idx) >= block_rows:
            yield pa.table({INDEX: pa.array(idx, pa.int64()), REQUEST: req, WHERE: where})
            idx, req, where = [], [], []
    if idx:
        yield pa.table({INDEX: pa.array(idx, pa.int64()), REQUEST: req, WHERE: where})


def _parquet_blocks(path: str, groups: list[int], first: int, block_rows: int, skip: Any) -> Iterator[Any]:
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


def request_datasource(path: str, fmt: str | None = None, *, block_rows: int = 256, skip: Any = None) -> Any:
    """A `ray.data.Datasource` for a request file (use with `ray.data.read_datasource`)."""
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    kind = detect_input_format(path, fmt)
    if kind not in FORMATS:
        raise ConfigError(f"input format must be one of {', '.join(FORMATS)}")
    if block_rows < 1:
        raise ConfigError("block_rows must be >= 1")

    def _parquet_task(groups: list[int], first: int) -> Callable[[], Iterator[Any]]:
        return lambda: _parquet_blocks(path, groups, first, block_rows, skip)

    class RequestFile(Datasource):
        def get_name(self) -> str:
            return f"Requests({kind})"

        def estimate_inmemory_data_size(self) -> int | None:
            return os.path.getsize(path)

        def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                           data_context: Any = None) -> list[Any]:
            meta = BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None, input_files=(path,))
            if kind != "parquet":
                return [ReadTask(lambda: _text_blocks(path, kind, block_rows, skip), meta)]
            md = pq.ParquetFile(path).metadata
            tasks, first = [], 0
            per_task = max(1, -(-md.num_row_groups // max(1, parallelism)))
            for lo in range(0, md.num_row_groups, per_task):
                groups = list(range(lo, min(lo + per_task, md.num_row_groups)))
                n = sum(md.row_group(g).num_rows for g in groups)
                tasks.append(ReadTask(_parquet_task(groups, first),
                                      BlockMetadata(num_rows=n, size_bytes=None, exec_stats=None,
                                                    input_files=(path,))))
                first += n
            return tasks

    return RequestFile()  # type: ignore[no-untyped-call]  # ray's Datasource.__init__ is untyped


def read_requests(path: str, fmt: str | None = None, *, block_rows: int = 256, skip: Any = None,
                  read_cpus: float = 0.25) -> Any:
    """`ray.data.Dataset` of numbered requests from an EDN, JSONL or Parquet file."""
    import ray.data
    # Ray merges a read's output up to DataContext.target_max_block_size (128 MiB by default): one
    # streaming read of a large file would hand the next stage blocks of ~400k requests and fill a small
    # object store. The dataset keeps a copy of the context taken here, with a block size near a few
    # thousand requests; the repartition below cuts exactly block_rows.
    ctx = ray.data.DataContext.get_current()
    default = ctx.target_max_block_size
    ctx.target_max_block_size = max(1 << 20, block_rows * 4096)
    try:
        # Reading is light: a quarter CPU, so a small node with request actors on it can still read.
        ds = ray.data.read_datasource(request_datasource(path, fmt, block_rows=block_rows, skip=skip),
                                      num_cpus=read_cpus)
    finally:
        ctx.target_max_block_size = default
    # A read's output is merged up to DataContext.target_max_block_size (bytes); cut it back to
    # blocks of block_rows adjacent requests, the unit a map task sends and a part file holds.
    return ds.repartition(target_num_rows_per_block=block_rows, strict=True)
