"""Weight-sync modes, picked by `grpo.sync`: one builder per mode of config/modes.py's table (BUILDERS, keyed by its
mode objects, which hold what the config and the server ask of a mode). This package imports nothing heavy itself:
the modes and the verifiers (which need torch) load when used."""

from __future__ import annotations

from grpo_plugin.config.modes import IPC, LORA_SYNC, MODES, RESTART
from grpo_plugin.sync.base import SyncResult, WeightSync


def _ipc(settings, client, shared: bool, gate) -> WeightSync:
    from grpo_plugin.sync.ipc import IpcSync

    # ipc fences itself (the optimizer step is the write): it announces the policy version when shared
    return IpcSync(client, fence=settings.ipc_fence, rpc_timeout=settings.request_timeout, announce=shared,
                   gate=gate)


def _lora_sync(settings, client, shared: bool, gate) -> WeightSync:
    from grpo_plugin.sync.lora import LoraSync
    from grpo_plugin.sync.served_base import ServedBase

    # ServedBase: over a quantized base (QLoRA), the server first gets the trainer's dequantized base
    lora = LoraSync(client, adapter_name=settings.adapter_name, sync_dir=settings.sync_dir, gate=gate,
                    keep=settings.policy_lag_bound + 1, serve_last_after_close=shared, announce=not shared)
    return _fenced(ServedBase(lora, client, sync_dir=settings.sync_dir, rpc_timeout=settings.request_timeout),
                   settings, client, shared)


def _restart(settings, client, shared: bool, gate) -> WeightSync:
    from grpo_plugin.sync.restart import RestartSync

    return _fenced(RestartSync(client, strategy=settings.restart_strategy, sync_dir=settings.sync_dir,
                               rpc_timeout=settings.request_timeout, start_timeout=settings.server_timeout,
                               delta_anchor_every=settings.delta_anchor_every),
                   settings, client, shared)


def _fenced(sync, settings, client, shared: bool) -> WeightSync:
    """With other clients generating on the server (Atropos), every write runs inside the server fence."""
    if not shared:
        return sync
    from grpo_plugin.sync.fence import FencedSync, ServerFence

    return FencedSync(sync, ServerFence(client, settings.sync))


BUILDERS = {IPC: _ipc, LORA_SYNC: _lora_sync, RESTART: _restart}


def build_weight_sync(settings, client, gate) -> WeightSync:
    """The mode's WeightSync. With grpo.atropos the environments generate on the server too: every write runs
    inside the server fence and announces the policy version (sync/fence.py). `gate`: the trainer's policy gate
    (sync/gate.py), which lora_sync and ipc consult themselves."""
    return BUILDERS[MODES[settings.sync]](settings, client, shared=settings.atropos is not None, gate=gate)


def __getattr__(name: str):  # the verifiers need torch: loaded when asked for, not with the builders
    if name in ("DeferredVerifier", "ProbeVerifier"):
        from grpo_plugin.sync import verify

        return getattr(verify, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["BUILDERS", "DeferredVerifier", "ProbeVerifier", "SyncResult", "WeightSync", "build_weight_sync"]
