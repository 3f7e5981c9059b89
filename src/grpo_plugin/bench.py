"""Benchmarks that print figures (never timed tests).

    python -m grpo_plugin.bench sync --mode lora_sync [--model DIR] [--repeats 30] [--json]

`sync`: in ONE run, on the same model, adapter and vLLM server, measures the trainer-visible pause of
  - ours: grpo_plugin's `lora_sync` push (adapter tensors -> /dev/shm, `/v1/load_lora_adapter` load_inplace,
    `/reset_prefix_cache`), and
  - axolotl's built-in `trl.vllm_lora_sync` (`AsyncGRPOTrainer._sync_lora_adapter`, called unmodified with
    TRL's own VLLMClient, as axolotl's trainer calls it),
alternating the two so drift on the machine hits both alike. After every push of either, the post-sync
probe measures whether the server really serves the new adapter (mean |Δlogp| vs the trainer's forward).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _perturb(model, seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.02)


def _axolotl_sync_fn(model, base_url: str, adapter_name: str):
    """axolotl's own LoRA sync, bound to the minimum trainer state it reads."""
    from accelerate import Accelerator
    from axolotl.core.trainers.grpo.async_trainer import AsyncGRPOTrainer
    from trl.generation.vllm_client import VLLMClient

    accelerator = Accelerator(cpu=True)
    host = SimpleNamespace(
        vllm_generation=SimpleNamespace(mode="server", accelerator=accelerator, model=model,
                                        vllm_client=VLLMClient(base_url=base_url, connection_timeout=60)),
        model_wrapped=model,
        args=SimpleNamespace(model_name_or_path=adapter_name, vllm_server_timeout=300),
    )
    def sync():
        AsyncGRPOTrainer._sync_lora_adapter(host)

    sync.cleanup = lambda: shutil.rmtree(getattr(host, "_lora_sync_dir", None) or "/nonexistent",
                                          ignore_errors=True)  # axolotl never removes its temp dir
    return sync


def bench_sync(mode: str, model_dir: str | None, repeats: int, lora_r: int, port: int | None) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_plugin.client import VLLMServerClient
    from grpo_plugin.server import ServerSpec, VLLMServerProcess, lora_rank_for_vllm
    from grpo_plugin.sync import ProbeVerifier
    from grpo_plugin.sync.lora import LoraSync
    from grpo_plugin.tiny import build_model

    if mode != "lora_sync":
        raise SystemExit(f"--mode {mode}: only lora_sync exists in this version")
    tmp = Path(tempfile.mkdtemp(prefix="grpo_bench-"))
    model_dir = model_dir or str(build_model(tmp / "tiny-qwen2"))
    spec = ServerSpec(model=model_dir, port=port or _free_port(), dtype="float32", max_model_len=512,
                      enforce_eager=True, max_lora_rank=lora_rank_for_vllm(lora_r), max_loras=2)
    server = VLLMServerProcess(spec, log_path=tmp / "vllm_server.log")
    server.start()
    try:
        client = VLLMServerClient(spec.base_url)
        server.wait_healthy(600, client.healthy)
        tok = AutoTokenizer.from_pretrained(model_dir)
        probe_ids = tok("The quick brown fox jumps over the lazy dog. 0123456789", add_special_tokens=False)[
            "input_ids"]
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model = get_peft_model(base, LoraConfig(
            r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="lora_sync")

        ours = LoraSync(client, adapter_name="bench-ours")
        ours.prepare(SimpleNamespace(model=model, accelerator=SimpleNamespace(unwrap_model=lambda m: m)))
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
            _perturb(model, seed=i)
            for name in ("ours", "axolotl") if i % 2 == 0 else ("axolotl", "ours"):
                t0 = time.perf_counter()
                if name == "ours":
                    ours.push(i)
                else:
                    theirs()
                ms = (time.perf_counter() - t0) * 1e3
                diff, _ = verifier.measure(model, "bench-ours" if name == "ours" else "bench-axolotl")
                if i > 0:
                    res[name]["ms"].append(ms)
                    res[name]["diff"].append(diff)
                    res[name]["write_ms"].append(last_write.get(name, float("nan")))
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
        "adapter_mb": round(n_params * 4 / 2**20, 3),
    }
    for name, r in res.items():
        out[name] = {
            "median_ms": round(statistics.median(r["ms"]), 2),
            "p90_ms": round(sorted(r["ms"])[int(0.9 * (len(r["ms"]) - 1))], 2),
            "write_median_ms": round(statistics.median(r["write_ms"]), 2),
            "max_logprob_diff": max(r["diff"]),
            "verified": all(d <= 1e-4 for d in r["diff"]),
        }
    out["ratio_ours_over_axolotl"] = round(out["ours"]["median_ms"] / out["axolotl"]["median_ms"], 3)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m grpo_plugin.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sync", help="sync pause: ours vs axolotl's built-in")
    s.add_argument("--mode", default="lora_sync")
    s.add_argument("--model", default=None, help="model dir (default: build the tiny model)")
    s.add_argument("--repeats", type=int, default=30)
    s.add_argument("--lora-r", type=int, default=16)
    s.add_argument("--port", type=int, default=None)
    s.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    out = bench_sync(args.mode, args.model, args.repeats, args.lora_r, args.port)
    if args.json:
        print(json.dumps(out))
        return
    print(f"sync benchmark · mode {out['mode']} · {out['repeats']} pushes each · LoRA r={out['lora_r']} "
          f"({out['adapter_mb']} MB fp32) · model {out['model']}")
    for name, label in (("ours", "grpo_plugin lora_sync"), ("axolotl", "axolotl trl.vllm_lora_sync")):
        r = out[name]
        print(f"  {label:28s} median {r['median_ms']:8.2f} ms  p90 {r['p90_ms']:8.2f} ms  "
              f"(writing the adapter: {r['write_median_ms']:.2f} ms)  "
              f"probe max|Δ| {r['max_logprob_diff']:.1e}  verified {r['verified']}")
    print(f"  ratio ours/axolotl: {out['ratio_ours_over_axolotl']:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
