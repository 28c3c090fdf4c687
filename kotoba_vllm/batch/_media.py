"""Batch entries with their local media read in: a part's `:vllm/path` from under the request file's own
directory or a `--media-root` the caller gave (kotoba_vllm/_media.py)."""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Iterator, TypeVar

import attrs

from .._media import has_local_media, inline_local_media
from ._ids import E

_replace: Callable[..., Any] = attrs.evolve
T = TypeVar("T")


def source_dir(where: str) -> str:
    """The directory of the file an entry came from (`where` is `file:line:column`)."""
    path = where.rsplit(":", 2)[0] if where.count(":") >= 2 else where
    return os.path.dirname(os.path.abspath(path)) if path and not path.startswith("<") else os.getcwd()


def with_local_media(entries: Iterable[E], roots: Iterable[str] = ()) -> Iterator[E]:
    extra = tuple(roots)
    for e in entries:
        req = e.request
        if req is not None and has_local_media(req):
            new, problems = inline_local_media(req, (source_dir(e.where), *extra), where=e.where)
            e = _replace(e, request=new, problems=e.problems + tuple(problems))
        yield e
