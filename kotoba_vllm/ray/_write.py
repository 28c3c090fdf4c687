"""Output: one file per block, its records sorted by request index and the file named by the range
it holds (`part-000000000000-000000000255.jsonl`), so sorting the names and streaming the files
reads every record in input order. Each file is written whole under a temporary name and renamed,
so a re-executed write replaces it with the same content and a reader never sees half a file.

Formats: `jsonl` (the run-batch lines `run -o x.jsonl` writes: `id`, `custom_id`, `response`, `error` and
the `kotoba` extras), `parquet` (the input columns, the typed columns and the EDN `record`), `edn` (the
EDN records alone, exactly what `run` writes).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable, TypedDict

import numpy as np
import pyarrow.parquet as pq

from .._edn import EdnError, kw
from .._errors import ConfigError
from ..batch import FormStream
from ..batch._jsonl import line_index
from ._rows import INDEX

if TYPE_CHECKING:  # the ray extra; without it these are Any, as pyarrow always is (no types)
    import pyarrow as pa
    from numpy.typing import NDArray
    from ray.data.block import Block
    from ray.data.datasource.datasink import WriteResult

BATCH_LINE = "batch_line"


class BlockStats(TypedDict):
    """What a summary counts, for one block of output rows."""

    outcomes: dict[str, int]  # outcome kind -> rows
    rows: int
    sent: int
    maybe_sent_twice: int


class SinkStats(TypedDict):
    """The counts of every block written, merged (`files`: part files)."""

    outcomes: Counter[str]
    rows: int
    sent: int
    maybe_sent_twice: int
    files: int

FORMATS = ("jsonl", "parquet", "edn")
_PART = re.compile(r"part-(\d+)-(\d+)\.(jsonl|parquet|edn)$")


def part_name(lo: int, hi: int, fmt: str) -> str:
    return f"part-{lo:012d}-{hi:012d}.{fmt}"


def part_files(directory: str) -> list[tuple[int, int, str]]:
    """(first index, last index, path) of every finished part file, in index order."""
    out = []
    for name in os.listdir(directory) if os.path.isdir(directory) else ():
        m = _PART.match(name)
        if m:
            out.append((int(m.group(1)), int(m.group(2)), os.path.join(directory, name)))
    return sorted(out)


def _write_table(table: pa.Table, path: str, fmt: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    if fmt == "parquet":
        i = table.schema.get_field_index(BATCH_LINE)
        pq.write_table(table.remove_column(i) if i >= 0 else table, tmp)
    else:
        with open(tmp, "w", encoding="utf-8") as fh:
            for rec in table.column("record" if fmt == "edn" else BATCH_LINE).to_pylist():
                fh.write(rec + "\n")
    os.replace(tmp, path)


def _runs(table: pa.Table) -> list[pa.Table]:
    """The table (sorted by index) cut where the index skips: a file holds every index of its range,
    so the ranges of any two files never overlap (inputs skipped by --resume are in older files)."""
    index = table.column(INDEX).to_numpy()
    cuts = (np.nonzero(np.diff(index) != 1)[0] + 1).tolist()
    bounds = [0, *cuts, len(index)]
    return [table.slice(a, b - a) for a, b in zip(bounds, bounds[1:])]


def block_stats(table: pa.Table) -> BlockStats:
    outcomes: Counter[str] = Counter()
    for ok, err in zip(table.column("ok").to_pylist(), table.column("error").to_pylist()):
        outcomes["ok" if ok else (err or "error")] += 1
    return {"outcomes": dict(outcomes), "rows": table.num_rows,
            "sent": sum(1 for s in table.column("sent").to_pylist() if s),
            "maybe_sent_twice": sum(1 for s in table.column("maybe_sent_twice").to_pylist() if s)}


def records_datasink(directory: str, fmt: str) -> Any:
    """A `ray.data.Datasink` writing part files into `directory`; `.stats` holds the merged counts
    after `write_datasink` returns. Any: a Datasink with a `stats` attribute (its class is made here, where
    ray is imported), which no annotation outside this function can name."""
    from ray.data.block import BlockAccessor
    from ray.data.datasource import Datasink

    if fmt not in FORMATS:
        raise ConfigError(f"output format must be one of {', '.join(FORMATS)}")

    class RecordFiles(Datasink[list[BlockStats]]):  # type: ignore[misc, unused-ignore]  # Any without ray
        def __init__(self) -> None:
            self.stats: SinkStats = {"outcomes": Counter(), "rows": 0, "sent": 0, "maybe_sent_twice": 0,
                                          "files": 0}

        def get_name(self) -> str:
            return "RecordFiles"

        def on_write_start(self, schema: pa.Schema | None = None) -> None:
            os.makedirs(directory, exist_ok=True)

        def write(self, blocks: Iterable[Block], ctx: object) -> list[BlockStats]:
            out = []
            for block in blocks:
                table = BlockAccessor.for_block(block).to_arrow()
                if table.num_rows == 0:
                    continue
                table = table.sort_by(INDEX)
                for run in _runs(table):
                    index = run.column(INDEX)
                    lo, hi = index[0].as_py(), index[-1].as_py()
                    _write_table(run, os.path.join(directory, part_name(lo, hi, fmt)), fmt)
                    out.append(block_stats(run))
            return out

        def on_write_complete(self, write_result: WriteResult[list[BlockStats]]) -> None:
            for per_task in write_result.write_returns:
                for s in per_task:
                    self.stats["outcomes"].update(s["outcomes"])
                    self.stats["rows"] += s["rows"]
                    self.stats["sent"] += s["sent"]
                    self.stats["maybe_sent_twice"] += s["maybe_sent_twice"]
                    self.stats["files"] += 1

    return RecordFiles()


def _line_index(line: str) -> int:
    """A JSONL part's record: a run-batch line (`kotoba.request_index`), or a row of an older output."""
    i = line_index(line)
    return i if i is not None else int(json.loads(line)[INDEX])


def done_indices(directory: str) -> NDArray[np.int64]:
    """Sorted indices that already have a record in `directory` (numpy int64): what `--resume` skips."""
    parts = []
    for _, _, path in part_files(directory):
        if path.endswith(".parquet"):
            parts.append(pq.read_table(path, columns=[INDEX]).column(INDEX).to_numpy())
        elif path.endswith(".jsonl"):
            with open(path, encoding="utf-8") as fh:
                parts.append(np.fromiter((_line_index(line) for line in fh if line.strip()), np.int64))
        else:
            k = kw("vllm/request-index")
            with open(path, encoding="utf-8") as fh:
                parts.append(np.fromiter((f.value.get(k) for f in FormStream(fh, path, vector_elements=False,
                                                                              recover=True)
                                          if not isinstance(f, EdnError) and isinstance(f.value, dict)), np.int64))
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
