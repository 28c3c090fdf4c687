"""Plan -> the engines' own launch commands, per node. Pure: argv vectors, never a shell.

Emitted flags are checked against each engine's parser (schemas/engine-flags/*.edn).
Pipeline plans pass their memory-weighted split through the engines' own knobs:
vLLM's `VLLM_PP_LAYER_PARTITION`, SGLang's `SGLANG_PP_LAYER_PARTITION` (both env vars
read in their 0.33.0 / 0.5.23 sources) and llama.cpp's `--tensor-split`.
"""

from __future__ import annotations

import json
import shlex
from typing import Callable, Mapping, Sequence

import attrs

from .._edn import Edn, Keyword, kw
from ._flags import CHECKED_ENGINES, engine_flags
from ._planner import NodePlan, Plan

RAY_PORT = 6379
SGLANG_DIST_PORT = 5000  # --dist-init-addr port when the head node names none
RPC_PORT = 50052  # ggml-rpc-server's own default
BINARIES = {"rpc-server": "ggml-rpc-server", "llama-server": "llama-server", "vllm": "vllm",
            "ray": "ray", "python": "python", "vllm-router": "vllm-router"}


@attrs.frozen
class Command:
    node: str
    role: str  # ray-head | ray-worker | server | rpc-server | sglang-node | dp-worker | prefill-server |
    #            decode-server | router
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    address: str = ""
    parser: str | None = None  # whose argument parser reads argv (its flags are checked); None: Ray, a router

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
    if plan.accelerators_per_node is not None:  # one entry per pipeline stage, not per node
        seen: dict[int, int] = {}
        for n in plan.nodes:
            seen.setdefault(n.stage, n.end_layer - n.first_layer)
        return ",".join(str(seen[k]) for k in sorted(seen))
    return ",".join(str(n.end_layer - n.first_layer) for n in plan.nodes)


# ---------------------------------------------------------------- speculative decoding, per engine

# vLLM's --speculative-config JSON `method` (vllm/config/speculative.py) and SGLang's
# --speculative-algorithm names (server_args.py) for each :speculative/method.
VLLM_SPEC_METHODS = {"ngram": "ngram", "draft": "draft_model", "eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp"}
SGLANG_SPEC_ALGORITHMS = {"ngram": "NGRAM", "draft": "STANDALONE", "eagle": "EAGLE", "eagle3": "EAGLE3",
                          "mtp": "NEXTN"}
DEFAULT_SPEC_TOKENS = 4


def _vllm_speculative(plan: Plan) -> list[str]:
    sp = plan.speculative
    if sp is None:
        return []
    cfg: dict[str, str | int] = {"method": VLLM_SPEC_METHODS[sp.method],
                           "num_speculative_tokens": sp.tokens or DEFAULT_SPEC_TOKENS}
    if sp.draft_model:
        cfg["model"] = sp.draft_model
    if sp.method == "ngram":
        cfg["prompt_lookup_max"] = sp.tokens or DEFAULT_SPEC_TOKENS
    return ["--speculative-config", json.dumps(cfg, separators=(",", ":"))]


def _sglang_speculative(plan: Plan) -> list[str]:
    sp = plan.speculative
    if sp is None:
        return []
    out = ["--speculative-algorithm", SGLANG_SPEC_ALGORITHMS[sp.method],
           "--speculative-num-draft-tokens", str(sp.tokens or DEFAULT_SPEC_TOKENS)]
    if sp.draft_model:
        out += ["--speculative-draft-model-path", sp.draft_model]
    return out


def _llamacpp_speculative(plan: Plan) -> list[str]:
    sp = plan.speculative
    if sp is None:
        return []
    out = ["--spec-type", LLAMACPP_SPEC_TYPES[sp.method]]
    if sp.draft_model:
        out += ["--spec-draft-model", sp.draft_model]
    return out + ["--spec-draft-n-max", str(sp.tokens or DEFAULT_SPEC_TOKENS)]


# llama-server --spec-type values (its own --help, schemas/engine-flags/llamacpp.edn) per :speculative/method;
# n-grams as the seed's own server ran them: lookup in the prompt and in its cache, no draft model.
LLAMACPP_NGRAM_SPEC = "ngram-cache,ngram-simple"
LLAMACPP_SPEC_TYPES = {"ngram": LLAMACPP_NGRAM_SPEC, "draft": "draft-simple", "eagle3": "draft-eagle3",
                       "mtp": "draft-mtp"}


# ---------------------------------------------------------------- context and KV memory, per engine


def _vllm_limits(plan: Plan) -> list[str]:
    out = []
    if plan.context_length is not None:
        out += ["--max-model-len", str(plan.context_length)]
    if plan.slots is not None:
        out += ["--max-num-seqs", str(plan.slots)]
    if plan.memory_fraction is not None:
        out += ["--gpu-memory-utilization", f"{plan.memory_fraction:g}"]
    if plan.kv_cache_bytes and plan.accelerators_per_node is not None:  # per accelerator, as vLLM counts it
        ranks = plan.tensor_parallel_size * plan.pipeline_parallel_size
        out += ["--kv-cache-memory-bytes", str(-(-plan.kv_cache_bytes // ranks))]
    return out


def _sglang_limits(plan: Plan) -> list[str]:
    out = []
    if plan.context_length is not None:
        out += ["--context-length", str(plan.context_length)]
    if plan.slots is not None:
        out += ["--max-running-requests", str(plan.slots)]
    if plan.memory_fraction is not None:
        out += ["--mem-fraction-static", f"{plan.memory_fraction:g}"]
    return out


def _llamacpp_limits(plan: Plan) -> list[str]:
    out = []
    slots = plan.slots or 1
    if plan.context_length is not None:  # -c is every slot's context together
        out += ["-c", str(plan.context_length * slots)]
    if plan.slots is not None:
        out += ["--parallel", str(plan.slots)]
    return out


# ---------------------------------------------------------------- vLLM

VLLM_DP_RPC_PORT = 13345  # --data-parallel-rpc-port when the head names none
VLLM_PD_CONNECTOR = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
ROUTER_PORT = 8000


def _vllm_core(plan: Plan, b: Mapping[str, str]) -> list[str]:
    argv = [b["vllm"], "serve", plan.model_ref, "--served-model-name", plan.model_id,
            "--tensor-parallel-size", str(plan.tensor_parallel_size),
            "--pipeline-parallel-size", str(plan.pipeline_parallel_size)]
    if plan.expert_parallel_size > 1 or plan.strategy == "expert":
        argv.append("--enable-expert-parallel")
    return argv + _vllm_limits(plan) + _vllm_speculative(plan)


def _vllm(plan: Plan, b: Mapping[str, str]) -> list[Command]:
    head = plan.nodes[0]
    env: tuple[tuple[str, str], ...] = ()
    if plan.pipeline_parallel_size > 1:
        env = (("VLLM_PP_LAYER_PARTITION", _partition(plan)),)
    if plan.disaggregated:
        return _vllm_pd(plan, b)
    core = _vllm_core(plan, b)
    g = plan.accelerators_per_node
    if g is not None and plan.replica_nodes == 1 and len(plan.nodes) > 1:
        return _vllm_dp_nodes(plan, b, core)
    dp = ["--data-parallel-size", str(plan.data_parallel_size)] if plan.data_parallel_size > 1 else []
    serve = core + dp + ["--host", head.address, "--port", str(plan.port)]
    if len(plan.nodes) == 1:
        return [Command(head.name, "server", tuple(serve), env, head.address, "vllm")]
    ray_port = str(head.port or RAY_PORT)
    cmds = [Command(head.name, "ray-head", (b["ray"], "start", "--head", "--node-ip-address", head.address,
                                            "--port", ray_port), (), head.address)]
    for n in plan.nodes[1:]:
        cmds.append(Command(n.name, "ray-worker", (b["ray"], "start", "--address", f"{head.address}:{ray_port}",
                                                   "--node-ip-address", n.address), (), n.address))
    serve += ["--distributed-executor-backend", "ray"]
    if plan.data_parallel_size > 1:
        serve += ["--data-parallel-backend", "ray"]
    cmds.append(Command(head.name, "server", tuple(serve), env, head.address, "vllm"))
    return cmds


def _vllm_dp_nodes(plan: Plan, b: Mapping[str, str], core: list[str]) -> list[Command]:
    """Replicas inside each node, data parallel across nodes: vLLM's own DP launch, the head serving
    HTTP and every other node `--headless` with its first rank."""
    head = plan.nodes[0]
    local = plan.data_parallel_size // len(plan.nodes)
    rpc = str(head.port or VLLM_DP_RPC_PORT)
    dp = ["--data-parallel-size", str(plan.data_parallel_size), "--data-parallel-size-local", str(local),
          "--data-parallel-address", head.address, "--data-parallel-rpc-port", rpc]
    cmds = []
    for i, n in enumerate(plan.nodes[1:], start=1):
        cmds.append(Command(n.name, "dp-worker", tuple(core + dp + ["--data-parallel-start-rank", str(i * local),
                                                                     "--headless"]), (), n.address, "vllm"))
    cmds.append(Command(head.name, "server", tuple(core + dp + ["--host", head.address, "--port", str(plan.port)]),
                        (), head.address, "vllm"))
    return cmds


def _serve_port(plan: Plan, n: NodePlan) -> int:
    return int(n.serve_port or plan.port + 1 + n.rank)


def _vllm_pd(plan: Plan, b: Mapping[str, str]) -> list[Command]:
    """Prefill and decode instances joined by NIXL KV transfer, and vLLM's router in front."""
    core = _vllm_core(plan, b) + ["--kv-transfer-config", json.dumps(VLLM_PD_CONNECTOR, separators=(",", ":"))]
    cmds = [Command(n.name, f"{n.role}-server", tuple(core + ["--host", n.address, "--port",
                                                              str(_serve_port(plan, n))]), (), n.address, "vllm")
            for n in plan.nodes]
    return cmds + [_router(plan, b, "vllm-router")]


# ---------------------------------------------------------------- SGLang


def _sglang_core(plan: Plan, b: Mapping[str, str]) -> list[str]:
    argv = [b["python"], "-m", "sglang.launch_server", "--model-path", plan.model_ref,
            "--served-model-name", plan.model_id,
            "--tp-size", str(plan.tensor_parallel_size), "--pp-size", str(plan.pipeline_parallel_size)]
    if plan.expert_parallel_size > 1:
        argv += ["--ep-size", str(plan.expert_parallel_size)]
    elif plan.strategy == "expert":
        argv += ["--ep-size", str(plan.tensor_parallel_size)]
    return argv + _sglang_limits(plan) + _sglang_speculative(plan)


def _sglang(plan: Plan, b: Mapping[str, str]) -> list[Command]:
    head = plan.nodes[0]
    env: tuple[tuple[str, str], ...] = ()
    if plan.pipeline_parallel_size > 1:
        env = (("SGLANG_PP_LAYER_PARTITION", _partition(plan)),)
    core = _sglang_core(plan, b)
    if plan.disaggregated:
        cmds = [Command(n.name, f"{n.role}-server", tuple(core + ["--disaggregation-mode", str(n.role), "--host",
                                                                  n.address, "--port", str(_serve_port(plan, n))]),
                        env, n.address, "sglang") for n in plan.nodes]
        return cmds + [_router(plan, b, "sglang-router")]
    per_node_dp = plan.data_parallel_size // len(plan.nodes) if len(plan.nodes) > 1 else plan.data_parallel_size
    if plan.accelerators_per_node is not None and plan.replica_nodes == 1 and len(plan.nodes) > 1:
        # Replicas inside each node: an independent server per node, the router spreading requests over them.
        dp = ["--dp-size", str(per_node_dp)] if per_node_dp > 1 else []
        cmds = [Command(n.name, "server", tuple(core + dp + ["--host", n.address, "--port",
                                                              str(_serve_port(plan, n))]), env, n.address,
                        "sglang") for n in plan.nodes]
        return cmds + [_router(plan, b, "sglang-router")]
    dp = ["--dp-size", str(plan.data_parallel_size)] if plan.data_parallel_size > 1 else []
    cmds = []
    for n in plan.nodes:
        argv = core + dp
        if len(plan.nodes) > 1:
            argv += ["--nnodes", str(len(plan.nodes)), "--node-rank", str(n.rank),
                     "--dist-init-addr", f"{head.address}:{head.port or SGLANG_DIST_PORT}"]
        argv += ["--host", n.address, "--port", str(plan.port)]
        cmds.append(Command(n.name, "sglang-node" if len(plan.nodes) > 1 else "server", tuple(argv), env, n.address,
                            "sglang"))
    return cmds


def _router(plan: Plan, b: Mapping[str, str], kind: str) -> Command:
    """The router joining per-node servers: sglang-router (`python -m sglang_router.launch_router`) or
    vllm-router, PD-aware when the layout is disaggregated. Its flags are the router's, not the engine's."""
    head = plan.nodes[0]
    urls = {n.name: f"http://{n.address}:{_serve_port(plan, n)}" for n in plan.nodes}
    argv = [b["python"], "-m", "sglang_router.launch_router"] if kind == "sglang-router" else [b["vllm-router"]]
    if plan.disaggregated:
        argv.append("--pd-disaggregation")
        for n in plan.nodes:
            argv += [f"--{n.role}", urls[n.name]]
    else:
        argv += ["--worker-urls", *urls.values()]
    argv += ["--host", head.address, "--port", str(plan.port)]
    return Command(head.name, "router", tuple(argv), (), head.address)


# ---------------------------------------------------------------- llama.cpp


def _llamacpp(plan: Plan, b: Mapping[str, str]) -> list[Command]:
    head = plan.nodes[0]
    server = [b["llama-server"], "-m", plan.model_ref, "--alias", plan.model_id,
              "--host", head.address, "--port", str(plan.port)] + _llamacpp_limits(plan) + _llamacpp_speculative(plan)
    if len(plan.nodes) == 1:
        return [Command(head.name, "server", tuple(server + ["-ngl", "999"]), (), head.address, "llamacpp")]
    # Every rank, the head included, serves its memory through an rpc-server, so the
    # --tensor-split entries map one-to-one onto the --rpc devices on a CPU-only head.
    cmds, endpoints = [], []
    for n in plan.nodes:
        port = str(n.port or RPC_PORT)
        cmds.append(Command(n.name, "rpc-server", (b["rpc-server"], "-H", n.address, "-p", port), (), n.address))
        endpoints.append(f"{n.address}:{port}")
    server += ["--rpc", ",".join(endpoints), "-ngl", "999", "--split-mode", "layer",
               "--tensor-split", _partition(plan)]
    cmds.append(Command(head.name, "server", tuple(server), (), head.address, "llamacpp"))
    return cmds


EMITTERS: dict[str, Callable[[Plan, Mapping[str, str]], list[Command]]] = {
    "vllm": _vllm, "sglang": _sglang, "llamacpp": _llamacpp}


def emit(plan: Plan, binaries: Mapping[str, str] | None = None) -> list[Command]:
    """Launch commands in start order: workers before the head's server."""
    return EMITTERS[plan.engine](plan, {**BINARIES, **(binaries or {})})


def unknown_flags(c: Command) -> tuple[str | None, list[str]]:
    """(the parser and version its flags were checked against, the flags that parser does not define);
    (None, []) for a command no committed table covers (Ray, a router)."""
    if c.parser not in CHECKED_ENGINES:
        return None, []
    table = engine_flags(c.parser)
    return table.label, table.unknown(flags_of(c.argv, short=c.parser == "llamacpp"))


def commands_to_edn(cmds: Sequence[Command]) -> list[dict[Keyword, Edn]]:
    """Each command, with the engine version its flags were checked against (and any it does not define)."""
    out = []
    for c in cmds:
        m = c.to_edn()
        label, unknown = unknown_flags(c)
        if label is not None:
            m[kw("cmd/flags-checked-against")] = label
            if unknown:
                m[kw("cmd/unknown-flags")] = unknown
        out.append(m)
    return out


def shell_lines(cmds: Sequence[Command]) -> str:
    out = []
    for c in cmds:
        out.append(f"# node {c.node} ({c.role})")
        out.append(c.shell())
    return "\n".join(out) + "\n"


def flags_of(argv: Sequence[str], short: bool = False) -> list[str]:
    """The long options an argv uses (`--x` and `--x=v` both give `--x`); with `short`, also the
    single-dash ones (llama.cpp's `-m`, `-ngl`), never a negative number."""
    return [a.split("=", 1)[0] for a in argv
            if a.startswith("--") or (short and a.startswith("-") and len(a) > 1 and not a[1].isdigit())]
