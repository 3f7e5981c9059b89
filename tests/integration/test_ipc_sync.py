"""ipc against a real vLLM-CPU server started for it: the trainer's parameters ARE the server's weights.

A single in-place write by the trainer is what the server computes with next (equal to an independent HF
forward of the new weights); optimizer steps through the fence verify with the probe; with the `server` fence a
request arriving during the step waits and runs on the new weights; unmapped parameters, a dtype mismatch and a
server not started for ipc are refused before anything is written; after a server restart the trainer
re-attaches and carries its trained weights over instead of training on an orphaned mapping."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerState

from grpo_plugin.ipc.layout import UnmappedParameterError
from grpo_plugin.server.process import ServerSpec, launch
from grpo_plugin.sync import ProbeVerifier, probe
from grpo_plugin.sync.base import SyncError
from grpo_plugin.sync.ipc import IpcSync
from tests.conftest import free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ipc_server(tiny_model_dir, cache_env, tmp_path_factory):
    spec = ServerSpec(model=str(tiny_model_dir), port=free_port(), dtype="float32", max_model_len=512,
                      enforce_eager=True, enable_lora=False, ipc=True)
    server, client = launch(spec, tmp_path_factory.mktemp("logs") / "ipc.log")
    try:
        yield server, client
    finally:
        export_dir = server.ipc_dir.path if server.ipc_dir else None
        server.stop()
        assert export_dir is None or not export_dir.exists(), "the server's shared weight file was left behind"


def trainer_for(model_dir, dtype=torch.float32, processes: int = 1, rank: int = 0):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    # what IpcSync.prepare takes (a sync.base.ModelHandle), with the model and the callbacks it registered
    callbacks = []
    return SimpleNamespace(model=model, callbacks=callbacks, unwrap=lambda: model, num_processes=processes,
                           is_main=rank == 0, add_callback=callbacks.append)


def fresh_copy(model):
    """An independent HF model holding the same values (its own memory): the reference forward."""
    ref = type(model)(model.config).eval()
    ref.load_state_dict({k: v.detach().clone() for k, v in model.state_dict().items()})
    return ref


@pytest.fixture(scope="module")
def probe_ids(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))("ipc probe: 0123456789 qwerty",
                                                              add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def attached(ipc_server, tiny_model_dir):
    _, client = ipc_server
    trainer = trainer_for(tiny_model_dir)
    sync = IpcSync(client, fence="trainer")
    sync.prepare(trainer)
    yield trainer, sync
    sync.close()


def test_every_parameter_is_a_view_of_the_servers_file(attached, ipc_server, probe_ids):
    trainer, sync = attached
    _, client = ipc_server
    model = trainer.model
    # every parameter's storage is the one mapping of the server's file (no trainer-owned copy left)
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert len(storages) == 1
    assert all(p.untyped_storage().nbytes() == sync.manifest["nbytes"] for p in model.parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied stays tied
    assert len(trainer.callbacks) == 1
    served = client.prompt_logprobs(probe_ids, model=sync.generation_model)
    assert probe.logprob_diff(served, probe.token_logprobs(fresh_copy(model), probe_ids))[1] <= 1e-5


def test_a_single_in_place_write_is_what_the_server_computes_next(attached, ipc_server, probe_ids):
    trainer, sync = attached
    _, client = ipc_server
    model = trainer.model
    before = client.prompt_logprobs(probe_ids, model=sync.generation_model)
    sync.before_step()
    with torch.no_grad():  # ONE write: a single weight matrix of one layer, nothing else
        model.model.layers[0].mlp.down_proj.weight.mul_(-3.0)
    sync.after_step()
    result = sync.push(step=1)
    served = client.prompt_logprobs(probe_ids, model=sync.generation_model)
    mean, mx = probe.logprob_diff(served, probe.token_logprobs(fresh_copy(model), probe_ids))
    assert mean <= 1e-5 and mx <= 1e-4, (mean, mx)
    assert probe.logprob_diff(served, before)[0] > 1e-3, "the write did not change what the server computes"
    assert result.sync_ms >= 0 and result.pushed


def test_optimizer_steps_through_the_fence_verify(attached, ipc_server, probe_ids):
    trainer, sync = attached
    _, client = ipc_server
    model, fence = trainer.model, trainer.callbacks[0]
    verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="ipc", max_len=512)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)  # touches every tensor
    ids = torch.tensor([probe_ids * 4])
    prev = client.prompt_logprobs(probe_ids, model=sync.generation_model)
    state = TrainerState()  # what the Trainer hands its callbacks
    for step in range(3):
        model.train()
        model(ids, labels=ids).loss.backward()
        fence.on_pre_optimizer_step(None, state, None)
        opt.step()
        fence.on_optimizer_step(None, state, None)
        state.global_step += 1
        opt.zero_grad()
        result = verifier.verify(model, sync.generation_model, sync.push(step))  # prompt + cached-generation probe
        assert result.logprob_diff <= 1e-5, result
        now = client.prompt_logprobs(probe_ids, model=sync.generation_model)
        assert probe.logprob_diff(now, prev)[0] > 1e-3
        prev = now


def test_a_step_without_the_prefix_cache_reset_is_caught(attached, ipc_server, probe_ids, monkeypatch):
    """Fault injection: the fence forgets the reset. The weights are shared, but KV computed with the old weights
    survives in the prefix cache; the probe's cached-generation check must catch it."""
    trainer, sync = attached
    _, client = ipc_server
    verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="ipc", max_len=512)
    verifier.verify(trainer.model, sync.generation_model, sync.push(10))  # caches the probe's prompt blocks
    monkeypatch.setattr(sync._reset.client, "reset_prefix_cache", lambda: None)
    sync.before_step()
    with torch.no_grad():
        trainer.model.model.embed_tokens.weight.mul_(1.5)
    sync.after_step()
    with pytest.raises(probe.SyncVerificationError, match="grpo.sync=ipc"):
        verifier.verify(trainer.model, sync.generation_model, sync.push(11))
    client.reset_prefix_cache()
    verifier.verify(trainer.model, sync.generation_model, sync.push(12))


def test_server_fence_holds_a_request_that_arrives_during_the_step(attached, ipc_server, probe_ids):
    trainer, sync = attached
    _, client = ipc_server
    model = trainer.model
    sync.fence = "server"
    try:
        sync.before_step()  # /pause?mode=wait
        got = {}

        def late_request():
            got["t"] = time.perf_counter()
            got["lp"] = type(client)(client.base_url, timeout=60).prompt_logprobs(probe_ids,
                                                                                   model=sync.generation_model)
            got["done"] = time.perf_counter()

        th = threading.Thread(target=late_request)
        th.start()
        time.sleep(0.5)
        assert "lp" not in got, "a request ran while generation was paused"
        with torch.no_grad():
            model.model.layers[1].self_attn.o_proj.weight.mul_(2.0)
        resumed = time.perf_counter()
        sync.after_step()  # /resume
        th.join(30)
        assert got["done"] >= resumed
        mean, _ = probe.logprob_diff(got["lp"], probe.token_logprobs(fresh_copy(model), probe_ids))
        assert mean <= 1e-5, "the held request did not run on the new weights"
    finally:
        sync.fence = "trainer"


def test_with_two_ranks_only_rank_0_attaches_the_other_keeps_its_own_replica(ipc_server, tiny_model_dir):
    """DDP: rank 0's model is the shared copy; rank 1 never maps the file nor registers the step fence."""
    _, client = ipc_server
    other = trainer_for(tiny_model_dir, processes=2, rank=1)
    own = {n: p.data_ptr() for n, p in other.model.named_parameters()}
    sync = IpcSync(client, fence="server")
    sync.prepare(other)
    assert sync.transport is None and other.callbacks == []
    assert {n: p.data_ptr() for n, p in other.model.named_parameters()} == own
    sync.close()


@pytest.mark.parametrize("case", ["extra_parameter", "bf16_trainer"])
def test_what_cannot_be_shared_is_refused_before_anything_is_written(ipc_server, tiny_model_dir, probe_ids, case):
    _, client = ipc_server
    before = client.prompt_logprobs(probe_ids, model=client.base_model())
    if case == "bf16_trainer":
        trainer, error, match = trainer_for(tiny_model_dir, dtype=torch.bfloat16), SyncError, "one dtype"
    else:
        trainer = trainer_for(tiny_model_dir)
        trainer.model.model.layers[0].mlp.extra_scale = torch.nn.Parameter(torch.ones(3))
        with torch.no_grad():
            trainer.model.model.layers[0].mlp.down_proj.weight.zero_()  # would show if anything were written
        error, match = UnmappedParameterError, r"model.layers.0.mlp.extra_scale: no shared tensor"
    sync = IpcSync(client)
    with pytest.raises(error, match=match):
        sync.prepare(trainer)
    sync.close()
    assert probe.logprob_diff(client.prompt_logprobs(probe_ids, model=client.base_model()), before)[1] == 0.0


def test_a_server_not_started_for_ipc_is_refused(full_weight_server, tiny_model_dir):
    _, client = full_weight_server  # the restart shape: worker extension, no shared weight file
    sync = IpcSync(client)
    with pytest.raises(SyncError, match="does not share its weights"):
        sync.prepare(trainer_for(tiny_model_dir))
    sync.close()


def test_after_a_server_restart_the_trainer_reattaches_with_its_trained_weights(attached, ipc_server, probe_ids):
    """Last in the module: restarts the ipc server."""
    trainer, sync = attached
    server, client = ipc_server
    model = trainer.model
    old_file, old_dir = sync.manifest["file"], server.ipc_dir.path
    trained = probe.token_logprobs(fresh_copy(model), probe_ids)
    server.restart()
    server.wait_healthy(300, client.healthy)
    assert not Path(old_file).exists() and not old_dir.exists()  # the old server's file went with it
    assert sync.orphaned()
    # the new server loaded the checkpoint from disk: not what the trainer holds
    assert probe.logprob_diff(client.prompt_logprobs(probe_ids, model=sync.generation_model), trained)[0] > 1e-3
    ptr_before = model.model.embed_tokens.weight.data_ptr()
    sync.ensure_attached()
    assert sync.reattached == 1 and sync.orphaned() is None and sync.manifest["file"] != old_file
    assert model.model.embed_tokens.weight.data_ptr() != ptr_before
    served = client.prompt_logprobs(probe_ids, model=sync.generation_model)
    assert probe.logprob_diff(served, trained)[0] <= 1e-5
