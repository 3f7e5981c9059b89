"""Environments (TRL's `environment_factory`): one instance per rollout, its public methods the rollout's tools,
`reset(**row)` before the rollout (a returned string is appended to the prompt's last message), an optional
`get_reward()` after it. Several named environments: the dataset's `environment` column picks each row's.

Instances are built once and reused (reset each time): a batch takes what it needs from the pool, the pool grows
when a batch needs more, and an instance whose tool call hung is dropped (its method may still be running).
`get_reward()` is read when the rollout ends and travels with the row, so a reward computed later (deferred
scoring, a prefetched batch) reads the rollout's own state, not a reused instance's.
"""

from __future__ import annotations

import asyncio
import inspect
import threading

NOT_TOOLS = ("reset", "get_reward")
REWARD_FIELD = "environment_reward"  # per row: (environment class name, get_reward()'s value) or None


def environment_tools(instance) -> list:
    """The instance's tools: its public methods other than reset and get_reward."""
    return [m for name, m in inspect.getmembers(instance, predicate=inspect.ismethod)
            if not name.startswith("_") and name not in NOT_TOOLS]


def tool_table(tools: list, instance) -> dict:
    """A rollout's tools by name: the standalone ones, then its environment's methods (a method replaces a
    standalone tool of the same name)."""
    return {t.__name__: t for t in list(tools) + (environment_tools(instance) if instance is not None else [])}


class EnvironmentSet:
    """The run's environments by name (`None`: the one unnamed environment) and the tools every rollout has."""

    def __init__(self, factories: dict, tools: list):
        self.factories, self.tools = dict(factories), list(tools)
        self.named = None not in self.factories
        self._free: dict = {}
        self._lock = threading.Lock()
        self.schemas: dict = {}  # name -> the tools the chat template shows a rollout of that environment
        self.reward_types: list[type] = []  # classes with get_reward, once each (their reward columns)
        for name, factory in self.factories.items():
            instance = self._build(name, factory)
            self.schemas[name] = list(tool_table(self.tools, instance).values())
            self._free[name] = [instance]
            if callable(getattr(instance, "get_reward", None)) and type(instance) not in self.reward_types:
                self.reward_types.append(type(instance))

    @staticmethod
    def _build(name, factory):
        instance = factory()
        if not callable(getattr(instance, "reset", None)):
            where = f"grpo.environment_factory[{name!r}]" if name is not None else "grpo.environment_factory"
            raise ValueError(f"{where}: {type(instance).__name__} has no reset() method; an environment needs "
                             "reset(**row) (its public methods are the tools, get_reward() is optional)")
        return instance

    def name_of(self, row: dict, i: int):
        if not self.named:
            return None
        name = row.get("environment")
        if name not in self.factories:
            raise ValueError(f"row {i}: environment {name!r} is not one of grpo.environment_factory's "
                             f"({', '.join(map(repr, self.factories))}); each row's `environment` column names one")
        return name

    def take(self, names: list) -> list:
        """One free instance per row (built when the pool has none)."""
        out = []
        for name in names:
            with self._lock:
                free = self._free[name]
                instance = free.pop() if free else None
            out.append(instance if instance is not None else self._build(name, self.factories[name]))
        return out

    def give_back(self, names: list, instances: list, hung: list[bool]) -> None:
        with self._lock:
            for name, instance, bad in zip(names, instances, hung):
                if not bad:
                    self._free[name].append(instance)

    @staticmethod
    def reset(instance, row: dict, named: bool, messages: list[dict]) -> list[dict]:
        """reset(**row) (without `environment` when it picks the environment); a returned observation is appended
        to the prompt's last message, as TRL does."""
        kwargs = {k: v for k, v in row.items() if k != "environment"} if named else dict(row)
        observation = instance.reset(**kwargs)
        if observation is None:
            return messages
        last = messages[-1]
        content = last.get("content")
        if isinstance(observation, list) and isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if isinstance(observation, str) and isinstance(content, list):
            observation = [{"type": "text", "text": observation}]
        return messages[:-1] + [{**last, "content": content + observation}]

    def reward_of(self, instance):
        """(class name, get_reward()) for an environment that owns its reward, else None."""
        if type(instance) not in self.reward_types:
            return None
        value = instance.get_reward()
        if inspect.iscoroutine(value):
            value = asyncio.run(value)
        return type(instance).__name__, value


def reward_function(env_type: type):
    """The reward column of one environment class with get_reward (TRL's: named after the class, weight 1): a
    row of another environment gets None (not scored by it)."""
    name = env_type.__name__

    def environment_reward(prompts=None, completions=None, **kwargs):
        values = kwargs.get(REWARD_FIELD) or [None] * len(completions)
        return [v[1] if isinstance(v, (tuple, list)) and v and v[0] == name else None for v in values]

    environment_reward.__name__ = name
    return environment_reward
