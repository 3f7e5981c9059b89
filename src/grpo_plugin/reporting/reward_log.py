"""The logged `reward` and `reward_std` as TRL means them: the reward functions' sum weighted by `reward_weights`,
over the scorable rows (a row every function returned None for is left out). axolotl's async trainer logs the
unweighted sum (and counts an unscorable row as 0); the plugin's metrics file and summary use the weighted one.
`RewardLog` replaces axolotl's figures with TRL's in the trainer's metrics, one for each batch axolotl scored, so
the step log, `grpo_metrics.jsonl` and the summary say one number."""

from __future__ import annotations

import torch
from trl.trainer.utils import nanstd


def weighted_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each row's reward as TRL computes it: the weighted sum of its functions' rewards (None as 0), NaN where every
    function returned None."""
    rewards = (rewards_per_func * weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return rewards


def reward_stats(rewards: torch.Tensor) -> tuple[float, float]:
    """TRL's logged `reward` and `reward_std` of a batch's rows (weighted_rewards)."""
    return torch.nanmean(rewards).item(), nanstd(rewards).item()


class RewardLog:
    """The figures of each batch axolotl scored (`scored`, from its post-advantage hook, which runs just before it
    appends its own), put in place of axolotl's once it has appended them (`correct`)."""

    def __init__(self):
        self.pending: dict[str, list[tuple[float, float]]] = {}

    def scored(self, mode: str, rewards: torch.Tensor) -> None:
        self.pending.setdefault(mode, []).append(reward_stats(rewards))

    def correct(self, metrics: dict) -> None:
        """Replace the last `reward` / `reward_std` entries of each mode (one per batch scored) with TRL's."""
        for mode, stats in self.pending.items():
            for key, values in (("reward", [m for m, _ in stats]), ("reward_std", [s for _, s in stats])):
                logged = metrics[mode][key]
                if len(logged) >= len(values):
                    logged[len(logged) - len(values):] = values
        self.pending.clear()


__all__ = ["RewardLog", "reward_stats", "weighted_rewards"]
