"""Text inputs (EDN, JSONL) as byte spans: planned on the driver, read by one Ray task each.

The driver streams the file once (one chunk in memory) and cuts it into spans of `block_rows`
requests, each starting where a request starts: JSONL at a line, EDN at a top-level form (or, in
the one-vector-of-requests shape, an element) found by the same scanner `run` streams with, so
strings, character literals, comments and nesting never fool a cut. A span knows the global index
of its first request and the line and column where it starts, so its read task numbers and locates
its rows on its own: no task ever sees the whole file and nothing is repartitioned afterwards.
"""

from __future__ import annotations

import codecs
from typing import IO, Iterator, NamedTuple

from .._edn import EdnError, dumps
from ..batch import FormStream, read_located

# Read this far back from a span's start to find its line's start (for a column in characters);
# a longer line keeps the column counted in bytes.
_COLUMN_LOOKBACK = 1 << 16


class Span(NamedTuple):
    start: int  # byte offset of its first request
    end: int  # byte offset just past its last request
    first: int  # request index of its first request
    rows: int
    line: int  # where `start` is in the file (column in characters)
    column: int


def segment_rows(seg: str, source: str, line: int, column: int) -> list[tuple[str, str]]:
    """The requests in one cut segment, as (text, "file:line:column"): a bracketed form is one
    request; a segment of atoms (rare) is read to count them. A segment that does not read is one
    request: the stage reads it again and records the located problem."""
    where = f"{source}:{line}:{column}"
    if seg[:1] in ("{", "[", "("):  # the scanner cut it right after this bracket closed: one form
        return [(seg, where)]
    try:
        forms = list(read_located(seg, source, line, column))
    except EdnError:
        return [(seg, where)]
    # Atoms, tags, discards, metadata: each request is its own text, from where the reader says it starts.
    starts = [_offset(seg, line, column, f.line, f.column) for f in forms]
    if any(a is None for a in starts):
        return [(dumps(f.value), f.where) for f in forms]
    ends = [*starts[1:], len(seg)]
    return [(seg[a:b], f.where) for f, a, b in zip(forms, starts, ends)]


def _offset(seg: str, line: int, column: int, at_line: int, at_column: int) -> int | None:
    """Where in `seg` (which starts at line:column) the position at_line:at_column is."""
    if at_line == line:
        off = at_column - column
    else:
        nl = -1
        for _ in range(at_line - line):
            nl = seg.find("\n", nl + 1)
            if nl == -1:
                return None
        off = nl + at_column
    return off if 0 <= off < len(seg) else None


class _ByteText:
    """A binary file read as latin-1 text: one character per byte, so text offsets are byte offsets
    (UTF-8 never puts an ASCII byte inside a character, so the scanner sees the same structure)."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh, self.consumed = fh, 0

    def read(self, n: int) -> str:
        data = self.fh.read(n)
        self.consumed += len(data)
        return data.decode("latin-1")


class _Utf8Range:
    """`n` bytes of a binary file from where it stands, decoded as UTF-8 as they are read."""

    def __init__(self, fh: IO[bytes], n: int) -> None:
        self.fh, self.left = fh, n
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def read(self, n: int) -> str:
        data = self.fh.read(min(n, self.left)) if self.left > 0 else b""
        self.left -= len(data)
        return self.decoder.decode(data, final=not data)


def _char_column(fh: IO[bytes], start: int, byte_column: int) -> int:
    """The column of byte offset `start` counted in characters, as the reader counts it."""
    back = byte_column - 1
    if back == 0 or back > _COLUMN_LOOKBACK:
        return byte_column
    here = fh.tell()
    fh.seek(start - back)
    text = fh.read(back).decode("utf-8", "replace")
    fh.seek(here)
    return len(text) + 1


def plan_edn(path: str, block_rows: int) -> Iterator[Span]:
    """Spans of `block_rows` requests (the last may hold fewer). Raises `EdnError` (located) for
    what breaks the file's shape: a vector of requests never closed, or anything after it."""
    with open(path, "rb") as fh, open(path, "rb") as side:
        text = _ByteText(fh)
        stream = FormStream(text, path, recover=True)  # type: ignore[arg-type]  # read() is all it uses
        count = 0
        span: list[int] | None = None  # [start, first, line, column] of the span being filled
        end = 0
        for seg, line, col in stream.segments():
            end = text.consumed - (len(stream.buf) - stream.off)  # the stream stands just past seg
            start = end - len(seg)
            if seg[:1] in ("{", "[", "("):
                n = 1
            else:  # rare: atoms, tagged values, discards; count them as the read task will
                n = len(segment_rows(seg.encode("latin-1").decode("utf-8", "replace"), path, line, col))
            if n == 0:
                continue
            if span is None:
                span = [start, count, line, _char_column(side, start, col)]
            count += n
            if count - span[1] >= block_rows:
                yield Span(span[0], end, span[1], count - span[1], span[2], span[3])
                span = None
        if span is not None:
            yield Span(span[0], end, span[1], count - span[1], span[2], span[3])


def read_edn_span(path: str, span: Span) -> Iterator[tuple[str, str]]:
    """(request text, where) of every request in the span, in order."""
    with open(path, "rb") as fh:
        fh.seek(span.start)
        text = _Utf8Range(fh, span.end - span.start)
        stream = FormStream(text, path, vector_elements=False, recover=True)  # type: ignore[arg-type]  # read() only
        stream.line, stream.column = span.line, span.column
        for seg, line, col in stream.segments():
            yield from segment_rows(seg, path, line, col)


def plan_jsonl(path: str, block_rows: int) -> Iterator[Span]:
    """Spans of `block_rows` non-blank lines (blank lines are not requests, as in vLLM's reader)."""
    with open(path, "rb") as fh:
        pos = count = lineno = 0
        span: tuple[int, int, int] | None = None  # start, first, line
        for raw in fh:
            lineno += 1
            at, pos = pos, pos + len(raw)
            if not raw.strip():
                continue
            if span is None:
                span = (at, count, lineno)
            count += 1
            if count - span[1] >= block_rows:
                yield Span(span[0], pos, span[1], count - span[1], span[2], 1)
                span = None
        if span is not None:
            yield Span(span[0], pos, span[1], count - span[1], span[2], 1)


def read_jsonl_span(path: str, span: Span) -> Iterator[tuple[str, str]]:
    with open(path, "rb") as fh:
        fh.seek(span.start)
        left, lineno = span.end - span.start, span.line
        while left > 0:
            raw = fh.readline(left)
            if not raw:
                return
            left -= len(raw)
            if raw.strip():
                yield raw.decode("utf-8", "replace").rstrip("\r\n"), f"{path}:{lineno}:1"
            lineno += 1
