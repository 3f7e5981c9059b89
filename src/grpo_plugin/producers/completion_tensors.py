"""Pure tensorisation of sampled rollouts into the tensors axolotl's GRPO loss reads."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from trl.trainer.utils import pad


def rollout_tensors(
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    sampling_logprobs: Sequence[Sequence[float]] | None,
    *,
    pad_token_id: int,
    stop_token_ids: Sequence[int] = (),
    mask_truncated: bool = False,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """Left-pad prompts, right-pad completions, build masks and per-token sampling logprobs.

    With `mask_truncated`, completions that do not end in a stop token (cut at max length) get an all-zero
    completion mask, so they contribute nothing to the loss.
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    if sampling_logprobs is not None:
        for i, (c, lp) in enumerate(zip(completion_ids, sampling_logprobs, strict=True)):
            if len(c) != len(lp):
                raise ValueError(f"completion {i}: {len(c)} tokens but {len(lp)} logprobs")
    p = [torch.tensor(list(x), dtype=torch.long, device=device) for x in prompt_ids]
    # an empty completion still occupies one (masked) position so shapes stay valid
    c = [torch.tensor(list(x) or [pad_token_id], dtype=torch.long, device=device) for x in completion_ids]
    cmask = [torch.full((len(x),), int(bool(len(y))), dtype=torch.long, device=device)
             if len(y) else torch.zeros(1, dtype=torch.long, device=device)
             for x, y in zip(c, completion_ids, strict=True)]
    out = {
        "prompt_ids": pad(p, padding_value=pad_token_id, padding_side="left"),
        "prompt_mask": pad([torch.ones_like(x) for x in p], padding_value=0, padding_side="left"),
        "completion_ids": pad(c, padding_value=pad_token_id, padding_side="right"),
        "completion_mask": pad(cmask, padding_value=0, padding_side="right"),
    }
    if mask_truncated:
        stops = set(stop_token_ids)
        truncated = torch.tensor([not ids or ids[-1] not in stops for ids in completion_ids], device=device)
        out["completion_mask"] = out["completion_mask"] * (~truncated).unsqueeze(1).long()
    if sampling_logprobs is not None:
        lps = [torch.tensor(list(x) or [0.0], dtype=torch.float32, device=device) for x in sampling_logprobs]
        out["sampling_per_token_logps"] = pad(lps, padding_value=0.0, padding_side="right")
    return out
