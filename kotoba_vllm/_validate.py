"""Pure validation: ranges and consistency (DESIGN §3), then what the chosen engine honours.

A request with an `:error` problem never reaches a transport.
"""

from __future__ import annotations

import math

from ._fields import stream_problems, value_problems
from ._memo import IdentityMemo
from ._model import ChatRequest, Request, Sampling
from ._problems import Problem
from ._sampling import KNOBS_BY_ATTR, STRUCTURED_ATTRS
from .dialects import get_dialect


# Samplings found clean: every value checked below is immutable in a frozen Sampling, and batches and
# keyword arguments repeat the same few objects (by identity: an attrs hash walks every field).
_CLEAN_SAMPLINGS: IdentityMemo[Sampling, bool] = IdentityMemo(1024)


def sampling_problems(s: Sampling) -> list[Problem]:
    if _CLEAN_SAMPLINGS.get(id(s)):
        return []
    out = _sampling_problems(s)
    if not out:
        _CLEAN_SAMPLINGS.keep(s, True)
    return out


def _sampling_problems(s: Sampling) -> list[Problem]:
    out: list[Problem] = []
    for attr, knob in KNOBS_BY_ATTR.items():
        v = getattr(s, attr)
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        # NaN and infinities (`##NaN`, `##Inf`) cannot be sent as JSON: never in range
        if not math.isfinite(v) or (knob.lo is not None and not v >= knob.lo) or (knob.hi is not None and not v <= knob.hi):
            lo = "-inf" if knob.lo is None else knob.lo
            hi = "inf" if knob.hi is None else knob.hi
            out.append(Problem("error", "sampling/range", f":{knob.key} = {v} is out of range [{lo}, {hi}]",
                               field=knob.key))
    if s.best_of is not None and s.best_of < (s.n or 1):
        out.append(Problem("error", "sampling/best-of", f":vllm/best-of {s.best_of} must be >= :vllm/n {s.n or 1}",
                           field="vllm/best-of"))
    guided = [a for a in STRUCTURED_ATTRS if getattr(s, a) is not None]
    if len(guided) > 1:
        keys = " ".join(":" + KNOBS_BY_ATTR[a].key for a in guided)
        out.append(Problem("error", "sampling/conflict", f"use one structured-output constraint, not {keys}",
                           field=KNOBS_BY_ATTR[guided[1]].key))
    if s.guided_choice is not None and not s.guided_choice:
        out.append(Problem("error", "sampling/empty", ":vllm/guided-choice needs at least one choice",
                           field="vllm/guided-choice"))
    if isinstance(s.stop, tuple) and len(s.stop) > 16:
        out.append(Problem("warn", "sampling/stop", f"{len(s.stop)} stop strings; most servers cap this",
                           field="vllm/stop"))
    return out


def request_problems(req: Request) -> list[Problem]:
    out: list[Problem] = []
    sampling = getattr(req, "sampling", None)
    if sampling is not None:
        out.extend(sampling_problems(sampling))
    if isinstance(req, ChatRequest):
        if not req.messages:
            out.append(Problem("error", "request/empty", "a chat request needs at least one message",
                               field="vllm/messages"))
        for i, m in enumerate(req.messages):
            if m.role == "tool" and m.tool_call_id is None:
                out.append(Problem("error", "message/tool-call-id", f"message {i}: a :tool message needs "
                                   ":vllm/tool-call-id", field="vllm/tool-call-id"))
            if m.content is None and not m.tool_calls:
                out.append(Problem("error", "message/content", f"message {i}: needs :vllm/content",
                                   field="vllm/content"))
    if req.extras:
        out.extend(value_problems(req.extras, req.stream, sampling.max_tokens if sampling is not None else None))
        out.extend(stream_problems(req.extras, req.stream))
    deadline = req.deadline_s
    if deadline is not None and not deadline > 0:  # a whole-call deadline (inf: none)
        out.append(Problem("error", "request/deadline", f":vllm/deadline-s must be a positive number of seconds, "
                           f"got {deadline!r}", field="vllm/deadline-s"))
    if req.stream and req.endpoint in ("embedding", "tokenize", "detokenize"):
        out.append(Problem("error", "request/stream", f"the {req.endpoint} endpoint does not stream",
                           field="vllm/stream"))
    return out


def validate(req: Request, backend: str | None = None) -> list[Problem]:
    """Every problem with `req`; engine support is checked when `backend` names an engine."""
    out = request_problems(req)
    if backend is not None and backend != "auto":
        out.extend(get_dialect(backend).problems(req))
    return out


def send_problems(req: Request, backend: str, checked: bool = False) -> list[Problem]:
    """What `validate(req, backend)` says, for a request about to be sent. `checked`: `request_problems(req)`
    already ran (a batch entry, read and checked before it is sent) and found no error; then, when the engine
    finds no error either, there is nothing to report (warnings do not stop a send)."""
    if not checked:
        return validate(req, backend)
    if backend == "auto":
        return []
    engine = get_dialect(backend).problems(req)
    if any(p.is_error for p in engine):
        return validate(req, backend)  # the refusal lists every problem, exactly as an unmarked request's
    return []
