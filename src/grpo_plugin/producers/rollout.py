"""What a producer tells the trainer about one rollout besides its tensors: one typed record under one key.

Every `produce()` puts a `Rollout` in the rollout dict under `ROLLOUT_KEY`. The trainer takes it on its main thread
when it scores the rollout (trainer.py `_compute_deferred_scores`): the step recorder (reporting/recorder.py) counts its
timings, policy version and server rows; the producer's own advantages, when it has them (Atropos), replace the ones
axolotl derives from the rewards (`_post_advantage_hook`). The key starts with "_", so axolotl's micro-batches never
carry it (its streaming split skips such keys; the trainer removes it after scoring).

Per-row values stay tensors in the rollout dict itself (e.g. `temperatures`, each sequence's sampling temperature):
axolotl shuffles and splits the rows into micro-batches, and they must follow their rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_plugin.atropos import onpolicy

ROLLOUT_KEY = "_grpo_rollout"
TEMPERATURES = "temperatures"  # per-row sampling temperatures (Atropos): each row is scored at its own


@dataclass(frozen=True)
class PolicyLag:
    """Optimizer steps between the weights that generated a rollout and the weights it trains, as the producer
    knows them (Atropos: from the server's ledger, or a lower bound from when the batch was fetched)."""

    max: int | None
    mean: float | None
    source: str  # "ledger" | "fetch_lower_bound"


@dataclass(frozen=True)
class AtroposBatch:
    """Which run-api batch a rollout is, and what became of its groups."""

    seq: int
    groups: int  # groups kept
    rejected_groups: int  # groups refused (this batch, and batches skipped because every group was refused)
    padding_rows: int  # rows added to fill the step's batch; they train nothing
    queued: int  # batches fetched and waiting


@dataclass
class Rollout:
    wait_ms: float  # how long the trainer waited for it (a prefetched rollout: the wait, not the generation)
    generate_ms: float = 0.0  # how long generating it took (overlapped with training when prefetched)
    policy_version: int | None = None  # the weights that sampled it (its oldest tokens'; None: not known)
    newest_version: int | None = None  # the newest weights that sampled some of it (streaming), else policy_version
    server_rows: list[int] | None = None  # completions each server sampled (several servers)
    advantages: torch.Tensor | None = None  # the producer's own advantages (Atropos); None: axolotl's
    real_rows: int | None = None  # rows with a score, before the padding rows (Atropos)
    lag: PolicyLag | None = None
    batch: AtroposBatch | None = None
    origin: onpolicy.Origin | None = None  # Atropos: which env, group and policy version each real row comes from
    onpolicy: list[onpolicy.EnvCheck] = field(default_factory=list)  # what scoring found (atropos/onpolicy.py)
    by_env: dict[str, dict] | None = None  # Atropos, once scored: each environment's rows and mean reward
    agent: dict | None = None  # a rollout_func's rollout: turns, model / environment tokens (producers/agent.py)
    environments: Any = None  # grpo.environment_factory: the rollout's instances, held until scored (agents/)
    onpolicy_check: Any = None  # a rollout_func's lag-0 logprob check (producers/agent_onpolicy.py), run when scored
    stream: dict | None = None  # streaming's figures for the step (producers/streaming.py stream_fields)
    completion_tokens: int | None = None  # the completions' tokens (single-turn producers)

    @property
    def sampled_up_to(self) -> int | None:
        """The newest version that sampled any of its tokens (a deferred verification of it must finish first)."""
        return self.newest_version if self.newest_version is not None else self.policy_version

    def step_fields(self) -> dict:
        """What this rollout adds to its step's metrics record (grpo_metrics.jsonl)."""
        out: dict = {}
        if self.lag is not None:
            out.update(policy_lag=self.lag.max, policy_lag_mean=self.lag.mean, policy_lag_source=self.lag.source)
        if self.batch is not None:
            out.update(atropos_batch=self.batch.seq, atropos_groups=self.batch.groups,
                       atropos_rejected_groups=self.batch.rejected_groups,
                       atropos_padding_rows=self.batch.padding_rows, atropos_queued=self.batch.queued)
        if self.onpolicy:
            out.update(onpolicy.step_fields(self.onpolicy))
        if self.by_env is not None:
            out["atropos_envs"] = self.by_env
        if self.agent is not None:
            out.update(self.agent)
        if self.stream is not None:
            out.update(self.stream)
        if self.completion_tokens is not None:
            out["completion_tokens"] = self.completion_tokens
        return out

    def add_other_ranks(self, counts: list[tuple[list[int] | None, dict | None]]) -> None:
        """Every trainer rank's `(server_rows, agent)` (this rank's among them, in rank order), so that the step's
        record counts the whole batch, not rank 0's share: counts summed, means and rates averaged (every rank
        makes as many rows)."""
        rows = [r for r, _ in counts if r is not None]
        self.server_rows = [sum(col) for col in zip(*rows)] if rows else None
        agents = [a for _, a in counts if a is not None]
        self.agent = summed_over_ranks(agents) if agents else None

    def scored_rewards(self, data: dict, rewards: torch.Tensor, gather_object=list) -> torch.Tensor:
        """After axolotl computed its advantages (`data["advantages"]`, this rank's rows; `rewards`: every rank's
        rows, as axolotl gathered them): the producer's own replace them (less the groups the on-policy check
        rejects: `gather_object`, a collective, brings every rank's rows to the check), and the rewards of the
        batch's real rows are returned (padding rows have no score)."""
        if self.onpolicy_check is not None:  # a rollout function's lag-0 rows (producers/agent_onpolicy.py)
            self.agent = {**(self.agent or {}), **self.onpolicy_check.apply(data, data["advantages"],
                                                                            self.policy_version, gather_object)}
        if self.advantages is None:
            return rewards
        real = rewards[: self.real_rows]
        if self.origin is not None:
            self.onpolicy = onpolicy.apply(self.origin, data, self.advantages, self.real_rows, gather_object)
            self.by_env = by_env(self.origin.env_ids, real.tolist())
        data["advantages"] = self.advantages
        return real


def by_env(env_ids: list, rewards: list[float]) -> dict[str, dict]:
    """Each environment's rows in a batch and their mean reward, keyed by env_id as text (JSON keys): which
    environment sent what, and which one learns."""
    out: dict[str, list[float]] = {}
    for env, r in zip(env_ids, rewards):
        out.setdefault(str(env), []).append(float(r))
    return {env: {"rows": len(rs), "reward_mean": round(sum(rs) / len(rs), 6)} for env, rs in sorted(out.items())}


def record_of(data: dict) -> Rollout:
    """The rollout's record, kept in `data` under ROLLOUT_KEY by every producer."""
    try:
        return data[ROLLOUT_KEY]
    except KeyError:
        raise KeyError(f"a rollout without its record ({ROLLOUT_KEY}): every producer puts one there") from None


def summed_over_ranks(fields: list[dict]) -> dict:
    """Per-rank figures of one step made into the step's: a `*_mean` or `*_rate` averaged over the ranks, any other
    number summed (a key a rank lacks counts 0 there: a tool only one rank's rollouts called)."""
    keys = list(dict.fromkeys(k for f in fields for k in f))
    out = {}
    for k in keys:
        values = [f.get(k, 0) for f in fields]
        if k.endswith(("_mean", "_rate")):
            out[k] = round(sum(values) / len(fields), 4)
        else:
            out[k] = sum(values)
    return out
