"""The EDN boundary: a position-aware reader and compact / pretty writers.

`edn_format` supplies the value vocabulary (`Keyword`, `Symbol`, and `Char`, refined here).
Its reader keeps no positions, silently merges duplicate map keys and raises
NotImplementedError on unknown tags, so reading is done here: every error names the
source, line and column. Maps read as `dict`, vectors as `list`, lists as `tuple`, sets as
`frozenset`, `7N` as `BigInt`, `1.5M` as `Decimal`.

The reference is `clojure.edn/read` (docs/clojure-compat.md): whatever it accepts reads the
same here or is refused with a position, never read differently; whatever `dumps` writes,
both readers read back (tests/test_clojure_interop.py holds both to the real reader).
"""

from __future__ import annotations

import datetime as _dt
import re
import sys
import uuid
from decimal import Decimal
from typing import AbstractSet, Any, Callable, Iterator, Mapping, Sequence, TextIO, TypeAlias, Union

import edn_format
from edn_format import Keyword, Symbol

from ._errors import EdnError, EdnWriteError
from ._edn_tokens import WHITESPACE, Tokens
from ._memo import BoundedMemo
from ._keywords import InternedKeyword, is_keyword_name, keyword_or_string, kw

__all__ = [
    "BigInt", "Char", "Edn", "EdnError", "EdnMap", "Form", "Keyword", "Symbol", "WHITESPACE", "dumps",
    "is_keyword_name", "keyword_or_string", "kw", "pretty", "read_all", "read_file", "read_forms", "read_one",
]

Edn: TypeAlias = Union[None, bool, int, float, Decimal, str, Keyword, Symbol, edn_format.Char, _dt.datetime, uuid.UUID,
                       Sequence["Edn"], AbstractSet["Edn"], Mapping[Any, "Edn"]]
"""An EDN value: nil, booleans, numbers, strings, keywords, symbols, characters, #inst, #uuid,
and collections of EDN values. The reader returns vectors as `list`, lists as `tuple`, sets as
`frozenset` and maps as `dict` (`isinstance` tells them apart); the collections are typed by
their read-only protocols so that a `list[str]` or a `dict[Keyword, int]` is an `Edn` too (a
`list[Edn]` alone would refuse them: `list` is invariant). Map keys are `Any` for the same reason:
`Mapping` is invariant in its key."""

EdnMap: TypeAlias = Mapping[Keyword, Edn]
"""A map with keyword keys: an EDN request (`{:vllm/endpoint :chat ...}`), a result, a spec."""

# ":name" tokens already checked, so a file's keywords are checked once (bounded: a file may hold any number)
_KW_READ: BoundedMemo[str, Keyword] = BoundedMemo(1 << 16)


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
        if r is None:
            return None
        return r.locate(mapping, key)

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}:{self.column}"

    def anchor(self) -> "tuple[str, int, str, int, int] | None":
        """What reads this form again where it stands (its text, offset, source, line, column), or None when
        its reader started elsewhere: light to keep (the text is the file chunk it was read from, shared), where
        the form itself keeps its reader's position tables. `read_coll_at(*anchor)` reads it again."""
        r = self._reader
        if r is None or (self.line, self.column) != (r.base_line, r.base_column):
            return None
        return r.text, r.start, self.source, self.line, self.column

    def nested(self, value: Edn) -> Form:
        """A form for `value`, read inside this one (an element of a top-level vector): it is
        located where this form starts, and the keys of maps inside it stay locatable."""
        return Form(value, self.source, self.line, self.column, 0, self._reader)

    def __repr__(self) -> str:
        return f"Form({self.value!r} @ {self.where})"


_INT = re.compile(r"[+-]?(?:0|[1-9][0-9]*)N?$")
_FLOAT = re.compile(r"[+-]?(?:0|[1-9][0-9]*)(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?M?$")
# Symbols and keywords: the EDN spec's characters; every one of them Clojure reads the same way.
_SYMBOL = re.compile(r"[A-Za-z*!_?$%&=<>.+\-][A-Za-z0-9*!_?$%&=<>.+\-:#']*"
                     r"(?:/[A-Za-z*!_?$%&=<>.+\-][A-Za-z0-9*!_?$%&=<>.+\-:#']*)?$|/$")
_STR_ESC = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "b": "\b", "f": "\f"}
# clojure.edn's named characters (what Clojure's pr-str prints for these chars)
_CHARS = {"newline": "\n", "return": "\r", "space": " ", "tab": "\t", "backspace": "\b", "formfeed": "\f"}
_CHAR_NAMES = {v: k for k, v in _CHARS.items()}
_CLOSERS = {"[": "]", "(": ")", "{": "}", "#{": "}"}
_SYMBOLIC = {"NaN": float("nan"), "Inf": float("inf"), "-Inf": float("-inf")}
_HEX4 = re.compile(r"[0-9A-Fa-f]{4}")
_OCTAL = re.compile(r"[0-7]{1,3}")
# after a 1- or 2-digit octal string escape Clojure wants whitespace or a macro character
_AFTER_SHORT_OCTAL = re.compile(f'[{WHITESPACE}";^()\\[\\]{{}}\\\\#]')
_SURROGATES = re.compile("[\ud800-\udfff]")


class Char(edn_format.Char):
    """A character (`\\a`). Unlike edn_format's, never equal to the one-char string "a" (Clojure's
    `=` tells them apart), so `#{\\a "a"}` holds two elements here as there."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, edn_format.Char) and str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__


class BigInt(int):
    """An integer written with Clojure's `N` suffix (`7N`): equal to the int, written back with its `N`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"BigInt({int(self)})"


# clojure.instant's timestamp grammar and ranges (RFC 3339 with optional parts, as #inst reads it)
_INST = re.compile(r"(\d\d\d\d)(?:-(\d\d)(?:-(\d\d)(?:[T](\d\d)(?::(\d\d)(?::(\d\d)(?:[.](\d+))?)?)?)?)?)?"
                   r"(?:[Z]|([-+])(\d\d):(\d\d))?")


def _inst(v: Edn) -> _dt.datetime:
    if not isinstance(v, str):
        raise ValueError("#inst needs a string")
    m = _INST.fullmatch(v)
    if m is None:
        raise ValueError(f"unrecognized date/time syntax {v!r}")
    year, month, day, hour, minute, sec, frac, sign, oh, om = m.groups()
    if sec == "60" or (oh is not None and (int(oh) > 23 or int(om) > 59)):
        raise ValueError(f"{v!r} is out of range")
    micro = int((frac or "0")[:6].ljust(6, "0"))
    offset = 0 if sign is None else (1 if sign == "+" else -1) * (int(oh) * 60 + int(om))
    tz = _dt.timezone(_dt.timedelta(minutes=offset))
    return _dt.datetime(int(year), int(month or 1), int(day or 1), int(hour or 0), int(minute or 0),
                        int(sec or 0), micro, tzinfo=tz)


_UUID = re.compile(r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}")


def _uuid(v: Edn) -> uuid.UUID:
    if not isinstance(v, str):
        raise ValueError("#uuid needs a string")
    if not _UUID.fullmatch(v):  # Python's UUID() takes braces and URNs; Java's fromString reads these others apart
        raise ValueError(f"{v!r} is not a canonical 8-4-4-4-12 UUID")
    return uuid.UUID(v)


TAG_HANDLERS: dict[str, Callable[[Edn], Edn]] = {"inst": _inst, "uuid": _uuid}
MAX_DEPTH = 100  # nesting levels a reader accepts; requests and specs use a handful


class _Reader:
    def __init__(self, text: str, source: str, line: int = 1, column: int = 1, start: int = 0) -> None:
        self.text, self.source = text, source
        self.start = start  # reading begins at text[start]
        self.base_line, self.base_column = line, column  # where text[start] is in its file
        self._mark = (start, 1)  # (offset, line number at that offset) of the last `where`
        # Positions below are token indices (`self.lex.offset(i)` is where token i starts): a plain line's
        # offsets are found only when a problem or a key is located.
        self.lex = Tokens(text, start)
        self.tokens = iter(self.lex)  # (index, text) of each token, comments included
        # id(map) -> (that map, its keys, their tokens), in reading order; the entry holds its map, so no
        # other object can have that id while the entry lives (`locate` checks it is the very map)
        self.key_offsets: dict[int, tuple[object, list[Any], list[int]]] = {}
        self.depth = 0
        self.last_closer = -1  # the token of the last closing bracket read

    def locate(self, mapping: object, key: Edn) -> tuple[int, int] | None:
        held, keys, starts = self.key_offsets.get(id(mapping), (None, (), ()))
        if held is not mapping:
            return None
        for k, i in zip(keys, starts):  # only when a problem is located: a scan beats hashing every key twice
            if k == key:
                return self.where(self.lex.offset(i))
        return None

    def where(self, pos: int) -> tuple[int, int]:
        # Forms are located in increasing order: count newlines from the last answer, not from
        # the start, or reading a 100,000-request file is quadratic.
        start, line = self._mark if pos >= self._mark[0] else (self.start, 1)
        line += self.text.count("\n", start, pos)
        self._mark = (pos, line)
        if line == 1:
            return self.base_line, pos - self.start + self.base_column
        return line + self.base_line - 1, pos - self.text.rfind("\n", self.start, pos)

    def enter(self, pos: int) -> None:
        # Bounded nesting: '[' x 500 must be a located error, not Python's RecursionError.
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.fail(f"nested deeper than {MAX_DEPTH} levels", pos)

    def fail(self, msg: str, pos: int) -> EdnError:
        """An error at token `pos`."""
        return self.fail_at(msg, self.lex.offset(pos))

    def fail_at(self, msg: str, offset: int) -> EdnError:
        line, col = self.where(offset)
        return EdnError(msg, self.source, line, col)

    def next(self) -> tuple[str, int] | None:
        """The next token that is not a comment, and its offset."""
        for pos, tok in self.tokens:
            if tok[0] != ";":
                return tok, pos
        return None

    def value_after(self, pos: int, what: str) -> tuple[Any, int]:
        """The next form that is not discarded (a tag's value, metadata and its target), and its offset."""
        self.enter(pos)
        while True:
            t = self.next()
            if t is None:
                raise self.fail(f"{what}: the text ends first", pos)
            v = self.read(*t)
            if v is not _DISCARDED:
                self.depth -= 1
                return v, t[1]

    def read(self, tok: str, pos: int) -> Any:  # an Edn value, or _DISCARDED after #_
        c = tok[0]
        if c == '"':
            if len(tok) == 1:
                raise self.fail("string is never closed", pos)
            return self.string(tok, pos)
        if c in "([{" or tok == "#{":
            self.enter(pos)
            v = self.coll(tok, pos)
            self.depth -= 1
            return v
        if c in ")]}":
            raise self.fail(f"unmatched '{tok}'", pos)
        if c == "\\":
            if len(tok) == 1:
                raise self.fail(f"unexpected character {tok!r}", pos)
            return self.char(tok[1:], pos)
        if c == "^" or tok == "#^":
            return self.meta(pos)
        if c != "#":
            return self.atom(tok, pos)
        if tok == "#_":
            self.value_after(pos, "#_ with nothing to discard")
            return _DISCARDED
        if tok == "#:":
            return self.namespaced_map(self.lex.offset(pos) + 2, pos)
        if len(tok) > 1 and tok[1].isascii() and tok[1].isalpha():
            name = tok[1:]
            value, _ = self.value_after(pos, f"tag #{name} with no value")
            handler = TAG_HANDLERS.get(name)
            if handler is None:
                raise self.fail(f"unknown tag #{name}", pos)
            try:
                return handler(value)
            except (ValueError, TypeError, OverflowError) as e:
                raise self.fail(f"bad #{name} value: {e}", pos) from None
        if tok == "##":  # symbolic values, as the writer emits them
            name, _ = self.value_after(pos, "## with no name")
            if isinstance(name, Symbol) and name.name in _SYMBOLIC:
                return _SYMBOLIC[name.name]
            raise self.fail(f"unknown symbolic value ##{dumps(name)}", pos)
        what = "evaluation (#=) is not allowed" if tok == "#=" else f"unsupported dispatch {tok!r}"
        raise self.fail(what, pos)

    def char(self, body: str, pos: int) -> Char:
        """A character literal as clojure.edn reads it: one UTF-16 unit, a name, \\uXXXX or \\oNNN."""
        if len(body) == 1:
            if ord(body) > 0xFFFF:
                raise self.fail(f"character \\{body} is outside the Basic Multilingual Plane; "
                                "Clojure chars cannot hold it (use a string)", pos)
            return Char(body)
        named = _CHARS.get(body)
        if named is not None:
            return Char(named)
        if body[0] == "u" and _HEX4.fullmatch(body, 1):
            code = int(body[1:], 16)
            if 0xD800 <= code <= 0xDFFF:
                raise self.fail(f"character \\{body} is a lone UTF-16 surrogate", pos)
            return Char(chr(code))
        if body[0] == "o" and _OCTAL.fullmatch(body, 1) and int(body[1:], 8) <= 0o377:
            return Char(chr(int(body[1:], 8)))
        raise self.fail(f"unsupported character \\{body}", pos)

    def meta(self, pos: int) -> Any:
        """`^meta form`: read as clojure.edn does, and left out of the value (as Clojure's `=` ignores it)."""
        meta, _ = self.value_after(pos, "metadata")
        if not isinstance(meta, (Symbol, str, Keyword, dict)):
            raise self.fail("metadata must be a symbol, keyword, string or map", pos)
        target, tpos = self.value_after(pos, "metadata with nothing to apply to")
        if not isinstance(target, (list, tuple, dict, frozenset, Symbol)):
            raise self.fail(f"metadata on {dumps(target)[:40]}: only collections and symbols carry metadata",
                            tpos)
        return target

    def namespaced_map(self, after: int, pos: int) -> dict[Any, Any]:
        """`#:vllm{:model "m"}` is `{:vllm/model "m"}`; `:_/k` inside stays `:k`."""
        if self.text.startswith(":", after):
            raise self.fail("#::{} needs the current namespace of Clojure source; EDN has none: "
                            "write #:ns{...} or full keywords", pos)
        ns, npos = self.value_after(pos, "#: with no namespace")
        if not isinstance(ns, Symbol) or "/" in ns.name:
            raise self.fail(f"#: needs a namespace name, found {dumps(ns)[:40]}", npos)
        t = next(self.tokens, None)  # Clojure skips whitespace here, but not comments
        if t is None or t[1] != "{":
            raise self.fail(f"#:{ns.name} must be followed by a map", pos)
        self.enter(t[0])
        out: dict[Any, Any] = self.coll("{", t[0], ns.name)  # coll reads a map after "{"
        self.depth -= 1
        return out

    def atom(self, tok: str, pos: int) -> Edn:
        if tok[0] == ":":
            k = keyword_token(tok)
            if k is None:
                raise self.fail(f"invalid keyword {tok!r}", pos)
            return k
        if tok == "nil":
            return None
        if tok == "true":
            return True
        if tok == "false":
            return False
        c = tok[0]
        if c.isdigit() or (c in "+-" and len(tok) > 1 and tok[1].isdigit()):
            if _INT.match(tok):
                return BigInt(tok[:-1]) if tok.endswith("N") else int(tok)
            if _FLOAT.match(tok):
                return Decimal(tok[:-1]) if tok.endswith("M") else float(tok)
            raise self.fail(f"invalid number {tok!r}", pos)
        if _SYMBOL.match(tok) and _clojure_name(tok):
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
                j = body.find("\\", i)
                j = n if j == -1 else j
                out.append(body[i:j])
                i = j
                continue
            esc = body[i + 1]
            if esc in _STR_ESC:
                out.append(_STR_ESC[esc])
                i += 2
            elif esc == "u" and _HEX4.fullmatch(body, i + 2, i + 6):
                out.append(chr(int(body[i + 2:i + 6], 16)))
                i += 6
            elif esc in "01234567":
                # union-attr: `esc` is an octal digit, so _OCTAL matches here.
                digits = _OCTAL.match(body, i + 1, i + 4).group()  # type: ignore[union-attr]
                end = i + 1 + len(digits)
                # Clojure reads up to three octal digits; after fewer, the next char must end a token
                if len(digits) < 3 and end < n and not _AFTER_SHORT_OCTAL.match(body, end):
                    raise self.fail_at(f"octal escape '\\{digits}' runs into {body[end]!r}", self.lex.offset(pos) + 1 + i)
                if int(digits, 8) > 0o377:
                    raise self.fail_at(f"octal escape '\\{digits}' is above \\377", self.lex.offset(pos) + 1 + i)
                out.append(chr(int(digits, 8)))
                i = end
            else:
                raise self.fail_at(f"invalid string escape '\\{esc}'", self.lex.offset(pos) + 1 + i)
        s = "".join(out)
        if _SURROGATES.search(s):  # "\uD83D\uDE00" is one character (U+1F600), as in Java's UTF-16 strings
            s = s.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
        return s

    def coll(self, opener: str, pos: int, namespace: str | None = None) -> Any:
        closer = _CLOSERS[opener]
        items: list[Any] = []
        starts: list[int] = []
        keyed = opener == "{" or opener == "#{"  # only maps and sets locate their elements
        known = _KW_READ
        v: Any
        for at, tok in self.tokens:
            c = tok[0]
            # the two commonest tokens inline: a keyword already checked, a string without escapes
            if c == ":":
                v = known.get(tok)
                if v is None:
                    v = self.atom(tok, at)
            elif c == '"' and "\\" not in tok and len(tok) > 1:
                v = tok[1:-1]
            elif c == "{" or c == "[":  # a nested map or vector, without `read`'s dispatch
                self.depth += 1
                if self.depth > MAX_DEPTH:
                    raise self.fail(f"nested deeper than {MAX_DEPTH} levels", at)
                v = self.coll(tok, at)
                self.depth -= 1
            elif c not in _NOT_ATOM:  # a number, nil, true, false or a symbol
                v = self.atom(tok, at)
            elif c in ")]}":
                if tok != closer:
                    raise self.fail(f"expected '{closer}' to close '{opener}', found '{tok}'", at)
                self.last_closer = at
                break
            elif c == ";":
                continue
            else:
                v = self.read(tok, at)
                if v is _DISCARDED:
                    continue
            items.append(v)
            if keyed:
                starts.append(at)
        else:
            raise self.fail(f"'{opener}' is never closed", pos)
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
        keys = items[0::2]
        if namespace is not None:
            keys = [_in_namespace(k, namespace) for k in keys]
        try:
            out: dict[Any, Any] = dict(zip(keys, items[1::2]))
        except TypeError:
            out = {}
        if len(out) != len(keys):  # an unhashable or repeated key: the first one, in order, is the error
            out = {}
            for i, k in enumerate(keys):
                n = len(out)
                try:
                    out[k] = items[2 * i + 1]
                except TypeError:
                    raise self.fail("unhashable map key", starts[2 * i]) from None
                if len(out) == n:
                    raise self.fail(f"duplicate map key {dumps(k)}", starts[2 * i])
        self.key_offsets[id(out)] = (out, keys, starts[0::2])
        return out


def _clojure_name(name: str) -> bool:
    """Clojure refuses a symbol or keyword whose name ends in ':' or that holds '::'."""
    ns, _, local = name.rpartition("/") if name != "/" else ("", "", name)
    return not (local.endswith(":") or ns.endswith(":") or "::" in name)


def _in_namespace(k: Any, ns: str) -> Any:
    """A key inside `#:ns{...}`: unqualified gets `ns`, `_/name` loses its namespace, others stay."""
    if isinstance(k, Keyword):
        if "/" not in k.name:
            return kw(f"{ns}/{k.name}")
        if k.name.startswith("_/"):
            return kw(k.name[2:])
    elif isinstance(k, Symbol) and k.name != "/":
        if "/" not in k.name:
            return Symbol(f"{ns}/{k.name}")
        if k.name.startswith("_/"):
            return Symbol(k.name[2:])
    return k


_DISCARDED = object()
_NOT_ATOM = frozenset('"([{)]}\\^#;')  # what a token that is not an atom starts with


def read_forms(text: str, source: str = "<string>", *, line: int = 1, column: int = 1) -> Iterator[Form]:
    """Yield each top-level form with its position; raises `EdnError` at the first error.
    `line`/`column`: where `text` starts in its file, when it is a piece of a larger one."""
    r = _Reader(text, source, line, column)
    index = 0
    while True:
        t = r.next()
        if t is None:
            return
        v = r.read(*t)
        if v is _DISCARDED:
            continue
        fl, fc = r.where(r.lex.offset(t[1]))
        yield Form(v, source, fl, fc, index, r)
        index += 1


def read_coll_at(text: str, pos: int, source: str, line: int, column: int) -> tuple[Form, int]:
    """The collection that opens at `text[pos]` (`line`:`column` of `source`), read in place, and the
    offset just past it: no copy of its text. Raises `EdnError` where reading it alone would; `text`
    may end before it closes (a buffer of a larger file): then it raises too."""
    if not text.startswith(_OPENERS, pos):
        raise EdnError("no collection opens here", source, line, column)
    r = _Reader(text, source, line, column, pos)
    i, tok = next(r.tokens)  # a token starts at `pos`: the opener
    r.depth = 1  # as `read` enters it
    value = r.coll(tok, i)
    return Form(value, source, line, column, 0, r), r.lex.end(r.last_closer)


_OPENERS = ("{", "[", "(", "#{")


def keyword_token(tok: str) -> Keyword | None:
    """The keyword a ":name" token reads as, or None when it is not one. `_KW_READ` remembers the answer
    for a token (a pure function of its text: nothing read before changes it)."""
    k = _KW_READ.get(tok)
    if k is None:
        name = tok[1:]
        if not name or name[0] in ":/" or not _SYMBOL.match(name) or not _clojure_name(name):
            return None
        k = _KW_READ.keep(tok, kw(name))
    return k


def plain_edn(v: Any) -> Any:
    """`v` with every other mapping as a dict and every other sequence as a list, recursively: what
    `edn_format.loads` returns (its immutable maps and vectors) becomes the plain values our reader
    makes. `v` itself, and each part of it, when it holds nothing to convert (a located form keeps
    the identities its positions are found by)."""
    t = type(v)
    if t is dict:
        out = None
        for k, x in v.items():
            y = plain_edn(x)
            if y is not x:
                if out is None:
                    out = dict(v)
                out[k] = y
        return v if out is None else out
    if t is list or t is tuple:
        changed = [plain_edn(x) for x in v]
        if all(y is x for x, y in zip(changed, v)):
            return v
        return changed if t is list else tuple(changed)
    if t in _ATOMS:
        return v
    if isinstance(v, Mapping):
        return {k: plain_edn(x) for k, x in v.items()}
    if isinstance(v, Sequence) and not isinstance(v, (str, bytes)):
        return [plain_edn(x) for x in v]
    return v


_ATOMS = frozenset((str, int, float, bool, type(None), Decimal))


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
    # printable ASCII with no quote or backslash needs no escape: three C scans, cheaper than starting the regex
    if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s or not _ESC_RE.search(s):
        return '"' + s + '"'
    return '"' + _ESC_RE.sub(lambda m: _ESC_OUT.get(m.group(), "\\u%04x" % ord(m.group())), s) + '"'


_READABLE: set[str] = set()  # keyword and symbol names already checked


def _name(n: str, prefix: str) -> str:
    """`:name` or `name`, refusing what no reader would read back as the same keyword or symbol."""
    if n not in _READABLE or not prefix and n in ("nil", "true", "false"):
        if not (n == "/" and not prefix or n and n[0] not in ":/" and _SYMBOL.match(n) and _clojure_name(n)
                and (prefix or n not in ("nil", "true", "false"))):
            what = "keyword" if prefix else "symbol"
            raise EdnWriteError(f"{what} {prefix}{n} would not read back as itself; use a string "
                             "(keyword_or_string does this for a server's words)")
        _READABLE.add(n)
    return prefix + n


def _char(c: str) -> str:
    """A char both readers read back: a name, a printable ASCII char, else \\uXXXX."""
    name = _CHAR_NAMES.get(c)
    if name is not None:
        return "\\" + name
    code = ord(c)
    if 0x21 <= code <= 0x7E:
        return "\\" + c
    if code > 0xFFFF or 0xD800 <= code <= 0xDFFF:
        raise EdnWriteError(f"char U+{code:04X} has no EDN form Clojure reads (its chars are single "
                         "UTF-16 units); write it in a string")
    return "\\u%04x" % code


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
    if t is InternedKeyword or t is Keyword:
        return _name(v.name, ":")
    if t is int:
        return str(v)
    if t is float:
        if v != v or v in (float("inf"), float("-inf")):
            return "##NaN" if v != v else ("##Inf" if v > 0 else "##-Inf")
        return repr(v)
    return None


def dumps(value: object) -> str:
    """Compact EDN text that our reader and clojure.edn both read back to `value` (an EDN value, or
    anything with `.to_edn()`). Raises `EdnWriteError` for what no EDN text can carry (a keyword
    with a space in it, an object with no EDN form)."""
    v: Any = value  # dispatch on exact type (faster than isinstance), which mypy does not narrow
    t = type(v)  # exact types that responses are made of first; the general rules below
    if t is InternedKeyword:
        return _name(v.name, ":")
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
        return _name(v.name, ":")
    if isinstance(v, Symbol):
        return _name(v.name, "")
    if isinstance(v, edn_format.Char):
        return _char(str(v))
    if isinstance(v, Decimal):
        if not v.is_finite():
            raise EdnWriteError(f"{v} has no EDN form (BigDecimal is finite); use a float for ##NaN or ##Inf")
        return str(v) + "M"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, BigInt):
        return str(int(v)) + "N"
    if isinstance(v, int):
        return str(int(v))
    if isinstance(v, float):
        return _scalar(float(v)) or repr(v)
    if isinstance(v, _dt.datetime):
        return '#inst "' + v.isoformat().replace("+00:00", "Z") + '"'
    if isinstance(v, uuid.UUID):
        return '#uuid "' + str(v) + '"'
    if isinstance(v, str):
        return _str(str(v))
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
