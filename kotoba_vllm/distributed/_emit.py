"""Plan -> the engines' own launch commands, per node. Pure: argv vectors, never a shell.

Emitted flags are checked against each engine's parser (schemas/engine-flags/*.edn).
Pipeline plans pass their memory-weighted split through the engines' own knobs:
vLLM's `VLLM_PP_LAYER_PARTITION`, SGLang's `SGLANG_PP_LAYER_PARTITION` (both env vars
read in their 0.33.0 / 0.5.23 sources) and llama.cpp's `--tensor-split`.
"""

from __future__ import annotations

import shlex
from typing import Any, Callable, Mapping, Sequence

import attrs

from .._edn import Edn, Keyword, kw
from ._planner import Plan

RAY_PORT = 6379
SGLANG_DIST_PORT = 5000  # --dist-init-addr port when the head node names none
RPC_PORT = 50052  # ggml-rpc-server's own default
BINARIES = {"rpc-server": "ggml-rpc-server", "llama-server": "llama-server", "vllm": "vllm",
            "ray": "ray", "python": "python"}


@attrs.frozen
class Command:
    node: str
    role: str  # ray-head | ray-worker | server | rpc-server | sglang-node
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    address: str = ""

    def to_edn(self) -> dict[Keyword, Edn]:
        out: dict[Keyword, Edn] = {kw("cmd/node"): self.node, kw("cmd/role"): kw(self.role),
                                   kw("cmd/argv"): list(self.argv)}
        if self.env:
            out[kw("cmd/env")] = {k: v for k, v in self.env}
        return out

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env)
        return (env + " " if env else "") + shlex.join(self.argv)


def _partition(plan: Plan) -> str:
    return ",".join(str(n.end_layer - n.first_layer) for n in plan.nodes)


def _vllm(plan: Plan, b: Mapping[str, str]) -> list[Command]:
    head = plan.nodes[0]
    serve = [b["vllm"], "serve", plan.model_ref, "--served-model-name", plan.model_id,
             "--tensor-parallel-size", str(plan.tensor_parallel_size),
             "--pipeline-parallel-size", str(plan.pipeline_parallel_size),
             "--host", head.address, "--port", str(plan.port)]
    if plan.strategy == "expert":
        serve.append("--enable-expert-parallel")
    env: tuple[tuple[str, str], ...] = ()
    if plan.pipeline_parallel_size > 1:
        env = (("VLLM_PP_LAYER_PARTITION", _partition(plan)),)
    if len(plan.nodes) == 1:
        return [Command(head.name, "server", tuple(serve), env, head.address)]
    ray_port = str(head.port or RAY_PORT)
    cmds = [Command(head.name, "ray-head", (b["ray"], "start", "--head", "--node-ip-address", head.address,
                                            "--port", ray_port), (), head.address)]
    for n in plan.nodes[1:]:
        cmds.append(Command(n.name, "ray-worker", (b["ray"], "start", "--address", f"{head.address}:{ray_port}",
                                                   "--node-ip-address", n.address), (), n.address))
    serve += ["--distributed-executor-backend", "ray"]
    cmds.append(Command(head.name, "server", tuple(serve), env, head.address))
    return cmds


def _sglang(plan: Plan, b: Mapping[str, str]) -> list[Command]:
    head = plan.nodes[0]
    cmds = []
    env: tuple[tuple[str, str], ...] = ()
    if plan.pipeline_parallel_size > 1:
        env = (("SGLANG_PP_LAYER_PARTITION", _partition(plan)),)
    for n in plan.nodes:
        argv = [b["python"], "-m", "sglang.launch_server", "--model-path", plan.model_ref,
                "--served-model-name", plan.model_id,
                "--tp-size", str(plan.tensor_parallel_size), "--pp-size", str(plan.pipeline_parallel_size)]
        if plan.strategy == "expert":
            argv += ["--ep-size", str(plan.tensor_parallel_size)]
        if len(plan.nodes) > 1:
            argv += ["--nnodes", str(len(plan.nodes)), "--node-rank", str(n.rank),
                     "--dist-init-addr", f"{head.address}:{head.port or SGLANG_DIST_PORT}"]
        argv += ["--host", n.address, "--port", str(plan.port)]
        cmds.append(Command(n.name, "sglang-node" if len(plan.nodes) > 1 else "server", tuple(argv), env, n.address))
    return cmds


def _llamacpp(plan: Plan, b: Mapping[str, str]) -> list[Command]:
    head = plan.nodes[0]
    server = [b["llama-server"], "-m", plan.model_ref, "--alias", plan.model_id,
              "--host", head.address, "--port", str(plan.port)]
    if len(plan.nodes) == 1:
        return [Command(head.name, "server", tuple(server + ["-ngl", "999"]), (), head.address)]
    # Every rank, the head included, serves its memory through an rpc-server, so the
    # --tensor-split entries map one-to-one onto the --rpc devices on a CPU-only head.
    cmds, endpoints = [], []
    for n in plan.nodes:
        port = str(n.port or RPC_PORT)
        cmds.append(Command(n.name, "rpc-server", (b["rpc-server"], "-H", n.address, "-p", port), (), n.address))
        endpoints.append(f"{n.address}:{port}")
    server += ["--rpc", ",".join(endpoints), "-ngl", "999", "--split-mode", "layer",
               "--tensor-split", _partition(plan)]
    cmds.append(Command(head.name, "server", tuple(server), (), head.address))
    return cmds


EMITTERS: dict[str, Callable[[Plan, Mapping[str, str]], list[Command]]] = {
    "vllm": _vllm, "sglang": _sglang, "llamacpp": _llamacpp}


def emit(plan: Plan, binaries: Mapping[str, str] | None = None) -> list[Command]:
    """Launch commands in start order: workers before the head's server."""
    return EMITTERS[plan.engine](plan, {**BINARIES, **(binaries or {})})


def commands_to_edn(cmds: Sequence[Command]) -> list[dict[Keyword, Edn]]:
    return [c.to_edn() for c in cmds]


def shell_lines(cmds: Sequence[Command]) -> str:
    out = []
    for c in cmds:
        out.append(f"# node {c.node} ({c.role})")
        out.append(c.shell())
    return "\n".join(out) + "\n"


def flags_of(argv: Sequence[str]) -> list[str]:
    """The long options an argv uses (`--x` and `--x=v` both give `--x`)."""
    return [a.split("=", 1)[0] for a in argv if a.startswith("--")]
