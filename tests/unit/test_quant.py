"""Quantized bases: the dequantized base is exactly what the trainer computes with (bitsandbytes on CPU)."""

from __future__ import annotations

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")

from grpo_plugin.quant.dequant import (  # noqa: E402
    dequantized_base,
    describe,
    keep_training_numerics,
    quantized_layers,
)

QUANTS = {
    "nf4-double": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                       bnb_4bit_quant_storage=torch.bfloat16),  # axolotl's qlora defaults
    "fp4": dict(load_in_4bit=True, bnb_4bit_quant_type="fp4", bnb_4bit_use_double_quant=False),
    "int8": dict(load_in_8bit=True),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from grpo_plugin.demo.tiny import build_model

    return build_model(tmp_path_factory.mktemp("quant") / "tiny-qwen2")


def load(path, quant: str | None, peft: bool = False):
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    kw = {}
    if quant:
        extra = {"bnb_4bit_compute_dtype": torch.float32} if QUANTS[quant].get("load_in_4bit") else {}
        kw = {"quantization_config": BitsAndBytesConfig(**QUANTS[quant], **extra), "device_map": "cpu"}
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, **kw)
    if peft:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(0)
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                 target_modules=["q_proj", "v_proj", "down_proj"]))
    return model


IDS = torch.tensor([[5, 17, 99, 200, 3, 64, 128, 250, 7, 1]])


def logits(model, train: bool):
    model.train(train)
    with torch.no_grad():
        return model(input_ids=IDS).logits


def plain_with(path, tensors):
    plain = load(path, None)
    missing, unexpected = plain.load_state_dict(tensors, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight"}, missing  # tied to the embedding, written once
    return plain


@pytest.mark.parametrize("quant", sorted(QUANTS))
def test_dequantized_base_is_what_the_trainer_computes_with(tiny, quant):
    model = load(tiny, quant)
    assert quantized_layers(model)
    keep_training_numerics(model)
    trained = logits(model, train=True)   # the path the loss takes
    probed = logits(model, train=False)   # the path the post-sync probe takes
    served = logits(plain_with(tiny, dequantized_base(model)), train=False)
    assert torch.equal(trained, probed)
    assert torch.equal(trained, served)
    # and it is not the full-precision base: serving that is what the probe must catch
    original = logits(load(tiny, None), train=False)
    assert (original - trained).abs().max() > 1e-3


def test_eight_bit_eval_differs_from_training_without_the_pin(tiny):
    model = load(tiny, "int8")
    trained = logits(model, train=True)
    assert not torch.equal(trained, logits(model, train=False))  # LLM.int8 in eval, dequantized in training
    keep_training_numerics(model)
    assert torch.equal(trained, logits(model, train=False))
    assert not model.training  # the pin leaves the layers' own mode as the caller set it
    assert not any(m.training for m in quantized_layers(model).values())


def test_peft_model_gives_checkpoint_names_without_the_adapter(tiny):
    from safetensors.torch import load_file

    model = load(tiny, "nf4-double", peft=True)
    tensors = dequantized_base(model)
    assert not [k for k in tensors if "lora" in k or "base_layer" in k]
    checkpoint = load_file(str(tiny / "model.safetensors"))
    assert set(tensors) == set(checkpoint)
    assert all(tensors[k].shape == checkpoint[k].shape for k in tensors)
    # the quantized weights came out dequantized and close to (not equal to) the checkpoint's
    w = "model.layers.0.self_attn.q_proj.weight"
    assert tensors[w].dtype == torch.float32
    assert 0 < (tensors[w] - checkpoint[w]).abs().max() < 0.1


def test_describe_names_the_format(tiny):
    assert describe(quantized_layers(load(tiny, "nf4-double"))) == "4-bit nf4, double quantization"
    assert describe(quantized_layers(load(tiny, "fp4"))) == "4-bit fp4"
    assert describe(quantized_layers(load(tiny, "int8"))) == "8-bit (LLM.int8)"
    assert describe(quantized_layers(load(tiny, None))) == "not quantized"
