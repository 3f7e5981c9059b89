"""The post-sync probe: does the server compute the same logprobs as the trainer?

After every weight push the trainer asks the server for the logprobs of a fixed token sequence and compares
them with its own forward pass. HTTP 200 proves nothing (on vLLM-CPU several sync paths answer 200 and leave
wrong weights); this measurement does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class SyncVerificationError(RuntimeError):
    """The server's weights after a sync do not match the trainer's."""


def token_logprobs(model: torch.nn.Module, token_ids: Sequence[int], temperature: float = 1.0) -> list[float]:
    """log p(token_t | tokens_<t) for t = 1..len-1, from one forward pass in eval mode (no dropout), with the
    logits divided by `temperature` as TRL does."""
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        ids = torch.tensor([list(token_ids)], device=device)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1].float() / temperature
        lp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:].unsqueeze(1)).squeeze(1)
        return lp.cpu().tolist()
    finally:
        model.train(was_training)


def logprob_diff(server: Sequence[float], trainer: Sequence[float]) -> tuple[float, float]:
    """(mean, max) of |server - trainer| over the probe tokens."""
    if len(server) != len(trainer) or not server:
        raise SyncVerificationError(
            f"probe length mismatch: server gave {len(server)} logprobs, trainer {len(trainer)}"
        )
    d = (torch.tensor(server, dtype=torch.float64) - torch.tensor(trainer, dtype=torch.float64)).abs()
    if not torch.isfinite(d).all():
        return float("inf"), float("inf")
    return d.mean().item(), d.max().item()


def check(mean_diff: float, tolerance: float, *, mode: str, step: int, detail: str = "") -> None:
    if not mean_diff <= tolerance:  # also catches NaN
        raise SyncVerificationError(
            f"grpo.sync={mode}: weight sync at step {step} did NOT take effect on the vLLM server: "
            f"mean |logprob_server - logprob_trainer| = {mean_diff:.3g} > tolerance {tolerance:.3g} on the "
            f"probe sequence. The server is generating with different weights than the trainer holds. "
            f"{detail}".strip()
        )
