"""The weight-sync protocol: one small class per `grpo.sync` mode, picked by config.

The trainer owns the loop and calls, in order: `prepare(trainer)` once, then `push(step)` whenever
`grpo.sync_interval` says so (the push is verified by the post-sync probe), and `close()` at the end.
`server_restarted()` after the server was lost and replaced, before the push that restores the weights.
`generation_model` names the model generation requests must use on the server.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from grpo_plugin import probe

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

    @property
    def generation_model(self) -> str: ...

    def prepare(self, trainer) -> None: ...

    def push(self, step: int) -> SyncResult: ...

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
        self.client = type(client)(client.base_url, timeout=client.timeout)
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


class ProbeVerifier:
    """Compares the server's logprobs of a fixed probe with the trainer model's own forward pass.

    Two checks, both must pass:
    1. prompt logprobs of the probe tokens (every position; vLLM computes these without the prefix cache);
    2. a seeded temperature-1 generation from the probe tiled past two KV blocks, scored token by token by the
       trainer. This goes through the prefix cache like every rollout does, so KV computed with old weights
       that survived the sync is caught (greedy tokens would be too confident to show it).
    """

    GEN_PROMPT_TOKENS = 288  # > 2 KV blocks on vLLM-CPU (block size 128), so the cached path is exercised
    GEN_TOKENS = 8

    def __init__(self, client: VLLMServerClient, probe_ids: list[int], tolerance: float, mode: str,
                 max_len: int | None = None):
        if len(probe_ids) < 2:
            raise ValueError("the probe needs at least 2 tokens (grpo.probe_text)")
        self.client, self.probe_ids, self.tolerance, self.mode = client, list(probe_ids), tolerance, mode
        n = self.GEN_PROMPT_TOKENS if max_len is None else max(2, min(self.GEN_PROMPT_TOKENS,
                                                                        max_len - self.GEN_TOKENS - 1))
        self.gen_prompt = (self.probe_ids * (n // len(self.probe_ids) + 1))[:n]

    def measure(self, model, server_model: str) -> tuple[float, float]:
        server = self.client.prompt_logprobs(self.probe_ids, model=server_model)
        mean1, max1 = probe.logprob_diff(server, probe.token_logprobs(model, self.probe_ids))
        gen = self.client.generate([self.gen_prompt], model=server_model, n=1, max_tokens=self.GEN_TOKENS,
                                   temperature=1.0, seed=1234)[0][0]
        trainer = probe.token_logprobs(model, self.gen_prompt + gen.token_ids)[len(self.gen_prompt) - 1:]
        mean2, max2 = probe.logprob_diff(gen.logprobs, trainer)
        return max(mean1, mean2), max(max1, max2)

    def measure_into(self, model, server_model: str, result: SyncResult) -> SyncResult:
        """Measure and record the probe difference and its time in `result` (no tolerance check)."""
        t0 = time.perf_counter()
        result.logprob_diff, result.logprob_diff_max = self.measure(model, server_model)
        result.verify_ms = (time.perf_counter() - t0) * 1e3
        return result

    def verify(self, model, server_model: str, result: SyncResult) -> SyncResult:
        self.measure_into(model, server_model, result)
        probe.check(result.logprob_diff, self.tolerance, mode=self.mode, step=result.step,
                    detail=f"(max |Δ| {result.logprob_diff_max:.3g}, server model {server_model!r})")
        return result


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
    from grpo_plugin.server.process import WORKER_EXTENSION

    if qualname == WORKER_EXTENSION:
        return True
    if not qualname or "." not in qualname:
        return False
    try:
        import importlib

        from grpo_plugin.serve.worker_ext import GRPOWorkerExtension

        module, _, name = qualname.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        return isinstance(cls, type) and issubclass(cls, GRPOWorkerExtension)
    except Exception:  # not importable here: not ours
        return False


def require_worker_extension(client: VLLMServerClient, mode: str, purpose: str) -> None:
    """The worker extension must be there BEFORE the first call: on vLLM 0.32 a collective_rpc of a method the
    workers lack kills the engine (EngineDeadError) instead of answering an error."""
    from grpo_plugin.server.client import ServerError
    from grpo_plugin.server.process import WORKER_EXTENSION

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


def full_weight_model(trainer, mode: str):
    """The trainer's unwrapped model for a full-weight mode; a LoRA model is refused with the way out."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(model, "peft_config"):
        raise SyncError(f"grpo.sync={mode} syncs full weights for full fine-tuning, but the trainer's model has a "
                        "LoRA adapter. Use `grpo.sync: lora_sync` for adapters, or remove `adapter:`.")
    return model
