"""One shape for the small module-level memos on hot paths."""

from __future__ import annotations

from typing import Dict, TypeVar

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
