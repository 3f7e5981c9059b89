"""`trl.beta > 0`: the KL term to the reference model applies on every step. axolotl's zero-advantage skip
(`trl.skip_zero_advantage_batches`, default true) skips the whole loss of a micro-batch whose advantages are all
zero, the KL term with it; the plugin turns the skip off when beta > 0 (config/defaults.py) and warns when a config
asks for it explicitly. The loss check runs axolotl's own `_compute_loss` on a GRPOPluginTrainer (only the model
forward replaced, as in test_ppo_clip_signs.py)."""

from __future__ import annotations

import logging

import torch

from grpo_plugin.compat.host import host
from grpo_plugin.config.defaults import fill_defaults
from tests.unit.test_ppo_clip_signs import plugin_trainer


def _filled(trl: dict) -> dict:
    cfg = {"trl": dict(trl)}
    fill_defaults(cfg)
    return cfg["trl"]


def test_beta_turns_the_zero_advantage_skip_off_and_an_explicit_skip_is_warned_about(caplog):
    assert _filled({"beta": 0.04})["skip_zero_advantage_batches"] is False
    assert "skip_zero_advantage_batches" not in _filled({"beta": 0.0})  # axolotl's default then
    assert "skip_zero_advantage_batches" not in _filled({})
    with caplog.at_level(logging.WARNING, logger="grpo_plugin"):
        assert _filled({"beta": 0.04, "skip_zero_advantage_batches": True})["skip_zero_advantage_batches"] is True
    assert "skips the whole loss, the KL term included" in caplog.text


def test_with_the_skip_off_a_zero_advantage_micro_batch_still_pulls_towards_the_reference():
    n = 4
    tr = plugin_trainer("grpo")
    tr.beta = 0.1
    tr.args.skip_zero_advantage_batches = _filled({"beta": tr.beta})["skip_zero_advantage_batches"]
    current = torch.full((n, 1), -1.0, requires_grad=True)
    tr._get_per_token_logps_and_entropies = lambda *a, **k: host().logps_result(current, torch.zeros(n, 1))
    inputs = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long), "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        "completion_ids": torch.ones(n, 1, dtype=torch.long), "completion_mask": torch.ones(n, 1, dtype=torch.long),
        "advantages": torch.zeros(n),  # no learning signal from the reward
        "old_per_token_logps": current.detach().clone(),
        "ref_per_token_logps": torch.full((n, 1), -2.0),  # the policy has moved away from the reference
        "importance_sampling_ratio": torch.ones(n, 1),
    }
    loss = tr._compute_loss(None, inputs)
    loss.backward()
    assert not tr._metrics["train"]["skipped_zero_adv_batches"]
    # the KL term's gradient moves the logprob back towards the reference (-2): a positive gradient (descent lowers it)
    assert current.grad is not None and bool((current.grad > 0).all()), current.grad
