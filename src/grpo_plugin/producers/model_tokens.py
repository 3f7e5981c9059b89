"""Length metrics and the token count over the model's own tokens, when a rollout carries a `tool_mask`.

A multi-turn rollout (a rollout_func's `env_mask`, an Atropos sequence with masked turns) holds tokens the model did
not write. They stay in `completion_mask` (the trainer attends to them, as the server did) and are kept out of the
loss by axolotl's `tool_mask`. axolotl's deferred scoring (`_compute_deferred_scores`) computes the completion length
metrics, `num_input_tokens_seen` and the sampling metrics (`sampling/sampling_logp_difference/*`,
`sampling/importance_sampling_ratio/*`) over `completion_mask` alone; TRL counts the model's tokens only (`tool_mask`
1), and an environment token has no sampling logprob to compare. `recount` puts the figures over the model's tokens
in place of the ones axolotl just logged for the step. A collective (`gather`): every rank calls it, on the main
thread, after scoring.
"""

from __future__ import annotations

import torch

LENGTHS = ("mean_length", "min_length", "max_length")
TERMINATED = ("mean_terminated_length", "min_terminated_length", "max_terminated_length")


def recount(metrics: dict, state, data: dict, gather, eos_and_pad: list) -> None:
    """`metrics`: the trainer's `_metrics["train"]`, holding the step's values axolotl appended last; `data`: the
    scored rollout (`completion_mask`, `tool_mask`, `completion_ids`)."""
    mask = data["completion_mask"]
    trained = mask * data["tool_mask"]
    env = gather((mask - trained).sum()).sum()
    lengths = gather(trained.sum(dim=1)).float()
    state.num_input_tokens_seen -= int(env.item())
    metrics["num_tokens"] = [state.num_input_tokens_seen]
    ids, n = data["completion_ids"], mask.sum(dim=1).tolist()  # a row's last real token (not its padding)
    truncated = gather(torch.tensor([k == 0 or int(row[k - 1]) not in eos_and_pad for row, k in zip(ids, n)],
                                    device=ids.device))
    ended = lengths[~truncated] if bool((~truncated).any()) else torch.zeros(1, device=lengths.device)
    for names, values in ((LENGTHS, lengths), (TERMINATED, ended)):
        for name, value in zip(names, (values.mean(), values.min(), values.max())):
            _replace(metrics, f"completions/{name}", value.item())
    if data.get("old_per_token_logps") is None or "sampling_per_token_logps" not in data:
        return
    trained = trained.bool()
    delta = (data["old_per_token_logps"] - data["sampling_per_token_logps"]).abs()[trained]
    none = torch.zeros((), device=delta.device)
    _replace(metrics, "sampling/sampling_logp_difference/mean",
             gather(delta.mean() if delta.numel() else none).mean().item())
    _replace(metrics, "sampling/sampling_logp_difference/max",
             gather(delta.max() if delta.numel() else none).max().item())
    ratio = data.get("importance_sampling_ratio")
    if ratio is not None and ratio.shape == trained.shape and bool(trained.any()):  # token level
        flat = ratio[trained]
        _replace(metrics, "sampling/importance_sampling_ratio/min", gather(flat.min()).min().item())
        _replace(metrics, "sampling/importance_sampling_ratio/mean", gather(flat.mean()).mean().item())
        _replace(metrics, "sampling/importance_sampling_ratio/max", gather(flat.max()).max().item())


def _replace(metrics: dict, name: str, value: float) -> None:
    """The step's value of `name` (axolotl appended it last), when axolotl logged one."""
    series = metrics.get(name)
    if series:
        series[-1] = value
