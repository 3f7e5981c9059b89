"""Build a tiny model and tokenizer locally and deterministically (no model hub).

The tokenizer is byte-level BPE with no merges: every byte is one token (256) plus three special tokens,
so any text round-trips and vLLM's incremental detokenizer is happy (259 tokens: a vocabulary vLLM pads). The
model is a random-init decoder of one of the families users train (seeded), saved as safetensors in float32,
with the features where weight syncing breaks silently switched on (`FAMILIES`):

- `qwen2` (default): tied embeddings, biases on q/k/v;
- `qwen3`: per-head `q_norm` / `k_norm`, no q/k/v bias, tied embeddings, GQA;
- `llama`: untied LM head, llama3 `rope_scaling`, no biases, GQA;
- `mistral`: untied LM head, a sliding window (128) shorter than the sync probe, GQA.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

# ChatML, with tools: a conversation without tools renders as plain ChatML; `tools` adds one short system line
# naming them, an assistant's tool calls render as `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`
# (Qwen's format) and a tool result as a `tool` turn. Every message renders the same whatever follows it (the
# tool-calling loop appends tool results to the tokens the model sampled).
CHATML = (
    "{% if tools %}{{ '<|im_start|>system\ntools:' }}{% for tool in tools %}"
    "{{ ' ' + (tool.function.name if tool.function is defined else tool.name) }}{% endfor %}"
    "{{ '<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% endif %}"
    "{% for call in message.get('tool_calls') or [] %}{% set f = call.function if call.function is defined "
    "else call %}{{ '<tool_call>\n' + {'name': f.name, 'arguments': f.arguments} | tojson + '\n</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# How transformers' parse_response reads a turn in that format: text, and `<tool_call>` JSON blocks as tool calls
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {"open": "<tool_call>", "close_pattern": "</tool_call>\\s*", "repeats": True,
                       "content": "json", "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": "<\\|im_end\\|>\\s*", "content": "text"},
    },
}
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
    # here, and torch below: `python -m grpo_plugin.demo --help` and the data builder stay light
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
    hf.response_template = RESPONSE_TEMPLATE  # transformers >= 5.13 (both stacks); saved with the tokenizer
    hf.save_pretrained(str(out_dir))
    return hf


# Shapes by name. "100m": a 104M-parameter random Qwen2 (12 layers, hidden 768, GQA 12/4 heads) for
# benchmarks that must show how a sync scales with model size.
MODEL_SIZES = {
    "tiny": {},
    "100m": {"hidden_size": 768, "num_layers": 12, "num_heads": 12, "num_kv_heads": 4, "intermediate_size": 3072},
    # Qwen2.5-0.5B's layers (the byte tokenizer's small vocabulary: ~0.36B parameters, 1.4 GB in fp32)
    "0.5b": {"hidden_size": 896, "num_layers": 24, "num_heads": 14, "num_kv_heads": 2, "intermediate_size": 4864},
}


# family -> (transformers config class, what makes it that family, tied embeddings by default)
FAMILIES: dict[str, tuple[str, dict, bool]] = {
    "qwen2": ("Qwen2Config", {}, True),
    "qwen3": ("Qwen3Config", {"num_heads": 4, "num_kv_heads": 2, "attention_bias": False}, True),
    "llama": ("LlamaConfig", {"num_heads": 4, "num_kv_heads": 2, "attention_bias": False, "mlp_bias": False,
                              "rope_scaling": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 128}},
              False),
    "mistral": ("MistralConfig", {"num_heads": 4, "num_kv_heads": 2, "sliding_window": 128}, False),
}


def build_model(
    out_dir: str | Path,
    *,
    family: str = "qwen2",
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    intermediate_size: int = 256,
    tie_word_embeddings: bool | None = None,
    embed_std: float = 0.1,
    seed: int = 0,
) -> Path:
    """Write tokenizer + a random-init model of `family` (FAMILIES) to `out_dir`; returns the path."""
    import torch  # here: as in build_tokenizer (`--help` and the data builder stay light)
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: expected one of {', '.join(FAMILIES)}")
    config_cls, features, tied = FAMILIES[family]
    features = dict(features)
    heads, kv_heads = features.pop("num_heads", 2), features.pop("num_kv_heads", 2)
    num_heads, num_kv_heads = num_heads or heads, num_kv_heads or kv_heads
    tie_word_embeddings = tied if tie_word_embeddings is None else tie_word_embeddings
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    config = getattr(transformers, config_cls)(
        **features,
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
    model = AutoModelForCausalLM.from_config(config).to(torch.float32)
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
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for _ in range(n):
            word = "".join(rng.choice(letters) for _ in range(rng.randint(3, 8)))
            f.write(json.dumps({"prompt": f"{word} = "}) + "\n")
    return out
