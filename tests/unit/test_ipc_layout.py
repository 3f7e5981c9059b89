"""ipc layout: HF parameters as views of vLLM's fused / padded tensors (pure, no server)."""

from __future__ import annotations

import pytest
import torch

from grpo_plugin.ipc.layout import UnmappedParameterError, attach, hf_views


def _hf_model(tied: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=259, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).eval()


def vllm_layout(model, pad_to: int = 64) -> dict[str, torch.Tensor]:
    """What vLLM holds for this model: q/k/v and gate/up stacked, vocab rows padded (a stand-in built from the
    HF weights; the integration test reads the real one from the server)."""
    sd = dict(model.named_parameters())
    out = {}
    for name, t in sd.items():
        if ".q_proj." in name:
            k, v = sd[name.replace("q_proj", "k_proj")], sd[name.replace("q_proj", "v_proj")]
            out[name.replace("q_proj", "qkv_proj")] = torch.cat([t, k, v]).detach().clone()
        elif ".gate_proj." in name:
            out[name.replace("gate_proj", "gate_up_proj")] = torch.cat(
                [t, sd[name.replace("gate_proj", "up_proj")]]).detach().clone()
        elif any(s in name for s in (".k_proj.", ".v_proj.", ".up_proj.")):
            continue
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            rows = -(-t.shape[0] // pad_to) * pad_to
            padded = torch.zeros(rows, t.shape[1])
            padded[: t.shape[0]] = t.detach()
            out[name] = padded
        else:
            out[name] = t.detach().clone()
    return out


def meta_model(model):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(model.config)


@pytest.mark.parametrize("tied", [True, False])
def test_attached_model_computes_what_the_original_does_and_shares_storage(tied):
    ref = _hf_model(tied)
    shared = vllm_layout(ref)
    model = meta_model(ref)
    attach(model, hf_views(ref.config, shared))
    model.model.rotary_emb = type(ref.model.rotary_emb)(config=ref.config)  # buffers are not weights
    ids = torch.randint(0, 259, (1, 12))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)
    # one storage: an in-place update of the server's tensor is the trainer's parameter, and vice versa
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.add_(1.0)
    rows = model.config.hidden_size  # q rows: heads x head_dim
    assert torch.equal(shared["model.layers.0.self_attn.qkv_proj.weight"][rows: rows + 32],
                       model.model.layers[0].self_attn.k_proj.weight)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) is tied


def test_unmapped_parameter_is_refused_not_zero_filled():
    ref = _hf_model(False)
    shared = vllm_layout(ref)
    del shared["model.layers.1.mlp.down_proj.weight"]
    with pytest.raises(UnmappedParameterError, match=r"layers.1.mlp.down_proj.weight: no shared tensor"):
        attach(meta_model(ref), hf_views(ref.config, shared))


def test_wrong_fused_shape_is_refused():
    ref = _hf_model(False)
    shared = vllm_layout(ref)
    shared["model.layers.0.self_attn.qkv_proj.weight"] = shared["model.layers.0.self_attn.qkv_proj.weight"][:-1]
    with pytest.raises(UnmappedParameterError, match="qkv_proj.weight: 127 rows, expected 128"):
        hf_views(ref.config, shared)
