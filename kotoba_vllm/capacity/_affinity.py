"""Conversation affinity (pure): remember which member served a conversation so its
next turn goes back there and hits that member's prefix cache.

Keys: an explicit conversation id, and chained hashes of message prefixes (a chat's next
turn starts with the previous turn's messages) or of prompt prefixes in 256-character
blocks (a completion's next prompt extends the previous one). Only a strict prefix
counts: a request that repeats an earlier one whole is independent, so it can spread.
Bounded LRU.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Hashable, Sequence

PROMPT_BLOCK = 256
Key = tuple[str, int | str]  # ("m", chained hash) a message prefix, ("p", chained hash) a prompt prefix, ("c", id)


def _fingerprint(x: object) -> int:
    try:
        return hash(x)  # frozen attrs messages hash their fields; the table lives in this process only
    except TypeError:  # something unhashable inside: its text stands in
        return hash(repr(x))


def message_prefix_keys(messages: Sequence[object]) -> list[Key]:
    """One key per prefix length 1..n; each key commits to every message before it."""
    h = 0
    out: list[Key] = []
    for m in messages:
        h = _chain(h, m)
        out.append(("m", h))
    return out


def _chain(h: int, message: object) -> int:
    """The prefix hash `h` extended by one message."""
    return hash((h, _fingerprint(message)))


def prompt_prefix_keys(prompt: str | Sequence[int]) -> list[Key]:
    """Keys for every whole 256-unit block boundary, then the full prompt (one pass: each key
    chains the previous one with the next block)."""
    seq = prompt if isinstance(prompt, str) else ",".join(map(str, prompt))
    h = 0
    out: list[Key] = []
    for start in range(0, len(seq), PROMPT_BLOCK):
        h = hash((h, seq[start:start + PROMPT_BLOCK]))
        out.append(("p", h))
    return out


def request_keys(request: object) -> list[Key]:
    messages = getattr(request, "messages", None)
    if messages:
        return message_prefix_keys(messages)
    prompt = getattr(request, "prompt", None)
    if prompt:
        return prompt_prefix_keys(prompt)
    return []


def _earlier_keys(request: object) -> list[Key]:
    """`request_keys(request)[-2::-1]`: the keys of its strict prefixes, longest first (a one-message
    chat has none, and hashes nothing)."""
    messages = getattr(request, "messages", None)
    if messages:
        return message_prefix_keys(messages[:-1])[::-1]
    return request_keys(request)[-2::-1]


class Affinity:
    """LRU map from conversation keys to the member URL that served them."""

    def __init__(self, max_entries: int = 4096) -> None:
        self._table: OrderedDict[Hashable, str] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()

    def lookup(self, request: object, conversation: str | None = None) -> str | None:
        """The member for this conversation id, else for the longest known *earlier* turn: a
        strict prefix of this request. The same request again is independent (it spreads)."""
        if not conversation and len(getattr(request, "messages", None) or ()) == 1:
            return None  # a first turn has no earlier turn (the common batch request)
        keys = ([("c", conversation)] if conversation else []) + _earlier_keys(request)
        if not keys:
            return None
        with self._lock:
            for k in keys:
                member = self._table.get(k)
                if member is not None:
                    self._table.move_to_end(k)
                    return member
        return None

    def remember(self, request: object, member: str, conversation: str | None = None) -> None:
        messages = getattr(request, "messages", None)
        if not conversation and messages and len(messages) == 1:  # a first turn (the common batch request)
            keys: list[Key] = [("m", _chain(0, messages[0]))]  # `message_prefix_keys`' one key, no prefix walk
        else:
            keys = request_keys(request)
            if conversation:
                keys.insert(0, ("c", conversation))
        table = self._table
        with self._lock:
            for k in keys:
                if k in table:
                    table.move_to_end(k)
                table[k] = member  # a new key goes in last: already the most recent
            while len(table) > self._max:
                table.popitem(last=False)

    def __len__(self) -> int:
        return len(self._table)
