"""Quantized bases: the trainer's memory with a 16-, 8- and 4-bit base, and why the served base must be the one the
trainer computes with (prints figures; never a test).

    python -m grpo_plugin.bench qlora [--size 100m] [--steps 3] [--json]

1. Trainer memory: for each base, a fresh process loads the model (bf16 weights; 8-bit: bitsandbytes int8;
   4-bit: nf4 with double quantization, axolotl's qlora defaults), adds a LoRA adapter (r 16, every linear layer),
   and runs `--steps` AdamW steps on a batch of 8 x 128 tokens. RSS above the process's baseline (libraries
   imported) once loaded and at the peak of training (sampled every 2 ms), the model's own bytes, and the process's
   peak RSS (ru_maxrss: includes loading's transient full-precision copy).
2. Probe difference on ONE vLLM-CPU server (fp32, runtime LoRA): the trainer's quantized model (fp32 compute) with
   a perturbed adapter; (a) the adapter pushed over the server's full-precision base — the stock path — then (b)
   over the trainer's dequantized base (grpo_plugin's lora_sync, sync/served_base.py). Mean / max |Δlogp| of the
   post-sync probe, and what loading the base cost. A plain fp32 LoRA run on the same server is the reference.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import threading
import time

import psutil

from grpo_plugin.bench.common import free_port, perturb, probe_token_ids, scratch, stack, stack_line
from grpo_plugin.demo.tiny import MODEL_SIZES, build_model
from grpo_plugin.server.process import ServerSpec, launch
from grpo_plugin.sync.base import ModelHandle

BASES = ("16-bit", "8-bit", "4-bit")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _quant_config(base: str, compute):
    # heavy (torch, transformers): loaded only when this benchmark runs
    import torch
    from transformers import BitsAndBytesConfig

    if base == "4-bit":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                  bnb_4bit_compute_dtype=compute, bnb_4bit_quant_storage=torch.bfloat16)
    if base == "8-bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return None


def load(model_dir: str, base: str, compute):
    """The trainer's model: `base` weights under a LoRA adapter (r 16 on every linear layer)."""
    # heavy (torch, transformers, peft): loaded only when this benchmark runs
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    quant = _quant_config(base, compute)
    kw = {"quantization_config": quant, "device_map": "cpu"} if quant else {}
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=compute, **kw)
    torch.manual_seed(0)
    return get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS))


class _PeakSampler:
    """Largest RSS of this process while active, sampled every 2 ms (ru_maxrss also counts the load's transient
    full-precision copy, which is not what training holds)."""

    def __init__(self):
        self._proc, self.peak, self._stop = psutil.Process(), 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            self._stop.wait(0.002)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def worker(model_dir: str, base: str, steps: int) -> dict:
    """One process, one base: load, LoRA, `steps` AdamW steps; RSS above the process's own baseline (torch and
    transformers imported) after loading and at the peak of training (run as a subprocess by `memory`)."""
    # heavy: loaded only in this subprocess, all before the baseline
    import peft  # noqa: F401  (imported before the baseline, like everything the model needs)
    import torch
    import transformers  # noqa: F401

    from grpo_plugin.quant.dequant import keep_training_numerics

    mb = 2**20
    baseline = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    model = load(model_dir, base, torch.bfloat16)
    keep_training_numerics(model)
    load_s = time.perf_counter() - t0
    after_load = psutil.Process().memory_info().rss
    footprint = model.get_base_model().get_memory_footprint()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (8, 128), generator=torch.Generator().manual_seed(0))
    model.train()
    t1 = time.perf_counter()
    with _PeakSampler() as sampler:
        for _ in range(steps):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
    return {"base": base, "model_mb": footprint / mb, "after_load_mb": (after_load - baseline) / mb,
            "train_peak_mb": (sampler.peak - baseline) / mb,
            "process_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "load_s": load_s, "step_s": (time.perf_counter() - t1) / steps}


def memory(model_dir: str, steps: int) -> list[dict]:
    rows = []
    for base in BASES:
        code = (f"import json; from grpo_plugin.bench.qlora import worker; "
                f"print('RESULT ' + json.dumps(worker({model_dir!r}, {base!r}, {steps})))")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode != 0 or not line:
            raise RuntimeError(f"the {base} memory run failed:\n{proc.stderr[-3000:]}")
        rows.append(json.loads(line[-1].removeprefix("RESULT ")))
    return rows


def probe_differences(model_dir: str, tmp) -> list[dict]:
    # heavy (torch, transformers, peft): loaded only when this benchmark runs
    import torch

    from grpo_plugin.sync import ProbeVerifier
    from grpo_plugin.sync.lora import LoraSync
    from grpo_plugin.sync.served_base import ServedBase

    spec = ServerSpec(model=model_dir, port=free_port(), dtype="float32", max_model_len=512, enforce_eager=True,
                      max_lora_rank=16)
    server, client = launch(spec, tmp / "server.log")
    rows = []
    try:
        verifier = ProbeVerifier(client, probe_token_ids(model_dir), tolerance=1.0, mode="lora_sync")
        for base in ("fp32 (no quantization)", "8-bit", "4-bit"):
            model = load(model_dir, base, torch.float32)
            sync = ServedBase(LoraSync(client, adapter_name=f"bench-{base[:5]}"), client)
            sync.prepare(ModelHandle.of(model))
            perturb(model, seed=1, scale=0.02, only="lora_B")
            row = {"base": base, "quantization": sync.quantization or "none"}
            if sync.quantization:
                r = sync.inner.push(0)  # the stock path: the adapter over the server's full-precision base
                verifier.measure_into(model, sync.generation_model, r)
                row["full_precision_base"] = {"mean": r.logprob_diff, "max": r.logprob_diff_max}
            r = sync.push(1) if sync.quantization else sync.push(0)
            verifier.measure_into(model, sync.generation_model, r)
            row["served_trainers_base"] = {"mean": r.logprob_diff, "max": r.logprob_diff_max}
            row["base_load"] = {k: sync.last_report.get(k) for k in ("base_write_ms", "reload_ms", "base_bytes")}
            sync.close()  # the server reloads its own checkpoint
            rows.append(row)
            del model, sync
    finally:
        server.stop()
    return rows


def run(size: str = "100m", steps: int = 3) -> dict:
    with scratch("grpo-bench-qlora-") as tmp:
        model_dir = str(build_model(tmp / f"model-{size}", **MODEL_SIZES[size]))
        t0 = time.perf_counter()
        mem = memory(model_dir, steps)
        probes = probe_differences(model_dir, tmp)
    return {"size": size, "steps": steps, "memory": mem, "probe": probes, "stack": stack(),
            "wall_s": time.perf_counter() - t0}


def report(out: dict) -> None:
    print(f"Quantized bases, {out['size']} model — {stack_line(out['stack'])}")
    print("\nTrainer memory, MB above the process's baseline (a process per base: load + LoRA r16 + "
          f"{out['steps']} AdamW steps on 8 x 128 tokens, bf16 compute)")
    print(f"{'base':<8} {'model':>8} {'loaded':>8} {'training peak':>14} {'process peak RSS':>17} {'step s':>7}")
    for r in out["memory"]:
        print(f"{r['base']:<8} {r['model_mb']:>8.0f} {r['after_load_mb']:>8.0f} {r['train_peak_mb']:>14.0f} "
              f"{r['process_peak_rss_mb']:>17.0f} {r['step_s']:>7.2f}")
    print("\nPost-sync probe, mean (max) |Δlogp| — the trainer's model vs the server (fp32, tolerance 1e-4)")
    print(f"{'trainer base':<24} {'server: full-precision base':>28} {'server: trainer’s base':>24}")
    for r in out["probe"]:
        a = r.get("full_precision_base")
        b = r["served_trainers_base"]
        a_s = f"{a['mean']:.2e} ({a['max']:.2e})" if a else "(same thing)"
        print(f"{r['quantization']:<24} {a_s:>28} {b['mean']:.2e} ({b['max']:.2e})".rstrip())
    loads = [r for r in out["probe"] if r["base_load"].get("base_bytes")]
    for r in loads:
        bl = r["base_load"]
        print(f"  loading the dequantized base ({r['quantization']}): {bl['base_bytes'] / 2**20:.0f} MiB written in "
              f"{bl['base_write_ms']:.0f} ms, reloaded in {bl['reload_ms']:.0f} ms (once per run / server start)")
