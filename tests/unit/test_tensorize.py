import pytest
import torch

from grpo_plugin.producers.completion_tensors import rollout_tensors


def test_padding_sides_masks_and_logprobs():
    out = rollout_tensors([[1, 2, 3], [4]], [[5, 6], [7, 8, 9]], [[-0.1, -0.2], [-0.3, -0.4, -0.5]],
                          pad_token_id=0)
    assert out["prompt_ids"].tolist() == [[1, 2, 3], [0, 0, 4]]
    assert out["prompt_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert out["completion_ids"].tolist() == [[5, 6, 0], [7, 8, 9]]
    assert out["completion_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    torch.testing.assert_close(out["sampling_per_token_logps"],
                               torch.tensor([[-0.1, -0.2, 0.0], [-0.3, -0.4, -0.5]]))


def test_mask_truncated_zeroes_completions_without_stop_token():
    out = rollout_tensors([[1], [1]], [[5, 99], [5, 6]], None, pad_token_id=0, stop_token_ids=[99],
                          mask_truncated=True)
    assert out["completion_mask"].tolist() == [[1, 1], [0, 0]]
    assert "sampling_per_token_logps" not in out


def test_empty_completion_is_fully_masked():
    out = rollout_tensors([[1, 2]], [[]], [[]], pad_token_id=0)
    assert out["completion_ids"].shape == (1, 1)
    assert out["completion_mask"].tolist() == [[0]]


def test_ragged_logprobs_are_rejected():
    with pytest.raises(ValueError, match="completion 0: 2 tokens but 1 logprobs"):
        rollout_tensors([[1]], [[2, 3]], [[-1.0]], pad_token_id=0)
