"""Keywords: interned, hashed fast, and which names can be keywords at all.

The lowest layer with `_errors`: both it and the EDN reader and writers (`_edn`) name keywords.
"""

from __future__ import annotations

import re

from edn_format import Keyword

__all__ = ["Keyword", "is_keyword_name", "keyword_or_string", "kw"]

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
