"""Build a tiny Qwen2-style model and tokenizer locally and deterministically (no model hub).

The tokenizer is byte-level BPE with no merges: every byte is one token (256) plus three special tokens,
so any text round-trips and vLLM's incremental detokenizer is happy. The model is a random-init
Qwen2ForCausalLM (seeded), saved as safetensors in float32.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _byte_char(b: int) -> str:
    """The printable character byte-level BPE uses for byte `b` (the GPT-2 convention tokenizers' ByteLevel
    pre-tokenizer emits): printable Latin-1 bytes map to themselves, the rest to 256 + their rank."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)]
    if b in printable:
        return chr(b)
    return chr(256 + sorted(set(range(256)) - set(printable)).index(b))


def build_tokenizer(out_dir: str | Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = [_byte_char(b) for b in range(256)]
    vocab = {ch: i for i, ch in enumerate(byte_chars)}
    for tok in SPECIAL_TOKENS:
        vocab[tok] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        model_max_length=512,
    )
    hf.chat_template = CHATML
    hf.save_pretrained(str(out_dir))
    return hf


# Shapes by name. "100m": a 104M-parameter random Qwen2 (12 layers, hidden 768, GQA 12/4 heads) for
# benchmarks that must show how a sync scales with model size.
MODEL_SIZES = {
    "tiny": {},
    "100m": {"hidden_size": 768, "num_layers": 12, "num_heads": 12, "num_kv_heads": 4, "intermediate_size": 3072},
}


def build_model(
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    tie_word_embeddings: bool = True,
    embed_std: float = 0.1,
    seed: int = 0,
) -> Path:
    """Write tokenizer + random-init Qwen2 model to `out_dir`; returns the path."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=512,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    # A wider embedding init than HF's 0.02: with the tied lm_head and final norm frozen under LoRA, the
    # reachable logit range scales with the embedding norm, and 0.02 caps what a small task can learn.
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, embed_std)
        if not tie_word_embeddings:
            model.lm_head.weight.normal_(0.0, embed_std)
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).save_pretrained(str(out))
    return out


def build_digit_task(out_file: str | Path, n: int = 512, seed: int = 0) -> Path:
    """The demo task: short random letter prompts; the reward (rewards.toy.digit_reward) pays for digits."""
    import random

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for _ in range(n):
            word = "".join(rng.choice(letters) for _ in range(rng.randint(3, 8)))
            f.write(json.dumps({"prompt": f"{word} = "}) + "\n")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="demo", help="output directory (model in <out>/tiny-qwen2, data in <out>/data)")
    ap.add_argument("--untied", action="store_true", help="untied lm_head (default: tied)")
    ap.add_argument("--size", choices=sorted(MODEL_SIZES), default="tiny", help="model shape (default: tiny)")
    args = ap.parse_args(argv)
    name = "tiny-qwen2" if args.size == "tiny" else f"qwen2-{args.size}"
    model_dir = build_model(Path(args.out) / name, tie_word_embeddings=not args.untied, **MODEL_SIZES[args.size])
    data = build_digit_task(Path(args.out) / "data" / "digits.jsonl")
    print(f"tiny model: {model_dir}\ntask data:  {data}")


if __name__ == "__main__":
    main()
