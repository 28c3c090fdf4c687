"""What the `lora` and `cache` commands share: one control call on one server, its answer as EDN."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from .._base_client import API_KEY_ENV, BASE_URL_ENV
from .._client import Client
from .._errors import KotobaError, ValidationError
from .._model import Request, to_edn
from ..dialects import DIALECTS
from ._common import emit


def add_server_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default=None, help=f"the server (default ${BASE_URL_ENV})")
    p.add_argument("--backend", "-b", choices=["auto", *sorted(DIALECTS)], default="auto",
                   help="engine dialect (default: detect from the server's own endpoints)")
    p.add_argument("--api-key", help=f"bearer token (also ${API_KEY_ENV}); never printed")
    p.add_argument("--timeout", type=float, default=None, help="seconds for each phase of the call")
    p.add_argument("--pretty", action="store_true", help="pretty-print EDN")


def send_control(args: argparse.Namespace, req: Request) -> int:
    """Exit 0 with the typed answer, 1 with a typed error from the server, 2 when nothing was sent."""
    with Client(args.base_url, backend=args.backend, api_key=args.api_key, timeout=args.timeout) as client:
        try:
            resp = client.send(req)
        except ValidationError as e:
            emit(e.to_edn(), pretty_print=args.pretty)
            print(f"error: {e}", file=sys.stderr)
            return 2
        except KotobaError as e:
            emit(e.to_edn(), pretty_print=args.pretty)
            print(f"error: {e}", file=sys.stderr)
            return 1
    emit(to_edn(resp), pretty_print=args.pretty)
    return 0 if getattr(resp, "ok", True) else 1


def run_control(args: argparse.Namespace, build: Callable[[argparse.Namespace], Request | str]) -> int:
    """`build` makes the request from the arguments, or says what is missing (exit 2, nothing sent)."""
    req = build(args)
    if isinstance(req, str):
        print(f"error: {req}", file=sys.stderr)
        return 2
    return send_control(args, req)
