"""Batch runs past one machine, on Ray Data (`pip install 'kotoba-vllm[ray]'`).

    import ray, kotoba_vllm.ray as kr
    ds = kr.read_requests("prompts.parquet")                  # numbered: request_index, request
    ds = ds.map_batches(kr.RequestStage, fn_constructor_kwargs={"pool": "pool.edn"},
                        batch_format="pyarrow", concurrency=4)
    ds.write_datasink(kr.records_datasink("out/", "parquet"))

Every row comes back with the record `run` writes (EDN, in `record`) and flat typed columns
(`ok`, `error`, `finish_reason`, `text`, tokens, `endpoint_url`, prefill/decode figures with
provenance, `maybe_sent_twice`). Answers are rows, never exceptions: Ray never retries a block
because a server said no. See docs/ray.md.
"""

from __future__ import annotations

from ._intent import IntentLog
from ._read import read_requests, request_datasource
from ._rows import COLUMNS, INDEX, REQUEST, entry_from_row, entry_from_value
from ._stage import RequestStage, UnexpectedError
from ._write import done_indices, part_files, records_datasink

__all__ = ["COLUMNS", "INDEX", "REQUEST", "IntentLog", "RequestStage", "UnexpectedError", "done_indices",
           "entry_from_row", "entry_from_value", "part_files", "read_requests", "records_datasink",
           "request_datasource"]
