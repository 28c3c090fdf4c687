"""Keywords: interned, hashed once, and which names can be keywords at all.

The lowest layer with `_errors`: both it and the EDN reader and writers (`_edn`) name keywords.
"""

from __future__ import annotations

import re
from typing import Callable

from edn_format import Keyword

__all__ = ["InternedKeyword", "Keyword", "is_keyword_name", "keyword_or_string", "kw"]

class InternedKeyword(Keyword):
    """A keyword as `kw` makes it: an `edn_format.Keyword`, equal to and hashed as edn_format's own
    keyword of the same name (so maps built with `edn_format.loads` or `edn_format.Keyword` work
    wherever the SDK takes EDN), with that hash computed once. edn_format hashes by building an
    immutable dict of the instance's `__dict__` on every call, and keyword-keyed dict lookups are most
    of reading a request; edn_format's class itself is left as it is. Exact-type dispatch (`type(v) is
    InternedKeyword`) finds ours first; a user's `Keyword` takes the general (isinstance) branch."""

    __slots__ = ("_hash",)  # a slot, not `__dict__`: edn_format's equality compares `__dict__`s

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._hash: int = Keyword.__hash__(self)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return other is self or isinstance(other, Keyword) and other.__dict__ == self.__dict__

    def __repr__(self) -> str:
        return f"Keyword({self.name})"  # as edn_format writes its own

    def __reduce__(self) -> tuple[Callable[[str], Keyword], tuple[str]]:
        return kw, (self.name,)  # another process hashes strings differently: intern there afresh


_KW_CACHE: dict[str, Keyword] = {}


def kw(name: str) -> Keyword:
    """An interned `Keyword` (`kw("vllm/model")` is `:vllm/model`)."""
    k = _KW_CACHE.get(name)
    if k is None:
        k = _KW_CACHE[name] = InternedKeyword(name)
    return k


# What the writer turns into a keyword: the EDN spec's symbol rules, narrowed to what every reader
# (ours, clojure.edn, edn_format) reads back to the same keyword. No ':' '#' or "'" inside, no leading
# digit, and '+', '-' or '.' first only when a non-digit follows.
_KW_SEGMENT = r"(?:[A-Za-z*!_?$%&=<>][A-Za-z0-9*!_?$%&=<>.+\-]*|[.+\-](?:[A-Za-z*!_?$%&=<>.+\-][A-Za-z0-9*!_?$%&=<>.+\-]*)?)"
_KW_NAME = re.compile(f"(?:{_KW_SEGMENT}/)?{_KW_SEGMENT}")


def is_keyword_name(s: str) -> bool:
    """True when `:s` is a keyword every EDN reader reads back as `s` ("tool_calls" yes, "stop sequence" no)."""
    return _KW_NAME.fullmatch(s) is not None


def keyword_or_string(s: str) -> Keyword | str:
    """A server's word as a keyword when it can be one (`:content_filter`), else the string as sent."""
    return kw(s) if is_keyword_name(s) else s
