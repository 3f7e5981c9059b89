"""Environments (TRL's `environment_factory`): one instance per rollout, its public methods the rollout's tools,
`reset(**row)` before the rollout (a returned string is appended to the prompt's last message), an optional
`get_reward()` after it. Several named environments: the dataset's `environment` column picks each row's.

Instances are built once and reused (reset each time): a batch takes what it needs from the pool, the pool grows
when a batch needs more, and an instance whose tool call hung is dropped (its method may still be running).
A rollout's instances stay its own until its rewards are computed (`Held`: the reward functions get them as
`environments=`, in row order, as TRL passes them; an environment's `get_reward()` is read then), and go back to
the pool after that, so a prefetched rollout never resets an instance a rollout waiting to be scored still holds.

A fault in an environment's own code (`reset`, `get_reward`) stops the run with an `AgentFault` naming the class,
the method and the row.
"""

from __future__ import annotations

import inspect
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

from grpo_plugin.agents.tool_calls import awaited
from grpo_plugin.producers.agent_output import RolloutFuncError, prompt_row, row_label

NOT_TOOLS = ("reset", "get_reward")


class AgentFault(RolloutFuncError):
    """An environment's or a tool's own code failed where the run cannot go on (reset, get_reward): names the
    class, the method and the row."""


def environment_tools(instance) -> list:
    """The instance's tools: its public methods other than reset and get_reward."""
    return [m for name, m in inspect.getmembers(instance, predicate=inspect.ismethod)
            if not name.startswith("_") and name not in NOT_TOOLS]


def tool_table(tools: list, instance) -> dict:
    """A rollout's tools by name: the standalone ones, then its environment's methods (a method replaces a
    standalone tool of the same name)."""
    return {t.__name__: t for t in list(tools) + (environment_tools(instance) if instance is not None else [])}


@dataclass
class Held:
    """A rollout's environment instances (one per row, None for a row without one), held until its rewards are
    computed; `release()` (once, from any thread) gives them back to the pool."""

    owner: EnvironmentSet
    names: list
    instances: list
    hung: list[bool]
    _released: bool = field(default=False, repr=False)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.owner.give_back(self.names, self.instances, self.hung)


class EnvironmentSet:
    """The run's environments by name (`None`: the one unnamed environment) and the tools every rollout has."""

    def __init__(self, factories: dict, tools: list):
        self.factories, self.tools = dict(factories), list(tools)
        self.named = None not in self.factories
        self._free: dict = {}
        self._lock = threading.Lock()
        self._hung: dict[int, object] = {}  # id -> an instance whose tool call hung (kept: its id stays its own)
        self.schemas: dict = {}  # name -> the tools the chat template shows a rollout of that environment
        self.reward_types: list[type] = []  # classes with get_reward, once each (their reward columns)
        for name, factory in self.factories.items():
            instance = self._build(name, factory)
            self.schemas[name] = list(tool_table(self.tools, instance).values())
            self._free[name] = [instance]
            if callable(getattr(instance, "get_reward", None)) and type(instance) not in self.reward_types:
                self.reward_types.append(type(instance))

    def where(self, name) -> str:
        return f"grpo.environment_factory[{name!r}]" if name is not None else "grpo.environment_factory"

    def _build(self, name, factory):
        try:
            instance = factory()
        except Exception as exc:
            raise AgentFault(f"{self.where(name)}: building {getattr(factory, '__qualname__', factory)!s}() raised "
                             f"{type(exc).__name__}: {exc}") from exc
        if not callable(getattr(instance, "reset", None)):
            raise ValueError(f"{self.where(name)}: {type(instance).__name__} has no reset() method; an environment "
                             "needs reset(**row) (its public methods are the tools, get_reward() is optional)")
        return instance

    def name_of(self, row: dict, i: int):
        if not self.named:
            return None
        name = row.get("environment")
        if name not in self.factories:
            raise ValueError(f"row {i}: environment {name!r} is not one of grpo.environment_factory's "
                             f"({', '.join(map(repr, self.factories))}); each row's `environment` column names one")
        return name

    def take(self, names: list) -> Held:
        """One free instance per row (built when the pool has none), held for the rollout."""
        out = []
        for name in names:
            with self._lock:
                free = self._free[name]
                instance = free.pop() if free else None
            out.append(instance if instance is not None else self._build(name, self.factories[name]))
        return Held(self, list(names), out, [False] * len(names))

    def give_back(self, names: list, instances: list, hung: list[bool]) -> None:
        with self._lock:
            for name, instance, bad in zip(names, instances, hung):
                if bad:
                    self._hung[id(instance)] = instance
                else:
                    self._free[name].append(instance)

    def hung(self, instance) -> bool:
        """Whether a tool call of this instance's never returned (its get_reward() may wait on it: not read)."""
        return id(instance) in self._hung

    def reset(self, instance, row: dict, i: int, messages: list[dict]) -> list[dict]:
        """reset(**row) (without `environment` when it picks the environment); a returned observation is appended
        to the prompt's last message, as TRL does."""
        kwargs = {k: v for k, v in row.items() if k != "environment"} if self.named else dict(row)
        try:
            observation = awaited(instance.reset(**kwargs))
        except Exception as exc:
            name = row.get("environment") if self.named else None
            raise AgentFault(f"{self.where(name)}: {type(instance).__name__}.reset() raised {type(exc).__name__}: "
                             f"{exc} on {prompt_row(i, messages)} (its columns: {sorted(kwargs)})") from exc
        if observation is None:
            return messages
        last = messages[-1]
        content = last.get("content")
        if isinstance(observation, list) and isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if isinstance(observation, str) and isinstance(content, list):
            observation = [{"type": "text", "text": observation}]
        return messages[:-1] + [{**last, "content": content + observation}]


def reward_function(env_type: type, pool: EnvironmentSet | None = None):
    """The reward column of one environment class with get_reward (TRL's: named after the class, weight 1): each
    row's own instance's `get_reward()` (the `environments=` TRL passes, in row order); a row of another
    environment gets None (not scored by it), and so does one whose tool call hung (`pool` knows which)."""
    name = env_type.__name__

    def get_reward(environments=None, prompts=None, **kwargs):
        if environments is None:
            raise AgentFault(f"the {name} reward column got no environments: it is read while a rollout of "
                             "grpo.environment_factory is scored")
        out = []
        for i, env in enumerate(environments):
            if type(env) is not env_type or (pool is not None and pool.hung(env)):
                out.append(None)
                continue
            try:
                out.append(awaited(env.get_reward()))
            except Exception as exc:
                where = row_label(prompts, i) if prompts is not None else f"row {i}"
                raise AgentFault(f"grpo.environment_factory: {name}.get_reward() raised {type(exc).__name__}: {exc} "
                                 f"on {where}") from exc
        return out

    get_reward.__name__ = get_reward.__qualname__ = name
    return get_reward


def release(held: Held | None) -> None:
    """A rollout's instances back to the pool (a rollout never scored, or scored)."""
    if held is not None:
        held.release()


@contextmanager
def lent(trainer, held: Held | None):
    """A rollout's instances as `trainer.environments` while its rewards are computed (TRL's `_calculate_rewards`
    passes them to every reward function as `environments=`); back to the pool afterwards."""
    if held is None:
        yield
        return
    trainer.environments = held.instances
    try:
        yield
    finally:
        trainer.environments = None
        held.release()
