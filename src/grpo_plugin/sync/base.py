"""The weight-sync protocol: one small class per `grpo.sync` mode, picked by config.

The sync session (sync/session.py) drives a mode and calls, in order: `prepare(model)` once, with a
`ModelHandle` (the trainer's model and rank facts, not the trainer), then `push(step)` whenever
`grpo.sync_interval` says so (the push is verified by the post-sync probe), and `close()` at the end.
`server_restarted()` after the server was lost and replaced, before the push that restores the weights.
`generation_model` names the model generation requests must use on the server.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from grpo_plugin.config.server import WORKER_EXTENSION

if TYPE_CHECKING:
    from grpo_plugin.server.client import VLLMServerClient


@dataclass
class SyncResult:
    step: int
    sync_ms: float  # trainer-visible pause of the push (write + load + cache reset)
    verify_ms: float = 0.0
    logprob_diff: float | None = None  # mean |Δlogp| of the probe, None when not verified
    logprob_diff_max: float | None = None
    pushed: bool = True  # False: the server already held these weights; only verified
    server_diffs: list[float] | None = None  # with several servers: each one's mean |Δlogp| (server order)


def _ignore(callback) -> None:
    """No training loop to hook (a handle on a bare model)."""


@dataclass(frozen=True)
class ModelHandle:
    """What a mode's `prepare` and the sync session see of the trainer: its model, the rank facts, and a way to
    hook the training loop (ipc fences every optimizer step)."""

    unwrap: Callable[[], Any]  # the trainer's model now, without its wrappers (DDP, DeepSpeed)
    num_processes: int = 1
    is_main: bool = True
    add_callback: Callable[[Any], None] = _ignore  # takes a transformers TrainerCallback

    @classmethod
    def of(cls, model, *, callbacks: list | None = None, **facts) -> ModelHandle:
        """A handle on a bare model (benchmarks, tests): `callbacks` collects what the mode registers."""
        return cls(unwrap=lambda: model, add_callback=callbacks.append if callbacks is not None else _ignore, **facts)


class WeightSync(Protocol):
    mode: str
    # False when the server is known to start on the trainer's initial weights: the first sync is then only
    # verified, and pushed only if the probe disagrees.
    needs_initial_push: bool
    # True when a push (re)starts the managed server itself (restart_strategy: process): a recovery then only
    # stops the lost server and lets the restoring push start it on the current weights.
    starts_server: bool
    # True when a push (or, for ipc, an optimizer step) changes weights the server is computing with: the trainer
    # then makes it wait for every generation in flight (sync/gate.py). False: the push serves a new name.
    writes_in_place: bool
    # What a push reads of the trainer's model: "trainable" (the adapter) or "all" (every weight). Under DeepSpeed
    # ZeRO-3 exactly these are gathered on every rank around the push (sync/ranks.py).
    reads: str
    # True when a push hands the server files from the sync directory (an adapter, a checkpoint): each server then
    # reads them there or is sent them (server/files.py, grpo.weight_transport). ipc hands no file.
    hands_files: bool

    @property
    def generation_model(self) -> str: ...

    def prepare(self, model: ModelHandle) -> None: ...

    def push(self, step: int, tensors: dict | None = None) -> SyncResult:
        """`tensors`: the trainer's full state dict when the trainer's own parameters are shards (FSDP2: gathered
        by sync/ranks.py); None: read the model."""

    def server_restarted(self) -> None:
        """The server was replaced by a fresh one (server/recovery.py): forget what the old one held, so the
        next push puts the trainer's current weights on the new one."""

    def close(self) -> None: ...


class PrefixCacheReset:
    """Resets the server's prefix cache beside a weight write, on a second client (own HTTP session) in one
    worker thread. Safe because the trainer sends no generation request while a push (or, for ipc, an optimizer
    step) runs: no request can see the cache between the write and the reset, whichever finishes first."""

    def __init__(self, client: VLLMServerClient, name: str):
        self.parent = client
        self.client = client.fork()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"grpo-{name}-reset")
        self._pending: Future | None = None

    def start(self) -> None:
        """Send the reset in the background (the write may start right away)."""
        self.client.watch = self.parent.watch  # a hung server is noticed here as on the main client
        self._pending = self._pool.submit(self.client.reset_prefix_cache)

    def wait(self) -> None:
        """Wait for the reset started by `start()`; re-raise its failure."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def around(self, load: Callable[[], object]):
        """Run `load()` while the reset runs; re-raise a failed reset after the load; return load's result."""
        self.start()
        try:
            return load()
        finally:
            self.wait()

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a failed reset was already reported by wait(), or is moot now
            self.wait()
        self._pool.shutdown(wait=True)


class SyncError(RuntimeError):
    """A push could not be completed (the server refused, or cannot do what the mode needs)."""


def explain_rpc_failure(mode: str, msg: str, otherwise: str) -> str:
    if "HTTP 404" in msg:
        hint = ("the server has no dev-mode routes (/server_info, /collective_rpc): it was started without "
                "VLLM_SERVER_DEV_MODE=1. Start it with `axolotl vllm-serve <config.yaml>` (the grpo_plugin serve "
                "module sets it) or `grpo.managed_server: true`.")
    else:
        hint = f"{otherwise} (see the server log for its traceback)."
    return f"grpo.sync={mode}: {hint} Server reply: {msg}"


def extends_ours(qualname: str | None) -> bool:
    """True if the server's worker extension is ours or a subclass of it (e.g. the benchmark's)."""
    if qualname == WORKER_EXTENSION:
        return True
    if not qualname or "." not in qualname:
        return False
    try:
        from grpo_plugin.in_vllm.worker_ext import GRPOWorkerExtension  # only for a subclass's name: rare

        module, _, name = qualname.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        return isinstance(cls, type) and issubclass(cls, GRPOWorkerExtension)
    except Exception:  # not importable here: not ours
        return False


def require_worker_extension(client: VLLMServerClient, mode: str, purpose: str) -> None:
    """The worker extension must be there BEFORE the first call: on vLLM 0.32 a collective_rpc of a method the
    workers lack kills the engine (EngineDeadError) instead of answering an error."""
    from grpo_plugin.server.client import ServerError  # here: this module loads with the config rules (no requests)

    try:
        ext = client.worker_extension()
    except ServerError as exc:
        raise SyncError(explain_rpc_failure(mode, str(exc), "the server could not describe itself")) from exc
    if not extends_ours(ext):
        raise SyncError(
            f"grpo.sync={mode}: the vLLM server at {client.base_url} was started with worker extension {ext!r}, "
            f"not {WORKER_EXTENSION!r}, so it cannot {purpose}. Start it with `axolotl vllm-serve "
            "<config.yaml>` (grpo_plugin's serve module adds it) or `grpo.managed_server: true`."
        )


def full_weight_model(handle: ModelHandle, mode: str):
    """The trainer's unwrapped model for a full-weight mode; a LoRA model is refused with the way out."""
    model = handle.unwrap()
    if hasattr(model, "peft_config"):
        raise SyncError(f"grpo.sync={mode} syncs full weights for full fine-tuning, but the trainer's model has a "
                        "LoRA adapter. Use `grpo.sync: lora_sync` for adapters, or remove `adapter:`.")
    return model
