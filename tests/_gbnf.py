"""A small GBNF reader and matcher for tests, written from llama.cpp's grammar rules
(src/llama-grammar.cpp: rules `name ::= ...`, "literals", [classes] with ranges and `^`,
`.`, groups, `|`, postfix `* + ? {m} {m,} {m,n}`, `#` comments, escapes \\x \\u \\U \\t \\r \\n).

It shares no code with the translator: it answers "does this grammar accept this whole
string?" by following the grammar itself, so a test can hold a regex and a grammar side by side.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import Union

ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}
HEX = {"x": 2, "u": 4, "U": 8}


@dataclass(frozen=True)
class Lit:
    text: str


@dataclass(frozen=True)
class Cls:
    negated: bool
    ranges: tuple[tuple[int, int], ...]
    any_char: bool = False


@dataclass(frozen=True)
class Ref:
    name: str


@dataclass(frozen=True)
class Seq:
    items: tuple["Expr", ...]


@dataclass(frozen=True)
class Alt:
    options: tuple["Expr", ...]


@dataclass(frozen=True)
class Rep:
    item: "Expr"
    lo: int
    hi: int | None


Expr = Union[Lit, Cls, Ref, Seq, Alt, Rep]


class GrammarSyntaxError(ValueError):
    pass


class _Reader:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def space(self, newlines: bool) -> None:
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "#":
                while self.i < len(self.s) and self.s[self.i] not in "\r\n":
                    self.i += 1
            elif c in " \t" or (newlines and c in "\r\n"):
                self.i += 1
            else:
                break

    def name(self) -> str:
        j = self.i
        while self.i < len(self.s) and (self.s[self.i].isascii() and (self.s[self.i].isalnum() or self.s[self.i] == "-")):
            self.i += 1
        if j == self.i:
            raise GrammarSyntaxError(f"expecting a name at {self.s[j:j + 20]!r}")
        return self.s[j:self.i]

    def char(self) -> int:
        c = self.peek()
        if not c:
            raise GrammarSyntaxError("unexpected end of input")
        if c != "\\":
            self.i += 1
            return ord(c)
        e = self.s[self.i + 1:self.i + 2]
        if e in HEX:
            n = HEX[e]
            digits = self.s[self.i + 2:self.i + 2 + n]
            if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise GrammarSyntaxError(f"expecting {n} hex chars at {self.s[self.i:self.i + 10]!r}")
            self.i += 2 + n
            return int(digits, 16)
        if e in ESCAPES:
            self.i += 2
            return ord(ESCAPES[e])
        raise GrammarSyntaxError(f"unknown escape at {self.s[self.i:self.i + 10]!r}")

    def alternates(self, nested: bool) -> Expr:
        options = [self.sequence(nested)]
        while self.peek() == "|":
            self.i += 1
            self.space(True)
            options.append(self.sequence(nested))
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self, nested: bool) -> Expr:
        items: list[Expr] = []
        while True:
            c = self.peek()
            if c == '"':
                self.i += 1
                text = ""
                while self.peek() != '"':
                    text += chr(self.char())
                self.i += 1
                items.append(Lit(text))
            elif c == "[":
                items.append(self.char_class())
            elif c == ".":
                self.i += 1
                items.append(Cls(False, (), any_char=True))
            elif c == "(":
                self.i += 1
                self.space(True)
                inner = self.alternates(True)
                if self.peek() != ")":
                    raise GrammarSyntaxError(f"expecting ')' at {self.s[self.i:self.i + 20]!r}")
                self.i += 1
                items.append(inner)
            elif c and (c.isascii() and (c.isalnum() or c == "-")):
                items.append(Ref(self.name()))
            elif c in ("*", "+", "?", "{"):
                if not items:
                    raise GrammarSyntaxError("nothing to repeat")
                self.i += 1
                lo, hi = self.bounds(c, nested)
                items[-1] = Rep(items[-1], lo, hi)
            else:
                break
            self.space(nested)
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def char_class(self) -> Cls:
        self.i += 1
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        while self.peek() != "]":
            lo = hi = self.char()
            if self.peek() == "-" and self.s[self.i + 1:self.i + 2] not in ("]", ""):
                self.i += 1
                hi = self.char()
            ranges.append((lo, hi))
        self.i += 1
        return Cls(negated, tuple(ranges))

    def bounds(self, c: str, nested: bool) -> tuple[int, int | None]:
        if c != "{":
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        self.space(nested)
        lo = self.int()
        self.space(nested)
        hi: int | None = lo
        if self.peek() == ",":
            self.i += 1
            self.space(nested)
            hi = self.int() if self.peek().isdigit() else None
            self.space(nested)
        if self.peek() != "}":
            raise GrammarSyntaxError("expecting '}'")
        self.i += 1
        return lo, hi

    def int(self) -> int:
        j = self.i
        while self.peek().isdigit():
            self.i += 1
        if j == self.i:
            raise GrammarSyntaxError("expecting an integer")
        return int(self.s[j:self.i])


@dataclass
class Grammar:
    rules: dict[str, Expr] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> "Grammar":
        r = _Reader(text)
        g = cls()
        r.space(True)
        while r.peek():
            name = r.name()
            r.space(False)
            if r.s[r.i:r.i + 3] != "::=":
                raise GrammarSyntaxError(f"expecting ::= after {name}")
            r.i += 3
            r.space(True)
            if name in g.rules:
                raise GrammarSyntaxError(f"rule {name} defined twice")
            g.rules[name] = r.alternates(False)
            if r.peek() not in ("\n", "\r", ""):
                raise GrammarSyntaxError(f"expecting newline or end at {r.s[r.i:r.i + 20]!r}")
            r.space(True)
        for expr in g.rules.values():
            for ref in _refs(expr):
                if ref not in g.rules:
                    raise GrammarSyntaxError(f"undefined rule {ref}")
        if "root" not in g.rules:
            raise GrammarSyntaxError("no root rule")
        return g

    def accepts(self, text: str, start: str = "root") -> bool:
        if len(text) < 200:
            return len(text) in _Match(self, text).rule(start, 0)
        # a long rule chain (x{0,2100}) nests a few calls per item: run deep, on a big stack
        out: list[bool | BaseException] = []

        def run() -> None:
            try:
                out.append(len(text) in _Match(self, text).rule(start, 0))
            except BaseException as e:  # pragma: no cover - re-raised below
                out.append(e)

        limit, size = sys.getrecursionlimit(), threading.stack_size(512 * 1024 * 1024)
        sys.setrecursionlimit(max(limit, 100_000))
        try:
            t = threading.Thread(target=run)
            t.start()
            t.join()
        finally:
            threading.stack_size(size)
            sys.setrecursionlimit(limit)
        if isinstance(out[0], BaseException):
            raise out[0]
        return out[0]


def _refs(e: Expr) -> list[str]:
    if isinstance(e, Ref):
        return [e.name]
    if isinstance(e, Seq):
        return [r for i in e.items for r in _refs(i)]
    if isinstance(e, Alt):
        return [r for o in e.options for r in _refs(o)]
    if isinstance(e, Rep):
        return _refs(e.item)
    return []


class _Match:
    """End positions reachable from a start position, memoised per (rule, position)."""

    def __init__(self, g: Grammar, text: str) -> None:
        self.g = g
        self.s = text
        self.memo: dict[tuple[str, int], frozenset[int]] = {}
        self.memo_expr: dict[tuple[int, int], frozenset[int]] = {}  # (id of expression, position)

    def rule(self, name: str, i: int) -> frozenset[int]:
        key = (name, i)
        if key not in self.memo:
            self.memo[key] = frozenset()  # a left-recursive grammar matches nothing here, never loops
            self.memo[key] = self.ends(self.g.rules[name], i)
        return self.memo[key]

    def ends(self, e: Expr, i: int) -> frozenset[int]:
        key = (id(e), i)
        if key not in self.memo_expr:
            self.memo_expr[key] = self.compute(e, i)
        return self.memo_expr[key]

    def compute(self, e: Expr, i: int) -> frozenset[int]:
        s = self.s
        if isinstance(e, Lit):
            return frozenset({i + len(e.text)}) if s.startswith(e.text, i) else frozenset()
        if isinstance(e, Cls):
            if i >= len(s):
                return frozenset()
            cp = ord(s[i])
            hit = e.any_char or any(lo <= cp <= hi for lo, hi in e.ranges)
            return frozenset({i + 1}) if hit != e.negated else frozenset()
        if isinstance(e, Ref):
            return self.rule(e.name, i)
        if isinstance(e, Seq):
            at = frozenset({i})
            for item in e.items:
                at = frozenset(j for p in at for j in self.ends(item, p))
                if not at:
                    break
            return at
        if isinstance(e, Alt):
            return frozenset(j for o in e.options for j in self.ends(o, i))
        assert isinstance(e, Rep)
        at = frozenset({i})
        for _ in range(e.lo):
            at = frozenset(j for p in at for j in self.ends(e.item, p))
        seen, frontier, count = set(at), at, e.lo
        while frontier and (e.hi is None or count < e.hi):
            frontier = frozenset(j for p in frontier for j in self.ends(e.item, p)) - seen
            seen |= frontier
            count += 1
        return frozenset(seen)
