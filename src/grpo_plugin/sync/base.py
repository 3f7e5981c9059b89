"""The weight-sync protocol: one small class per `grpo.sync` mode, picked by config.

The trainer owns the loop and calls, in order: `prepare(trainer)` once, then `push(step)` whenever
`grpo.sync_interval` says so (the push is verified by the post-sync probe), and `close()` at the end.
`generation_model` names the model generation requests must use on the server.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from grpo_plugin import probe

if TYPE_CHECKING:
    from grpo_plugin.client import VLLMServerClient


@dataclass
class SyncResult:
    step: int
    sync_ms: float  # trainer-visible pause of the push (write + load + cache reset)
    verify_ms: float = 0.0
    logprob_diff: float | None = None  # mean |Δlogp| of the probe, None when not verified
    logprob_diff_max: float | None = None


class WeightSync(Protocol):
    mode: str

    @property
    def generation_model(self) -> str: ...

    def prepare(self, trainer) -> None: ...

    def push(self, step: int) -> SyncResult: ...

    def close(self) -> None: ...


class ProbeVerifier:
    """Compares the server's logprobs of a fixed probe with the trainer model's own forward pass."""

    def __init__(self, client: VLLMServerClient, probe_ids: list[int], tolerance: float, mode: str):
        if len(probe_ids) < 2:
            raise ValueError("the probe needs at least 2 tokens (grpo.probe_text)")
        self.client, self.probe_ids, self.tolerance, self.mode = client, list(probe_ids), tolerance, mode

    def measure(self, model, server_model: str) -> tuple[float, float]:
        server = self.client.prompt_logprobs(self.probe_ids, model=server_model)
        return probe.logprob_diff(server, probe.token_logprobs(model, self.probe_ids))

    def verify(self, model, server_model: str, result: SyncResult) -> SyncResult:
        t0 = time.perf_counter()
        mean, mx = self.measure(model, server_model)
        result.verify_ms = (time.perf_counter() - t0) * 1e3
        result.logprob_diff, result.logprob_diff_max = mean, mx
        probe.check(mean, self.tolerance, mode=self.mode, step=result.step,
                    detail=f"(max |Δ| {mx:.3g}, server model {server_model!r})")
        return result
