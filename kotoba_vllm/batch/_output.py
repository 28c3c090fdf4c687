"""Ordered, resumable batch output.

The output file only ever holds records in input order: record i is written once
records 0..i-1 are. A record that finishes early waits in memory *and* is appended to a
sidecar journal (`OUTPUT.pending`), so an interrupt or a crash never loses a finished
result. `--resume` reads the output (which input positions are answered), takes the
journal's records for positions after the first gap, sends only what is in neither, and
appends in order; when nothing is left waiting the journal is removed.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import IO, Iterable, Mapping

from .._edn import Edn, EdnError, dumps, kw, pretty
from ._edn_stream import FormStream
from ._jsonl import line_index

K_INDEX = kw("vllm/request-index")
K_ERROR = kw("vllm/error")


def journal_path(output: str) -> str:
    return output + ".pending"


_PIECE = 1 << 20  # characters of a record written at once


class ExistingOutput:
    """What an earlier run left: answered positions, and journaled records past the first gap."""

    def __init__(self) -> None:
        self.done: set[int] = set()
        self.journal: dict[int, tuple[list[str], str]] = {}  # index -> (record text lines, outcome)


def _edn_outcome(rec: Mapping[object, Edn]) -> str:
    err = rec.get(K_ERROR)
    return getattr(err, "name", None) or ("ok" if err is None else str(err))


def _jsonl_outcome(line: str) -> str:
    try:
        err = json.loads(line).get("error")
    except ValueError:
        return "unknown"
    return "ok" if err is None else str(err.get("code") if isinstance(err, dict) else "error")


def _read_records(path: str, fmt: str) -> tuple[list[tuple[int, str, str]], bool]:
    """(index, record text, outcome) for every record in `path`, and whether anything did not read
    (a torn last record after a crash)."""
    out: list[tuple[int, str, str]] = []
    bad = False
    if fmt == "jsonl":
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    continue
                idx = line_index(line)
                if idx is None or not line.endswith("\n"):
                    bad = True
                    continue
                out.append((idx, line.rstrip("\n"), _jsonl_outcome(line)))
        return out, bad
    with open(path, encoding="utf-8", errors="replace") as fh:
        for f in FormStream(fh, path, vector_elements=False, recover=True):
            if isinstance(f, EdnError):
                bad = True
                continue
            v = f.value
            index = v.get(K_INDEX) if isinstance(v, dict) else None
            if isinstance(index, int) and isinstance(v, dict):
                out.append((index, dumps(v), _edn_outcome(v)))
    return out, bad


def load_existing(output: str, fmt: str, redo: frozenset[str] = frozenset()) -> ExistingOutput:
    """Read an earlier run's output and journal. A torn record at the end of the output is
    dropped by rewriting the file from the records that do read.

    `redo`: outcomes to send again (`--redo admission-rejected`). Every other record moves to the
    journal (written whole, then put in place of the old one, so a crash loses nothing) and the output
    starts empty: the run writes kept and new records in input order."""
    ex = ExistingOutput()
    if redo:
        return _for_redo(output, fmt, redo)
    if os.path.exists(output):
        records, bad = _read_records(output, fmt)
        if bad:
            tmp = output + ".rewrite"
            with open(tmp, "w", encoding="utf-8") as fh:
                for _, text, _ in records:
                    fh.write(text + "\n")
            os.replace(tmp, output)
        ex.done.update(i for i, _, _ in records)
    jp = journal_path(output)
    if os.path.exists(jp):
        for i, text, outcome in _read_records(jp, fmt)[0]:
            if i not in ex.done:
                ex.journal[i] = ([text], outcome)
    return ex


def _for_redo(output: str, fmt: str, redo: frozenset[str]) -> ExistingOutput:
    ex = ExistingOutput()
    jp = journal_path(output)
    kept: dict[int, tuple[str, str]] = {}
    for path in (output, jp):
        if os.path.exists(path):
            for i, text, outcome in _read_records(path, fmt)[0]:
                kept.setdefault(i, (text, outcome))
    kept = {i: r for i, r in kept.items() if r[1] not in redo}
    tmp = jp + ".rewrite"
    with open(tmp, "w", encoding="utf-8") as fh:
        for i in sorted(kept):
            fh.write(kept[i][0] + "\n")
    os.replace(tmp, jp)
    open(output, "w", encoding="utf-8").close()  # every record kept is in the journal now
    ex.journal = {i: ([text], outcome) for i, (text, outcome) in kept.items()}
    return ex


class OrderedSink:
    """Writes each record in input order; holds (and journals) the ones that finish early."""

    def __init__(self, out: IO[str], *, journal: str | None = None, skip: Iterable[int] = ()) -> None:
        self.out = out
        self.journal_path = journal
        self._journal: IO[str] | None = None
        self.skip = set(skip)  # positions the output already holds
        self.next = 0
        self.buffer: dict[int, list[str]] = {}
        self.written = 0
        self._advanced = asyncio.Event()
        self._advance_skips()

    def _advance_skips(self) -> None:
        while self.next in self.skip:
            self.skip.discard(self.next)
            self.next += 1

    def put(self, index: int, lines: list[str], *, journaled: bool = False) -> None:
        if index == self.next:
            self._write(lines)
            self.next += 1
            self._advance_skips()
            while self.next in self.buffer:
                self._write(self.buffer.pop(self.next))
                self.next += 1
                self._advance_skips()
            self.out.flush()
            self._advanced.set()
            return
        self.buffer[index] = lines
        if self.journal_path is not None and not journaled:
            if self._journal is None:
                self._journal = open(self.journal_path, "a", encoding="utf-8")
            self._journal.write(lines[-1] + "\n")  # the record itself; stream deltas are not kept
            self._journal.flush()

    def _write(self, lines: list[str]) -> None:
        for line in lines:
            # not `line + "\n"`, and a long record in pieces: each would copy a record as large as its answer
            # once more (the text file encodes what it is given whole)
            if len(line) > _PIECE:
                for i in range(0, len(line), _PIECE):
                    self.out.write(line[i:i + _PIECE])
            else:
                self.out.write(line)
            self.out.write("\n")
        self.written += 1

    def wake(self) -> None:
        self._advanced.set()

    async def wait_window(self, index: int, window: int, stop: asyncio.Event) -> None:
        """Bound memory: do not start position `index` while `window` positions before it are unwritten."""
        while index - self.next >= window and not stop.is_set():
            self._advanced.clear()
            await self._advanced.wait()

    @property
    def waiting(self) -> int:
        return len(self.buffer)

    def close(self, *, keep_journal: bool = False) -> None:
        """Every record held is already in the journal when there is one; without a journal
        (stdout) the held records are written now, in order, gaps and all."""
        if self._journal is not None:
            self._journal.close()
        if self.journal_path is None:
            for i in sorted(self.buffer):
                self._write(self.buffer.pop(i))
        elif not self.buffer and not keep_journal and os.path.exists(self.journal_path):
            os.remove(self.journal_path)  # everything journaled reached the output
        self.out.flush()


def render_edn(value: object, pretty_print: bool) -> str:
    return pretty(value) if pretty_print else dumps(value)

