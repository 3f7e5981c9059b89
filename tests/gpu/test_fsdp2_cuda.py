"""FSDP2 on a GPU, one rank (NCCL; skipped without CUDA): sync/ranks.py's FSDP2 gather (torch's full state dict)
gives rank 0 the full weights — bit-identical to the loaded model; after one SGD step, an unsharded model loaded
with the gathered weights computes what the sharded model computes — and the probe's forward on the sharded model
equals the unsharded one. Two CPU ranks push through the
same gather to real vLLM servers in tests/integration/test_fsdp2_ranks.py.

Run on a GPU machine (torch and transformers suffice):
    python -m pytest -q tests/gpu/test_fsdp2_cuda.py
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_fsdp2_gather_gives_the_trained_weights_and_the_probe_forward_matches(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from grpo_plugin.bench.common import free_port, load_model
    from grpo_plugin.demo.tiny import build_model
    from grpo_plugin.sync import probe
    from grpo_plugin.sync.ranks import LeadFollow, fsdp2_gather
    from grpo_plugin.sync.restart import checkpoint_tensors

    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", str(free_port()))):
        os.environ.setdefault(key, value)
    if not dist.is_initialized():
        dist.init_process_group("nccl")
    model_dir = str(build_model(tmp_path / "tiny"))
    ref = load_model(model_dir).cuda()
    loaded = {k: v.detach().cpu().clone() for k, v in checkpoint_tensors(ref).items()}
    model = load_model(model_dir).cuda()
    mesh = init_device_mesh("cuda", (1,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert all(hasattr(p, "to_local") for p in model.parameters())  # DTensors: sharded
    lead = LeadFollow(gather=fsdp2_gather, broadcast=lambda obj: obj, name="FSDP2")
    with lead.gathered(model, "all") as full:
        got = checkpoint_tensors(model, full)
    assert got.keys() == loaded.keys() and all(torch.equal(got[k], loaded[k]) for k in loaded)
    ids = list(range(3, 40))
    assert max(abs(a - b) for a, b in zip(lead.logprobs(model, ids), probe.token_logprobs(ref, ids))) <= 1e-5

    batch = torch.tensor([ids], device="cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(input_ids=batch, labels=batch).loss.backward()
    opt.step()
    with lead.gathered(model, "all") as full:
        got = checkpoint_tensors(model, full)
    assert any(not torch.equal(got[k], loaded[k]) for k in loaded)  # the step changed the weights
    ref.load_state_dict(got, strict=False)  # tied lm_head: written once, as the embedding (as a push writes it)
    ours, theirs = lead.logprobs(model, ids), probe.token_logprobs(ref, ids)
    assert max(abs(a - b) for a, b in zip(ours, theirs)) <= 1e-5  # what a push sends is what the trainer computes
