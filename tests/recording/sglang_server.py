"""Start SGLang 0.5.23's real serving layer on loopback with only the scheduler replaced.

    /work/venvs/sglang/bin/python tests/recording/sglang_server.py MODEL_DIR -- [SGLang server flags]

Writes a tiny local model directory first (no download is possible here): a llama `config.json`
and a byte-level BPE tokenizer built with `tokenizers`, with a chat template. Then parses the
flags with SGLang's own CLI parser and calls `launch_server(server_args,
run_scheduler_process_func=run_fake_scheduler)`. Run by `scripts/record-sglang`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CONTEXT_LEN = 512
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>"
                 # Qwen3's switch: chat_template_kwargs {"enable_thinking": false} pre-fills an empty think span
                 "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
                 "{% endif %}")
CORPUS = ["one two three four five six seven eight nine ten", " one one two one two three one two three four", "The capital of France is Paris.",
          "Say hello. Greet me. Hello, world! Once upon a time there was a quick brown fox.",
          "the quick brown fox jumps over the lazy dog", "hi"]


def write_model(out: Path) -> Path:
    """A tiny llama-architecture model directory: config and tokenizer only (the fake scheduler
    loads no weights)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out.mkdir(parents=True, exist_ok=True)
    made = out / "tokenizer_config.json"
    if (out / "tokenizer.json").exists() and (out / "config.json").exists() and made.exists() \
            and json.loads(made.read_text()).get("chat_template") == CHAT_TEMPLATE:
        return out
    specials = ["<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>", "<|tool|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.save(str(out / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": CONTEXT_LEN, "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE}, indent=1))
    (out / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                              "unk_token": "<unk>"}))
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 2, "max_position_embeddings": CONTEXT_LEN, "rms_norm_eps": 1e-5,
        "bos_token_id": tok.token_to_id("<s>"), "eos_token_id": tok.token_to_id("</s>"),
        "torch_dtype": "float32", "tie_word_embeddings": False}, indent=1))
    (out / "generation_config.json").write_text(json.dumps({
        "bos_token_id": tok.token_to_id("<s>"), "eos_token_id": tok.token_to_id("</s>")}))
    return out


def main(argv: list[str]) -> None:
    model = write_model(Path(argv[0]))
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import prepare_server_args

    from sglang_fake_scheduler import run_fake_scheduler
    server_args = prepare_server_args(["--model-path", str(model), "--context-length", str(CONTEXT_LEN), *flags])
    launch_server(server_args, run_scheduler_process_func=run_fake_scheduler)


if __name__ == "__main__":
    main(sys.argv[1:])
