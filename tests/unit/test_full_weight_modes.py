"""restart and ipc sync full weights: a LoRA model is refused before anything touches the server."""

from __future__ import annotations

import pytest

from grpo_plugin.sync.base import ModelHandle, SyncError, full_weight_model
from tests.unit.test_ipc_layout import _hf_model


@pytest.mark.parametrize("mode", ["restart", "ipc"])
def test_lora_model_is_refused_by_full_weight_modes(mode):
    from peft import LoraConfig, get_peft_model

    plain = _hf_model(tied=True)
    assert full_weight_model(ModelHandle.of(plain), mode) is plain
    lora = get_peft_model(_hf_model(tied=True), LoraConfig(r=4, target_modules=["q_proj"]))
    with pytest.raises(SyncError, match=rf"grpo.sync={mode} syncs full weights .* Use `grpo.sync: lora_sync`"):
        full_weight_model(ModelHandle.of(lora), mode)
