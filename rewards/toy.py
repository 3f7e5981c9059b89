"""The CPU demo's task: a reward a freshly initialised tiny model can learn in a few minutes.

Prompts are short random words ("qzkf = "); the reward is the fraction of the completion's characters that
are digits. A random model emits digits ~4% of the time (10 of 259 byte tokens); GRPO pushes that up.
"""

from __future__ import annotations


def _text(completion) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content") or "")
    return ""


def digit_fraction(text: str) -> float:
    return sum(ch.isdigit() for ch in text) / len(text) if text else 0.0


def digit_reward(prompts, completions, **kwargs) -> list[float]:
    """TRL reward signature: one float per completion (plain-text or chat format)."""
    return [digit_fraction(_text(c)) for c in completions]
