"""The logged reward as TRL means it under `reward_weights` (grpo_plugin.reporting.reward_log)."""

from __future__ import annotations

import math

import torch

from grpo_plugin.reporting.reward_log import RewardLog, reward_stats, weighted_rewards

NAN = float("nan")


def test_rewards_are_weighted_and_unscorable_rows_left_out():
    per_func = torch.tensor([[1.0, 1.0], [0.0, 1.0], [NAN, NAN], [1.0, NAN]])
    rewards = weighted_rewards(per_func, torch.tensor([1.0, 0.5]))
    assert rewards[[0, 1, 3]].tolist() == [1.5, 0.5, 1.0]  # a None counts 0 beside a function that scored
    assert math.isnan(rewards[2])  # no function scored it: not a 0 in the mean
    mean, std = reward_stats(rewards)
    assert mean == 1.0 and abs(std - 0.5) < 1e-7  # the sample std of 1.5, 0.5, 1.0


def test_axolotls_figures_are_replaced_batch_for_batch():
    log = RewardLog()
    metrics = {"train": {"reward": [7.0, 2.0], "reward_std": [7.0, 0.0]}}
    log.scored("train", torch.tensor([1.5, 0.5]))
    log.correct(metrics)
    assert metrics["train"]["reward"][0] == 7.0 and metrics["train"]["reward"][1] == 1.0  # earlier entries kept
    assert abs(metrics["train"]["reward_std"][1] - math.sqrt(0.5)) < 1e-7
    log.correct(metrics)  # nothing scored since: nothing changes
    assert metrics["train"]["reward"] == [7.0, 1.0]
