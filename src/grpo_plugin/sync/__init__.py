"""Weight-sync modes, picked by `grpo.sync`."""

from __future__ import annotations

from grpo_plugin.sync.base import ProbeVerifier, SyncResult, WeightSync


def build_weight_sync(settings, client) -> WeightSync:
    if settings.sync == "lora_sync":
        from grpo_plugin.sync.lora import LoraSync

        return LoraSync(client, adapter_name=settings.adapter_name, sync_dir=settings.sync_dir)
    raise ValueError(f"grpo.sync: {settings.sync!r} is not available yet")


__all__ = ["ProbeVerifier", "SyncResult", "WeightSync", "build_weight_sync"]
