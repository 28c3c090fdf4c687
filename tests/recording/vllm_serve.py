"""vLLM 0.33.0's own `vllm serve` path with only the engine core replaced (run in the vLLM venv).

    python tests/recording/vllm_serve.py --model DIR --port N [any `vllm serve` flag ...]

The arguments go through vLLM's own CLI parser and validation, then its own
`run_server` (FastAPI app, OpenAIServing*, AsyncLLM with its input/output processors and
detokenizer, Prometheus loggers). Only `EngineCoreClient.make_async_mp_client` is swapped for
the deterministic fake in vllm_fake_engine.py.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    import uvloop

    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.common.startup import cli_env_setup
    from vllm.entrypoints.launchers.api_server.entry import run_server
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    import vllm_fake_engine

    cli_env_setup()
    parser = make_arg_parser(FlexibleArgumentParser(description="vLLM API server, fake engine core"))
    args = parser.parse_args()
    configure_logging_from_args(args)
    validate_parsed_serve_args(args)
    vllm_fake_engine.install()
    uvloop.run(run_server(args))


if __name__ == "__main__":
    main()
