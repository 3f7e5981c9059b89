"""End to end, as users run it: steps/s of `axolotl train` in each sync mode with and without
`trl.async_prefetch`, against axolotl's stock GRPO with its own HF generation (no plugin, `trl.use_vllm: false`) —
one command, one machine, one run:

    python -m grpo_plugin.bench e2e [--size 100m] [--steps 20] [--prompts 2] [--modes lora_sync,restart,ipc]
                                    [--seed N] [--no-stock] [--json]

The CPU stand-in for the common GPU topology (vLLM on one GPU, the trainer on another): the vLLM server is pinned
to core 0 (its OpenMP threads bound there), `axolotl train` to core 1 (one thread). The stock run has no server and
gets both cores (two threads) — what a CPU user without this plugin runs. Every run trains the same locally built
Qwen2-shaped model on the digit task (rewards.toy.digit_reward), same seed, same batch; the reward after the same
number of steps is reported beside the speed, so speed is not bought with learning. Every run does the same work
per step: axolotl's zero-advantage skipping is off (`trl.skip_zero_advantage_batches: false`; with it, a step whose
rewards are all equal skips its forward/backward, so a run's speed would depend on how soon its batches go
uniform — 6 s of a 9 s step on this model). The batch (`--prompts` x `trl.num_generations` completions of
`--completion-len` tokens) is where generation and training take similar time here. `restart` is measured with the
in-place reload (`restart_strategy: process` restarts the server at every push: tens of seconds, not a fair
per-step figure). Steps/s is HF Trainer's own `train_steps_per_second` for every run (first step included).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

from grpo_plugin.bench.common import free_port, scratch, stack, stack_line
from grpo_plugin.config.lookups import run_config
from grpo_plugin.demo.tiny import MODEL_SIZES, build_digit_task, build_model
from grpo_plugin.server.client import VLLMServerClient
from grpo_plugin.server.process import VLLMServerProcess, spec_from

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = {"lora_sync": "quickstart_lora_sync.yaml", "restart": "quickstart_restart.yaml",
           "ipc": "quickstart_ipc.yaml"}
SERVER_CORE, TRAINER_CORE = 0, 1
# Full fine-tuning at the quickstarts' 5e-4 with 16 completions per step collapsed with async_prefetch (policy lag 1):
# reward 0 from step 4 on in restart and ipc, while the synchronous runs learned. At 2e-4 both forms learn.
FULL_WEIGHT_LR = 2e-4
# LoRA at the quickstart's 2e-3 with async_prefetch collapsed in one of five runs (seed 42, the default); at 1e-3 sync
# and async learned alike over three seeds, and seed 42 learned too (docs/benchmarks.md, the seed study).
LORA_LR = 1e-3


def _config(mode: str, model: Path, data: Path, out: Path, steps: int, completion_len: int, port: int,
            async_prefetch: bool | None, prompts: int = 2, seed: int | None = None) -> dict:
    """The mode's quickstart on this model; `async_prefetch=None`: the stock run (plugin lines removed)."""
    cfg = yaml.safe_load((ROOT / "configs" / CONFIGS[mode]).read_text())
    cfg.update(base_model=str(model), output_dir=str(out), dataset_prepared_path=str(out / "prepared"),
               max_steps=steps, micro_batch_size=prompts * cfg["trl"]["num_generations"])
    if seed is not None:  # the trainer's seed and (through the plugin) the server's sampling seed
        cfg["seed"] = seed
    cfg["datasets"][0]["path"] = str(data)
    cfg["trl"].update(max_completion_length=completion_len, skip_zero_advantage_batches=False)
    cfg["learning_rate"] = LORA_LR if mode == "lora_sync" else FULL_WEIGHT_LR
    if async_prefetch is None:
        for key in ("plugins", "grpo", "vllm"):
            cfg.pop(key, None)
        cfg["trl"]["use_vllm"] = False
    else:
        cfg["trl"]["async_prefetch"] = async_prefetch
        cfg["vllm"]["port"] = port
        cfg["grpo"].update(managed_server=False, adapter_name=f"bench-{'async' if async_prefetch else 'sync'}")
    return cfg


def _train(cfg: dict, cores: set[int], threads: int, log: Path) -> dict:
    """`axolotl train` pinned to `cores`; HF Trainer's steps/s and the reward of every step."""
    path = Path(cfg["output_dir"]).with_suffix(".yaml")
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), AXOLOTL_DO_NOT_TRACK="1", WANDB_MODE="disabled",
               HF_HUB_OFFLINE="1", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    cmd = ["taskset", "-c", ",".join(map(str, sorted(cores))), str(Path(sys.executable).parent / "axolotl"),
           "train", str(path)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"`axolotl train` failed ({proc.returncode}); output in {log}:\n{proc.stderr[-3000:]}")
    rewards, final = [], None
    for line in (proc.stdout + proc.stderr).splitlines():
        m = re.search(r"(\{'(?:loss|train_runtime)'.*\})", line)
        if not m:
            continue
        with contextlib.suppress(ValueError, SyntaxError):
            d = ast.literal_eval(m.group(1))
            if "train_steps_per_second" in d:
                final = d
            elif "reward" in d:
                rewards.append(round(float(d["reward"]), 4))
    if final is None:
        raise RuntimeError(f"no train_steps_per_second in the output of `axolotl train` ({log})")
    out = {"steps_per_s": round(float(final["train_steps_per_second"]), 4),
           "wall_s": round(time.perf_counter() - t0, 1), "rewards": rewards,
           "reward_last3": round(sum(rewards[-3:]) / max(1, len(rewards[-3:])), 4)}
    summary = Path(cfg["output_dir"]) / "grpo_summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        out.update(all_syncs_verified=s.get("all_syncs_verified"), policy_lag_max=s.get("policy_lag_max"),
                   rollout_wait_ms_median=s.get("rollout_ms_median"), step_ms_median=s.get("step_ms_median"))
        # where a step's time goes (after the first step): the push, the probe as the trainer waited for it, the
        # generation of its rollout (overlapped with training under async_prefetch)
        recs = [json.loads(x) for x in (Path(cfg["output_dir"]) / "grpo_metrics.jsonl").read_text().splitlines()]
        for key in ("sync_ms", "verify_ms", "generate_ms"):
            values = sorted(r[key] for r in recs[1:] if r.get(key) is not None)
            out[f"{key}_median"] = round(values[len(values) // 2], 1) if values else None
    return out


@contextlib.contextmanager
def _pinned_server(cfg: dict, log: Path, timeout: float = 900.0, extra_args: list[str] | None = None):
    """A vLLM server for `cfg` (`extra_args`: more vLLM flags), its process tree on SERVER_CORE (inherited from this
    thread's affinity at start)."""
    spec = spec_from(run_config(cfg))
    if extra_args:
        spec = dataclasses.replace(spec, extra_args=[*spec.extra_args, *extra_args])
    server = VLLMServerProcess(spec, log_path=log)
    saved_affinity, saved_bind = os.sched_getaffinity(0), os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(SERVER_CORE)
    os.sched_setaffinity(0, {SERVER_CORE})
    try:
        server.start()
    finally:
        os.sched_setaffinity(0, saved_affinity)
        if saved_bind is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = saved_bind
    try:
        server.wait_healthy(timeout, VLLMServerClient(server.spec.base_url).healthy)
        yield server
    finally:
        server.stop()


def run(size: str = "100m", steps: int = 20, modes: list[str] | None = None, completion_len: int = 32,
        prompts: int = 2, seed: int | None = None, stock: bool = True) -> dict:
    if len(os.sched_getaffinity(0)) < 2 or not {SERVER_CORE, TRAINER_CORE} <= os.sched_getaffinity(0):
        raise RuntimeError(f"the e2e benchmark pins the server to core {SERVER_CORE} and the trainer to core "
                           f"{TRAINER_CORE}; this process may use cores {sorted(os.sched_getaffinity(0))}")
    modes = modes or list(CONFIGS)
    base = yaml.safe_load((ROOT / "configs" / CONFIGS[modes[0]]).read_text())
    seed = base["seed"] if seed is None else seed  # one seed for every run, and the one reported
    res: dict = {"stack": stack(), "size": size, "steps": steps, "completion_len": completion_len, "prompts": prompts,
                 "seed": seed, "group": base["trl"]["num_generations"],
                 "topology": f"vLLM server on core {SERVER_CORE}, trainer on core {TRAINER_CORE}; stock HF "
                             f"generation on cores {SERVER_CORE},{TRAINER_CORE}", "modes": {}, "hf_generate": {}}
    with scratch("grpo-bench-e2e-") as tmp:
        model = build_model(tmp / f"qwen2-{size}", **MODEL_SIZES[size])
        data = build_digit_task(tmp / "digits.jsonl")
        for mode in modes:
            port = free_port()
            row: dict = {}
            with _pinned_server(_config(mode, model, data, tmp / f"{mode}-server", steps, completion_len, port,
                                        False, prompts, seed), tmp / f"{mode}-vllm.log"):
                for prefetch in (False, True):
                    key = "async" if prefetch else "sync"
                    cfg = _config(mode, model, data, tmp / f"{mode}-{key}", steps, completion_len, port, prefetch,
                                  prompts, seed)
                    print(f"[bench e2e] {mode} {key} ...", file=sys.stderr, flush=True)
                    row[key] = _train(cfg, {TRAINER_CORE}, 1, tmp / f"{mode}-{key}.log")
            row["sync_steps_per_s"] = row["sync"]["steps_per_s"]
            row["async_steps_per_s"] = row["async"]["steps_per_s"]
            row["async_speedup"] = round(row["async_steps_per_s"] / row["sync_steps_per_s"], 3)
            res["modes"][mode] = row
        # axolotl's stock GRPO with HF generation, on the LoRA config (lora_sync's) and the full fine-tuning one
        stock_modes = ("lora_sync", "restart") if "restart" in modes or "ipc" in modes else ("lora_sync",)
        for mode in stock_modes if stock else ():
            label = "lora" if mode == "lora_sync" else "full"
            print(f"[bench e2e] stock HF generation ({label}) ...", file=sys.stderr, flush=True)
            cfg = _config(mode, model, data, tmp / f"stock-{label}", steps, completion_len, 0, None, prompts, seed)
            res["hf_generate"][label] = _train(cfg, {SERVER_CORE, TRAINER_CORE}, 2, tmp / f"stock-{label}.log")
    best_mode, best = max(((m, max(r["sync_steps_per_s"], r["async_steps_per_s"])) for m, r in res["modes"].items()),
                          key=lambda x: x[1])
    res["best"] = {"mode": best_mode, "steps_per_s": best}
    if stock:
        res["hf_generate_steps_per_s"] = res["hf_generate"]["lora"]["steps_per_s"]
        res["best"]["vs_hf_generate"] = round(best / res["hf_generate_steps_per_s"], 3)
    return res


def report(res: dict) -> None:
    lines = [f"e2e: {res['steps']} steps of `axolotl train` per run, model {res['size']}, {res['prompts']} prompts x "
             f"{res['group']} completions of {res['completion_len']} tokens, seed {res['seed']}; {res['topology']}",
             stack_line(res["stack"]),
             f"  {'run':<28} {'steps/s':>8} {'step median':>12} {'reward (last 3)':>16} {'lag max':>8} "
             f"{'verified':>9}"]
    for mode, row in res["modes"].items():
        for key in ("sync", "async"):
            r = row[key]
            step = r.get("step_ms_median")
            lines.append(f"  {mode + ' ' + key:<28} {r['steps_per_s']:>8.3f} "
                         f"{(f'{step / 1e3:.2f} s' if step else ''):>12} {r['reward_last3']:>16.3f} "
                         f"{r.get('policy_lag_max')!s:>8} {r.get('all_syncs_verified')!s:>9}")
        lines.append(f"  {'':<28} async/sync {row['async_speedup']:.2f}x")
    for label, r in res["hf_generate"].items():
        lines.append(f"  {'stock HF generate ' + label:<28} {r['steps_per_s']:>8.3f} {r['reward_last3']:>16.3f}")
    b = res["best"]
    if "vs_hf_generate" in b:
        lines.append(f"  best plugin mode {b['mode']}: {b['steps_per_s']:.3f} steps/s = {b['vs_hf_generate']:.2f}x "
                     "axolotl's stock GRPO with HF generation (LoRA config)")
    print("\n".join(lines))
