"""EDN request maps <-> typed requests (dispatch on `:vllm/endpoint`)."""

from __future__ import annotations

from typing import Iterable

import attrs

from ._codec import describe, structure_located
from ._edn import Edn, Form, Keyword, kw, plain_edn
from ._model import ENDPOINTS, REQUEST_CLASSES, Request, to_edn
from ._problems import Problem

K_ENDPOINT = kw("vllm/endpoint")
K_MESSAGES = kw("vllm/messages")
K_PROMPT = kw("vllm/prompt")
_NOT_FIELDS = frozenset((K_ENDPOINT,))  # the dispatch key, read here


def request_from_edn(m: Edn, form: Form | None = None) -> tuple[Request | None, list[Problem]]:
    """A typed request from an EDN map, or None and the problems (located when `form` is given)."""
    if form is None:  # a caller's map (maybe edn_format's); our reader's forms hold plain values already
        m = plain_edn(m)
    if not isinstance(m, dict):
        return None, [Problem("error", "request/type", f"a request must be a map, got {describe(m)}",
                              where=_where(form))]
    endpoint = m.get(K_ENDPOINT)
    if endpoint is None:
        # The Clojure builders always set it; infer only when the shape says it plainly.
        endpoint = kw("chat") if K_MESSAGES in m else kw("completion") if K_PROMPT in m else None
        if endpoint is None:
            return None, [Problem("error", "request/missing-key",
                                  "request needs :vllm/endpoint (one of " + " ".join(":" + e for e in ENDPOINTS) + ")",
                                  field="vllm/endpoint", where=_where(form))]
    if not isinstance(endpoint, Keyword) or endpoint.name not in REQUEST_CLASSES:
        loc = form.locate(m, K_ENDPOINT) if form is not None else None
        return None, [Problem("error", "request/endpoint",
                              f":vllm/endpoint must be one of {' '.join(':' + e for e in ENDPOINTS)}, "
                              f"got {describe(endpoint)}", field="vllm/endpoint",
                              where=f"{form.source}:{loc[0]}:{loc[1]}" if form is not None and loc else _where(form))]
    cls = REQUEST_CLASSES[endpoint.name]
    req, problems = structure_located(m, cls, form, skip=_NOT_FIELDS)
    return req, problems


def _where(form: Form | None) -> str | None:
    return form.where if form is not None else None  # made only for a problem: a request that reads needs none


def request_to_edn(req: Request) -> dict[Keyword, Edn]:
    out: dict[Keyword, Edn] = {K_ENDPOINT: kw(req.endpoint)}
    out.update(to_edn(req))
    return out


def _find_key(value: object, key: Keyword, form: Form) -> tuple[int, int] | None:
    """Line and column of the first `key` in a map anywhere inside `value`."""
    if isinstance(value, dict):
        if key in value:
            return form.locate(value, key)
        children: Iterable[object] = value.values()
    elif isinstance(value, (list, tuple)):
        children = value
    else:
        return None
    for child in children:
        loc = _find_key(child, key, form)
        if loc is not None:
            return loc
    return None


def key_where(form: Form, key: str) -> str | None:
    """`file:line:column` of the first `key` (an EDN key, "vllm/max-tokens") in `form`, or None."""
    loc = _find_key(form.value, kw(key), form)
    return f"{form.source}:{loc[0]}:{loc[1]}" if loc else None


def locate_problems(problems: Iterable[Problem], form: Form) -> list[Problem]:
    """Give each unlocated problem the file:line:column of its key in `form` (else of the form)."""
    out = []
    for p in problems:
        if p.where is None:
            p = attrs.evolve(p, where=(key_where(form, p.field) if p.field else None) or form.where)
        out.append(p)
    return out
