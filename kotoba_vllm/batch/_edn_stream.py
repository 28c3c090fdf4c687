"""Streaming EDN: cut a large file into top-level forms without reading it whole.

The EDN tokenizer (`_edn_tokens`, the one under every reader) finds where each top-level
form closes by its brackets; each cut segment is then read by the ordinary position-aware
reader, with its line and column shifted to the segment's place in the file. A file
that is one vector of requests is streamed element by element the same way.
Memory: one read chunk plus one form at a time.
"""

from __future__ import annotations

from typing import IO, Iterator

from .._edn import EdnError, Form, read_coll_at, read_forms
from .._edn_tokens import Tokens, blank_end

CHUNK = 1 << 20

def _read_segment(text: str, source: str, line: int, column: int) -> Iterator[Form]:
    return read_forms(text, source, line=line, column=column)


def read_located(text: str, source: str, line: int = 1, column: int = 1) -> Iterator[Form]:
    """The forms of `text` located as if it started at `line`:`column` of `source`
    (a segment cut from a larger file keeps the file's positions in its problems)."""
    return _read_segment(text, source, line, column)


class FormStream:
    """Yield the top-level forms of a text stream one at a time, located in the file.

    `vector_elements=True`: when the first form is a vector, yield its elements instead
    (the "one vector of requests" file shape); forms after that vector are an error.
    `recover=True`: a segment that does not read yields its `EdnError` in place of forms and
    reading goes on at the next segment (segments are cut on brackets and strings alone, so
    a bad token inside one form does not spoil the rest).
    """

    def __init__(self, fh: IO[str], source: str, *, vector_elements: bool = True, chunk: int = CHUNK,
                 recover: bool = False) -> None:
        self.fh, self.source, self.chunk = fh, source, chunk
        self.recover = recover
        self.vector_elements = vector_elements
        self.buf = ""
        self.off = 0  # buf[:off] is consumed; slicing per form would copy the chunk each time
        self.eof = False
        self.line, self.column = 1, 1  # file position of buf[off]

    def _more(self) -> bool:
        if self.eof:
            return False
        data = self.fh.read(self.chunk)
        if not data:
            self.eof = True
            return False
        self.buf = self.buf[self.off:] + data
        self.off = 0
        return True

    def _advance(self, to: int) -> None:
        """Consume buf[off:to], keeping the line and column of the new position."""
        nl = self.buf.count("\n", self.off, to)
        if nl:
            self.line += nl
            self.column = to - self.buf.rfind("\n", self.off, to)
        else:
            self.column += to - self.off
        self.off = to

    def _skip_blank(self) -> None:
        while True:
            end = blank_end(self.buf, self.off)
            self._advance(end)
            if end < len(self.buf) and self.buf[end] != ";":
                return
            # blank to the buffer's end, or a comment that may go on in the next chunk: kept
            if not self._more():
                self._advance(len(self.buf))
                return

    def _cut(self, in_vector: bool) -> int:
        """Offset just past the form that starts at `off`, reading more as needed (buffer end at EOF).
        Inside the top-level vector, its closing `]` is left in place. Only brackets change the depth;
        metadata (`^m form`, `#^m form`) after a bracketed `m` needs one more form."""
        depth, pos, pending_meta = 0, self.off, 0
        while True:
            lex = Tokens(self.buf, pos)
            for i, tok in lex:
                c = tok[0]
                if c in "([{" or tok == "#{":
                    depth += 1
                elif c in ")]}":
                    depth -= 1
                    if depth < 0 and in_vector:
                        return lex.offset(i)
                    if depth == 0 and pending_meta:  # that was metadata; its target follows
                        pending_meta -= 1
                    elif depth <= 0:
                        return lex.end(i)
                elif c == "^" or tok == "#^":
                    pending_meta += depth == 0
                elif tok == '"' or tok == "\\" or c == ";" and lex.end(i) == len(self.buf):
                    # a string, character or comment the buffer cuts: it may go on in the next chunk
                    if not self.eof:
                        pos = lex.offset(i)
                        break
                    if c != ";":
                        return len(self.buf)  # unterminated at EOF: the reader locates it
            else:
                pos = len(self.buf)
            before = len(self.buf) - self.off
            pos -= self.off
            if not self._more() and pos >= before:
                return len(self.buf)
            pos += self.off

    def __iter__(self) -> Iterator[Form | EdnError]:
        for seg, line, col, form in self._pieces(read_maps=True):
            if form is not None:
                yield form
                continue
            if not self.recover:
                yield from _read_segment(seg, self.source, line, col)
                continue
            try:
                forms = list(_read_segment(seg, self.source, line, col))
            except EdnError as e:
                yield e
                continue
            yield from forms

    def segments(self) -> Iterator[tuple[str, int, int]]:
        """The raw text of each top-level form (usually one form, possibly a few atoms) with the
        line and column where it starts; `read_located` reads one back with the same positions."""
        for seg, line, col, _ in self._pieces(read_maps=False):
            yield seg, line, col

    def _pieces(self, read_maps: bool) -> Iterator[tuple[str, int, int, Form | None]]:
        """Each segment, or with `read_maps` a map that reads in place: a map's segment ends at its closing
        brace, so reading it in the buffer gives the same form without cutting it first (half of reading a
        request file). Anything that does not read so (an error, a map the buffer cuts) is cut and read as
        before, with the same errors."""
        self._more()
        self._skip_blank()
        in_vector = False
        open_line = open_col = 0
        if self.vector_elements and self.buf.startswith("[", self.off):
            in_vector, open_line, open_col = True, self.line, self.column
            self._advance(self.off + 1)
        while True:
            self._skip_blank()
            if self.off >= len(self.buf):
                if in_vector:
                    raise EdnError("'[' is never closed", self.source, open_line, open_col)
                return
            if in_vector and self.buf[self.off] == "]":
                self._advance(self.off + 1)
                self._skip_blank()
                if self.off < len(self.buf):
                    raise EdnError("a file that is one vector of requests must hold nothing after it",
                                   self.source, self.line, self.column)
                return
            line, col = self.line, self.column
            if read_maps and self.buf.startswith("{", self.off):
                try:
                    form, end = read_coll_at(self.buf, self.off, self.source, line, col)
                except EdnError:
                    pass
                else:
                    self._advance(end)
                    yield "", line, col, form
                    continue
            end = self._cut(in_vector)
            seg = self.buf[self.off:end]
            self._advance(end)
            yield seg, line, col, None
