"""A code agent with the sandbox as its tool (`grpo.environment_factory: rewards.code_agent.CodeAgent`,
docs/agents.md#a-code-agent).

The model reads a task and its example tests, writes a program, runs it with the `run_tests` tool, reads what
failed, and revises. The tool runs the program in the plugin's sandbox (grpo_plugin.sandbox: a kernel jail, the
same one the code rewards use) against the **example** tests only, and answers with how many passed, the first that
failed and why, and the start of what the program wrote to stderr. The reward (`get_reward`, a reward column named
`CodeAgent`) is the fraction of the **hidden** tests the last program the model ran passes: the hidden tests go to
the sandbox only when the rollout has ended, never in a run the model's program can see or a reply the model reads.

    datasets:
      - path: ./data/code/train.jsonl   # {"instruction": ..., "response": ..., "test_cases": ["assert ...", ...]}
        ds_type: json
        split: train
        type: rewards.code_agent_transform   # the first test visible (GRPO_AGENT_VISIBLE_TESTS), the rest hidden
    grpo:
      environment_factory: rewards.code_agent.CodeAgent
      max_tool_calling_iterations: 4
"""

from __future__ import annotations

import json
import os

from rewards.code import run_programs, system_prompt

SYSTEM_PROMPT = (
    "You are an expert Python programmer. Write the function the task asks for. Call the run_tests tool with your "
    "complete program to run it against the example tests, read what failed, fix it, and run it again. When the "
    "examples pass, answer with the final program in one ```python code block.")
OUTPUT_CHARS = 400  # of the program's stderr, in the tool's reply


def _tests(value) -> list[str]:
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else []
    return [str(t) for t in value or []]


class CodeAgent:
    """One coding task per rollout: `run_tests(code)` is the model's tool, `get_reward()` the hidden tests'
    verdict on the last program it ran."""

    def reset(self, prompt=None, visible_tests="[]", hidden_tests="[]", **row) -> None:
        self.visible, self.hidden = _tests(visible_tests), _tests(hidden_tests)
        self.program: str | None = None
        self.runs = 0

    def run_tests(self, code: str) -> str:
        """Run a Python program against the task's example tests, in a sandbox.

        Args:
            code: The complete Python program: the function the task asks for and everything it needs.

        Returns:
            How many example tests passed, the first one that failed and why, and the start of what the program
            wrote to stderr.
        """
        self.program, self.runs = str(code), self.runs + 1
        if not self.visible:
            return "This task has no example tests to run."
        result = run_programs([self.program], [self.visible])[0]
        if result is None:
            return "The program is not valid Python (it does not parse)."
        lines = [f"{sum(result.passed)} of {len(result.passed)} example tests passed."]
        failed = [(test, detail) for test, ok, detail in zip(self.visible, result.passed, result.detail) if not ok]
        if failed:
            lines.append(f"First failing test: {failed[0][0]}\nResult: {failed[0][1]}")
        if result.output.strip():
            lines.append("The program wrote to stderr:\n" + result.output[:OUTPUT_CHARS])
        return "\n".join(lines)

    def get_reward(self) -> float:
        """The fraction of the hidden tests the last program passes (0 without a program or hidden tests)."""
        if not self.program or not self.hidden:
            return 0.0
        result = run_programs([self.program], [self.hidden])[0]
        return result.score if result is not None else 0.0


def code_agent_transform(cfg=None, dataset_idx: int = 0, **kwargs):
    """Code rows ({"instruction", "test_cases"}, as rewards.code_transform reads them) -> {prompt, visible_tests,
    hidden_tests}: the first GRPO_AGENT_VISIBLE_TESTS tests (default 1) are the examples the prompt shows and the
    tool runs; the rest are hidden (a row with one test keeps it hidden and shows none). A row's `system` column, else
    the dataset entry's `system_prompt`, replaces SYSTEM_PROMPT."""
    visible_count = int(os.environ.get("GRPO_AGENT_VISIBLE_TESTS", 1))
    system = system_prompt(cfg, dataset_idx, SYSTEM_PROMPT)

    def transform(example, tokenizer=None):
        tests = _tests(example.get("test_cases"))
        shown = tests[:visible_count] if len(tests) > visible_count else []
        hidden = tests[len(shown):]
        task = str(example.get("instruction") or example.get("input") or "")
        if shown:
            task += "\n\nExample tests:\n" + "\n".join(shown)
        prompt = [{"role": "system", "content": str(example.get("system") or system)},
                  {"role": "user", "content": task}]
        return {"prompt": prompt, "visible_tests": json.dumps(shown), "hidden_tests": json.dumps(hidden)}

    return transform, {"remove_columns": "__all__"}
