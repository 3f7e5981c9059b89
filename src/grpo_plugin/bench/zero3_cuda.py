"""DeepSpeed ZeRO-3 on a CUDA GPU, one rank (NCCL): the push's gather and the probe's forward pass of sync/ranks.py.

    python -m grpo_plugin.bench zero3 --cuda [--size tiny|100m] [--json]

Needs torch with CUDA, transformers and deepspeed (no vLLM, axolotl or TRL: the gathered weights are written to
the sync directory as restart's push writes them, and compared with an unsharded copy instead of a server).
Checks, on one model built locally (fp32):
- outside a push every parameter is partitioned (ZeRO-3 keeps it in `ds_tensor`; the module sees an empty tensor);
- `LeadFollow.gathered(model, "all")` gives the full weights: before training bit-identical to the model that was
  loaded, and after one SGD step on the same batch within 1e-6 of an unsharded model given the same step (SGD: the
  update is linear in the gradient; Adam's first step divides by the gradient's own size and turns the last-bit
  differences of a sharded reduction of tiny gradients into differences of the learning rate's order — measured:
  5e-5 at lr 1e-4 on the 100m model);
- the probe's forward under ZeRO-3 (`LeadFollow.logprobs`) equals the unsharded model's;
- timings: gather, and gather + write of the checkpoint file (restart's push without the server's reload).
"""

from __future__ import annotations

import os
import statistics
import time

from grpo_plugin.bench.common import free_port, load_model, scratch
from grpo_plugin.config.storage import SyncDir
from grpo_plugin.demo.tiny import MODEL_SIZES, build_model


def run(size: str = "100m", repeats: int = 5) -> dict:
    # heavy (deepspeed, torch, transformers): loaded only when this benchmark runs
    import deepspeed
    import torch
    import transformers

    from grpo_plugin.sync import probe
    from grpo_plugin.sync.ranks import LeadFollow, describe_gather, selected
    from grpo_plugin.sync.restart import WEIGHTS_FILE, checkpoint_tensors

    if not torch.cuda.is_available():
        raise RuntimeError("bench zero3 --cuda needs a CUDA GPU")
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", str(free_port()))):
        os.environ.setdefault(key, value)
    deepspeed.init_distributed(dist_backend="nccl")
    out: dict = {"benchmark": "zero3_cuda", "size": size, "device": torch.cuda.get_device_name(0),
                 "stack": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "deepspeed": deepspeed.__version__}}
    with scratch("grpo_bench_zero3_cuda-") as tmp:
        model_dir = str(build_model(tmp / f"qwen2-{size}", **MODEL_SIZES[size]))
        ref = load_model(model_dir).cuda()
        loaded = {k: v.detach().cpu().clone() for k, v in checkpoint_tensors(ref).items()}
        model = load_model(model_dir)
        config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
                  "zero_allow_untested_optimizer": True, "gradient_clipping": 0.0}
        engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                          config=config)
        model = engine.module
        lead = LeadFollow(broadcast=lambda obj: obj)  # one rank: nobody to tell
        params = selected(model, "all")
        out["partitioned_outside_a_push"] = all(p.numel() == 0 and hasattr(p, "ds_tensor") for p in params)
        with lead.gathered(model, "all"):
            out["gathered"] = describe_gather(params)
            got = checkpoint_tensors(model)
            out["bit_identical_after_load"] = (got.keys() == loaded.keys()
                                               and all(torch.equal(got[k].cpu(), loaded[k]) for k in loaded))
        ids = list(range(3, 40))
        ours, theirs = lead.logprobs(model, ids), probe.token_logprobs(ref, ids)
        out["probe_max_abs_diff_vs_unsharded"] = max(abs(a - b) for a, b in zip(ours, theirs))

        batch = torch.tensor([ids], device="cuda")
        loss = engine(input_ids=batch, labels=batch).loss
        engine.backward(loss)
        engine.step()
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        ref(input_ids=batch, labels=batch).loss.backward()
        ref_opt.step()
        with lead.gathered(model, "all"):
            got = checkpoint_tensors(model)
            want = checkpoint_tensors(ref)
            out["max_abs_diff_after_a_step_vs_unsharded"] = max(
                (got[k].float() - want[k].float()).abs().max().item() for k in want)
            out["changed_by_the_step"] = any(not torch.equal(got[k].cpu(), loaded[k]) for k in loaded)

        storage = SyncDir("restart", str(tmp / "sync"))
        gather_ms, push_ms, plain_ms = [], [], []
        for _ in range(repeats + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with lead.gathered(model, "all"):
                torch.cuda.synchronize()
                t1 = time.perf_counter()
                storage.write_checkpoint(checkpoint_tensors(model), "zero3 bench", WEIGHTS_FILE)
            t2 = time.perf_counter()
            storage.write_checkpoint(checkpoint_tensors(ref), "zero3 bench (unsharded)", WEIGHTS_FILE)
            t3 = time.perf_counter()
            gather_ms.append((t1 - t0) * 1e3)
            push_ms.append((t2 - t0) * 1e3)
            plain_ms.append((t3 - t2) * 1e3)
        storage.close()
    med = lambda xs: round(statistics.median(xs[1:]), 2)  # noqa: E731 — the first is a warm-up
    out.update(gather_ms=med(gather_ms), zero3_write_ms=med(push_ms), unsharded_write_ms=med(plain_ms))
    out["ratio_zero3_vs_unsharded_write"] = round(out["zero3_write_ms"] / out["unsharded_write_ms"], 3)
    return out


def report(out: dict) -> None:
    print(f"ZeRO-3 on CUDA, 1 rank · model {out['size']} fp32 · {out['device']} · deepspeed "
          f"{out['stack']['deepspeed']} · torch {out['stack']['torch']}")
    for key in ("partitioned_outside_a_push", "bit_identical_after_load", "probe_max_abs_diff_vs_unsharded",
                "changed_by_the_step", "max_abs_diff_after_a_step_vs_unsharded", "gathered"):
        print(f"  {key}: {out[key]}")
    print(f"  gather {out['gather_ms']:.1f} ms; gather + write {out['zero3_write_ms']:.1f} ms vs unsharded write "
          f"{out['unsharded_write_ms']:.1f} ms: {out['ratio_zero3_vs_unsharded_write']:.2f}x")
