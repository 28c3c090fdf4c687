"""The two shapes of the small module-level memos on hot paths: by value (`BoundedMemo`) and by
identity (`IdentityMemo`). Both are bounded: their keys come from callers and servers."""

from __future__ import annotations

from typing import Dict, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedMemo(Dict[K, V]):
    """A dict that starts over once it holds `limit` entries.

    Its keys come from callers or servers (a caller's Samplings, names in servers' answers), so
    nothing bounds how many differ; a batch repeats a few, which is what the memo is for. Reads
    are plain dict reads (`get`), so a hit costs no Python call."""

    __slots__ = ("limit",)

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def keep(self, key: K, value: V) -> V:
        """Remember `value` under `key` and return it; forget everything first when full."""
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value


class IdentityMemo(Dict[int, V], Generic[K, V]):
    """A memo keyed by an object's identity, for values that hash slowly (a frozen attrs instance) and
    recur as the very same object (one structured `Sampling` shared by a batch's requests).

    Read it as a plain dict of ids, `memo.get(id(obj))`: no Python call on a hit. That read is exact
    because the memo holds every key object it was given (`keep`) for as long as its entry lives, so no
    other object can have that id meanwhile. Write only through `keep` (which holds the key). Bounded like
    `BoundedMemo` (starts over when full)."""

    __slots__ = ("_held", "limit")

    def __init__(self, limit: int) -> None:
        super().__init__()
        self._held: dict[int, K] = {}
        self.limit = limit

    def keep(self, key: K, value: V) -> V:
        """Remember `value` for this object (and hold the object) and return it; forget all first when full."""
        if len(self) >= self.limit:
            self.clear()
        i = id(key)
        self._held[i] = key
        self[i] = value
        return value

    def clear(self) -> None:
        super().clear()
        self._held.clear()
