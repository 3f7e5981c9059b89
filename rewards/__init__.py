"""Reward functions and dataset transforms, named by import path in configs (run from the repo root).

Reward functions may live at any depth (`rewards.gsm8k.accuracy_reward`). Dataset transforms must be named
`<top-level module>.<function>`: axolotl 0.19 resolves `type: a.b.fn` by importing a *top-level* module `b`,
so `rewards.gsm8k.gsm8k_transform` fails while `rewards.gsm8k_transform` works. Transforms are therefore
re-exported here (see docs/rewards.md).
"""

from rewards.code import code_contest_transform, code_input_output_transform, code_transform
from rewards.code_agent import code_agent_transform
from rewards.gsm8k import gsm8k_transform

__all__ = ["code_agent_transform", "code_contest_transform", "code_input_output_transform", "code_transform",
           "gsm8k_transform"]
