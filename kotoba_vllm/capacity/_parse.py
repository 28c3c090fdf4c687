"""Pure parsers for each engine's capacity endpoints: bytes in, numbers out.

Nothing here does I/O. A parser that cannot read its input raises `Unparsable` with
the reason; the verdict layer turns that into an unmeasured answer, never a zero.
"""

from __future__ import annotations

import json
import math
from typing import Iterable

import attrs
from prometheus_client.parser import text_string_to_metric_families

from .._errors import BadNumber, Unparsable, redact
from .._json import JsonValue

_SNIPPET = 160


# More requests or slots than any server runs: a figure past this is garbage, not load.
MAX_COUNT = 10**9


def checked(name: str, value: object, *, path: str = "/metrics") -> float:
    """`value` as a finite, non-negative, plausible figure, or BadNumber naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadNumber(f"GET {path}: {name} is not a number ({type(value).__name__})")
    try:
        x = float(value)
    except OverflowError:
        raise BadNumber(f"GET {path}: {name} is too large ({str(value)[:20]}...)") from None
    if not math.isfinite(x) or x < 0 or x > MAX_COUNT:
        raise BadNumber(f"GET {path}: {name} is {value!r}: not a count a server can report")
    return x


def count(name: str, s: "MetricSum") -> int:
    """A summed gauge as a whole count (the sums are already checked)."""
    return int(checked(name, s.value))


@attrs.frozen
class Fetched:
    """What a shell got for one probe path: an HTTP answer, or the transport failure."""

    path: str
    status: int | None = None
    body: bytes = b""
    error: str | None = None
    ms: float | None = None


def failure(f: Fetched) -> str | None:
    """Why this probe gives no reading (transport failure or HTTP error), or None when it answered 200."""
    if f.error is not None:
        return f"GET {f.path}: {f.error}"
    if f.status != 200:
        # redact: a server may quote our Authorization header back in its error body
        text = (redact(f.body.decode("utf-8", "replace")) or "").strip().replace("\n", " ")
        snippet = text if len(text) <= _SNIPPET else text[:_SNIPPET] + "..."
        return f"GET {f.path}: HTTP {f.status}" + (f" {snippet}" if snippet else "")
    return None


def _json(body: bytes, path: str) -> JsonValue:
    try:
        obj: JsonValue = json.loads(body)
        return obj
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise Unparsable(f"GET {path}: not JSON ({e})") from None


def json_body(f: Fetched) -> JsonValue:
    """A probe's JSON answer, or Unparsable naming the path."""
    return _json(f.body, f.path)


# ------------------------------------------------------------------ Prometheus text


@attrs.frozen
class MetricSum:
    """One metric summed over its label sets; `series` says how many were summed."""

    value: float
    series: int


# Tensor/pipeline ranks of one engine repeat the same scheduler figures: count rank 0 only.
_RANK_LABELS = ("tp_rank", "pp_rank")


def metric_sums(text: str, names: Iterable[str]) -> dict[str, MetricSum]:
    """Sum each named sample over its label sets (several models, engines or DP ranks
    behind one /metrics). Names absent from the text are absent from the result."""
    wanted = set(names)
    acc: dict[str, list[float]] = {}
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name not in wanted:
                    continue
                if any(s.labels.get(r, "0") != "0" for r in _RANK_LABELS):
                    continue
                series = (s.name, frozenset(s.labels.items()))
                if series in seen:  # the same series twice is no reading: summing it would double a count
                    raise Unparsable(f"{s.name}{_labels(s.labels)} appears twice: duplicate series, not summed")
                seen.add(series)
                acc.setdefault(s.name, []).append(checked(s.name, s.value))
    except Unparsable:
        raise
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, RecursionError) as e:
        raise Unparsable(f"not Prometheus text ({e})") from None
    return {n: MetricSum(sum(v), len(v)) for n, v in acc.items()}


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else ""


@attrs.frozen
class Sample:
    """One series of a metric: its labels and value (info gauges carry their facts in labels)."""

    labels: dict[str, str]
    value: float


def metric_samples(text: str, names: Iterable[str]) -> dict[str, list[Sample]]:
    """Each named metric's series, rank 0 only (as `metric_sums`), in the order the text gives them."""
    wanted = set(names)
    acc: dict[str, list[Sample]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in wanted and all(s.labels.get(r, "0") == "0" for r in _RANK_LABELS):
                    acc.setdefault(s.name, []).append(Sample(dict(s.labels), float(s.value)))
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, RecursionError) as e:
        raise Unparsable(f"not Prometheus text ({e})") from None
    return acc


def prometheus_samples(f: Fetched, names: Iterable[str]) -> dict[str, list[Sample]]:
    try:
        return metric_samples(f.body.decode("utf-8"), names)
    except UnicodeDecodeError as e:
        raise Unparsable(f"GET {f.path}: not UTF-8 text ({e})") from None
    except Unparsable as e:
        raise Unparsable(f"GET {f.path}: {e}") from None


def prometheus(f: Fetched, names: Iterable[str]) -> dict[str, MetricSum]:
    try:
        text = f.body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Unparsable(f"GET {f.path}: not UTF-8 text ({e})") from None
    try:
        return metric_sums(text, names)
    except BadNumber:
        raise
    except Unparsable as e:
        raise Unparsable(f"GET {f.path}: {e}") from None


# ------------------------------------------------------------------ llama.cpp


def llamacpp_slots(f: Fetched) -> tuple[int, int]:
    """`/slots`: a JSON list, one object per slot with `is_processing` -> (total, busy)."""
    obj = _json(f.body, f.path)
    if not isinstance(obj, list) or not obj:
        raise Unparsable(f"GET {f.path}: expected a non-empty list of slots")
    busy = 0
    for slot in obj:
        flag = slot.get("is_processing") if isinstance(slot, dict) else None
        if not isinstance(flag, bool):
            raise Unparsable(f"GET {f.path}: a slot without a boolean is_processing")
        busy += flag
    return len(obj), busy


def llamacpp_total_slots(f: Fetched) -> int:
    """`/props` `total_slots` (the server's `--parallel`)."""
    obj = _json(f.body, f.path)
    total = obj.get("total_slots") if isinstance(obj, dict) else None
    if type(total) is not int or total < 1:
        raise Unparsable(f"GET {f.path}: no positive integer total_slots")
    checked("total_slots", total, path=f.path)
    return total


# ------------------------------------------------------------------ SGLang / vLLM JSON


def sglang_max_running(f: Fetched) -> int | None:
    """`/server_info` or `/get_server_info`: `max_running_requests` (top level, else in
    `internal_states`). None when the server does not say."""
    obj = _json(f.body, f.path)
    if not isinstance(obj, dict):
        raise Unparsable(f"GET {f.path}: expected a JSON object")
    candidates = [obj.get("max_running_requests")]
    states = obj.get("internal_states")
    if isinstance(states, list):
        candidates += [s.get("max_running_requests") for s in states if isinstance(s, dict)]
    for c in candidates:
        if type(c) is int and 0 < c <= MAX_COUNT:
            return c
    return None


def vllm_load(f: Fetched) -> int:
    """`/load` (vLLM with `--enable-server-load-tracking`): `{"server_load": n}`."""
    obj = _json(f.body, f.path)
    load = obj.get("server_load") if isinstance(obj, dict) else None
    if type(load) is not int:
        raise Unparsable(f"GET {f.path}: no integer server_load")
    return int(checked("server_load", load, path=f.path))
