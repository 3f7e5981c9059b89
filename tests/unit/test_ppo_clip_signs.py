"""The clipped surrogate the trainer optimises, checked for all four (advantage sign x ratio side) cases.

PPO's objective per token is min(r·A, clip(r, 1-ε, 1+ε)·A). Its gradient must
  - push a token UP when A > 0 and r < 1-ε (not clipped), and stop when r > 1+ε (clipped);
  - push a token DOWN when A < 0 and r > 1+ε (not clipped), and stop when r < 1-ε (clipped).
Atropos' example trainer takes max(...) for A < 0, which inverts the two negative cases: it stops pushing down a
bad token whose probability already rose past the clip, and keeps pushing down one that already fell below it.
The same check run on it must fail (strict xfail), so this test can tell the two apart.

The trainer's loss is the host's own (axolotl's AsyncGRPOTrainer._compute_loss on TRL's formulas), called on a
GRPOPluginTrainer; only the model forward is replaced by a leaf tensor of logits, so the gradient per token can
be read directly.
"""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from grpo_plugin.compat.host import host

EPS = 0.2
# (advantage, ratio) per sequence, and the expected sign of d(loss)/d(logit of the sampled token):
# negative = gradient descent raises the token's probability, positive = lowers it, 0 = clipped
CASES = [(+1.0, 1.5, 0), (+1.0, 0.5, -1), (-1.0, 1.5, +1), (-1.0, 0.5, 0)]
VOCAB = 5
LABEL = 2


def policy_logits() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(len(CASES), 1, VOCAB, requires_grad=True)


def current_logps(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, dim=-1)[..., LABEL]  # (S, 1)


def logps_for_ratios(logits: torch.Tensor) -> torch.Tensor:
    """Reference logprobs that put each sequence at its case's ratio exp(current - reference)."""
    ratios = torch.tensor([[r] for _, r, _ in CASES])
    return (current_logps(logits).detach() - ratios.log())


def expected_signs() -> list[int]:
    return [s for _, _, s in CASES]


def signs(grad: torch.Tensor) -> list[int]:
    g = grad[:, 0, LABEL]
    return [0 if abs(x) < 1e-9 else int(math.copysign(1, x)) for x in g.tolist()]


def plugin_trainer(loss_type: str):
    from grpo_plugin.trainer import GRPOPluginTrainer

    tr = object.__new__(GRPOPluginTrainer)  # the loss needs these attributes only, not a whole training setup
    tr.args = SimpleNamespace(skip_zero_advantage_batches=True, batch_flattening=False, delta=None)
    tr.loss_type, tr.epsilon_low, tr.epsilon_high, tr.beta = loss_type, EPS, EPS, 0.0
    tr.top_entropy_quantile, tr.off_policy_mask_threshold, tr.importance_sampling_level = 1.0, None, "token"
    tr.use_vllm, tr.vllm_importance_sampling_correction = True, True
    tr.max_completion_length = 1
    tr.aux_loss_enabled = False  # axolotl >= 0.20 reads it (MoE router loss)
    tr.current_gradient_accumulation_steps = 1
    tr.model = torch.nn.Linear(1, 1)  # only `.training` is read
    tr.accelerator = SimpleNamespace(gather=lambda x: x, num_processes=1)
    tr._metrics = defaultdict(lambda: defaultdict(list))
    return tr


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
def test_trainer_loss_pushes_the_right_way_in_all_four_cases(loss_type):
    logits = policy_logits()
    tr = plugin_trainer(loss_type)
    tr._get_per_token_logps_and_entropies = lambda *a, **k: host().logps_result(current_logps(logits),
                                                                                torch.zeros(len(CASES), 1))
    n = len(CASES)
    inputs = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long), "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        "completion_ids": torch.full((n, 1), LABEL), "completion_mask": torch.ones(n, 1, dtype=torch.long),
        "advantages": torch.tensor([a for a, _, _ in CASES]),
        "old_per_token_logps": logps_for_ratios(logits),
        "importance_sampling_ratio": torch.ones(n, 1),
    }
    loss = tr._compute_loss(None, inputs)
    loss.backward()
    assert signs(logits.grad) == expected_signs()
    # and the clipped cases are counted as clipped by the host's metrics
    assert tr._metrics["train"]["clip_ratio/region_mean"] == [pytest.approx(0.5)]


def test_per_token_advantages_reach_the_loss():
    """Env-given per-token advantages (B, T) take the same path: each token is pushed by its own sign."""
    logits = policy_logits()
    tr = plugin_trainer("grpo")
    tr._get_per_token_logps_and_entropies = lambda *a, **k: host().logps_result(current_logps(logits),
                                                                                torch.zeros(len(CASES), 1))
    n = len(CASES)
    inputs = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long), "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        "completion_ids": torch.full((n, 1), LABEL), "completion_mask": torch.ones(n, 1, dtype=torch.long),
        "advantages": torch.tensor([[a] for a, _, _ in CASES]),
        "old_per_token_logps": logps_for_ratios(logits), "importance_sampling_ratio": torch.ones(n, 1),
    }
    tr._compute_loss(None, inputs).backward()
    assert signs(logits.grad) == expected_signs()


@pytest.mark.xfail(strict=True, reason="Atropos example_trainer uses max(r·A, clip(r)·A) for A < 0: the two "
                                       "negative-advantage cases come out inverted")
def test_atropos_example_trainer_loss_fails_the_same_check():
    from example_trainer.training import compute_grpo_loss

    logits = policy_logits()

    class Policy(torch.nn.Module):
        def forward(self, tokens):
            return SimpleNamespace(logits=logits)

    n = len(CASES)
    loss, _ = compute_grpo_loss(
        Policy(), tokens=torch.zeros(n, 1, dtype=torch.long), labels=torch.full((n, 1), LABEL),
        advantages=torch.tensor([[a] for a, _, _ in CASES]), temperatures=torch.ones(n, 1, 1),
        gradient_accumulation_steps=1, inference_logprobs=logps_for_ratios(logits), clip_eps=EPS)
    loss.backward()
    assert signs(logits.grad) == expected_signs()
