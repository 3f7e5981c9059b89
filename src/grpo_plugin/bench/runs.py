"""`axolotl train` runs for the benchmarks that train (bench/e2e.py, bench/async_tail.py): a quickstart config on a
benchmark's model, a vLLM server pinned to one core, `axolotl train` pinned to another, and what HF Trainer and
the plugin's metrics say of the run.
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

from grpo_plugin.config.lookups import run_config
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


def config(mode: str, model: Path, data: Path, out: Path, steps: int, completion_len: int, port: int,
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


def train(cfg: dict, cores: set[int], threads: int, log: Path) -> dict:
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
def pinned_server(cfg: dict, log: Path, timeout: float = 900.0, extra_args: list[str] | None = None):
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
