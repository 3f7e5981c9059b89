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

import os
import sys

import yaml

from grpo_plugin.bench.common import free_port, scratch, stack, stack_line
from grpo_plugin.bench.runs import CONFIGS, ROOT, SERVER_CORE, TRAINER_CORE, config, pinned_server, train
from grpo_plugin.demo.tiny import MODEL_SIZES, build_digit_task, build_model


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
            with pinned_server(config(mode, model, data, tmp / f"{mode}-server", steps, completion_len, port,
                                        False, prompts, seed), tmp / f"{mode}-vllm.log"):
                for prefetch in (False, True):
                    key = "async" if prefetch else "sync"
                    cfg = config(mode, model, data, tmp / f"{mode}-{key}", steps, completion_len, port, prefetch,
                                  prompts, seed)
                    print(f"[bench e2e] {mode} {key} ...", file=sys.stderr, flush=True)
                    row[key] = train(cfg, {TRAINER_CORE}, 1, tmp / f"{mode}-{key}.log")
            row["sync_steps_per_s"] = row["sync"]["steps_per_s"]
            row["async_steps_per_s"] = row["async"]["steps_per_s"]
            row["async_speedup"] = round(row["async_steps_per_s"] / row["sync_steps_per_s"], 3)
            res["modes"][mode] = row
        # axolotl's stock GRPO with HF generation, on the LoRA config (lora_sync's) and the full fine-tuning one
        stock_modes = ("lora_sync", "restart") if "restart" in modes or "ipc" in modes else ("lora_sync",)
        for mode in stock_modes if stock else ():
            label = "lora" if mode == "lora_sync" else "full"
            print(f"[bench e2e] stock HF generation ({label}) ...", file=sys.stderr, flush=True)
            cfg = config(mode, model, data, tmp / f"stock-{label}", steps, completion_len, 0, None, prompts, seed)
            res["hf_generate"][label] = train(cfg, {SERVER_CORE, TRAINER_CORE}, 2, tmp / f"stock-{label}.log")
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
