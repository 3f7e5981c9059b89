"""training/forward.py without a trainer: each row is scored at its own sampling temperature, in one forward when they
share one, else one per temperature (the forward is a stand-in that shows which temperature scored which row)."""

from __future__ import annotations

import pytest
import torch

from grpo_plugin.training.forward import RowScoring


@pytest.mark.parametrize("temps", [None, [0.75, 0.75, 0.75], [1.0, 0.5, 1.0]])
def test_rows_are_scored_at_their_own_temperature(temps):
    model = torch.nn.Module()
    model.get_input_embeddings = lambda: torch.nn.Embedding(4, 2)
    scoring = RowScoring(model)
    assert scoring.fp32
    ids = torch.tensor([[1, 2], [3, 4], [5, 6]])
    calls = []

    def forward(temperature, input_ids, mask):  # logps = token id / temperature, so each row shows its own
        calls.append((temperature, input_ids[:, 0].tolist()))
        t = temperature or 1.0
        return input_ids.float() / t, None, torch.tensor(float(len(input_ids)))

    batch = {} if temps is None else {"temperatures": torch.tensor(temps)}
    with scoring.rows_of(batch):
        logps, _, aux = scoring.by_temperature(forward, ids, torch.ones_like(ids), 2, compute_entropy=False)
    want = ids.float() / torch.tensor(temps or [1.0] * 3).unsqueeze(1)
    assert torch.allclose(logps, want)
    if temps is None or len(set(temps)) == 1:
        assert calls == [(None if temps is None else temps[0], [1, 3, 5])]
        assert aux.item() == 3.0
    else:  # one forward per temperature, aux weighted by its rows
        assert sorted(calls) == [(0.5, [3]), (1.0, [1, 5])] and aux.item() == pytest.approx(1 / 3 + 4 / 3)
