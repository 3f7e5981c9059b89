"""The trainer's forward over a rollout's rows, each at its own sampling temperature: the policy logprobs of
deferred scoring and the loss's forward (not reward scoring: that is producers/ and rewards/).

- Per-row temperatures: an Atropos rollout carries each sequence's sampling temperature (`temperatures`). TRL
  divides the logits by the trainer's one `temperature`, so the rows are scored in groups of equal temperature,
  each with the trainer's temperature set to theirs.
- fp32 models: axolotl runs this forward under bf16 autocast whatever the model's dtype (0.19 and 0.21 alike), so
  an fp32 run silently scores and trains in bf16 precision (on the CPU demo its logprobs were 2.3e-3 off a plain
  forward, while vLLM's matched to 1.5e-8). fp32 models are scored by TRL's own implementation, which does not
  autocast (the trainer picks it: `fp32`); others keep axolotl's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from grpo_plugin.producers.rollout import TEMPERATURES

# forward(temperature, input_ids, attention_mask) -> (logps, entropies, aux_loss) of those rows at that temperature
# (None: the trainer's own)
Forward = Callable[[float | None, torch.Tensor, torch.Tensor], tuple]


class RowScoring:
    def __init__(self, model: torch.nn.Module):
        dtype = next(model.get_input_embeddings().parameters()).dtype
        self.fp32 = dtype == torch.float32  # score without axolotl's bf16 autocast
        self._temperatures: torch.Tensor | None = None
        # inside rows_of: the host's scoring or loss is the caller. Outside it, the only caller is TRL's own
        # evaluation path (_generate_and_score_completions), which unpacks 3 values even where the host takes 2
        self.hosts_call = False

    @contextmanager
    def rows_of(self, batch: dict) -> Iterator[None]:
        """Score these rows at their own temperatures (when they carry them)."""
        self._temperatures, self.hosts_call = batch.get(TEMPERATURES), True
        try:
            yield
        finally:
            self._temperatures, self.hosts_call = None, False

    def by_temperature(self, forward: Forward, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       logits_to_keep: int, compute_entropy: bool) -> tuple:
        """(logps, entropies, aux_loss) of every row, each scored at its temperature: one forward for all rows
        when they share one, else one per group of equal temperature (aux_loss weighted by the group's rows)."""
        temps = self._temperatures
        values = torch.unique(temps) if temps is not None and temps.numel() == input_ids.size(0) else None
        if values is None or values.numel() == 1:
            return forward(None if values is None else float(values[0]), input_ids, attention_mask)
        logps = torch.zeros(input_ids.size(0), logits_to_keep, device=input_ids.device)
        entropies = torch.zeros_like(logps) if compute_entropy else None
        aux_losses = []
        for value in values.tolist():
            rows = torch.nonzero(temps == value).flatten().to(input_ids.device)
            lp, ent, aux = forward(value, input_ids[rows], attention_mask[rows])
            logps = logps.to(lp.dtype).index_copy(0, rows, lp)
            if compute_entropy:
                entropies = entropies.to(ent.dtype).index_copy(0, rows, ent)
            if aux is not None:
                aux_losses.append(aux * rows.numel() / input_ids.size(0))
        return logps, entropies, sum(aux_losses) if aux_losses else None
