"""Rows in, rows out (pure; no Ray, no I/O): a row's request becomes a `BatchEntry`, an outcome
becomes the flat typed columns plus the record text `run` writes.

A row's request is one of
- EDN text of one request map (`"{:vllm/endpoint :chat ...}"`), located at the row's `where`;
- a request map with `Keyword` keys, as the EDN reader returns it;
- one OpenAI/vLLM batch JSONL line, as text or as its decoded object
  (`{"custom_id": .., "url": .., "body": {..}}`), or the row itself when it has those columns.
"""

from __future__ import annotations

import json
from typing import Mapping, cast

from .._edn import Edn, EdnError, Keyword
from .._errors import AdmissionRejected, ConfigError, KotobaError, ValidationError
from .._model import AnyResponse, Figure
from .._requests import request_from_edn
from .._validate import request_problems
from ..batch import BatchEntry, Recorder, entry_from_form, line_to_entry, read_located, syntax_entry
from .._problems import Problem

INDEX = "request_index"  # the input position; readers add it, the stage requires it
REQUEST = "request"
WHERE = "where"  # "file:line:column" of the request in its input, when known

# name -> Arrow type name, in output order. The record column is the EDN `run` writes.
COLUMNS: dict[str, str] = {
    "request_id": "string", "ok": "bool", "error": "string", "admission_reason": "string",
    "finish_reason": "string", "text": "string",
    "prompt_tokens": "int64", "completion_tokens": "int64", "cached_tokens": "int64",
    "endpoint_url": "string", "backend": "string",
    "prefill_tokens": "int64", "prefill_ms": "float64", "prefill_tokens_per_s": "float64",
    "prefill_provenance": "string", "prefill_computed_from": "string",
    "decode_tokens": "int64", "decode_ms": "float64", "decode_tokens_per_s": "float64",
    "decode_provenance": "string", "decode_computed_from": "string",
    "sent": "bool", "maybe_sent_twice": "bool", "record": "string",
    # the run-batch JSONL line `run -o x.jsonl` writes for it (made when the output is JSONL, else null)
    "batch_line": "string",
}
_BATCH_LINE_KEYS = ("custom_id", "method", "url", "body")
_RECORDER = Recorder("edn")
_LINES = Recorder("jsonl")


def _drop_nulls(v: object) -> object:
    # A JSON struct column fills fields other rows have with nulls; absent and null mean the same to OpenAI.
    if isinstance(v, dict):
        return {k: _drop_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_drop_nulls(x) for x in v]
    return v


def _edn_text_entry(index: int, text: str, where: str | None) -> BatchEntry:
    source, line, column = "<row>", 1, 1
    if where:
        head, _, rest = where.rpartition(":")
        src, _, ln = head.rpartition(":")
        if src and ln.isdigit() and rest.isdigit():
            source, line, column = src, int(ln), int(rest)
        else:
            source = where
    try:
        forms = list(read_located(text, source, line, column))
    except EdnError as e:
        return syntax_entry(index, e)
    if len(forms) != 1:
        at = f"{source}:{line}:{column}"
        return BatchEntry(index, at, None, (Problem("error", "batch/row", f"a row holds one request form, "
                                                                          f"found {len(forms)}", where=at),))
    return entry_from_form(index, forms[0])


def entry_from_value(index: int, value: object, where: str | None = None) -> BatchEntry:
    """The entry for one row's request value (see the module docstring for the shapes)."""
    at = where or f"<row {index}>"
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        stripped = value.lstrip()
        if stripped.startswith('{"'):
            try:
                obj = json.loads(value)
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                source, _, line = at.rpartition(":")[0].rpartition(":")
                return line_to_entry(index, value, source or at, int(line) if line.isdigit() else 1)
        return _edn_text_entry(index, value, where)
    if isinstance(value, Mapping):
        if value and all(isinstance(k, Keyword) for k in value):
            req, problems = request_from_edn(dict(value))
            if req is not None:
                problems = problems + request_problems(req)
            return BatchEntry(index, at, req, tuple(problems))
        if any(k in value for k in _BATCH_LINE_KEYS):
            line = json.dumps(_drop_nulls(dict(value)), ensure_ascii=False, default=str)
            return line_to_entry(index, line, at, 1)
    return BatchEntry(index, at, None, (Problem(
        "error", "batch/row", f"a row's request must be EDN text, a :vllm/* map or a batch JSONL line; "
                              f"got {type(value).__name__}", where=at),))


def entry_from_row(row: Mapping[str, object]) -> BatchEntry:
    """A row with `request_index` and either a `request` column or the batch JSONL columns."""
    index = row.get(INDEX)
    if not isinstance(index, int) or isinstance(index, bool):
        raise ConfigError(f"every row needs an integer {INDEX!r} column (the readers in kotoba_vllm.ray add it)")
    where = cast("str | None", row.get(WHERE))  # the readers write it as text, or leave it out
    if REQUEST in row:
        return entry_from_value(index, row[REQUEST], where)
    return entry_from_value(index, {k: row[k] for k in _BATCH_LINE_KEYS if k in row}, where)


# ------------------------------------------------------------------ outcomes -> columns


def _base(e: BatchEntry) -> dict[str, object]:
    out: dict[str, object] = dict.fromkeys(COLUMNS)
    rid = e.custom_id if e.custom_id is not None else e.request_id
    out["request_id"] = None if rid is None else str(rid)
    out["sent"] = out["maybe_sent_twice"] = False
    return out


def _figure(out: dict[str, object], prefix: str, fig: Figure) -> None:
    out[f"{prefix}_provenance"] = fig.provenance
    out[f"{prefix}_tokens"] = fig.tokens
    out[f"{prefix}_ms"] = fig.ms
    out[f"{prefix}_tokens_per_s"] = fig.tokens_per_s
    # provenance "computed": the server's fields the numbers were worked out from
    out[f"{prefix}_computed_from"] = ",".join(fig.computed_from) if fig.computed_from else None


def ok_columns(e: BatchEntry, resp: AnyResponse, attempts: list[dict[Keyword, Edn]] | None = None) -> dict[str, object]:
    """`attempts`: every attempt of a request rejected at admission and sent again (the record's :vllm/attempts)."""
    out = _base(e)
    out.update(ok=True, sent=True, record=_RECORDER.ok(e, resp, [], attempts)[-1])
    out["text"] = getattr(resp, "text", None)
    out["finish_reason"] = getattr(resp, "finish_reason", None)
    out["endpoint_url"] = getattr(resp, "endpoint_url", None)
    out["backend"] = getattr(resp, "backend", None)
    usage = getattr(resp, "usage", None)
    if usage is not None:
        out.update(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                   cached_tokens=usage.cached_tokens)
    timings = getattr(resp, "timings", None)
    if timings is not None:
        _figure(out, "prefill", timings.prefill)
        _figure(out, "decode", timings.decode)
    else:
        out["prefill_provenance"] = out["decode_provenance"] = "unavailable"
    return out


def error_columns(e: BatchEntry, err: KotobaError, attempts: list[dict[Keyword, Edn]] | None = None
                  ) -> dict[str, object]:
    out = _base(e)
    out.update(ok=False, error=err.kind, endpoint_url=err.endpoint, backend=err.backend,
               record=_RECORDER.failed(e, err, attempts)[-1])
    out["sent"] = not isinstance(err, ValidationError) and getattr(err, "sent", True)
    if isinstance(err, AdmissionRejected):
        out["admission_reason"] = err.reason
    return out


def invalid_columns(e: BatchEntry) -> dict[str, object]:
    out = _base(e)
    out.update(ok=False, error="validation", record=_RECORDER.invalid(e)[-1])
    return out


def batch_line(e: BatchEntry, outcome: AnyResponse | KotobaError | None,
               attempts: list[dict[Keyword, Edn]] | None = None) -> str:
    """The run-batch JSONL line `run` writes for `e`: `outcome` is the response, the typed error, or None
    (invalid: nothing was sent)."""
    if outcome is None:
        return _LINES.invalid(e)[-1]
    if isinstance(outcome, KotobaError):
        return _LINES.failed(e, outcome, attempts)[-1]
    return _LINES.ok(e, outcome, [], attempts)[-1]


def flag_maybe_sent_twice(cols: dict[str, object]) -> dict[str, object]:
    """Mark a record whose request an earlier attempt may already have delivered. The record is the text
    of one EDN map, so the key goes in front of its first key; the batch line says it in its `kotoba` object."""
    rec = cols["record"]
    assert isinstance(rec, str) and rec.startswith("{")
    out = {**cols, "maybe_sent_twice": True, "record": "{:vllm/maybe-sent-twice true " + rec[1:].lstrip()}
    line = cols.get("batch_line")
    if isinstance(line, str):
        obj = json.loads(line)
        obj["kotoba"]["maybe_sent_twice"] = True
        out["batch_line"] = json.dumps(obj, ensure_ascii=False, allow_nan=False, default=str)
    return out
