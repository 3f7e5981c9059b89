"""Runs inside the async benchmark's vLLM server (`--logits-processors grpo_plugin.bench.tail_lengths:TailLengths`):
it decides where each completion ends, so that completion lengths are heavy-tailed as an agent's are (most short,
a few many times the median), whatever the model.

Each completion's length is drawn when its request starts: Lomax, P(length > t) = (c / (t + c)) ** alpha, with
median `median` (about 5% run past 10x the median at alpha 1.5). A continuation (producers/inflight.py: the
request's prompt holds the m tokens sampled so far) draws what is left from the same law given length > m, which is
Lomax again with scale c + m: continued completions keep the length distribution. The end is the end-of-sequence
token forced at the drawn length; before it, that token is forbidden (the model never ends by itself).

Where a completion starts inside a request's prompt (a continuation's prompt holds what was sampled so far) is
found by `marker`: the token ids every original prompt ends with (the chat template's assistant header).

Configured by the environment variable GRPO_BENCH_TAIL (JSON: marker, eos, median, alpha). The server runs with
`--logprobs-mode raw_logprobs`: the logprobs it returns are the model's own, so the trainer's importance ratio sees
the model, not this processor (an environment that ends a rollout, not a policy).
"""

from __future__ import annotations

import json
import math
import os
import random

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

ENV = "GRPO_BENCH_TAIL"


def lomax_c(median: float, alpha: float) -> float:
    """The scale c of a Lomax length whose median is `median`."""
    return median / (2 ** (1 / alpha) - 1)


def remaining_length(u: float, done: int, alpha: float, c: float) -> int:
    """Tokens left for a completion `done` tokens long, drawn (u uniform in (0, 1]) from its Lomax length given that
    it is longer than `done` (at least 1: the end-of-sequence token)."""
    return max(1, math.ceil((c + done) * (u ** (-1 / alpha) - 1)))


def completion_start(prompt: list[int], marker: list[int]) -> int:
    """Where the completion starts in `prompt` (a continuation's prompt holds the start of the completion): just past
    the last `marker` in it; its end if there is none."""
    m = len(marker)
    for i in range(len(prompt) - m, -1, -1):
        if prompt[i:i + m] == marker:
            return i + m
    return len(prompt)


class TailLengths(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        cfg = json.loads(os.environ[ENV])
        self.marker, self.eos = list(cfg["marker"]), int(cfg["eos"])
        self.alpha = float(cfg.get("alpha", 1.5))
        self.c = lomax_c(float(cfg.get("median", 16)), self.alpha)
        self.rows: dict[int, tuple[int, list[int]]] = {}  # batch index -> (tokens left at the start, output ids)
        self.rng = random.Random()

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, _params, prompt, output in batch_update.added:
            prompt = list(prompt or [])
            done = len(prompt) - completion_start(prompt, self.marker)
            self.rows[index] = (remaining_length(1.0 - self.rng.random(), done, self.alpha, self.c), output)
        for a, b, direction in batch_update.moved:
            moved_a, moved_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if moved_a is not None:
                self.rows[b] = moved_a
            if moved_b is not None and direction.name == "SWAP":
                self.rows[a] = moved_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (left, output) in self.rows.items():
            if index >= logits.shape[0]:
                continue
            if len(output) + 1 >= left:
                logits[index, :] = float("-inf")
                logits[index, self.eos] = 0.0
            else:
                logits[index, self.eos] = float("-inf")
        return logits
