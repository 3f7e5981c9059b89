"""Putting the tool-calling loop on the trainer: the loop becomes the trainer's `rollout_func` (the agent producer
and TRL's evaluation call it), and each environment class with `get_reward()` becomes a reward column (TRL's: named
after the class, weight 1)."""

from __future__ import annotations

import torch

from grpo_plugin.agents.chat_format import ensure_response_parser
from grpo_plugin.agents.environments import EnvironmentSet, reward_function
from grpo_plugin.agents.tool_loop import ToolLoop
from grpo_plugin.config.preflight import import_callable


def attach(trainer, settings) -> ToolLoop | None:
    """With grpo.tools or grpo.environment_factory: the loop, set as `trainer.rollout_func`; else None."""
    if not settings.tools and not settings.environment_factory:
        return None
    tools = [import_callable(path) for path in settings.tools]
    factory = settings.environment_factory
    factories = ({name: import_callable(path) for name, path in factory.items()} if isinstance(factory, dict)
                 else {None: import_callable(factory)} if factory else {})
    environments = EnvironmentSet(factories, tools) if factories else None
    ensure_response_parser(trainer.processing_class)
    loop = ToolLoop(tools=tools, environments=environments, max_iterations=settings.max_tool_calling_iterations,
                    max_completion_length=trainer.max_completion_length, tool_timeout=settings.tool_timeout)
    for env_type in environments.reward_types if environments else ():
        trainer.reward_funcs.append(reward_function(env_type))
        trainer.reward_func_names.append(env_type.__name__)
        trainer.reward_processing_classes.append(None)
        trainer.reward_weights = torch.cat([trainer.reward_weights, torch.ones(1, dtype=trainer.reward_weights.dtype)])
    if not trainer.reward_funcs:
        raise ValueError("grpo.environment_factory: no reward source: set trl.reward_funcs, or give the environment "
                         "a get_reward() method")
    trainer.rollout_func = loop
    return loop
