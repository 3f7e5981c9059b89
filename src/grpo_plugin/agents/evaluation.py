"""Evaluation of a tool-calling run (`grpo.tools`, `grpo.environment_factory`) on training's rollout path.

TRL evaluates through `_generate_and_score_completions(inputs)`, which calls the trainer's `rollout_func(prompts,
trainer)` with the prompts alone and then decodes the completion ids itself into ONE assistant message. The tool
loop needs more and gives more, so for each evaluation batch `AgentEvaluation`:
- hands the loop the batch's dataset rows, as training does: `reset(**row)` gets every column, a named
  environment is picked by the row's `environment` column;
- gives the reward functions what training gives them: the completions as the loop's messages (the assistant
  turns with their tool calls AND the tool messages), the prompts as the model read them (reset's observation
  included), the rollout's environment instances as `environments=` (held until the batch is scored), and none of
  the loop's private keys;
- logs the loop's tool metrics under TRL's eval prefix (`eval_agent_tool/<name>/calls`, ...).
A user's own `trl.rollout_func` is evaluated as TRL calls it; nothing here changes for it.
"""

from __future__ import annotations

from contextlib import contextmanager

from grpo_plugin.agents.environments import release
from grpo_plugin.producers.agent_output import COMPLETIONS_KEY, ENVIRONMENTS_KEY, METRICS_KEY, PRIVATE_KEYS, PROMPTS_KEY

COMPLETIONS_AT = 3  # TRL's `_generate` returns (prompt_ids, completion_ids, tool_mask, completions, ...)


class AgentEvaluation:
    """`loop`: the run's tool loop (agents/tool_loop.py), or None (nothing to do)."""

    def __init__(self, loop=None):
        self.loop = loop
        self._own: dict | None = None

    @contextmanager
    def batch(self, trainer, inputs: list[dict]):
        """Around TRL's `_generate_and_score_completions` of one evaluation batch."""
        if self.loop is None or trainer.model.training:
            yield
            return
        rows = [dict(x) for x in inputs]
        self._own = {}

        def rollout_func(prompts, view):
            out = self.loop(prompts, view, rows)
            self._own = {k: out.pop(k) for k in PRIVATE_KEYS if k in out}
            held = self._own.get(ENVIRONMENTS_KEY)
            trainer.environments = held.instances if held is not None else None
            return out

        trainer.rollout_func = rollout_func
        try:
            yield
        finally:
            trainer.rollout_func = self.loop
            own, self._own = self._own, None
            trainer.environments = None
            release(own.get(ENVIRONMENTS_KEY))  # scored: the instances go back to the pool
            for key, value in own.get(METRICS_KEY, {}).items():
                trainer._metrics["eval"][key].append(float(value))

    def generated(self, prompts: list, result: tuple) -> tuple:
        """TRL's `_generate` result for `prompts` (the list the rewards will be given), with the loop's completions
        and the prompts as the model read them in place of TRL's decoding."""
        own = self._own
        if not own or COMPLETIONS_KEY not in own:
            return result
        if PROMPTS_KEY in own:
            prompts[:] = own[PROMPTS_KEY]
        return (*result[:COMPLETIONS_AT], own[COMPLETIONS_KEY], *result[COMPLETIONS_AT + 1:])
