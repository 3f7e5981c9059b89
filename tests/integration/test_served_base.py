"""lora_sync over a 4-bit base against the real session server: the server computes with the trainer's base only
after the dequantized base was loaded, gets it again after a (simulated) fresh server, and its own checkpoint back
at close."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from grpo_plugin.sync import ProbeVerifier, probe
from grpo_plugin.sync.lora import LoraSync
from grpo_plugin.sync.served_base import ServedBase
from tests.integration.conftest import perturb_lora

pytestmark = pytest.mark.integration
pytest.importorskip("bitsandbytes")


@pytest.fixture
def qlora_trainer(tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.float32, bnb_4bit_quant_storage=torch.bfloat16)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32, quantization_config=quant,
                                                device_map="cpu")
    torch.manual_seed(0)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]))
    return SimpleNamespace(model=model, unwrap=lambda: model)  # what prepare() takes (sync.base.ModelHandle)


def test_quantized_base_is_served_resent_after_a_fresh_server_and_restored(vllm_server, qlora_trainer, probe_ids,
                                                                           request):
    _, client = vllm_server
    served = client.base_model()
    original = client.prompt_logprobs(probe_ids, model=served)
    sync = ServedBase(LoraSync(client, adapter_name="t-served-base"), client)
    request.addfinalizer(sync.close)
    sync.prepare(qlora_trainer)
    assert sync.quantization == "4-bit nf4, double quantization"
    model = qlora_trainer.model
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}  # promoted
    verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="lora_sync",
                             context=lambda: sync.verify_context)
    perturb_lora(model, seed=1)
    pushed = sync.push(0)
    result = verifier.verify(model, sync.generation_model, pushed)
    assert sync.base_sent and result.logprob_diff <= 1e-4
    assert sync.last_report["base_bytes"] > 0 and sync.last_report["workers"] == 1

    # A fresh server holds the checkpoint again (what a recovery brings up); here it is put back in place.
    sync._reload.apply(None)
    assert probe.logprob_diff(client.prompt_logprobs(probe_ids, model=served), original)[1] == 0.0
    perturb_lora(model, seed=2)
    with pytest.raises(probe.SyncVerificationError, match=r"4-bit nf4.*grpo.verify_tolerance"):
        pushed = sync.push(1)  # the adapter alone, over the checkpoint's base: the probe catches it
        verifier.verify(model, sync.generation_model, pushed)
    sync.server_restarted()  # what the recovery tells the sync
    assert not sync.base_sent
    pushed = sync.push(2)
    result = verifier.verify(model, sync.generation_model, pushed)
    assert sync.base_sent and result.logprob_diff <= 1e-4

    sync.close()
    assert probe.logprob_diff(client.prompt_logprobs(probe_ids, model=served), original)[1] == 0.0
