"""Conversation affinity (pure): remember which member served a conversation so its
next turn goes back there and hits that member's prefix cache.

Keys: an explicit conversation id, and hashes of message prefixes (a chat's next turn
starts with the previous turn's messages) or of prompt prefixes in 256-character
blocks (a completion's next prompt extends the previous one). Only a strict prefix
counts: a request that repeats an earlier one whole is independent, so it can spread.
Bounded LRU.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any, Sequence

PROMPT_BLOCK = 256


def message_prefix_keys(messages: Sequence[Any]) -> list[str]:
    """One key per prefix length 1..n; each key commits to every message before it."""
    h = hashlib.sha256(b"messages")
    out = []
    for m in messages:
        h.update(repr(m).encode("utf-8", "replace"))  # frozen attrs: repr is the content
        h.update(b"\x00")
        out.append("m:" + h.copy().hexdigest())
    return out


def prompt_prefix_keys(prompt: str | Sequence[int]) -> list[str]:
    """Keys for every whole 256-unit block boundary, then the full prompt."""
    seq = prompt if isinstance(prompt, str) else ",".join(map(str, prompt))
    cuts = list(range(PROMPT_BLOCK, len(seq), PROMPT_BLOCK)) + [len(seq)]
    return ["p:" + hashlib.sha256(seq[:c].encode("utf-8", "replace")).hexdigest() for c in cuts if c]


def request_keys(request: Any) -> list[str]:
    messages = getattr(request, "messages", None)
    if messages:
        return message_prefix_keys(messages)
    prompt = getattr(request, "prompt", None)
    if prompt:
        return prompt_prefix_keys(prompt)
    return []


def _earlier_keys(request: Any) -> list[str]:
    """`request_keys(request)[-2::-1]`: the keys of its strict prefixes, longest first (a one-message
    chat has none, and hashes nothing)."""
    messages = getattr(request, "messages", None)
    if messages:
        return message_prefix_keys(messages[:-1])[::-1]
    return request_keys(request)[-2::-1]


class Affinity:
    """LRU map from conversation keys to the member URL that served them."""

    def __init__(self, max_entries: int = 4096) -> None:
        self._table: OrderedDict[str, str] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()

    def lookup(self, request: Any, conversation: str | None = None) -> str | None:
        """The member for this conversation id, else for the longest known *earlier* turn: a
        strict prefix of this request. The same request again is independent (it spreads)."""
        keys = (["c:" + conversation] if conversation else []) + _earlier_keys(request)
        if not keys:
            return None
        with self._lock:
            for k in keys:
                member = self._table.get(k)
                if member is not None:
                    self._table.move_to_end(k)
                    return member
        return None

    def remember(self, request: Any, member: str, conversation: str | None = None) -> None:
        keys = (["c:" + conversation] if conversation else []) + request_keys(request)
        with self._lock:
            for k in keys:
                self._table[k] = member
                self._table.move_to_end(k)
            while len(self._table) > self._max:
                self._table.popitem(last=False)

    def __len__(self) -> int:
        return len(self._table)
