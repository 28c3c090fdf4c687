"""Batch runs: many requests from a file, bounded concurrency, every input answered once,
results in input order, resumable after an interrupt; EDN or OpenAI/vLLM batch JSONL.

    from kotoba_vllm.batch import iter_entries, run_batch
"""

from __future__ import annotations

from ._collector import batch_collector
from ._edn_stream import FormStream, read_located
from ._entries import BatchEntry, detect_format, entry_from_form, iter_entries, syntax_entry
from ._flow import FixedLimit, FlowControl, Limiter
from ._ids import new_prefix, with_request_ids
from ._jsonl import line_to_entry
from ._output import ExistingOutput, OrderedSink, journal_path, load_existing
from ._runner import BatchRunner, BatchSummary, Recorder, attempt_of

__all__ = ["BatchEntry", "BatchRunner", "BatchSummary", "ExistingOutput", "FixedLimit", "FlowControl", "FormStream",
           "Limiter", "OrderedSink",
           "Recorder", "attempt_of", "batch_collector", "detect_format", "entry_from_form", "iter_entries", "journal_path", "line_to_entry", "load_existing",
           "new_prefix", "read_located", "syntax_entry", "with_request_ids"]
