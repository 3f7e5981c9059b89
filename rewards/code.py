"""Code generation: dataset transforms and reward functions, by import path.

    datasets:
      - path: ./data/code/train.jsonl   # {"instruction": ..., "response": ..., "test_cases": ["assert ...", ...]}
        ds_type: json
        split: train
        type: rewards.code_transform      # {"input", "output"} rows: rewards.code_input_output_transform
    trl:
      reward_funcs: [rewards.code.code_execution_reward, rewards.code.soft_format_reward]
      reward_weights: [1.0, 0.1]

Transforms (axolotl dataset-transform factories; top-level names, see rewards/__init__.py):
- `code_transform`: `instruction` (+ optional `system`) -> a chat prompt; a multi-turn row (`follow_up`, with
  `response` as the first answer and `follow_up_response` as the reference) becomes a chat that ends at the
  follow-up. `test_cases` (a list of Python statements, or a JSON string of one) is kept for the reward;
  `response` / `follow_up_response` are kept as `reference` (the dataset check runs them).
- `code_input_output_transform`: the same for `{"input": ..., "output": ...}` rows.
- `code_contest_transform`: competitive-programming rows as APPS, TACO, CodeContests, Codeforces (open-r1) and
  LiveCodeBench store them (grpo_plugin/codedata/contests.py): the statement (+ starter code) as the prompt, the
  stdin/stdout or call-based tests as a JSON column `tests`, the row's time limit per test.
Your own fields: write a factory like these (docs/code.md#your-own-transform).

Rewards (TRL's signature; completions as strings or as chat message lists):
- `code_execution_reward(completions, test_cases=None, tests=None, **kwargs)`: the code is the last fenced
  ```python block of the completion (else the whole completion); the score is the fraction of the row's tests
  that pass — its assert-style `test_cases`, or its stdin/stdout or call-based `tests` — each judged on its own
  in the sandbox (grpo_plugin.sandbox: a kernel jail — namespaces, a separate user, Landlock, seccomp, limits —
  and tests judged in a process of their own, never in the program's). Never raises on bad input:
  a row without tests, or code that does not parse, scores 0.0.
- `code_all_pass_reward(...)`: the same, binary: 1.0 only when every test passes (what many code-RL recipes use).
- `soft_format_reward(completions, **kwargs)`: 1.0 when the completion has a fenced Python block that parses,
  else 0.0.

Sandbox limits from the environment of `axolotl train`: GRPO_SANDBOX_TIMEOUT_S (per test, default 2),
GRPO_SANDBOX_MEMORY_MB (per program, default 2048), GRPO_SANDBOX_WORKERS (programs at once, default: 2 per core
+ 6, at most 5 per core), GRPO_SANDBOX_SCRATCH_MB (each running program's own scratch space, default 64; each file
at most 1 MiB). A row's own time limit (contest rows) replaces the per-test default; GRPO_CODE_MAX_TESTS
(default 32) caps the tests a contest row keeps (public ones first); GRPO_CODE_COMPARE (`tokens`, the default, or
`exact`) and GRPO_CODE_FLOAT_TOL (default 1e-6) set how stdin/stdout outputs are compared (a row's own
`compare`/`tol` win).
"""

from __future__ import annotations

import atexit
import json
import os
import threading

from grpo_plugin.codedata.contests import RowError, parse_row, tests_of
from grpo_plugin.codedata.extract import (
    PYTHON_TAGS,
    as_test_list,
    completion_text,
    extract_code,
    fenced_blocks,
    parses,
)

DEFAULT_SYSTEM_PROMPT = (
    "You are an expert Python programmer. Answer with the complete solution in one ```python code block.")
_MAX_CODE_CHARS = 50_000


# ---- the sandbox, one per process ----------------------------------------------------------------------
_SANDBOX = None
_SANDBOX_LOCK = threading.Lock()


def sandbox():
    """This process's sandbox (started on first use, stopped at exit)."""
    global _SANDBOX
    with _SANDBOX_LOCK:
        if _SANDBOX is None:
            from grpo_plugin.sandbox import Limits, Sandbox

            limits = Limits(wall_s=float(os.environ.get("GRPO_SANDBOX_TIMEOUT_S", 2.0)),
                            memory_mb=int(os.environ.get("GRPO_SANDBOX_MEMORY_MB", 2048)),
                            scratch_mb=int(os.environ.get("GRPO_SANDBOX_SCRATCH_MB", 64)))
            workers = int(os.environ["GRPO_SANDBOX_WORKERS"]) if os.environ.get("GRPO_SANDBOX_WORKERS") else None
            _SANDBOX = Sandbox(limits, workers=workers)
            atexit.register(_SANDBOX.close)
        return _SANDBOX


# ---- rewards ----------------------------------------------------------------------------------------
def run_programs(codes: list[str], tests: list) -> list:
    """Each program's ProgramResult (None without tests, or for code that does not parse: not sent at all)."""
    results: list = [None] * len(codes)
    batch = [(i, code, t) for i, (code, t) in enumerate(zip(codes, tests))
             if t and len(code) <= _MAX_CODE_CHARS and parses(code)]
    if batch:
        from grpo_plugin.sandbox.suites import suite_for

        compare = os.environ.get("GRPO_CODE_COMPARE") or None
        tol = float(os.environ["GRPO_CODE_FLOAT_TOL"]) if os.environ.get("GRPO_CODE_FLOAT_TOL") else None
        suites = [suite_for(code, t, compare, tol) for _, code, t in batch]
        for (i, _, _), res in zip(batch, sandbox().run_suites(suites)):
            results[i] = res
    return results


def _completion_results(completions, test_cases, tests) -> list:
    """The ProgramResult of each completion's code against its row's tests: the contest `tests` column when the
    row has one, else `test_cases` (None: nothing to run)."""
    n = len(completions)

    def column(values):
        return list(values) if isinstance(values, (list, tuple)) and len(values) == n else [None] * n

    rows = [tests_of(t) or as_test_list(a) for a, t in zip(column(test_cases), column(tests))]
    return run_programs([extract_code(c) for c in completions], rows)


def code_execution_reward(completions, test_cases=None, tests=None, **kwargs) -> list[float]:
    """Fraction of the row's tests the completion's code passes (docstring of this module)."""
    return [r.score if r is not None else 0.0 for r in _completion_results(completions, test_cases, tests)]


def code_all_pass_reward(completions, test_cases=None, tests=None, **kwargs) -> list[float]:
    """1.0 when the completion's code passes every one of the row's tests, else 0.0."""
    return [r.all_passed if r is not None else 0.0 for r in _completion_results(completions, test_cases, tests)]


def soft_format_reward(completions, **kwargs) -> list[float]:
    """1.0 for a completion with a fenced Python block that parses, else 0.0."""
    out = []
    for c in completions:
        blocks = [body for tag, body in fenced_blocks(completion_text(c)) if tag in (*PYTHON_TAGS, "")]
        out.append(1.0 if blocks and parses(blocks[-1]) else 0.0)
    return out


# ---- dataset transforms --------------------------------------------------------------------------------
def system_prompt(cfg, dataset_idx: int, default: str = DEFAULT_SYSTEM_PROMPT) -> str:
    """The dataset entry's `system_prompt`, else `default`."""
    if cfg is not None and hasattr(cfg, "get"):
        ds_cfg = (cfg.get("datasets") or [{}])[dataset_idx] or {}
        return ds_cfg.get("system_prompt") or default
    return default


def code_row(example: dict, system: str, prompt_key: str, response_key: str) -> dict:
    """One dataset row -> {prompt (chat), test_cases (JSON list), reference}. Multi-turn rows end at the
    follow-up; the reference is then the follow-up's response."""
    prompt = [{"role": "system", "content": str(example.get("system") or system)},
              {"role": "user", "content": str(example[prompt_key])}]
    reference = example.get(response_key)
    if example.get("follow_up"):
        prompt += [{"role": "assistant", "content": str(example.get(response_key) or "")},
                   {"role": "user", "content": str(example["follow_up"])}]
        reference = example.get("follow_up_response")
    tests = as_test_list(example.get("test_cases"))
    # a JSON string column: one Arrow type whether a row has tests or not; `tests` (contest rows' column) empty, so
    # these rows and code_contest_transform's can be mixed in one run
    return {"prompt": prompt, "test_cases": json.dumps(tests or []), "tests": "", "reference": str(reference or "")}


def _factory(prompt_key: str, response_key: str):
    def factory(cfg=None, dataset_idx: int = 0, **kwargs):
        system = system_prompt(cfg, dataset_idx)

        def transform(example, tokenizer=None):
            return code_row(example, system, prompt_key, response_key)

        drop = [prompt_key, response_key, "follow_up", "follow_up_response", "system"]
        return transform, {"remove_columns": drop}
    return factory


code_transform = _factory("instruction", "response")
code_input_output_transform = _factory("input", "output")


def code_contest_transform(cfg=None, dataset_idx: int = 0, **kwargs):
    """Competitive-programming rows of any shape codedata/contests.py reads -> {prompt, tests, test_cases, reference}.
    A row that cannot be read stops the load with what is wrong (`python -m grpo_plugin.codedata.check FILE` lists
    every such row)."""
    system = system_prompt(cfg, dataset_idx)
    max_tests = int(os.environ.get("GRPO_CODE_MAX_TESTS", 32)) or None

    def transform(example, tokenizer=None):
        try:
            problem = parse_row(dict(example), max_tests=max_tests)
        except RowError as exc:
            head = str(example.get("question") or example.get("description") or example.get("question_content")
                       or example.get("name") or "")[:80]
            raise ValueError(f"rewards.code_contest_transform: {exc} (row {head!r}). List every such row with "
                             "`python -m grpo_plugin.codedata.check FILE`.") from None
        prompt = [{"role": "system", "content": system}, {"role": "user", "content": problem.prompt_text()}]
        return {"prompt": prompt, "tests": json.dumps(problem.tests), "test_cases": "[]",
                "reference": problem.reference or ""}

    return transform, {"remove_columns": "__all__"}


__all__ = ["DEFAULT_SYSTEM_PROMPT", "code_all_pass_reward", "code_contest_transform", "code_execution_reward",
           "code_input_output_transform", "code_transform", "run_programs", "soft_format_reward"]
