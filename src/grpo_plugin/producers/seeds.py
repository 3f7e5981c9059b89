"""Per-prompt sampling seeds (`grpo.seeded_sampling`).

vLLM draws the tokens of unseeded requests from one generator per engine, in the order of the sequences in each
engine step, and which sequences share a step depends on when their requests arrive: two runs of one config sample
differently from the first draw that lands in another step. A request with its own seed draws from a generator of
its own (vLLM gives the i-th of its `n` samples seed + i), so what it samples does not depend on what else the
engine runs. The seed of a prompt is fixed by the run's `seed`, what the generation is for, the step, the trainer
rank, the prompt's tokens and how often the same prompt came before in the call: the same in every run of the
config, different for every prompt and step.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class PromptSeeds:
    seed: int  # the config's top-level `seed`
    rank: int = 0  # the trainer rank generating

    def __call__(self, purpose: str, step: int, prompts: list[list[int]]) -> list[int]:
        """One seed per prompt of a generation call ("train" or "eval" at optimizer step `step`): 31 bits, so that
        vLLM's seed + sample index stays in range."""
        seen: Counter = Counter()
        out = []
        for p in prompts:
            key = tuple(p)
            text = f"{self.seed}/{purpose}/{step}/{self.rank}/{seen[key]}/" + ",".join(map(str, p))
            seen[key] += 1
            out.append(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big") >> 1)
        return out


def seeded(seeds: PromptSeeds | None, purpose: str, step: int, prompts: list[list[int]]) -> dict[str, list[int]]:
    """`client.generate`'s per-prompt `seeds` for these prompts, or nothing when seeded sampling is off (None)."""
    return {} if seeds is None else {"seeds": seeds(purpose, step, prompts)}
