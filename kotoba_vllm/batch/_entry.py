"""One batch entry: the data both input readers (EDN forms, JSONL lines) yield."""

from __future__ import annotations

from typing import Any

import attrs

from .._model import Request
from .._problems import Problem


@attrs.frozen
class BatchEntry:
    """One request of a batch: typed when it could be read, with its problems either way.

    `index` is the position in the input (0-based); `custom_id` is the JSONL line's id. `checked`: the
    request's engine-independent checks already ran while it was read (its problems say what they
    found), so sending it runs only the engine's (`send(..., checked=True)`).
    """

    index: int
    where: str
    request: Request | None
    problems: tuple[Problem, ...] = ()
    custom_id: str | None = None
    checked: bool = False
    # where its EDN form can be read again (`Form.anchor`), so a server's refusal naming a field can name that
    # key's line and column; the form itself is not kept (its position tables cost ~4 KB a request held)
    anchor: tuple[str, int, str, int, int] | None = attrs.field(default=None, eq=False, repr=False)
    # a JSONL entry's line, for the same (the line is read anyway; it is held while its request is in flight)
    jsonl_line: str | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def sendable(self) -> bool:
        return self.request is not None and (not self.problems or not any(p.is_error for p in self.problems))

    @property
    def request_id(self) -> str | int | None:
        return self.request.request_id if self.request is not None else None
