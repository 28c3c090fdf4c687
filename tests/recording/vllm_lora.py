"""A tiny PEFT LoRA adapter for the recording models' llama (vllm_model.py's; sglang_server.py's too).

    python tests/recording/vllm_lora.py OUT_DIR MODEL_DIR [RANK]

Rank 8 (or RANK) on every layer's q_proj and v_proj, random (seeded) weights, in PEFT's file layout
(adapter_config.json, adapter_model.safetensors with `base_model.model.…lora_A/B.weight` keys), shaped
from MODEL_DIR/config.json. vLLM loads it with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1; SGLang's
LoRAManager reads it in the SGLang recording (scripts/record-sglang --only lora).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RANK = 8
MODULES = ("q_proj", "v_proj")


def write(out: Path, model_dir: Path, rank: int = RANK) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    cfg = json.loads((model_dir / "config.json").read_text())
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    heads, kv_heads, head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg.get(
        "head_dim", hidden // cfg["num_attention_heads"])
    outs = {"q_proj": heads * head_dim, "v_proj": kv_heads * head_dim}
    rng = np.random.default_rng(0)
    tensors = {}
    for i in range(layers):
        for m in MODULES:
            key = f"base_model.model.model.layers.{i}.self_attn.{m}"
            tensors[key + ".lora_A.weight"] = (rng.standard_normal((rank, hidden)) * 0.01).astype(np.float32)
            tensors[key + ".lora_B.weight"] = (rng.standard_normal((outs[m], rank)) * 0.01).astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(MODULES), "bias": "none",
        "lora_dropout": 0.0, "fan_in_fan_out": False, "base_model_name_or_path": "tiny", "task_type": "CAUSAL_LM"}))
    return out


if __name__ == "__main__":
    print(write(Path(sys.argv[1]), Path(sys.argv[2]), *(int(a) for a in sys.argv[3:4])))
