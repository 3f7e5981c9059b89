"""The CPU demo's tool-calling task (`grpo.tools` and `grpo.environment_factory`, docs/agents.md).

The prompt is "key <letters>"; the model may call `lookup()` and then answer. The reward (`answer_matches_tool`)
pays 1 when the final answer is exactly what the last tool call returned, 0.5 when the rollout called the tool and
answered with a digit, 0 otherwise: only a rollout that calls the tool earns anything. `python -m grpo_plugin.demo
--tool-warm-start` teaches the tiny model the call format (it calls in about half its rollouts, and answers with
the tool's digit about as often as by chance: copying it is left to learn); GRPO raises the call rate and the
reward.

- `lookup`: a standalone tool (`grpo.tools: [rewards.toy_tools.lookup]`): a random digit each call.
- `Vault`: an environment (`grpo.environment_factory: rewards.toy_tools.Vault`): `reset()` derives the row's secret
  digit from its key, its `lookup()` method returns it, `get_reward()` pays 1 for having looked.
- `Desk`: an environment with no tools of its own (beside `Vault` in a `{name: path}` factory).
"""

from __future__ import annotations

import random


def lookup() -> str:
    """Look up the number to answer with.

    Returns:
        One digit.
    """
    return str(random.randrange(10))


def _text(message) -> str:
    return str(message.get("content") or "") if isinstance(message, dict) else str(message)


def answer_matches_tool(prompts, completions, **kwargs) -> list[float]:
    """1.0 when the completion's last assistant turn says exactly what its last tool result said; 0.5 when a tool
    answered and the last turn is a digit; else 0.0."""
    out = []
    for messages in completions:
        messages = messages if isinstance(messages, list) else [{"role": "assistant", "content": messages}]
        tool = [_text(m) for m in messages if m.get("role") == "tool"]
        final = _text(messages[-1]).strip() if messages and messages[-1].get("role") == "assistant" else ""
        out.append(0.0 if not tool or len(messages) < 3 else 1.0 if final == tool[-1].strip()
                   else 0.5 if final.isdigit() and len(final) == 1 else 0.0)
    return out


class Vault:
    """One rollout's vault: its number comes from the row's key; looking it up is the only way to know it."""

    def reset(self, prompt=None, **row) -> None:
        key = _text(prompt[-1]) if isinstance(prompt, list) and prompt else str(prompt)
        self.secret = str(sum(map(ord, key)) % 10)
        self.looked = False

    def lookup(self) -> str:
        """Look up the number to answer with.

        Returns:
            One digit.
        """
        self.looked = True
        return self.secret

    def get_reward(self) -> float:
        return 1.0 if self.looked else 0.0


class Desk:
    """An environment without tools of its own: a rollout of it calls the standalone `lookup` (grpo.tools), and it
    owns no reward (the rows of other environments get no `Vault` column). With `{vault: Vault, desk: Desk}` and an
    `environment` column, one run holds both kinds of rollout."""

    def reset(self, **row) -> None:
        return None
