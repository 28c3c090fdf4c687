"""Does a re-recording reproduce a cassette? Everything except ids, timestamps and timings.

Probe answers (/props, /slots, /metrics) hold live counters, so only their shape is compared:
top-level JSON keys, or the set of metric families. Stream chunk boundaries are TCP's choice,
so streams are compared event by event, not chunk by chunk.
"""

from __future__ import annotations

import json
from prometheus_client.parser import text_string_to_metric_families

from .._json import JsonValue
from ._format import Cassette, sse_payloads

# Values that legitimately change between two recordings of the same exchange.
VOLATILE = frozenset({"id", "created", "timings", "system_fingerprint", "model", "model_path", "model_alias",
                      "owned_by", "id_task", "t_start", "date"})


def _strip(v: JsonValue) -> JsonValue:
    if isinstance(v, dict):
        return {k: _strip(x) for k, x in v.items() if k not in VOLATILE}
    if isinstance(v, list):
        return [_strip(x) for x in v]
    return v


def _json_or_text(s: str) -> JsonValue:
    try:
        return _strip(json.loads(s))
    except ValueError:
        return s


def comparable(c: Cassette) -> tuple[object, ...]:
    """The part of a cassette a re-recording must reproduce."""
    head = (c.method, c.path, c.status, c.headers.get("content-type"), c.request_body)
    if c.op == "probe":
        if c.path.endswith("/metrics"):
            return head, sorted(f.name for f in text_string_to_metric_families(c.raw.decode()))
        obj = json.loads(c.raw)
        keys = sorted(obj) if isinstance(obj, dict) else sorted({k for x in obj for k in x})
        return head, keys
    if c.streaming:
        return head, [_json_or_text(p) for p in sse_payloads(c.raw)]
    return head, _json_or_text(c.raw.decode("utf-8", "replace"))


def differences(old: list[Cassette], new: list[Cassette]) -> list[str]:
    """Human-readable differences between two recordings of the same set (empty: reproduced)."""
    a, b = {c.name: c for c in old}, {c.name: c for c in new}
    out = [f"{n}: only in the old set" for n in sorted(set(a) - set(b))]
    out += [f"{n}: only in the new set" for n in sorted(set(b) - set(a))]
    for n in sorted(set(a) & set(b)):
        if comparable(a[n]) != comparable(b[n]):
            out.append(f"{n}: answer differs")
        elif a[n].expect != b[n].expect:
            out.append(f"{n}: expectations differ")
    return out
