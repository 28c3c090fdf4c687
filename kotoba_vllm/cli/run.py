"""`run FILE|-`: send each request, print one EDN result per request (response or typed error)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any, Iterator, TextIO

from .._base_client import API_KEY_ENV, BASE_URL_ENV
from .._client import Client
from .._edn import EdnError, kw
from .._errors import KotobaError
from .._model import to_edn
from .._requests import request_to_edn
from ..dialects import DIALECTS
from ._common import Entry, emit, load_entries, problem_record

HELP = "Send every request in an EDN file and print one EDN result per request (exit 1 if any failed)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="EDN request file: request maps or one vector of them ('-' for stdin)")
    p.add_argument("--base-url", help=f"server URL (else the request's :vllm/base-url, else ${BASE_URL_ENV}, "
                                      "else a local llama-server is started)")
    p.add_argument("--backend", "-b", choices=["auto", *sorted(DIALECTS)], default="auto",
                   help="engine dialect (default: detect from the server's own endpoints)")
    p.add_argument("--api-key", help=f"bearer token (also ${API_KEY_ENV}); never printed")
    p.add_argument("--stream", action="store_true", help="stream every request; print each delta as it arrives")
    p.add_argument("--output", "-o", help="write results to this file instead of stdout")
    p.add_argument("--local", action="store_true", help="start a local llama-server (tiny model) for this run")
    p.add_argument("--model", help="GGUF for --local (default: the tiny random test model)")
    p.add_argument("--timeout", type=float, default=None, help="per-request timeout in seconds")
    p.add_argument("--pretty", action="store_true", help="pretty-print EDN")


@contextlib.contextmanager
def _server(args: argparse.Namespace, entries: list[Entry]) -> Iterator[str | None]:
    configured = args.base_url or os.environ.get(BASE_URL_ENV)
    every_request_has_url = bool(entries) and all(e.request is not None and e.request.base_url for e in entries)
    if configured and not args.local:
        yield configured
        return
    if every_request_has_url and not args.local:
        yield None
        return
    from ..local import LlamaServer, LocalServerError

    try:
        server = LlamaServer(args.model, n_ctx=2048).start()
    except LocalServerError as e:
        print(f"error: could not start a local llama-server: {e}", file=sys.stderr)
        raise SystemExit(3) from None
    print(f";; local llama-server at {server.base_url}", file=sys.stderr)
    try:
        yield server.base_url
    finally:
        server.stop()


def run(args: argparse.Namespace) -> int:
    try:
        entries = load_entries(args.file)
    except (EdnError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out: TextIO = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    failed = 0
    try:
        with _server(args, entries) as base_url:
            backend = "llamacpp" if args.local and args.backend == "auto" else args.backend
            with Client(base_url, backend=backend, api_key=args.api_key, timeout=args.timeout) as client:
                for entry in entries:
                    record = _one(client, entry, args, out)
                    if kw("vllm/error") in record:
                        failed += 1
                    emit(record, out, pretty_print=args.pretty)
    finally:
        if out is not sys.stdout:
            out.close()
    return 1 if failed else 0


def _one(client: Client, entry: Entry, args: argparse.Namespace, out: TextIO) -> dict[Any, Any]:
    if entry.request is None or any(p.is_error for p in entry.problems):
        return problem_record(entry, [p for p in entry.problems if p.is_error])
    req = entry.request
    request_id = req.request_id if req.request_id is not None else entry.index
    try:
        if args.stream or req.stream:
            stream = client.stream(req, timeout=args.timeout)
            with stream:
                for delta in stream:
                    emit(to_edn(delta), out)
            result: dict[Any, Any] = to_edn(stream.response)
        else:
            result = to_edn(client.send(req, timeout=args.timeout))
    except KotobaError as e:
        result = e.to_edn()
        result[kw("vllm/request")] = request_to_edn(req)
    result[kw("vllm/request-id")] = request_id
    return result
