"""Weight-sync modes, picked by `grpo.sync`."""

from __future__ import annotations

from grpo_plugin.sync.base import ProbeVerifier, SyncResult, WeightSync


def build_weight_sync(settings, client) -> WeightSync:
    if settings.sync == "lora_sync":
        from grpo_plugin.sync.lora import LoraSync

        return LoraSync(client, adapter_name=settings.adapter_name, sync_dir=settings.sync_dir)
    if settings.sync == "restart":
        from grpo_plugin.sync.restart import RestartSync

        return RestartSync(client, strategy=settings.restart_strategy, sync_dir=settings.sync_dir,
                           rpc_timeout=settings.request_timeout, start_timeout=settings.server_timeout)
    if settings.sync == "ipc":
        from grpo_plugin.sync.ipc import IpcSync

        return IpcSync(client, fence=settings.ipc_fence, rpc_timeout=settings.request_timeout)
    raise ValueError(f"grpo.sync: {settings.sync!r} is not available yet")


__all__ = ["ProbeVerifier", "SyncResult", "WeightSync", "build_weight_sync"]
