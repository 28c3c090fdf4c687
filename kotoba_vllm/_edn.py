"""The EDN boundary: a position-aware reader and compact / pretty writers.

`edn_format` supplies the value vocabulary (`Keyword`, `Symbol`, `Char`) and the
compact writer. Its reader keeps no positions, silently merges duplicate map keys
and raises NotImplementedError on unknown tags, so reading is done here: every
error names the source, line and column. Maps read as `dict`, vectors as `list`,
lists as `tuple`, sets as `frozenset`.
"""

from __future__ import annotations

import datetime as _dt
import re
import sys
import uuid
from decimal import Decimal
from typing import Any, Callable, Iterator, Mapping, TextIO, TypeAlias, Union

from edn_format import Char, Keyword, Symbol

from ._errors import EdnError, EdnWriteError

__all__ = [
    "Char", "Edn", "EdnError", "EdnMap", "Form", "Keyword", "Symbol", "dumps", "kw",
    "pretty", "read_all", "read_file", "read_forms", "read_one",
]

Edn: TypeAlias = Union[None, bool, int, float, Decimal, str, Keyword, Symbol, Char, _dt.datetime, uuid.UUID,
                       list["Edn"], tuple["Edn", ...], frozenset["Edn"], dict[Any, "Edn"]]
"""An EDN value as the reader returns it and the writers take it: nil, booleans, numbers,
strings, keywords, symbols, characters, #inst, #uuid; vectors as `list`, lists as `tuple`,
sets as `frozenset`, maps as `dict`. Map keys are typed `Any` only because `dict` is
invariant in its key: a `dict[Keyword, Edn]` would otherwise not be an `Edn`."""

EdnMap: TypeAlias = Mapping[Keyword, Edn]
"""A map with keyword keys: an EDN request (`{:vllm/endpoint :chat ...}`), a result, a spec."""

# edn_format hashes a Keyword by building an ImmutableDict of its __dict__ on every call
# (~1.8 us); keyword-keyed dict lookups made that a third of reading a request file.
# Equal keywords have equal names, so hashing the name keeps hash/eq consistent.
Keyword.__hash__ = lambda self: hash(self._name)  # type: ignore[method-assign]

_KW_CACHE: dict[str, Keyword] = {}


def kw(name: str) -> Keyword:
    """An interned `Keyword` (`kw("vllm/model")` is `:vllm/model`)."""
    k = _KW_CACHE.get(name)
    if k is None:
        k = _KW_CACHE[name] = Keyword(name)
    return k


class Form:
    """One top-level form and where it started."""

    __slots__ = ("value", "source", "line", "column", "index", "_reader")

    def __init__(self, value: Edn, source: str, line: int, column: int, index: int,
                 reader: "_Reader | None" = None) -> None:
        self.value, self.source, self.line, self.column, self.index = value, source, line, column, index
        self._reader = reader

    def locate(self, mapping: object, key: Edn) -> tuple[int, int] | None:
        """Line and column of `key` inside a map read as part of this form."""
        r = self._reader
        off = r.key_offsets.get(id(mapping), {}).get(key) if r is not None else None
        return None if off is None or r is None else r.where(off)

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}:{self.column}"

    def nested(self, value: Edn) -> Form:
        """A form for `value`, read inside this one (an element of a top-level vector): it is
        located where this form starts, and the keys of maps inside it stay locatable."""
        return Form(value, self.source, self.line, self.column, 0, self._reader)

    def __repr__(self) -> str:
        return f"Form({self.value!r} @ {self.where})"


_TOKEN = re.compile(
    r"""
    (?P<ws>[\s,]+|;[^\n]*)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<open>\#\{|[\[({])
  | (?P<close>[\])}])
  | (?P<discard>\#_)
  | (?P<tag>\#[A-Za-z][^\s,\[\](){}"#;]*)
  | (?P<hash>\#[^\s]?)
  | (?P<char>\\(?:newline|return|space|tab|u[0-9A-Fa-f]{4}|\S))
  | (?P<atom>[^\s,\[\](){}"\\;]+)
  | (?P<bad>.)
    """,
    re.VERBOSE | re.DOTALL,
)
_INT = re.compile(r"[+-]?(?:0|[1-9][0-9]*)N?$")
_FLOAT = re.compile(r"[+-]?(?:0|[1-9][0-9]*)(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?M?$")
_SYMBOL = re.compile(r"[A-Za-z*!_?$%&=<>.+\-][A-Za-z0-9*!_?$%&=<>.+\-:#']*(?:/[A-Za-z0-9*!_?$%&=<>.+\-:#']+)?$|/$")
_STR_ESC = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "b": "\b", "f": "\f"}
_CHARS = {"newline": "\n", "return": "\r", "space": " ", "tab": "\t"}
_CLOSERS = {"[": "]", "(": ")", "{": "}", "#{": "}"}
_SYMBOLIC = {"NaN": float("nan"), "Inf": float("inf"), "-Inf": float("-inf")}


def _inst(v: Edn) -> _dt.datetime:
    if not isinstance(v, str):
        raise ValueError("#inst needs a string")
    return _dt.datetime.fromisoformat(v.replace("Z", "+00:00"))


def _uuid(v: Edn) -> uuid.UUID:
    if not isinstance(v, str):
        raise ValueError("#uuid needs a string")
    return uuid.UUID(v)


TAG_HANDLERS: dict[str, Callable[[Edn], Edn]] = {"inst": _inst, "uuid": _uuid}
MAX_DEPTH = 100  # nesting levels a reader accepts; requests and specs use a handful


class _Reader:
    def __init__(self, text: str, source: str) -> None:
        self.text, self.source = text, source
        self._mark = (0, 1)  # (offset, line number at that offset) of the last `where`
        self.tokens = _TOKEN.finditer(text)
        self.peeked: re.Match[str] | None = None
        self.key_offsets: dict[int, dict[Any, int]] = {}
        self.depth = 0

    def where(self, pos: int) -> tuple[int, int]:
        # Forms are located in increasing order: count newlines from the last answer, not from
        # the start, or reading a 100,000-request file is quadratic.
        start, line = self._mark if pos >= self._mark[0] else (0, 1)
        line += self.text.count("\n", start, pos)
        self._mark = (pos, line)
        return line, pos - (self.text.rfind("\n", 0, pos) + 1) + 1

    def enter(self, pos: int) -> None:
        # Bounded nesting: '[' x 500 must be a located error, not Python's RecursionError.
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.fail(f"nested deeper than {MAX_DEPTH} levels", pos)

    def fail(self, msg: str, pos: int) -> EdnError:
        line, col = self.where(pos)
        return EdnError(msg, self.source, line, col)

    def next(self) -> re.Match[str] | None:
        if self.peeked is not None:
            m, self.peeked = self.peeked, None
            return m
        for m in self.tokens:
            if m.lastgroup != "ws":
                return m
        return None

    def read(self, m: re.Match[str]) -> Any:  # an Edn value, or _DISCARDED after #_
        kind, tok, pos = m.lastgroup, m.group(), m.start()
        if kind == "atom":
            return self.atom(tok, pos)
        if kind == "str":
            return self.string(tok, pos)
        if kind == "open":
            self.enter(pos)
            v = self.coll(tok, pos)
            self.depth -= 1
            return v
        if kind == "close":
            raise self.fail(f"unmatched '{tok}'", pos)
        if kind == "char":
            body = tok[1:]
            if body in _CHARS:
                return Char(_CHARS[body])
            if len(body) == 5 and body[0] == "u":
                return Char(chr(int(body[1:], 16)))
            return Char(body)
        if kind == "discard":
            nxt = self.next()
            if nxt is None:
                raise self.fail("#_ with nothing to discard", pos)
            self.enter(pos)
            self.read(nxt)
            self.depth -= 1
            return _DISCARDED
        if kind == "tag":
            name = tok[1:]
            nxt = self.next()
            if nxt is None:
                raise self.fail(f"tag #{name} with no value", pos)
            self.enter(pos)
            value = self.read(nxt)
            self.depth -= 1
            handler = TAG_HANDLERS.get(name)
            if handler is None:
                raise self.fail(f"unknown tag #{name}", pos)
            try:
                return handler(value)
            except (ValueError, TypeError) as e:
                raise self.fail(f"bad #{name} value: {e}", pos) from None
        if kind == "bad":  # finditer would otherwise skip it silently
            raise self.fail("string is never closed" if tok == '"' else f"unexpected character {tok!r}", pos)
        if kind == "hash" and tok == "##":  # symbolic values, as the writer emits them
            nxt = self.next()
            name = nxt.group() if nxt is not None and nxt.lastgroup == "atom" else ""
            if name in _SYMBOLIC:
                return _SYMBOLIC[name]
            raise self.fail(f"unknown symbolic value ##{name}", pos)
        if kind == "hash":
            what = "evaluation (#=) is not allowed" if tok == "#=" else f"unsupported dispatch '{tok}'"
            raise self.fail(what, pos)
        raise self.fail(f"unexpected {tok!r}", pos)  # pragma: no cover

    def atom(self, tok: str, pos: int) -> Edn:
        if tok[0] == ":":
            name = tok[1:]
            if not name or name[0] == ":" or name.endswith("/") or name.startswith("/") or not _SYMBOL.match(name):
                raise self.fail(f"invalid keyword {tok!r}", pos)
            return kw(name)
        if tok == "nil":
            return None
        if tok == "true":
            return True
        if tok == "false":
            return False
        c = tok[0]
        if c.isdigit() or (c in "+-" and len(tok) > 1 and tok[1].isdigit()):
            if _INT.match(tok):
                return int(tok.rstrip("N"))
            if _FLOAT.match(tok):
                return Decimal(tok[:-1]) if tok.endswith("M") else float(tok)
            raise self.fail(f"invalid number {tok!r}", pos)
        if _SYMBOL.match(tok):
            return Symbol(tok)
        raise self.fail(f"invalid token {tok!r}", pos)

    def string(self, tok: str, pos: int) -> str:
        body = tok[1:-1]
        if "\\" not in body:
            return body
        out: list[str] = []
        i, n = 0, len(body)
        while i < n:
            ch = body[i]
            if ch != "\\":
                out.append(ch)
                i += 1
                continue
            esc = body[i + 1]
            if esc in _STR_ESC:
                out.append(_STR_ESC[esc])
                i += 2
            elif esc == "u" and re.fullmatch(r"[0-9A-Fa-f]{4}", body[i + 2:i + 6]):
                out.append(chr(int(body[i + 2:i + 6], 16)))
                i += 6
            else:
                raise self.fail(f"invalid string escape '\\{esc}'", pos + 1 + i)
        return "".join(out)

    def coll(self, opener: str, pos: int) -> Edn:
        closer = _CLOSERS[opener]
        items: list[Any] = []
        starts: list[int] = []
        while True:
            m = self.next()
            if m is None:
                raise self.fail(f"'{opener}' is never closed", pos)
            if m.lastgroup == "close":
                if m.group() != closer:
                    raise self.fail(f"expected '{closer}' to close '{opener}', found '{m.group()}'", m.start())
                break
            v = self.read(m)
            if v is not _DISCARDED:
                items.append(v)
                starts.append(m.start())
        if opener == "[":
            return items
        if opener == "(":
            return tuple(items)
        if opener == "#{":
            out_set: set[Any] = set()
            for v, p in zip(items, starts):
                try:
                    if v in out_set:
                        raise self.fail(f"duplicate set element {dumps(v)}", p)
                    out_set.add(v)
                except TypeError:
                    raise self.fail("unhashable set element", p) from None
            return frozenset(out_set)
        if len(items) % 2:
            raise self.fail("map literal has an odd number of forms", pos)
        out: dict[Any, Any] = {}
        offsets: dict[Any, int] = {}
        self.key_offsets[id(out)] = offsets
        for i in range(0, len(items), 2):
            k = items[i]
            try:
                if k in out:
                    raise self.fail(f"duplicate map key {dumps(k)}", starts[i])
            except TypeError:
                raise self.fail("unhashable map key", starts[i]) from None
            out[k] = items[i + 1]
            offsets[k] = starts[i]
        return out


_DISCARDED = object()


class _ShiftedReader(_Reader):
    """`_Reader` whose positions are those of the whole file, not the segment it reads."""

    def __init__(self, text: str, source: str, line: int, column: int) -> None:
        super().__init__(text, source)
        self.base_line, self.base_column = line, column

    def where(self, pos: int) -> tuple[int, int]:
        line, col = super().where(pos)
        return line + self.base_line - 1, col + (self.base_column - 1 if line == 1 else 0)


def read_forms(text: str, source: str = "<string>", *, line: int = 1, column: int = 1) -> Iterator[Form]:
    """Yield each top-level form with its position; raises `EdnError` at the first error.
    `line`/`column`: where `text` starts in `source` (a segment of a larger file)."""
    if line == 1 and column == 1:
        return _forms(_Reader(text, source))
    return _forms(_ShiftedReader(text, source, line, column))


def _forms(r: "_Reader") -> Iterator[Form]:
    """Every top-level form a reader holds, located by that reader."""
    source = r.source
    index = 0
    while True:
        m = r.next()
        if m is None:
            return
        v = r.read(m)
        if v is _DISCARDED:
            continue
        line, col = r.where(m.start())
        yield Form(v, source, line, col, index, r)
        index += 1


def read_all(text: str, source: str = "<string>") -> list[Edn]:
    return [f.value for f in read_forms(text, source)]


def read_one(text: str, source: str = "<string>") -> Edn:
    forms = list(read_forms(text, source))
    if len(forms) != 1:
        raise EdnError(f"expected exactly one form, found {len(forms)}", source, 1, 1)
    return forms[0].value


def read_file(path: str, *, stdin: TextIO | None = None) -> list[Form]:
    """All forms of a file (`-` reads stdin)."""
    if path == "-":
        return list(read_forms((stdin or sys.stdin).read(), "<stdin>"))
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except UnicodeDecodeError as e:
        raise EdnError(f"not UTF-8 text ({e.reason} at byte {e.start})", path, 1, 1) from None
    return list(read_forms(text, path))


# ---------------------------------------------------------------- writing

# Lone surrogates (a server's JSON may carry "\ud83d") are escaped too: raw, they cannot be encoded as UTF-8.
_ESC_RE = re.compile(r'[\\"\n\r\t\x00-\x1f\ud800-\udfff]')
_ESC_OUT = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _str(s: str) -> str:
    if not _ESC_RE.search(s):
        return '"' + s + '"'
    return '"' + _ESC_RE.sub(lambda m: _ESC_OUT.get(m.group(), "\\u%04x" % ord(m.group())), s) + '"'


def _scalar(v: Any) -> str | None:  # Any: dispatch on exact type (faster), which mypy does not narrow
    if v is None:
        return "nil"
    if v is True:
        return "true"
    if v is False:
        return "false"
    t = type(v)
    if t is str:
        return _str(v)
    if t is Keyword:
        return f":{v.name}"
    if t is int:
        return str(v)
    if t is float:
        if v != v or v in (float("inf"), float("-inf")):
            return "##NaN" if v != v else ("##Inf" if v > 0 else "##-Inf")
        return repr(v)
    return None


def dumps(value: object) -> str:
    """Compact EDN text of an EDN value, or of anything with `.to_edn()`; `EdnWriteError` otherwise."""
    v: Any = value  # dispatch on exact type (faster than isinstance), which mypy does not narrow
    t = type(v)  # exact types that responses are made of first; the general rules below
    if t is Keyword:
        return f":{v.name}"
    if t is str:
        return _str(v)
    if t is dict:
        return "{" + " ".join([dumps(k) + " " + dumps(x) for k, x in v.items()]) + "}"
    if t is list:
        return "[" + " ".join([dumps(x) for x in v]) + "]"
    s = _scalar(v)
    if s is not None:
        return s
    if isinstance(v, dict):
        return "{" + " ".join(dumps(k) + " " + dumps(x) for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + " ".join(dumps(x) for x in v) + "]"
    if isinstance(v, tuple):
        return "(" + " ".join(dumps(x) for x in v) + ")"
    if isinstance(v, (set, frozenset)):
        return "#{" + " ".join(sorted(dumps(x) for x in v)) + "}"
    if isinstance(v, Keyword):
        return ":" + v.name
    if isinstance(v, Symbol):
        return v.name
    if isinstance(v, Char):
        return "\\" + {"\n": "newline", "\r": "return", " ": "space", "\t": "tab"}.get(str(v), str(v))
    if isinstance(v, Decimal):
        return str(v) + "M"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _scalar(float(v)) or repr(v)
    if isinstance(v, _dt.datetime):
        return '#inst "' + v.isoformat().replace("+00:00", "Z") + '"'
    if isinstance(v, uuid.UUID):
        return '#uuid "' + str(v) + '"'
    if isinstance(v, str):
        return _str(v)
    to_edn = getattr(v, "to_edn", None)
    if to_edn is not None:
        return dumps(to_edn())
    raise EdnWriteError(f"cannot write {type(v).__name__} as EDN")


def pretty(v: object, width: int = 88, indent: int = 0) -> str:
    """Readable EDN: a collection that fits in `width` stays on one line, else one entry a line."""
    flat = dumps(v)
    if len(flat) + indent <= width or not isinstance(v, (dict, list, tuple)) or not v:
        return flat
    if isinstance(v, dict):
        pad = " " * (indent + 1)
        parts = []
        for i, (k, x) in enumerate(v.items()):
            ks = dumps(k)
            body = pretty(x, width, indent + 1 + len(ks) + 1)
            parts.append(("" if i == 0 else pad) + ks + " " + body)
        return "{" + "\n".join(parts) + "}"
    o, c = ("[", "]") if isinstance(v, list) else ("(", ")")
    pad = " " * (indent + 1)
    return o + ("\n" + pad).join(pretty(x, width, indent + 1) for x in v) + c
