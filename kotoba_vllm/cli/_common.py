"""Shared CLI pieces: reading request files into located, typed requests; EDN output."""

from __future__ import annotations

import sys
from typing import Any, Iterator, TextIO

import attrs

from .._edn import EdnError, Form, dumps, kw, pretty
from .._model import Request
from .._problems import Problem
from .._requests import locate_problems, request_from_edn
from ..batch import FormStream


@attrs.frozen
class Entry:
    """One request form from a file: typed when it could be read, with its problems either way."""

    index: int
    where: str
    request: Request | None
    problems: tuple[Problem, ...]
    form: Form | None = None

    def located(self, problems: list[Problem]) -> list[Problem]:
        """Problems found after typing, given the file:line:column of the key they name."""
        return locate_problems(problems, self.form) if self.form is not None else problems


def expand_forms(forms: list[Form]) -> Iterator[Form]:
    """A file holds request maps, or one vector of them."""
    for f in forms:
        if isinstance(f.value, list) and len(forms) == 1:
            for v in f.value:
                yield f.nested(v)
        else:
            yield f


def iter_request_entries(path: str) -> Iterator[Entry]:
    """Each request of an EDN file ('-' is stdin), read one form at a time: memory stays flat
    however long the file. Raises `EdnError` (file:line:column) where the text stops being EDN."""
    source = "<stdin>" if path == "-" else path
    fh = sys.stdin if path == "-" else open(path, encoding="utf-8", errors="strict", newline="")
    try:
        for i, f in enumerate(FormStream(fh, source)):
            assert isinstance(f, Form)  # without recover=True the stream raises instead
            req, problems = request_from_edn(f.value, f)
            yield Entry(i, f.where, req, tuple(problems), f)
    except UnicodeDecodeError as e:
        raise EdnError(f"not UTF-8 text ({e.reason})", source, 1, 1) from None
    finally:
        if fh is not sys.stdin:
            fh.close()


def load_entries(path: str) -> list[Entry]:
    """Raises `EdnError` (with file:line:column) when the file is not readable EDN."""
    return list(iter_request_entries(path))


def emit(value: Any, out: TextIO | None = None, *, pretty_print: bool = False) -> None:
    out = out or sys.stdout
    out.write((pretty(value) if pretty_print else dumps(value)) + "\n")
    out.flush()


def edn_error_line(e: EdnError) -> str:
    return f"error: {e}"


def problem_record(entry: Entry, problems: list[Problem] | tuple[Problem, ...]) -> dict[Any, Any]:
    return {kw("vllm/error"): kw("validation"), kw("vllm/request-index"): entry.index,
            kw("vllm/where"): entry.where, kw("vllm/problems"): [p.to_edn() for p in problems]}
