"""Request ids across a batch: two requests with one id are a problem naming both positions (a server's
log, a router's trace or a record could not tell them apart), and `run --request-ids` gives every request
without an id one (`<prefix>-<index>`), so each record can be joined with the server's logs."""

from __future__ import annotations

import uuid
from typing import Any, Callable, Iterable, Iterator, Protocol, TypeVar

import attrs

from .._model import Request
from .._problems import Problem


class _Entry(attrs.AttrsInstance, Protocol):
    @property
    def index(self) -> int: ...
    @property
    def where(self) -> str: ...
    @property
    def request(self) -> Request | None: ...
    @property
    def problems(self) -> tuple[Problem, ...]: ...


E = TypeVar("E", bound=_Entry)
_replace: Callable[..., Any] = attrs.evolve  # mypy's attrs plugin does not follow a protocol-bound TypeVar


def new_prefix() -> str:
    """A prefix no other run shares: ids stay unique across runs against one server."""
    return "kotoba-" + uuid.uuid4().hex[:12]


def with_request_ids(entries: Iterable[E], prefix: str | None = None) -> Iterator[E]:
    """The entries, in order; with `prefix`, a request without `:vllm/request-id` gets `<prefix>-<index>`.
    A request whose id an earlier one has is not sent: its problem names both positions."""
    first: dict[str, int] = {}  # a request's own id -> the index of the first request that has it
    for e in entries:
        req = e.request
        generated = False
        if req is not None and req.request_id is None and prefix is not None:
            generated = True  # unique by construction: not kept (a million-request file stays small)
            req = attrs.evolve(req, request_id=f"{prefix}-{e.index}")
            e = _replace(e, request=req)  # an entry's `checked` stays true: the id changes none of its checks
        rid = req.request_id if req is not None else None
        if rid is not None and not generated:
            key = str(rid)  # 7 and "7" reach the server as the same id
            seen = first.get(key)
            if seen is None:
                first[key] = e.index
            else:
                e = _replace(e, problems=e.problems + (Problem(
                    "error", "batch/duplicate-request-id",
                    f"requests {seen} and {e.index} both have the request id {rid!r}: the server's logs could not "
                    "tell them apart", field="vllm/request-id", where=e.where),))
        yield e
