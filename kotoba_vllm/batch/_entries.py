"""Batch input, one located entry at a time: EDN request forms or OpenAI/vLLM batch JSONL lines."""

from __future__ import annotations

import sys
from typing import IO, Iterator

from .._edn import EdnError, Form
from .._errors import InternalError
from .._problems import Problem
from .._requests import locate_problems, request_from_edn
from .._validate import request_problems
from ._edn_stream import FormStream
from ._entry import BatchEntry
from ._jsonl import iter_jsonl_entries

__all__ = ["BatchEntry", "detect_format", "entry_from_form", "iter_edn_entries", "iter_entries", "syntax_entry"]


def detect_format(path: str, fmt: str | None = None) -> str:
    if fmt and fmt != "auto":
        return fmt
    return "jsonl" if path.endswith((".jsonl", ".ndjson")) else "edn"


def _open(path: str) -> IO[str]:
    if path == "-":
        return sys.stdin
    return open(path, encoding="utf-8", errors="strict", newline="")


def syntax_entry(index: int, err: EdnError) -> BatchEntry:
    """The entry for a form that does not read: an `:edn/syntax` problem, nothing to send."""
    where = f"{err.source}:{err.line}:{err.column}"
    return BatchEntry(index, where, None, (Problem("error", "edn/syntax", err.msg, where=where),))


def entry_from_form(index: int, f: Form) -> BatchEntry:
    """One read EDN form as a request entry, its problems located in the form's text."""
    try:
        req, problems = request_from_edn(f.value, f)
        if req is not None:  # engine-independent checks now, so their problems name the key's line
            found = request_problems(req)
            if found:
                problems = problems + locate_problems(found, f)
    except Exception as exc:  # a reader bug costs this form its request, never the run its records
        msg = InternalError.from_exception(exc, during="while reading this request").message
        return BatchEntry(index, f.where, None, (Problem("error", "request/internal", msg, where=f.where),))
    return BatchEntry(index, f.where, req, tuple(problems), checked=req is not None, anchor=f.anchor())


def iter_edn_entries(fh: IO[str], source: str) -> Iterator[BatchEntry]:
    """Each request form of an EDN stream; a form that does not read is an entry with an
    `:edn/syntax` problem, and reading goes on."""
    for i, f in enumerate(FormStream(fh, source, recover=True)):
        yield syntax_entry(i, f) if isinstance(f, EdnError) else entry_from_form(i, f)


def iter_entries(path: str, fmt: str | None = None) -> Iterator[BatchEntry]:
    """Stream the entries of `path` ('-' is stdin) without reading the file whole."""
    fmt = detect_format(path, fmt)
    source = "<stdin>" if path == "-" else path
    fh = _open(path)
    try:
        if fmt == "jsonl":
            yield from iter_jsonl_entries(fh, source)
        else:
            try:
                yield from iter_edn_entries(fh, source)
            except UnicodeDecodeError as e:
                raise EdnError(f"not UTF-8 text ({e.reason})", source, 1, 1) from None
    finally:
        if fh is not sys.stdin:
            fh.close()

