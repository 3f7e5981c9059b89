"""TRL's tool-calling loop (`tools`, `environment_factory`) as the plugin runs it: a rollout function the agent
producer calls like a user's `trl.rollout_func`, so it gets the same pinned weight version for every turn, the same
output checks, env-token masking and metrics.

Per row: the prompt (a list of messages; an environment's `reset()` may extend it) is rendered with the row's tool
schemas; the model's turn is sampled through the plugin's handle (`trainer.grpo_generation`) and read by the
tokenizer's response parser; its tool calls run (agents/tool_calls.py) and their results are appended as the chat
template frames them (tokens the model did not write: `env_mask` 0); the model takes its next turn, until a turn
has no call, `max_tool_calling_iterations` rounds of calls have run, or the completion budget
(`trl.max_completion_length`, every turn and tool result together) would be passed — then the tool results that do
not fit are left out and the row ends with the turn that called them (TRL's rules). A turn cut by the budget ends
its row.

The reward functions get TRL's conversational completions (the assistant turns, with their parsed tool calls, and
the tool messages), the rollout's environment instances as `environments=` (held until they are scored), and per
row `tool_calls`, `tool_failures`, `turns`. Faults are said where they happen: a tool that raises or times out in a
warning per rollout batch with its first error text (and counted apart), tool results left out for the budget in
a count and once in the log; an environment's `reset()` that raises stops the run naming its class and row.
"""

from __future__ import annotations

import sys
from collections import Counter

from grpo_plugin.agents.chat_format import parse_turn, render_prompt, tool_suffix_ids
from grpo_plugin.agents.environments import EnvironmentSet, Held, tool_table
from grpo_plugin.agents.tool_calls import ToolRunner, ToolStats
from grpo_plugin.producers.agent_output import COMPLETIONS_KEY, ENVIRONMENTS_KEY, METRICS_KEY, PROMPTS_KEY


def _row_groups(contexts: list[list[int]], rows: list[int]) -> tuple[list[list[int]], int] | None:
    """(distinct contexts, n) when `rows` are runs of n identical contexts (a first turn without a reset that
    changed the prompt): the server then reads each prompt once; else None."""
    n = 1
    while n < len(rows) and contexts[rows[n]] == contexts[rows[0]]:
        n += 1
    if len(rows) % n:
        return None
    heads = [contexts[r] for r in rows[::n]]
    for k, head in enumerate(heads):
        if any(contexts[r] != head for r in rows[k * n:(k + 1) * n]):
            return None
    return heads, n


def tool_metrics(counts: Counter, rows: int, calls_per_row: list[int], dropped: int = 0) -> dict:
    """The batch's tool metrics: calls (a malformed one included) and failures in all and per tool (of which the
    tool raised, or did not return in time), the share of rows whose turns called a tool, and the rows whose tool
    results were left out because they did not fit the completion budget."""
    def total(tool=None, outcome=None, not_ok=False):
        return sum(v for (t, o), v in counts.items() if (tool is None or t == tool)
                   and (outcome is None or o == outcome) and (not not_ok or o != "ok"))

    out = {"agent_tool_calls": total(), "agent_tool_failures": total(not_ok=True),
           "agent_tool_raised": total(outcome="error"), "agent_tool_timeouts": total(outcome="timeout"),
           "agent_tool_results_dropped": dropped,
           "agent_tool_call_rate": round(sum(1 for c in calls_per_row if c) / max(rows, 1), 4)}
    for tool in sorted({t for t, _ in counts}):
        out[f"agent_tool/{tool}/calls"] = total(tool)
        out[f"agent_tool/{tool}/failures"] = total(tool, not_ok=True)
        out[f"agent_tool/{tool}/raised"] = total(tool, "error")
        out[f"agent_tool/{tool}/timeouts"] = total(tool, "timeout")
    return out


WHAT = {"error": "raised", "timeout": "timed out", "unknown": "named no tool", "malformed": "could not be read"}


def fault_lines(counts: Counter, first: dict) -> list[str]:
    """One line per tool and kind of failure in a batch, with how many and the first error text."""
    return [f"tool {tool}: {counts[(tool, outcome)]} call(s) {WHAT[outcome]} (first: {text})"
            for (tool, outcome), text in sorted(first.items())]


def _say(line: str) -> None:
    print(f"[grpo_plugin] {line}", file=sys.stderr, flush=True)


class ToolLoop:
    """The rollout function of a run with `grpo.tools` and/or `grpo.environment_factory`."""

    takes_rows = True  # the producer passes the dataset rows (reset(**row), the `environment` column)

    def __init__(self, *, tools: list, environments: EnvironmentSet | None, max_iterations: int | None,
                 max_completion_length: int, tool_timeout: float, template_kwargs: dict | None = None):
        self.tools, self.environments = list(tools), environments
        self.max_iterations = max_iterations if max_iterations is not None else 10 ** 9
        self.max_completion_length = max_completion_length
        self.runner = ToolRunner(tool_timeout)
        self.template_kwargs = template_kwargs or {}
        self.__name__ = self.__qualname__ = "tool_loop"
        # what the run's errors call it: the keys the user set, not this class
        self.grpo_label = "grpo.environment_factory" if environments is not None else "grpo.tools"
        self._said_dropped = False

    def __call__(self, prompts: list, trainer, rows: list[dict] | None = None) -> dict:
        bad = next((i for i, p in enumerate(prompts) if not isinstance(p, list)), None)
        if bad is not None:
            raise ValueError(f"grpo.tools / grpo.environment_factory need conversational prompts (a list of "
                             f"messages per row); row {bad}'s prompt is a {type(prompts[bad]).__name__}: "
                             "make the dataset's `prompt` a list like [{'role': 'user', 'content': ...}]")
        rows = rows if rows is not None else [{"prompt": p} for p in prompts]
        envs = self.environments
        if envs is None:
            return self._rollouts(prompts, trainer, rows, None)
        held = envs.take([envs.name_of(r, i) for i, r in enumerate(rows)])
        try:
            out = self._rollouts(prompts, trainer, rows, held)
        except BaseException:
            held.release()
            raise
        out[ENVIRONMENTS_KEY] = held  # the scoring releases them, once the reward functions have read them
        return out

    def _rollouts(self, prompts, trainer, rows, held: Held | None) -> dict:
        tok, gen, envs = trainer.processing_class, trainer.grpo_generation, self.environments
        n = len(prompts)
        names = held.names if held is not None else [None] * n
        instances = held.instances if held is not None else [None] * n
        hung = held.hung if held is not None else [False] * n
        messages = [envs.reset(inst, row, i, list(p)) if envs else list(p)
                    for i, (inst, row, p) in enumerate(zip(instances, rows, prompts))]
        tools = [tool_table(self.tools, inst) for inst in instances]
        prompt_ids = [render_prompt(tok, m, envs.schemas[name] if envs else self.tools, self.template_kwargs)
                      for m, name in zip(messages, names)]
        contexts = [list(p) for p in prompt_ids]
        completion, logprobs, mask = [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)]
        said: list[list[dict]] = [[] for _ in range(n)]
        turns, calls, failures, dropped = [0] * n, [0] * n, [0] * n, 0
        stats = ToolStats()
        active, rounds = list(range(n)), 0
        while active:
            budget = {i: self.max_completion_length - len(completion[i]) for i in active}
            grouped = _row_groups(contexts, active) if rounds == 0 else None
            heads, per = grouped if grouped else ([contexts[i] for i in active], 1)
            samples = [c for g in gen.generate(heads, n=per, max_tokens=max(budget.values())) for c in g]
            wants_tools = []
            for i, sample in zip(active, samples):
                ids, lps = list(sample.token_ids[:budget[i]]), list(sample.logprobs[:budget[i]])
                parsed = parse_turn(tok, ids, contexts[i])
                completion[i] += ids
                logprobs[i] += lps
                mask[i] += [1] * len(ids)
                contexts[i] += ids
                turns[i] += 1
                said[i].append(parsed.message)
                ended = bool(ids) and ids[-1] == tok.eos_token_id  # the turn closed (not cut by the budget)
                if ended and (parsed.calls or parsed.malformed) and rounds < self.max_iterations:
                    wants_tools.append((i, parsed))
            results = self.runner.run([(p.calls, tools[i], p.malformed) for i, p in wants_tools], stats)
            active = []
            for (i, parsed), (tool_messages, row_hung, failed) in zip(wants_tools, results):
                calls[i] += len(parsed.calls)
                failures[i] += failed
                hung[i] = hung[i] or row_hung
                suffix = tool_suffix_ids(tok, tool_messages, self.template_kwargs) if tool_messages else []
                if not suffix or len(completion[i]) + len(suffix) >= self.max_completion_length:
                    dropped += bool(suffix)
                    continue  # the results do not fit: the row ends with the turn that called them
                completion[i] += suffix
                logprobs[i] += [0.0] * len(suffix)
                mask[i] += [0] * len(suffix)
                contexts[i] += suffix
                said[i] += tool_messages
                active.append(i)
            rounds += 1
        counts, first = stats.take()
        for line in fault_lines(counts, first):
            _say(line)
        if dropped and not self._said_dropped:
            self._said_dropped = True
            _say(f"{dropped} rollout(s) ended because their tool results did not fit trl.max_completion_length="
                 f"{self.max_completion_length} (the model never read them; counted per step as "
                 "agent_tool_results_dropped; this is said once)")
        return {"prompt_ids": prompt_ids, "completion_ids": completion, "logprobs": logprobs, "env_mask": mask,
                "tool_calls": calls, "tool_failures": failures, "turns": turns,
                COMPLETIONS_KEY: said, PROMPTS_KEY: messages, METRICS_KEY: tool_metrics(counts, n, calls, dropped)}
