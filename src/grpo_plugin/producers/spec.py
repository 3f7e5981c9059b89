"""What the trainer gives its data producer once, when it builds it (trainer.py `_create_data_producer`), so that a
producer never reads the trainer: the server and who may use it, the tokenizer, the sampling settings, the rank
facts, and the few live values a producer asks for while the run goes on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from accelerate.utils import broadcast_object_list


@dataclass(frozen=True)
class GenerationSpec:
    client: Any  # the vLLM server(s) the trainer talks to (server/connect.py)
    gate: Any  # which weights the server generates with; rollouts lease a version (sync/gate.py)
    guard: Any  # a call that loses the server recovers it, on the main thread (server/recovery.py)
    tokenizer: Any  # the trainer's processing class: decodes what was sampled
    pad_token_id: int
    num_generations: int  # completions per prompt (a group)
    temperature: float | None  # the sampling temperature (TRL's `temperature`)
    sampling: dict[str, Any]  # every generation request's sampling settings (producers/local.py sampling_kwargs)
    tokenize_prompts: Callable[[list], tuple]  # the host's prompt tokenizer (chat template): (ids, images, extra)
    stop_token_ids: tuple[int, ...]  # a completion ending with one of these is complete, not truncated
    mask_truncated: bool  # TRL's mask_truncated_completions: a truncated completion adds nothing to the loss
    shuffle_dataset: bool  # prompts in shuffled order
    scale_rewards: Any  # how group advantages are scaled (TRL's `scale_rewards`: "group", "batch", "none", or a bool)
    vocab_size: int  # rows of the model's input embedding
    device: torch.device  # where the rollout's tensors go
    num_processes: int  # trainer ranks
    gather: Callable[[torch.Tensor], torch.Tensor]  # every rank's value of a tensor, concatenated (a collective)
    gather_object: Callable[[list], list]  # every rank's list of picklable values, concatenated (a collective)
    step: Callable[[], int]  # the trainer's global step, now
    synced_version: Callable[[], int | None]  # the version the server holds, now (sync/session.py)
    add_callback: Callable[[Any], None]  # hooks the training loop (a transformers TrainerCallback)
    process_index: int = 0  # this trainer rank
    broadcast_object: Callable[[Any], Any] = lambda obj: obj  # rank 0's picklable value on every rank (a collective)
    seeds: Any = None  # grpo.seeded_sampling: each prompt's sampling seed (producers/seeds.py PromptSeeds); None: off


def pad_token_id(tokenizer) -> int:
    """The tokenizer's pad token, or its end-of-sequence token when it has none."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def broadcast_from_rank_0(obj: Any) -> Any:
    """Rank 0's `obj` on every trainer rank (accelerate's object broadcast: a collective, main thread only)."""
    return broadcast_object_list([obj], from_process=0)[0]
