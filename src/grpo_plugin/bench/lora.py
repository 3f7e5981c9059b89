"""lora_sync vs axolotl's built-in `trl.vllm_lora_sync`, on ONE server and adapter (prints figures; never a test).

    python -m grpo_plugin.bench sync --mode lora_sync [--model DIR] [--repeats 30] [--lora-r 16] [--json]

Alternating pushes of ours (grpo_plugin's `lora_sync`: adapter tensors -> /dev/shm, a new adapter version via
`/v1/load_lora_adapter`) and axolotl's (`AsyncGRPOTrainer._sync_lora_adapter`, called unmodified with TRL's own
VLLMClient, as axolotl's trainer calls it), the post-sync probe after every push of either; then greedy decode
throughput through each side's adapter vs the same adapter loaded once under a fresh name (never reloaded).
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from grpo_plugin.bench.common import (
    decode_prompts,
    decode_rates,
    free_port,
    pct,
    perturb,
    probe_token_ids,
    stack,
    stack_line,
)
from grpo_plugin.config.server import lora_rank_for_vllm
from grpo_plugin.demo.tiny import build_model
from grpo_plugin.server.process import ServerSpec, launch
from grpo_plugin.sync.base import ModelHandle


def _axolotl_sync_fn(model, base_url: str, adapter_name: str):
    """axolotl's own LoRA sync (`AsyncGRPOTrainer._sync_lora_adapter`, unmodified), bound to the minimum trainer
    state it reads. `sync.served()` is the adapter name its generation requests use after the last sync: axolotl
    >= 0.21 loads every version under a new name (its vLLM client's `model`), 0.19 reloaded one name in place."""
    # heavy (axolotl, trl, accelerate): loaded only when this benchmark runs
    from accelerate import Accelerator
    from axolotl.core.trainers.grpo.async_trainer import AsyncGRPOTrainer
    from trl.generation.vllm_client import VLLMClient

    accelerator = Accelerator(cpu=True)
    client = VLLMClient(base_url=base_url, connection_timeout=60)
    served_base = client.model if hasattr(client, "model") else None
    host = SimpleNamespace(
        vllm_generation=SimpleNamespace(mode="server", accelerator=accelerator, model=model, vllm_client=client),
        model_wrapped=model, _vllm_lora_alias=None,
        args=SimpleNamespace(model_name_or_path=adapter_name, vllm_server_timeout=300),
    )

    def sync():
        AsyncGRPOTrainer._sync_lora_adapter(host)

    sync.served = lambda: client.model if getattr(client, "model", None) not in (None, served_base) else adapter_name
    sync.cleanup = lambda: shutil.rmtree(getattr(host, "_lora_sync_dir", None) or "/nonexistent",
                                          ignore_errors=True)  # axolotl never removes its temp dir
    return sync


def run(mode: str, model_dir: str | None, repeats: int, lora_r: int, port: int | None,
               decode_seqs: int = 32) -> dict:
    """ours vs axolotl's built-in LoRA sync on ONE server and adapter: the pause of every push (alternating),
    the probe after each, then decode throughput through each side's last adapter vs the same adapter loaded
    once under a fresh name (never reloaded)."""
    # heavy (torch, transformers, peft): loaded only when this benchmark runs
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from grpo_plugin.sync import ProbeVerifier
    from grpo_plugin.sync.lora import LoraSync

    tmp = Path(tempfile.mkdtemp(prefix="grpo_bench-"))
    model_dir = model_dir or str(build_model(tmp / "tiny-qwen2"))
    # room for every adapter alive at once (axolotl keeps two versions, ours one, the fresh one): no eviction
    spec = ServerSpec(model=model_dir, port=port or free_port(), dtype="float32", max_model_len=512,
                      enforce_eager=True, max_lora_rank=lora_rank_for_vllm(lora_r), max_loras=4)
    server, client = launch(spec, tmp / "vllm_server.log", timeout=600, client_timeout=300)
    try:
        probe_ids = probe_token_ids(model_dir)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model = get_peft_model(base, LoraConfig(
            r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="lora_sync")

        ours = LoraSync(client, adapter_name="bench-ours")
        ours.prepare(ModelHandle.of(model))
        theirs = _axolotl_sync_fn(model, spec.base_url, "bench-axolotl")
        res = {"ours": {"ms": [], "diff": [], "write_ms": []}, "axolotl": {"ms": [], "diff": [], "write_ms": []}}
        # Time the adapter-writing part of each push (the rest is HTTP to the server) by wrapping, not changing,
        # the function each side calls: ours `_write_weights`, axolotl's PEFT `save_pretrained`.
        last_write = {}

        def timed(name, fn):
            def wrapper(*a, **k):
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    last_write[name] = (time.perf_counter() - t) * 1e3
            return wrapper

        ours._write_weights = timed("ours", ours._write_weights)
        model.save_pretrained = timed("axolotl", model.save_pretrained)
        for i in range(repeats + 1):  # the first round of each is warm-up and not counted
            perturb(model, seed=i, scale=0.02, only="lora_B")
            for name in ("ours", "axolotl") if i % 2 == 0 else ("axolotl", "ours"):
                t0 = time.perf_counter()
                if name == "ours":
                    ours.push(i)
                else:
                    theirs()
                ms = (time.perf_counter() - t0) * 1e3
                diff, _ = verifier.measure(model, ours.generation_model if name == "ours" else theirs.served())
                if i > 0:
                    res[name]["ms"].append(ms)
                    res[name]["diff"].append(diff)
                    res[name]["write_ms"].append(last_write.get(name, float("nan")))
        # decode through each side's adapter (both hold the last weights) vs the same adapter loaded once
        fresh_dir = tmp / "fresh-adapter"
        del model.save_pretrained  # the PEFT method again, untimed
        model.save_pretrained(str(fresh_dir))
        client.load_lora_adapter("bench-fresh", str(fresh_dir), inplace=False)
        fresh_diff, _ = verifier.measure(model, "bench-fresh")
        prompts = decode_prompts(model_dir, decode_seqs)
        decode = decode_rates(client, prompts, {"ours": ours.generation_model, "axolotl": theirs.served(),
                                                 "fresh": "bench-fresh"})
        ours.close()
        theirs.cleanup()
    except BaseException:
        print(f"benchmark failed; server log kept in {tmp / 'vllm_server.log'}", file=sys.stderr)
        raise
    finally:
        server.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    n_params = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    out = {
        "benchmark": "sync", "mode": mode, "model": model_dir, "repeats": repeats,
        "lora_r": lora_r, "lora_params": n_params,
        "adapter_mb": round(n_params * 4 / 2**20, 3), "stack": stack(),
    }
    for name, r in res.items():
        out[name] = {
            "median_ms": round(statistics.median(r["ms"]), 2),
            "p90_ms": round(pct(r["ms"], 0.9), 2),
            "write_median_ms": round(statistics.median(r["write_ms"]), 2),
            "max_logprob_diff": max(r["diff"]),
            "verified": all(d <= 1e-4 for d in r["diff"]),
            "decode_tok_s": decode[name],
        }
    out["fresh"] = {"decode_tok_s": decode["fresh"], "logprob_diff": fresh_diff}
    out["decode_seqs"] = decode_seqs
    out["ratio_ours_over_axolotl"] = round(out["ours"]["median_ms"] / out["axolotl"]["median_ms"], 3)
    out["decode_ratio"] = round(decode["ours"] / decode["fresh"], 3)  # ours after `repeats` syncs / loaded once
    out["decode_ratio_axolotl"] = round(decode["axolotl"] / decode["fresh"], 3)
    return out


def report(out: dict) -> None:
    st = out["stack"]
    print(f"sync benchmark · mode {out['mode']} · {out['repeats']} pushes each · LoRA r={out['lora_r']} "
          f"({out['adapter_mb']} MB fp32) · model {out['model']}")
    print(stack_line(st))
    for name, label in (("ours", "grpo_plugin lora_sync"), ("axolotl", "axolotl trl.vllm_lora_sync")):
        r = out[name]
        print(f"  {label:28s} median {r['median_ms']:8.2f} ms  p90 {r['p90_ms']:8.2f} ms  "
              f"(writing the adapter: {r['write_median_ms']:.2f} ms)  "
              f"probe max|Δ| {r['max_logprob_diff']:.1e}  verified {r['verified']}  "
              f"decode {r['decode_tok_s']:.0f} tok/s")
    print(f"  {'same adapter loaded once':28s} decode {out['fresh']['decode_tok_s']:.0f} tok/s "
          f"({out['decode_seqs']} sequences)")
    print(f"  ratio ours/axolotl (pause): {out['ratio_ours_over_axolotl']:.3f}   decode ours/loaded-once: "
          f"{out['decode_ratio']:.3f}   decode axolotl/loaded-once: {out['decode_ratio_axolotl']:.3f}")
    sys.stdout.flush()
