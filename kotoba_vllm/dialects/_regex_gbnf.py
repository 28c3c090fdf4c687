"""Regular expressions (Python `re` syntax, matched in full) as GBNF grammars for llama.cpp.

Pure and stdlib-only. The pattern is parsed by CPython's own regex parser (`re._parser`, named
`sre_parse` before 3.11), so escapes, classes and repeat syntax mean exactly what `re` means,
then lowered to a tiny regular-language tree and printed as GBNF:

    regex_to_gbnf(r"[a-z]{2,3}-(?:[0-9]|x)")  ->  'root ::= [a-z] [a-z] [a-z]? "-" ([0-9] | "x")\n'

What the grammar accepts is what `re.fullmatch(pattern, s)` accepts, for every `s` that can be
written in UTF-8 (so never a lone surrogate, which no engine can output). A construct with no
exact grammar equivalent (back-references, look-arounds, word boundaries, a case-insensitive
flag, an anchor in the middle) gives an `Untranslatable` naming it: never a looser grammar.

Bounded repeats are spelled out as chains of named rules instead of GBNF's `{m,n}`:
llama.cpp widens a `{m,n}` whose bound exceeds 2000 to unbounded, and refuses nested
bounded repeats whose product exceeds 2000; a chain has neither problem and grows linearly.
"""

from __future__ import annotations

import functools
import importlib
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence, Union, cast

# CPython's parser: private, but it is what `re` itself runs, unchanged in shape from 3.7 to 3.13
# (3.11 renamed it and added atomic groups and possessive repeats, which we refuse by name).
if TYPE_CHECKING:  # typeshed describes it as sre_parse (its opcodes and SubPattern, the same in both)
    import sre_parse as _sre
else:
    _sre = importlib.import_module("re._parser" if sys.version_info >= (3, 11) else "sre_parse")

_Code = tuple[int, object]  # (opcode, its argument: a shape per opcode, read as such below)

MAX_CODEPOINT = 0x10FFFF
MAX_BOUND = 10_000  # largest {m,n} bound spelled out; the grammar grows linearly with it
MAX_GROUP_DEPTH = 100  # refused before parsing: re's parser and ours recurse once per level


@dataclass(frozen=True)
class Untranslatable:
    """Why a pattern has no grammar: `construct` is what it uses that no GBNF grammar expresses
    exactly, or, when `invalid`, `re`'s own complaint about it."""

    construct: str
    invalid: bool = False


class _Refused(Exception):
    """Control flow inside this module: unwinds the lowering to `regex_to_gbnf`."""

    def __init__(self, why: Untranslatable) -> None:
        super().__init__(why.construct)
        self.why = why


def _refuse(construct: str) -> _Refused:
    return _Refused(Untranslatable(construct))


# ---------------------------------------------------------------- the regular-language tree

Ranges = tuple[tuple[int, int], ...]  # sorted, disjoint, non-adjacent inclusive code point ranges


@dataclass(frozen=True)
class Chars:
    """One code point out of `ranges`; no ranges = matches nothing."""
    ranges: Ranges


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]  # no items = the empty string


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    item: Node
    lo: int
    hi: int | None  # None = unbounded


Node = Union[Chars, Seq, Alt, Repeat]
EMPTY = Seq(())
NOTHING = Chars(())


def normalize(ranges: list[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


def complement(ranges: Ranges) -> Ranges:
    out: list[tuple[int, int]] = []
    nxt = 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODEPOINT:
        out.append((nxt, MAX_CODEPOINT))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def category_ranges(escape: str, ascii_only: bool) -> Ranges:
    r"""The code points `re` matches with `\d`, `\s` or `\w`: asked of `re` itself, so they
    follow this Python's Unicode tables exactly."""
    every = _every_char()[:0x80] if ascii_only else _every_char()
    flags = re.ASCII if ascii_only else 0
    return tuple((m.start(), m.end() - 1) for m in re.finditer(escape + "+", every, flags))


@functools.lru_cache(maxsize=1)
def _every_char() -> str:
    return "".join(map(chr, range(MAX_CODEPOINT + 1)))


SURROGATES = (0xD800, 0xDFFF)


def chars(ranges: Ranges) -> Chars:
    """A character set without the surrogates: `re` matches them in a str, but no UTF-8 text holds
    them, and a grammar allowing them would let llama.cpp emit bytes the server can only mangle."""
    lo, hi = SURROGATES
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if b < lo or a > hi:
            out.append((a, b))
            continue
        if a < lo:
            out.append((a, lo - 1))
        if b > hi:
            out.append((hi + 1, b))
    return Chars(tuple(out))


def nullable(n: Node) -> bool:
    if isinstance(n, Chars):
        return False
    if isinstance(n, Seq):
        return all(nullable(i) for i in n.items)
    if isinstance(n, Alt):
        return any(nullable(o) for o in n.options)
    return n.lo == 0 or nullable(n.item)


def non_empty(n: Node) -> Node:
    """The same language without the empty string. A repeated item must not match the empty
    string: llama.cpp refuses `(x*)*` as left recursion, and ambiguity multiplies its parse stacks."""
    if not nullable(n):
        return n
    if isinstance(n, Seq):
        # all items nullable: the first non-empty piece comes from some item i
        return alt([seq([non_empty(n.items[i]), *n.items[i + 1:]]) for i in range(len(n.items))])
    if isinstance(n, Alt):
        return alt([non_empty(o) for o in n.options])
    assert isinstance(n, Repeat)
    return repeat(non_empty(n.item), 1, n.hi)


def seq(items: list[Node]) -> Node:
    flat: list[Node] = []
    for i in items:
        if i == NOTHING:
            return NOTHING
        flat.extend(i.items if isinstance(i, Seq) else (i,))
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def alt(options: list[Node]) -> Node:
    kept: list[Node] = []
    for o in options:
        for x in (o.options if isinstance(o, Alt) else (o,)):
            if x != NOTHING and x not in kept:
                kept.append(x)
    if not kept:
        return NOTHING
    return kept[0] if len(kept) == 1 else Alt(tuple(kept))


def repeat(item: Node, lo: int, hi: int | None) -> Node:
    if hi == 0 or item == EMPTY:
        return EMPTY
    if item == NOTHING:
        return EMPTY if lo == 0 else NOTHING
    if nullable(item):
        # x nullable: x{lo,hi} = x{0,hi} = (x without "") {0,hi}
        item, lo = non_empty(item), 0
        if item == NOTHING:
            return EMPTY
    if lo == hi == 1:
        return item
    return Repeat(item, lo, hi)


# ---------------------------------------------------------------- from CPython's parse tree

def parse(pattern: str) -> Node:
    """`pattern` -> tree; raises _Refused (also for a pattern `re` rejects)."""
    try:
        tree = _sre.parse(pattern)
    except (re.error, OverflowError) as e:
        raise _Refused(Untranslatable(str(e), invalid=True)) from None
    return _Lowering().items(tree.data, tree.state.flags, True, True)


def _op(name: str) -> int | None:
    return getattr(_sre, name, None)  # None for opcodes this Python does not have


class _Lowering:
    def items(self, items: Sequence[_Code], flags: int, at_start: bool, at_end: bool) -> Node:
        if flags & _sre.SRE_FLAG_IGNORECASE:
            raise _refuse("case-insensitive matching (?i)")
        anchors = [op == _sre.AT for op, _ in items]
        out: list[Node] = []
        for k, (op, av) in enumerate(items):
            start = at_start and all(anchors[:k])
            end = at_end and all(anchors[k + 1:])
            out.append(self.one(op, av, flags, start, end))
        return seq(out)

    def one(self, op: int, av: object, flags: int, at_start: bool, at_end: bool) -> Node:
        ascii_only = bool(flags & _sre.SRE_FLAG_ASCII)
        if op == _sre.LITERAL:
            c = cast(int, av)
            return chars(((c, c),))
        if op == _sre.NOT_LITERAL:
            c = cast(int, av)
            return chars(complement(((c, c),)))
        if op == _sre.ANY:
            return chars(((0, MAX_CODEPOINT),) if flags & _sre.SRE_FLAG_DOTALL else complement(((10, 10),)))
        if op == _sre.IN:
            return chars(self.char_class(cast("list[_Code]", av), ascii_only))
        if op == _sre.BRANCH:
            branches = cast("tuple[None, list[_sre.SubPattern]]", av)[1]
            return alt([self.items(b.data, flags, at_start, at_end) for b in branches])
        if op == _sre.SUBPATTERN:
            _group, add, remove, p = cast("tuple[int | None, int, int, _sre.SubPattern]", av)
            return self.items(p.data, (flags | add) & ~remove, at_start, at_end)
        if op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT):  # lazy or greedy: same strings in a full match
            lo, hi, p = cast("tuple[int, int, _sre.SubPattern]", av)
            bound = lo if hi == _sre.MAXREPEAT else hi
            if bound > MAX_BOUND:
                raise _refuse(f"a repeat bound of {bound} (at most {MAX_BOUND} is spelled out)")
            return repeat(self.items(p.data, flags, False, False), lo, None if hi == _sre.MAXREPEAT else hi)
        if op == _sre.AT:
            return self.anchor(cast(int, av), at_start, at_end)
        raise _refuse(self.describe(op, av))

    def anchor(self, at: int, at_start: bool, at_end: bool) -> Node:
        if at in (_sre.AT_BEGINNING, _sre.AT_BEGINNING_STRING):
            if at_start:
                return EMPTY
            raise _refuse("a start anchor (^ or \\A) that is not at the start of the pattern")
        if at in (_sre.AT_END, _sre.AT_END_STRING):
            if at_end:
                return EMPTY
            raise _refuse("an end anchor ($ or \\Z) that is not at the end of the pattern")
        if at in (_sre.AT_BOUNDARY, _sre.AT_NON_BOUNDARY):
            raise _refuse("a word boundary (\\b or \\B)")
        raise _refuse(f"the anchor {at}")

    def describe(self, op: int, av: object) -> str:
        if op == _sre.GROUPREF:
            return f"a back-reference to group {av}"
        if op == _sre.GROUPREF_EXISTS:
            return "a conditional group (?(id)yes|no)"
        if op in (_sre.ASSERT, _sre.ASSERT_NOT):
            kind = "look-ahead" if cast("tuple[int, object]", av)[0] == 1 else "look-behind"
            return f"a {'negative ' if op == _sre.ASSERT_NOT else ''}{kind}"
        if op is not None and op == _op("ATOMIC_GROUP"):
            return "an atomic group (?>...)"
        if op is not None and op == _op("POSSESSIVE_REPEAT"):
            return "a possessive repeat (*+, ++, ?+)"
        return f"the regex construct {op}"

    def char_class(self, items: Sequence[_Code], ascii_only: bool) -> Ranges:
        negate = False
        ranges: list[tuple[int, int]] = []
        for op, av in items:
            if op == _sre.NEGATE:
                negate = True
            elif op == _sre.LITERAL:
                c = cast(int, av)
                ranges.append((c, c))
            elif op == _sre.RANGE:
                lo, hi = cast("tuple[int, int]", av)
                ranges.append((lo, hi))
            elif op == _sre.CATEGORY:
                ranges.extend(self.category(cast(int, av), ascii_only))
            else:
                raise _refuse(f"the class item {op}")
        out = normalize(ranges)
        return complement(out) if negate else out

    def category(self, cat: int, ascii_only: bool) -> Ranges:
        table: dict[int, tuple[str, bool]] = {
            _sre.CATEGORY_DIGIT: (r"\d", False), _sre.CATEGORY_NOT_DIGIT: (r"\d", True),
            _sre.CATEGORY_SPACE: (r"\s", False), _sre.CATEGORY_NOT_SPACE: (r"\s", True),
            _sre.CATEGORY_WORD: (r"\w", False), _sre.CATEGORY_NOT_WORD: (r"\w", True)}
        if cat not in table:
            raise _refuse(f"the class {cat}")
        escape, negated = table[cat]
        ranges = category_ranges(escape, ascii_only)
        return complement(ranges) if negated else ranges


# ---------------------------------------------------------------- GBNF text

# characters that need a backslash inside a GBNF "literal" / [class]; everything else outside
# printable text is written as a \x, \u or \U escape, so the grammar is plain text on the wire
_LITERAL_SPECIAL = {'"': '\\"', "\\": "\\\\"}
_CLASS_SPECIAL = {"\\": "\\\\", "]": "\\]", "[": "\\[", "-": "\\-", "^": "\\x5E", '"': '\\"'}


def gbnf_char(cp: int, special: dict[str, str]) -> str:
    c = chr(cp)
    if c in special:
        return special[c]
    if 0x20 <= cp < 0x7F or (cp >= 0x80 and c.isprintable()):
        return c
    if cp < 0x100:
        return f"\\x{cp:02X}"
    return f"\\u{cp:04X}" if cp < 0x10000 else f"\\U{cp:08X}"


def gbnf_literal(text: str) -> str:
    """A GBNF string literal matching exactly `text`."""
    return '"' + "".join(gbnf_char(ord(c), _LITERAL_SPECIAL) for c in text) + '"'


def gbnf_class(ranges: Ranges) -> str:
    """A GBNF character class for `ranges`, negated when that is shorter."""
    if not ranges:
        return "[^\\x00-\\U0010FFFF]"  # matches nothing
    negated = complement(ranges)
    body, mark = (negated, "^") if len(negated) < len(ranges) else (ranges, "")
    if not body:
        return "[\\x00-\\U0010FFFF]"

    def one(lo: int, hi: int) -> str:
        a = gbnf_char(lo, _CLASS_SPECIAL)
        if lo == hi:
            return a
        return a + ("" if hi == lo + 1 else "-") + gbnf_char(hi, _CLASS_SPECIAL)

    return "[" + mark + "".join(one(lo, hi) for lo, hi in body) + "]"


class _Printer:
    """Prints a tree as `root ::= ...` plus named helper rules, each helper printed once."""

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}  # name -> body
        self.by_body: dict[str, str] = {}

    def name(self, prefix: str, body: str) -> str:
        if body not in self.by_body:
            name = f"{prefix}-{len(self.rules) + 1}"
            self.rules[name] = body
            self.by_body[body] = name
        return self.by_body[body]

    def expr(self, n: Node) -> str:
        if isinstance(n, Alt):
            return " | ".join(self.sequence(o) for o in n.options)
        return self.sequence(n)

    def sequence(self, n: Node) -> str:
        items = n.items if isinstance(n, Seq) else (n,)
        parts: list[str] = []
        text = ""
        for i in items:
            if is_one_char(i):
                assert isinstance(i, Chars)
                text += chr(i.ranges[0][0])
                continue
            if text:
                parts.append(gbnf_literal(text))
                text = ""
            if isinstance(i, Alt):
                parts.append("(" + self.expr(i) + ")")
            elif isinstance(i, Repeat):
                parts.append(self.repeat(i))
            else:
                parts.append(self.symbol(i))
        if text or not parts:
            parts.append(gbnf_literal(text))
        return " ".join(parts)

    def symbol(self, n: Node) -> str:
        """One GBNF symbol, safe to repeat or suffix: a literal character, a class or a rule name."""
        if is_one_char(n):
            assert isinstance(n, Chars)
            return gbnf_literal(chr(n.ranges[0][0]))
        if isinstance(n, Chars):
            cls = gbnf_class(n.ranges)
            return cls if len(cls) <= 40 else self.name("class", cls)
        return self.name("group", self.expr(n))

    def repeat(self, n: Repeat) -> str:
        item = self.symbol(n.item)
        if n.hi is None:
            return " ".join([item] * max(n.lo - 1, 0) + [item + ("*" if n.lo == 0 else "+")])
        parts = [item] * n.lo
        if n.hi > n.lo:
            parts.append(self.optional_chain(item, n.hi - n.lo))
        return " ".join(parts)

    def optional_chain(self, item: str, k: int) -> str:
        """Up to k more items, as opt-k ::= item opt-(k-1) | "": unambiguous and not recursive."""
        if k == 1:
            return item + "?"
        chain = self.name("opt", item + " " + item + "? | \"\"")
        for _ in range(k - 2):
            chain = self.name("opt", item + " " + chain + ' | ""')
        return chain

    def grammar(self, n: Node) -> str:
        root = self.expr(n)
        return "\n".join([f"root ::= {root}", *(f"{k} ::= {v}" for k, v in self.rules.items())]) + "\n"


def is_one_char(n: Node) -> bool:
    return isinstance(n, Chars) and len(n.ranges) == 1 and n.ranges[0][0] == n.ranges[0][1]


@functools.lru_cache(maxsize=256)
def regex_to_gbnf(pattern: str) -> str | Untranslatable:
    """A GBNF grammar (rule `root`) accepting exactly the strings `re.fullmatch(pattern, s)` accepts,
    or what keeps the pattern from having one."""
    if group_depth(pattern) > MAX_GROUP_DEPTH:
        return Untranslatable("groups nested too deeply")
    try:
        return _Printer().grammar(parse(pattern))
    except _Refused as e:
        return e.why
    except RecursionError:
        return Untranslatable("groups nested too deeply")


# Pairs of code point spans whose UTF-8 encodings differ in length; llama.cpp's partial-character
# check lets an overlong sequence through where one class allows characters from both (measured:
# docs/guided-regex.md, "A llama.cpp quirk with multi-byte characters").
_OVERLONG_PRONE = (((0x80, 0x7FF), (0x800, 0xFFF)), ((0x800, 0xFFFF), (0x10000, 0x3FFFF)))


def _touches(ranges: Ranges, lo: int, hi: int) -> bool:
    return any(a <= hi and b >= lo for a, b in ranges)


def overlong_prone(pattern: str) -> bool:
    """Whether one character class of `pattern` (`.`, Unicode `\\d`/`\\w`, a wide negated class)
    spans UTF-8 lengths in a way llama.cpp's grammar cannot keep overlong bytes out of."""
    if group_depth(pattern) > MAX_GROUP_DEPTH:
        return False
    try:
        tree = parse(pattern)
    except (_Refused, RecursionError):
        return False
    todo: list[Node] = [tree]
    while todo:
        n = todo.pop()
        if isinstance(n, Chars):
            if any(_touches(n.ranges, *a) and _touches(n.ranges, *b) for a, b in _OVERLONG_PRONE):
                return True
        elif isinstance(n, Seq):
            todo.extend(n.items)
        elif isinstance(n, Alt):
            todo.extend(n.options)
        else:
            todo.append(n.item)
    return False


def group_depth(pattern: str) -> int:
    """The deepest nesting of `(` in `pattern`, skipping escapes and character classes.

    Checked before `re`'s recursive parser runs, so the refusal does not depend on how much
    stack the caller has left (hypothesis and pytest change the recursion limit)."""
    depth = deepest = 0
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i += 1
            if i < n and pattern[i] == "^":
                i += 1
            if i < n and pattern[i] == "]":
                i += 1  # a `]` first in a class is a literal
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
        elif c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth = max(depth - 1, 0)
        i += 1
    return deepest
