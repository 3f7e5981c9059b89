"""Evaluation during training: TRL's own evaluation path, generating on the plugin's server.

Training rollouts come from the producers; evaluation (`eval_strategy` with `val_set_size` or `test_datasets`)
stays TRL's: `prediction_step` -> `_generate_and_score_completions` scores the eval prompts with the same reward
functions, computes the loss, and logs `eval_reward`, `eval_rewards/<fn>/mean`, completion lengths, ... as TRL
names them. TRL generates through its `vllm_generation` object (`sync_weights()`, then `generate()`); the plugin
never builds TRL's server client, so `EvalGeneration` takes that object's place and serves both calls with what
the training rollouts use:

- `sync_weights()` brings the server to the trainer's current weights (a push, verified by the probe, unless the
  server already holds this step's version): an evaluation at step g scores the policy of step g, whatever
  `grpo.sync_interval` says;
- `generate()` samples on the server with a lease on the policy gate for version g (nothing writes the weights
  while it generates; the lease names the model to ask for), through the server guard (an outage is recovered
  like a training rollout's), with the training rollouts' sampling parameters and TRL's `num_generations_eval`.

Eval completions never reach the training producers, their policy-version accounting or the prefetch queue.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from grpo_plugin.producers.agent import AgentGeneration
from grpo_plugin.producers.seeds import seeded


class EvalGeneration:
    """Stands in for TRL's `VLLMGeneration` during evaluation (its two methods TRL's trainer calls)."""

    def __init__(self, *, client, gate, guard, step: Callable[[], int], bring_current: Callable[[], None],
                 sampling: Callable[[], dict[str, Any]], lag_timeout: float, seeds: Callable | None = None):
        """`step()`: the trainer's optimizer step; `bring_current()`: push (and verify) the current weights unless
        the server holds them; `sampling()`: keyword arguments of `client.generate` besides prompts, model, n;
        `seeds`: grpo.seeded_sampling's per-prompt seeds (producers/seeds.py), or None."""
        self.client, self.gate, self.guard, self.seeds = client, gate, guard, seeds
        self.step, self.bring_current, self.sampling = step, bring_current, sampling
        self.lag_timeout = lag_timeout

    def sync_weights(self) -> None:
        self.bring_current()

    def generate(self, prompts: list[list[int]], images=None, num_generations: int = 1, profiler=None) -> tuple:
        """TRL's contract: `prompts` holds each prompt `num_generations` times in a row; returns (prompt_ids,
        completion_ids, per-token [logprob] lists, per-token [token id] lists), one row per prompt row."""
        if images is not None and any(i is not None for i in images):
            raise ValueError("grpo_plugin: evaluation with images is not supported (text prompts only)")
        if num_generations < 1 or len(prompts) % num_generations:
            raise ValueError(f"evaluation got {len(prompts)} prompt rows, not a multiple of "
                             f"num_generations_eval={num_generations}")
        self.bring_current()  # TRL asks for a sync only when its own step counter moved; this is idempotent
        unique = [list(p) for p in prompts[::num_generations]]
        version = self.step()
        sampling = {**self.sampling(), **seeded(self.seeds, "eval", version, unique)}

        def once():
            with self.gate.lease(version, timeout=self.lag_timeout) as lease:
                return self.client.generate(unique, model=lease.model, n=num_generations, **sampling)

        with profiler if profiler is not None else nullcontext():
            groups = self.guard.run("evaluation rollout", once)
        flat = [c for group in groups for c in group]
        return ([list(p) for p in prompts], [c.token_ids for c in flat],
                [[[lp] for lp in c.logprobs] for c in flat], [[[t] for t in c.token_ids] for c in flat])

    def rollout_handle(self):
        """`trainer.grpo_generation` where TRL itself calls a rollout_func (evaluation): each generate() leases the
        current step's weights (training rollouts get a handle pinned to their own lease: producers/agent.py)."""
        return AgentGeneration(self.client, self.sampling(), gate=self.gate, min_version=self.step,
                               timeout=self.lag_timeout)
