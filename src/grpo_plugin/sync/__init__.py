"""Weight-sync modes, picked by `grpo.sync`."""

from __future__ import annotations

from grpo_plugin.sync.base import ProbeVerifier, SyncResult, WeightSync


def build_weight_sync(settings, client) -> WeightSync:
    """The mode's WeightSync. With grpo.atropos the environments generate on the server too: every write runs
    inside the server fence and announces the policy version (sync/fence.py)."""
    shared = settings.atropos is not None
    if settings.sync == "ipc":
        from grpo_plugin.sync.ipc import IpcSync

        return IpcSync(client, fence=settings.ipc_fence, rpc_timeout=settings.request_timeout, announce=shared)
    if settings.sync == "lora_sync":
        from grpo_plugin.sync.lora import LoraSync

        sync = LoraSync(client, adapter_name=settings.adapter_name, sync_dir=settings.sync_dir)
    elif settings.sync == "restart":
        from grpo_plugin.sync.restart import RestartSync

        sync = RestartSync(client, strategy=settings.restart_strategy, sync_dir=settings.sync_dir,
                           rpc_timeout=settings.request_timeout, start_timeout=settings.server_timeout)
    else:
        raise ValueError(f"grpo.sync: {settings.sync!r} is not available yet")
    if shared:
        from grpo_plugin.sync.fence import FencedSync, ServerFence

        sync = FencedSync(sync, ServerFence(client, settings.sync))
    return sync


__all__ = ["ProbeVerifier", "SyncResult", "WeightSync", "build_weight_sync"]
