"""Putting the tool-calling loop on the trainer, in two steps around the host trainer's construction:
- `environment_rewards`, before it: the environments (built and probed once), and each environment class with
  `get_reward()` added to the run's reward functions as a column named after the class, weight 1 (TRL's rule;
  TRL refuses a run without a reward source, so a run whose only reward is an environment's needs it there);
- `attach`, once it is built: the loop becomes the trainer's `rollout_func` (the agent producer and TRL's
  evaluation call it)."""

from __future__ import annotations

from grpo_plugin.agents.chat_format import ensure_response_parser
from grpo_plugin.agents.environments import EnvironmentSet, reward_function
from grpo_plugin.agents.tool_loop import ToolLoop
from grpo_plugin.config.import_paths import import_callable


def _tools(settings) -> list:
    return [import_callable(path) for path in settings.tools]


def environment_rewards(settings, trainer_args: tuple, trainer_kwargs: dict) -> tuple[tuple, EnvironmentSet | None]:
    """With grpo.environment_factory: its EnvironmentSet, and its reward columns added to the host trainer's
    `reward_funcs` (and to `args.reward_weights` when the config sets weights); else None. Returns the host
    trainer's positional arguments (axolotl passes `reward_funcs` second: it moves into the keywords)."""
    factory = settings.environment_factory
    if not factory:
        return trainer_args, None
    if len(trainer_args) > 1:  # GRPOTrainer(model, reward_funcs, ...): axolotl's builder passes both by position
        trainer_kwargs["reward_funcs"] = trainer_args[1]
        trainer_args = (trainer_args[0], *trainer_args[2:])
    factories = ({name: import_callable(path) for name, path in factory.items()} if isinstance(factory, dict)
                 else {None: import_callable(factory)})
    environments = EnvironmentSet(factories, _tools(settings))
    columns = [reward_function(t, environments) for t in environments.reward_types]
    if columns:
        funcs = trainer_kwargs.get("reward_funcs") or []
        trainer_kwargs["reward_funcs"] = [*(funcs if isinstance(funcs, list) else [funcs]), *columns]
        args = trainer_kwargs["args"]
        if getattr(args, "reward_weights", None) is not None:
            args.reward_weights = [*args.reward_weights, *[1.0] * len(columns)]
        classes = trainer_kwargs.get("reward_processing_classes")
        if isinstance(classes, list):
            trainer_kwargs["reward_processing_classes"] = [*classes, *[None] * len(columns)]
    return trainer_args, environments


def attach(trainer, settings, environments: EnvironmentSet | None) -> ToolLoop | None:
    """With grpo.tools or grpo.environment_factory: the loop, set as `trainer.rollout_func`; else None."""
    if not settings.tools and environments is None:
        return None
    ensure_response_parser(trainer.processing_class)
    loop = ToolLoop(tools=environments.tools if environments else _tools(settings), environments=environments,
                    max_iterations=settings.max_tool_calling_iterations,
                    max_completion_length=trainer.max_completion_length, tool_timeout=settings.tool_timeout)
    trainer.rollout_func = loop
    return loop
