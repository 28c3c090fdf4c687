"""When one call may send its request a second time: the evidence rule, transport-neutral.

A request is resent only on *positive* evidence, reported by the transport, that the
attempt went out on a **reused** keep-alive connection and that connection failed
**before any response byte** arrived: the server closed an idle connection as we wrote
to it, so it never answered. Anything the transport cannot vouch for stays unknown, and
unknown never resends: a transport that reports nothing makes exactly one request.

How a transport reports (every wire, and httpx's trace hook in `_base_client`, the same way):

    ev = AttemptEvidence()                   # one per attempt, before sending
    ev.connection(reused=True | False)       # once a connection is picked (the first one counts)
    ev.response(seen=False)                  # the request is out, or: a byte count that did not move
    ev.response(seen=True)                   # a response byte (or header) arrived
    ...the wire raises a TransportError with connection_lost=True...
    if may_resend(connection_failed=True, evidence=ev): send again on a fresh connection

Readers read `ev.reused` and `ev.response_seen` (None: not reported).
"""

from __future__ import annotations

__all__ = ["AttemptEvidence", "MAX_RESENDS", "may_resend"]

MAX_RESENDS = 4  # bounded by how many pooled connections can be stale at once


class AttemptEvidence:
    """What the transport saw of one attempt. `None` is "not reported", never "no"."""

    __slots__ = ("reused", "response_seen")

    def __init__(self) -> None:
        self.reused: bool | None = None
        self.response_seen: bool | None = None

    def connection(self, *, reused: bool) -> None:
        if self.reused is None:  # the first connection of the attempt is the one that counts
            self.reused = reused

    def response(self, *, seen: bool) -> None:
        """`seen=False` never takes back a `True`: a byte that arrived stays arrived."""
        if seen or self.response_seen is None:
            self.response_seen = seen

    @property
    def stale_connection(self) -> bool:
        """Positive evidence of the one resendable failure."""
        return self.reused is True and self.response_seen is False

    def __repr__(self) -> str:
        return f"AttemptEvidence(reused={self.reused}, response_seen={self.response_seen})"


def may_resend(*, connection_failed: bool, evidence: AttemptEvidence | None) -> bool:
    """Resend exactly when a connection-level failure (reset, EOF, broken pipe: no timeout, no
    refusal, no HTTP answer) hit a reused connection before any response byte, as the transport
    reported. A response of any status - a 429 included - is never resent."""
    return connection_failed and evidence is not None and evidence.stale_connection
