"""tiny.py --family: each family's distinguishing features are really switched on, deterministically."""

from __future__ import annotations

import hashlib

import pytest
from grpo_plugin.demo.__main__ import main

from grpo_plugin.demo.tiny import FAMILIES, build_model


def _load(path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("fam")
    return {f: build_model(root / f"tiny-{f}", family=f) for f in FAMILIES}


def test_each_family_has_what_breaks_syncs_switched_on(built):
    models = {f: _load(p) for f, p in built.items()}
    for f, m in models.items():
        assert m.config.vocab_size == 259 and 259 % 64, f  # not a multiple of vLLM's padding: padded rows exist
    q2, q3, ll, mi = (models[f] for f in ("qwen2", "qwen3", "llama", "mistral"))
    assert type(q2).__name__ == "Qwen2ForCausalLM" and q2.model.layers[0].self_attn.q_proj.bias is not None
    assert q2.lm_head.weight is q2.model.embed_tokens.weight  # tied
    attn3 = q3.model.layers[0].self_attn
    assert type(q3).__name__ == "Qwen3ForCausalLM" and hasattr(attn3, "q_norm") and hasattr(attn3, "k_norm")
    assert attn3.q_proj.bias is None and q3.config.num_key_value_heads < q3.config.num_attention_heads
    assert type(ll).__name__ == "LlamaForCausalLM" and ll.lm_head.weight is not ll.model.embed_tokens.weight
    rope = getattr(ll.config, "rope_parameters", None) or ll.config.rope_scaling
    assert rope["rope_type"] == "llama3"
    assert ll.model.layers[0].self_attn.q_proj.bias is None
    assert type(mi).__name__ == "MistralForCausalLM" and mi.config.sliding_window == 128
    assert mi.lm_head.weight is not mi.model.embed_tokens.weight


def test_builds_are_deterministic_and_the_default_is_unchanged(built, tmp_path):
    again = build_model(tmp_path / "again", family="llama")
    digest = [hashlib.sha256((p / "model.safetensors").read_bytes()).hexdigest() for p in (built["llama"], again)]
    assert digest[0] == digest[1]
    main(["--out", str(tmp_path / "demo")])  # the quickstarts' model: ./demo/tiny-qwen2
    assert (tmp_path / "demo" / "tiny-qwen2" / "config.json").exists()
    main(["--out", str(tmp_path / "demo"), "--family", "mistral"])
    assert (tmp_path / "demo" / "tiny-mistral" / "model.safetensors").exists()
    with pytest.raises(ValueError, match="family 'gpt2'"):
        build_model(tmp_path / "x", family="gpt2")
