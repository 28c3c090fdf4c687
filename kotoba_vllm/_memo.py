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


class IdentityMemo(Generic[K, V]):
    """A memo keyed by an object's identity, for values that hash slowly (a frozen attrs instance) and
    recur as the very same object (one structured `Sampling` shared by a batch's requests).

    Each entry holds its key object, so while the entry lives no other object can have that id; a read
    checks the held object `is` the one asked about. Bounded like `BoundedMemo` (starts over when full)."""

    __slots__ = ("_entries", "limit")

    def __init__(self, limit: int) -> None:
        self._entries: dict[int, tuple[K, V]] = {}
        self.limit = limit

    def get(self, key: K) -> V | None:
        """The value kept for this very object, or None."""
        entry = self._entries.get(id(key))
        return entry[1] if entry is not None and entry[0] is key else None

    def keep(self, key: K, value: V) -> V:
        """Remember `value` for this object and return it; forget everything first when full."""
        entries = self._entries
        if len(entries) >= self.limit:
            entries.clear()
        entries[id(key)] = (key, value)
        return value

    def pop(self, key: K) -> V | None:
        """Take this object's value out (None when it has none)."""
        entry = self._entries.get(id(key))
        if entry is None or entry[0] is not key:
            return None
        del self._entries[id(key)]
        return entry[1]

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
