"""Write the DERIVED SGLang cassettes of the LoRA endpoints.

`/flush_cache` and `/v1/rerank` are recorded from SGLang 0.5.23's serving layer (scripts/record-sglang
--only control / --only rerank) and never replaced here. LoRA stays derived: it needs SGLang's adapter
manager, which the fake scheduler does not have, so these answers are written by hand from SGLang's own code, read
with the code index, not copied: `serving_rerank.py` (a bare list of {score, document, index, meta_info},
sorted best first), `protocol.py` (V1RerankReqInput, RerankResponse), `http_server.py` (`/flush_cache`
answers text, 200 or 400; `/load_lora_adapter` and `/unload_lora_adapter` answer
LoadLoRAAdapterReqOutput {success, error_message, loaded_adapters}, 400 when not successful; `/v1/models`
lists each loaded adapter with its path as `root` and the base model as `parent`). The request side is what
the SDK renders, as the recorder does; expectations are read from these bytes by the recorder's own reader.

    .venv/bin/python tests/cassettes/derive_endpoints.py      # rewrites tests/cassettes/sglang-endpoints
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent))

from derive import JSON_CT, SGL_MODEL, j, make  # noqa: E402
from kotoba_vllm._edn import kw  # noqa: E402
from kotoba_vllm.cassettes import Cassette, read_cassette, write_cassette  # noqa: E402
from kotoba_vllm.cassettes._recorder import Exchange, edn_request  # noqa: E402

DATE = "2026-12-01"
NOTE = ("derived: recording tried — with the SGLang 0.5.23 environment built (scripts/record-sglang), "
        "/flush_cache and a cross-encoder /v1/rerank are recorded from SGLang's serving layer (--only control, "
        "--only rerank); LoRA needs SGLang's adapter manager (--enable-lora, LoRAManager loading real adapter "
        "weights in the scheduler), which the fake scheduler does not have.")
PROV = {
    kw("cassette/how"): kw("derived"),
    kw("cassette/engine-version"): "sglang main (serving_rerank.py @15bb7d4e, protocol.py, http_server.py)",
    kw("cassette/date"): DATE,
    kw("cassette/source"): (
        "sgl-project/sglang read with the code index: python/sglang/srt/entrypoints/openai/serving_rerank.py "
        "@15bb7d4e (_build_rerank_response: RerankResponse(score, document, index, meta_info) sorted by score, "
        "descending), protocol.py (V1RerankReqInput{query, documents}), http_server.py (/flush_cache text "
        "answer, 200 or 400; /load_lora_adapter, /unload_lora_adapter: LoadLoRAAdapterReqOutput{success, "
        "error_message, loaded_adapters}, HTTP 400 when success is false), tokenizer_manager meta_info (id, "
        "finish_reason, prompt_tokens, weight_version)"),
    kw("cassette/note"): NOTE,
}


def meta(i: int, prompt_tokens: int) -> dict[str, object]:
    return {"id": f"rerank-{i:08x}", "finish_reason": {"type": "length", "length": 0},
            "prompt_tokens": prompt_tokens, "weight_version": "default"}


def sglang_endpoints() -> list[Cassette]:
    E, P, M = "sglang", PROV, SGL_MODEL
    docs = ["the cat sat on the mat", "EDN is a data format", "hello world"]
    rerank = Exchange("rerank", "send", edn_request("rerank", query="what is EDN", documents=docs, model=M))
    ranked = [{"score": 0.9313, "document": docs[1], "index": 1, "meta_info": meta(1, 14)},
              {"score": 0.0732, "document": docs[2], "index": 2, "meta_info": meta(2, 10)},
              {"score": 0.0108, "document": docs[0], "index": 0, "meta_info": meta(0, 13)}]
    adapter = {kw("vllm/lora-name"): "sql", kw("vllm/lora-path"): "/adapters/sql-lora"}
    return [
        make(E, E, P, rerank, 200, JSON_CT, j(ranked)),
        make(E, E, P, Exchange("lora-load", "send", {kw("vllm/endpoint"): kw("lora-load"), **adapter}), 200,
             JSON_CT, j({"success": True, "error_message": None, "loaded_adapters": {"sql": "/adapters/sql-lora"}})),
        make(E, E, P, Exchange("lora-load-fails", "send",
                               {kw("vllm/endpoint"): kw("lora-load"), kw("vllm/lora-name"): "bad",
                                kw("vllm/lora-path"): "/adapters/missing"}), 400, JSON_CT,
             j({"success": False, "error_message": "Failed to load LoRA adapter bad from /adapters/missing",
                "loaded_adapters": {"sql": "/adapters/sql-lora"}})),
        make(E, E, P, Exchange("lora-list", "send", edn_request("lora-list")), 200, JSON_CT,
             j({"object": "list", "data": [
                 {"id": M, "object": "model", "created": 1796000000, "owned_by": "sglang", "root": M,
                  "parent": None, "max_model_len": 131072},
                 {"id": "sql", "object": "model", "created": 1796000000, "owned_by": "sglang",
                  "root": "/adapters/sql-lora", "parent": M, "max_model_len": 131072}]})),
        make(E, E, P, Exchange("lora-unload", "send", edn_request("lora-unload", lora_name="sql")), 200, JSON_CT,
             j({"success": True, "error_message": None, "loaded_adapters": {}})),
        # flush-cache and flush-cache-busy are recorded from SGLang's serving layer (scripts/record-sglang --only control)
    ]


def main() -> None:
    d = HERE / "sglang-endpoints"
    recorded = set()
    for old in d.glob("*.edn") if d.is_dir() else ():
        if read_cassette(old).how == "derived":
            old.unlink()
        else:  # scripts/record-sglang's: never replaced by a derived one
            recorded.add(old.stem)
    cassettes = [c for c in sglang_endpoints() if c.name not in recorded]
    for c in cassettes:
        write_cassette(c, d)
    print(f"{len(cassettes)} derived cassettes written to {d}", file=sys.stderr)



if __name__ == "__main__":
    main()
