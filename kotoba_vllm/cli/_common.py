"""Shared CLI pieces: reading request files into located, typed requests; EDN output."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Iterator, TextIO

import attrs
import httpx

from .._base_client import API_KEY_ENV, USER_AGENT
from .._edn import Edn, EdnError, Form, Keyword, dumps, kw, pretty
from .._errors import register_secret
from .._model import BACKENDS
from .._wire import SyncWire, default_sync_wire
from .._wire_core import PROBE_MAX_BYTES
from ..pool import PoolConfig, load_pool_config
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


def emit(value: object, out: TextIO | None = None, *, pretty_print: bool = False) -> None:
    out = out or sys.stdout
    out.write((pretty(value) if pretty_print else dumps(value)) + "\n")
    out.flush()


def edn_error_line(e: EdnError) -> str:
    return f"error: {e}"


def problem_record(entry: Entry, problems: list[Problem] | tuple[Problem, ...]) -> dict[Keyword, Edn]:
    return {kw("vllm/error"): kw("validation"), kw("vllm/request-index"): entry.index,
            kw("vllm/where"): entry.where, kw("vllm/problems"): [p.to_edn() for p in problems]}


def probe_headers(api_key: str | None) -> dict[str, str]:
    """Headers for probes of many servers: the key (flag, else $KOTOBA_VLLM_API_KEY) as a bearer
    token, registered so that no reason or error ever echoes it."""
    headers = {"user-agent": USER_AGENT, "accept": "application/json, text/plain"}
    key = api_key or os.environ.get(API_KEY_ENV)
    if key:
        headers["authorization"] = f"Bearer {key}"
        register_secret(key)
    return headers


def add_endpoint_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """URL..., --pool, --backend, --api-key: the servers a probing command asks (`capacity`, `inspect`)."""
    p.add_argument("urls", nargs="*", metavar="URL", help=f"server base URLs ({what})")
    p.add_argument("--pool", metavar="FILE.edn", help="a pool file: {:pool/members [...] :pool/backend :llamacpp}; "
                                                      "its members come first")
    p.add_argument("--backend", "-b", choices=["auto", *BACKENDS], default=None,
                   help="engine of every server (default: the pool file's, else detect per server)")
    p.add_argument("--api-key", help="bearer token for the probes (also $KOTOBA_VLLM_API_KEY); never printed")


@attrs.frozen
class Endpoints:
    urls: list[str]
    backend: str | None
    pool: PoolConfig | None


def endpoints_from(args: argparse.Namespace) -> Endpoints | None:
    """The URLs to ask (a pool file's members first) and their backend; None (the reason printed) when
    the pool file cannot be read or nothing was given."""
    urls, backend, cfg = list(args.urls), args.backend, None
    if args.pool:
        try:
            cfg = load_pool_config(args.pool)
        except (EdnError, ValueError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return None
        urls = list(cfg.members) + urls
        backend = backend or cfg.backend
    if not urls:
        print("error: give at least one URL or --pool FILE.edn", file=sys.stderr)
        return None
    return Endpoints(urls, backend, cfg)


def bounded_probe_wire(headers: dict[str, str]) -> SyncWire:
    """http.client with each probe's deadline over every read and a probe-sized body limit: a trickling or
    flooding server cannot hold a probing command (`inspect`, `plan --check`)."""
    return default_sync_wire(headers, True, httpx.Limits(), PROBE_MAX_BYTES)
