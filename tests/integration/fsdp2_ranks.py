"""Worker of tests/integration/test_fsdp2_ranks.py, one per rank (`torchrun --nproc_per_node 2`): a tiny model
sharded with FSDP2 (`fully_shard`, gloo, CPU) trains two SGD steps; after each, rank 0 pushes the weights to a
real vLLM server through sync/ranks.py (every rank joins the gather and the probe's forward) and verifies them.

    python -m torch.distributed.run --nproc_per_node 2 tests/integration/fsdp2_ranks.py MODE MODEL_DIR URL OUT
"""

from __future__ import annotations

import json
import sys


def main(mode: str, model_dir: str, url: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_plugin.server.client import VLLMServerClient
    from grpo_plugin.sync import ProbeVerifier
    from grpo_plugin.sync.base import ModelHandle
    from grpo_plugin.sync.lora import LoraSync
    from grpo_plugin.sync.ranks import LeadFollow, fsdp2_gather
    from grpo_plugin.sync.restart import RestartSync

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if mode == "lora_sync":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                 target_modules=["q_proj", "v_proj", "down_proj"]))
        layers = model.base_model.model.model.layers
    else:
        layers = model.model.layers
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)

    def broadcast(obj):
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    lead = LeadFollow(gather=fsdp2_gather, broadcast=broadcast, name="FSDP2")
    tok = AutoTokenizer.from_pretrained(model_dir)
    probe_ids = tok("The quick brown fox jumps over the lazy dog", add_special_tokens=False)["input_ids"]
    if rank == 0:
        client = VLLMServerClient(url, timeout=300)
        sync = LoraSync(client, adapter_name="fsdp2") if mode == "lora_sync" else RestartSync(client)
        sync.prepare(ModelHandle.of(model))
        verifier = ProbeVerifier(client, probe_ids, 1e-4, mode, max_len=512, forward=lead.logprobs)
    batch = torch.tensor([list(range(5, 45))])
    report = {"diffs": [], "probe": []}
    try:
        for step in range(1, 3):
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            if rank != 0:
                lead.follow(model)
                continue
            with lead.leading():
                with lead.gathered(model, sync.reads) as full:
                    report["rank0_entries"] = len(full)
                    sync.push(step, full)
                report["diffs"].append(verifier.measure(model, sync.generation_model)[0])
                report["probe"].append(lead.logprobs(model, probe_ids))
        if rank == 0:
            sync.close()
    finally:
        dist.barrier()
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(report, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:5])
