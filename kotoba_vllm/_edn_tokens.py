"""The EDN tokenizer: the one lexer under every reader (`read_forms`, the streaming batch reader, Ray's span
planner).

`Tokens(text, start)` yields each token's index and text, comments included (`; ...`), whitespace left
out, and says where each one starts and ends. A token's kind is told by its text alone: `"` opens a string (a lone `"` is one never closed),
`:` a keyword, `\\` a character (a lone `\\` is one with no character), `([{` and `#{` open, `)]}` close, `^`
and `#^` metadata, `#_` a discard, `#:` a namespaced map, `#` and an ASCII letter a tag, any other `#...` a
dispatch; anything else is an atom (a number, symbol, nil, true or false), checked by the reader.

The fast path is inside: a line with no backslash whose code (outside its strings) is ASCII with no `#`,
`;` or `^` splits at its quotes and then at blanks and brackets in C, and yields the same tokens at the
same offsets as the regular expression does (`tests/test_edn_tokens.py` holds the two equal). Which path a
line takes depends on that line's text alone.
"""

from __future__ import annotations

import bisect
import itertools
import re
from typing import Iterator

__all__ = ["WHITESPACE", "Tokens", "blank_end", "plain_tokens"]

# What ends a token, as clojure.edn decides: Java's Character.isWhitespace, the comma, and the
# terminating macro characters. Python's `\s` differs (it counts U+00A0 and U+0085; Java does not),
# and a differing split would read `a<U+00A0>b` as two symbols where Clojure reads one.
WHITESPACE = "\t\n\x0b\x0c\r\x1c-\x1f ,\u1680\u2000-\u2006\u2008-\u200a\u2028\u2029\u205f\u3000"
_STOP = WHITESPACE + '";^()\\[\\]{}\\\\'

# `atom` comes second: it is the commonest token after whitespace and, never starting with '#' or a
# stop character, it matches nowhere another alternative does, so its place changes no answer.
# The groups only say where a token ends; `tokens` passes on the text.
_TOKEN = re.compile(
    rf"""
    (?P<ws>[{WHITESPACE}]+)
  | (?P<token>
      [^{_STOP}\#][^{_STOP}]*
    | "(?:[^"\\]|\\.)*"
    | ;[^\n\r]*
    | \#\{{|[\[({{\])}}]
    | \#[_^:]
    | \^
    | \#[A-Za-z][^{_STOP}]*
    | \#.?
    | \\.[^{_STOP}]*
    | .)
    """,
    re.VERBOSE | re.DOTALL,
)

# A line longer than this takes the regular expression, which lexes only as far as it is read (a file that
# is one long line of requests is read one element at a time).
PLAIN_LINE_MAX = 1 << 14
STRETCH = 256  # tokens the regular expression lexes at a time


def plain_tokens(line: str) -> list[str] | None:
    """The tokens of `line` when it is plain (see the module's docstring), else None. On ASCII text
    `str.split` cuts at exactly EDN's blanks but the comma (padded here), so the tokens are the regular
    expression's."""
    if "\\" in line:
        return None
    pieces = line.split('"')
    if not len(pieces) % 2:
        return None  # a string the line does not close
    out: list[str] = []
    in_string = False
    for piece in pieces:
        if in_string:
            out.append('"' + piece + '"')
        elif piece.isascii() and "#" not in piece and ";" not in piece and "^" not in piece:
            # brackets padded so that `str.split` cuts at them too (`replace` is C; `translate` per char is not)
            code = piece.replace("{", " { ").replace("}", " } ").replace("[", " [ ").replace("]", " ] ")
            if "(" in code or ")" in code:
                code = code.replace("(", " ( ").replace(")", " ) ")
            out += code.replace(",", " ").split()
        else:
            return None
        in_string = not in_string
    return out


# what may stand before a plain line's first token or after its last (ASCII blanks and the comma)
_BLANK = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f,"


class Tokens:
    """The tokens of `text` from `start` on, lexed as far as they are read: iterate it for (index, text)
    pairs; `offset(i)` and `end(i)` say where token `i` starts and ends. A plain line keeps no offsets
    (finding them costs more than the rest of reading it): its first token's and last token's are found
    from the line's blanks, any other by lexing that line again (the same text lexes the same)."""

    __slots__ = ("text", "_firsts", "_starts", "_offsets", "_iter")

    def __init__(self, text: str, start: int = 0) -> None:
        self.text = text
        # per line or stretch lexed: its first token's index, its start offset, its tokens' offsets (a plain
        # line: how many tokens it has)
        self._firsts: list[int] = []
        self._starts: list[int] = []
        self._offsets: list[list[int] | int] = []
        lines = _lex(text, start, self._firsts, self._starts, self._offsets)  # holds no `self`: no cycle to collect
        self._iter = enumerate(itertools.chain.from_iterable(lines))  # a line's tokens in C

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return self._iter

    def _place(self, i: int) -> tuple[int, int, list[int] | int]:
        """The stretch token `i` was lexed in: its first token's index, its start, its offsets (or count)."""
        firsts = self._firsts
        c = len(firsts) - 1 if i >= firsts[-1] else bisect.bisect_right(firsts, i) - 1  # mostly the last
        return self._firsts[c], self._starts[c], self._offsets[c]

    def offset(self, i: int) -> int:
        """Where token `i` (already read) starts in the text."""
        first, start, at = self._place(i)
        if type(at) is list:
            return at[i - first]
        text = self.text
        if i == first:
            nl = text.find("\n", start)
            line = text[start:len(text) if nl == -1 else nl + 1]
            return start + len(line) - len(line.lstrip(_BLANK))
        return self._plain_offsets(start)[i - first]

    def end(self, i: int) -> int:
        """Where token `i` (already read) ends in the text."""
        first, start, at = self._place(i)
        if type(at) is list:
            return at[i - first] + len(self._token(at[i - first]))
        text = self.text
        if type(at) is int and i - first == at - 1:  # the line's last token: its closing bracket, as a request line ends
            nl = text.find("\n", start)
            return start + len(text[start:len(text) if nl == -1 else nl + 1].rstrip(_BLANK))
        offset = self._plain_offsets(start)[i - first]
        return offset + len(self._token(offset))

    def _token(self, offset: int) -> str:
        m = _TOKEN.match(self.text, offset)
        assert m is not None
        return m.group()

    def _plain_offsets(self, start: int) -> list[int]:
        text = self.text
        nl = text.find("\n", start)
        toks = plain_tokens(text[start:len(text) if nl == -1 else nl + 1])
        assert toks is not None  # the same line lexes the same
        out: list[int] = []
        pos = start
        for tok in toks:
            pos = text.find(tok, pos)  # only blanks lie between two tokens: the first find is the token
            out.append(pos)
            pos += len(tok)
        return out


def _lex(text: str, pos: int, firsts: list[int], starts: list[int],
         offsets: list[list[int] | int]) -> Iterator[list[str]]:
    """The tokens line by line (a long line's in stretches of `STRETCH`)."""
    n, count = len(text), 0
    while pos < n:
        nl = text.find("\n", pos)
        stop = n if nl == -1 else nl + 1
        toks = plain_tokens(text[pos:stop]) if stop - pos <= PLAIN_LINE_MAX else None
        firsts.append(count)
        starts.append(pos)
        if toks is not None:
            offsets.append(len(toks))
            count += len(toks)
            yield toks
            pos = stop
            continue
        at: list[int] = []
        offsets.append(at)
        toks = []
        for m in _TOKEN.finditer(text, pos):  # up to the token that reaches this line's end
            pos = m.end()
            if m.lastgroup == "token":
                at.append(m.start())
                toks.append(m.group())
            if pos >= stop or len(toks) >= STRETCH:
                break
        else:
            pos = n
        count += len(toks)
        yield toks


_BLANKS = re.compile(f"[{WHITESPACE}]*")


def blank_end(text: str, pos: int) -> int:
    """Where the first token at or after `pos` starts: past blanks and comments, or at the start of a
    comment that runs to the text's end (a buffer's comment may go on in the next one)."""
    while True:
        m = _BLANKS.match(text, pos)
        assert m is not None  # `*`: it matches the empty string
        pos = m.end()
        if not text.startswith(";", pos):
            return pos
        ends = [e for e in (text.find("\n", pos), text.find("\r", pos)) if e != -1]
        if not ends:
            return pos
        pos = min(ends)
