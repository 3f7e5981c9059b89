"""What a `rollout_func` returns, checked and put in the shape the trainer trains on. Pure functions.

TRL's contract (trl 1.14 `GRPOTrainer._generate`): a dict with `prompt_ids`, `completion_ids` and `logprobs`, and
optionally `env_mask` (per completion token: 1 the model wrote it, 0 the environment did: a tool's output, a user
turn) and `logprob_token_ids`; every other key is an extra field handed to the reward functions, one value per row.
Rows: the function gets one prompt per completion to make (each prompt `num_generations` times in a row) and returns
one completion per row. Accepted as well, because agent code written for TRL's other callers returns them:
`prompt_ids` once per distinct prompt (NeMo Gym's rollout function), and each token's logprob as a one-element list
(vLLM's top-k shape, the token's own first).

Every problem is a `RolloutFuncError` naming the row (and its prompt), the field and what was expected: never a shape
error deep inside the loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

REQUIRED = ("prompt_ids", "completion_ids", "logprobs")
NOT_REWARD_FIELDS = ("env_mask", "logprob_token_ids")  # TRL's own keys: not handed to the reward functions
# Keys the plugin's own rollout function (agents/tool_loop.py) adds, taken out before the checks:
COMPLETIONS_KEY = "_grpo_completions"  # the completions as messages, for the reward functions (else decoded)
PROMPTS_KEY = "_grpo_prompts"  # the prompts as the model read them (an environment's reset() may extend them)
METRICS_KEY = "_grpo_agent_metrics"  # the batch's tool metrics, added to the step's record
ENVIRONMENTS_KEY = "_grpo_environments"  # the rollout's environment instances (agents/environments.py Held)
PRIVATE_KEYS = (COMPLETIONS_KEY, PROMPTS_KEY, METRICS_KEY, ENVIRONMENTS_KEY)


class RolloutFuncError(ValueError):
    """A rollout_func failed or returned what the trainer cannot train on; says which row and field."""


@dataclass
class AgentRows:
    """A rollout_func's output, one entry per row, checked."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logprobs: list[list[float]]  # per completion token; env tokens' values are never used
    env_mask: list[list[int]] | None  # per completion token: 1 the model wrote it, 0 the environment did
    extra: dict[str, list] = field(default_factory=dict)  # per-row fields for the reward functions

    def model_mask(self, i: int) -> list[int]:
        return self.env_mask[i] if self.env_mask is not None else [1] * len(self.completion_ids[i])


def _excerpt(prompt, width: int = 60) -> str:
    text = prompt if isinstance(prompt, str) else (prompt[-1].get("content", "") if isinstance(prompt, list) and
                                                   prompt and isinstance(prompt[-1], dict) else repr(prompt))
    text = " ".join(str(text).split())
    return repr(text if len(text) <= width else text[: width - 1] + "…")


def prompt_row(i: int, prompt) -> str:
    """How a message names row `i` of a batch: its index and the start of its prompt."""
    return f"row {i} (prompt {_excerpt(prompt)})"


def row_label(prompts: list, i: int) -> str:
    return prompt_row(i, prompts[i]) if i < len(prompts) else f"row {i}"


def _token_list(value, what: str, vocab_size: int) -> list[int]:
    if not isinstance(value, (list, tuple)):
        raise RolloutFuncError(f"{what} is a {type(value).__name__}, not a list of token ids")
    out = []
    for j, t in enumerate(value):
        if isinstance(t, bool) or not isinstance(t, int):
            try:
                t = int(t)  # numpy / torch integers
            except (TypeError, ValueError):
                raise RolloutFuncError(f"{what}[{j}] = {t!r} is not a token id") from None
        if not 0 <= t < vocab_size:
            raise RolloutFuncError(f"{what}[{j}] = {t} is not a token id (the model has {vocab_size})")
        out.append(t)
    return out


def _logprob(x, what: str) -> float:
    if isinstance(x, (list, tuple)):  # vLLM's top-k shape: the sampled token's logprob first
        if not x:
            raise RolloutFuncError(f"{what} is an empty list")
        x = x[0]
    if x is None:
        return math.nan  # vLLM's NaN; TRL maps it the same way and it corrects nothing
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise RolloutFuncError(f"{what} = {x!r} is not a number") from None
    if v > 1e-6:
        raise RolloutFuncError(f"{what} = {v} is not a log-probability (> 0)")
    return v


def check_output(out, prompts: list, num_generations: int, vocab_size: int) -> AgentRows:
    """`out` as the rollout_func returned it for `prompts` (one per row), checked row by row."""
    if not isinstance(out, dict):
        raise RolloutFuncError(f"returned a {type(out).__name__}; it must return a dict with {list(REQUIRED)}")
    missing = [k for k in REQUIRED if k not in out]
    if missing:
        raise RolloutFuncError(f"returned no {missing} (it must return {list(REQUIRED)}; got {sorted(out)})")
    rows = len(prompts)
    completions = out["completion_ids"]
    if not isinstance(completions, (list, tuple)) or len(completions) != rows:
        got = len(completions) if isinstance(completions, (list, tuple)) else type(completions).__name__
        raise RolloutFuncError(
            f"completion_ids has {got} completions for {rows} prompt rows: one completion per row (each prompt "
            f"comes num_generations={num_generations} times in a row and gets one completion each time)")
    prompt_ids = out["prompt_ids"]
    if isinstance(prompt_ids, (list, tuple)) and num_generations > 1 and len(prompt_ids) * num_generations == rows:
        prompt_ids = [p for p in prompt_ids for _ in range(num_generations)]  # once per distinct prompt
    if not isinstance(prompt_ids, (list, tuple)) or len(prompt_ids) != rows:
        got = len(prompt_ids) if isinstance(prompt_ids, (list, tuple)) else type(prompt_ids).__name__
        raise RolloutFuncError(f"prompt_ids has {got} entries for {rows} prompt rows: one per row (or one per "
                               f"distinct prompt, {rows // max(num_generations, 1)})")
    env_mask = out.get("env_mask")
    if env_mask is not None and (not isinstance(env_mask, (list, tuple)) or len(env_mask) != rows):
        raise RolloutFuncError(f"env_mask must have one list per row ({rows})")
    logprobs = out["logprobs"]
    if not isinstance(logprobs, (list, tuple)) or len(logprobs) != rows:
        raise RolloutFuncError(f"logprobs must have one list per row ({rows})")
    checked = AgentRows([], [], [], [] if env_mask is not None else None)
    for i in range(rows):
        where = row_label(prompts, i)
        p = _token_list(prompt_ids[i], f"{where}: prompt_ids", vocab_size)
        if not p:
            raise RolloutFuncError(f"{where}: prompt_ids is empty")
        c = _token_list(completions[i], f"{where}: completion_ids", vocab_size)
        lp = logprobs[i]
        if not isinstance(lp, (list, tuple)) or len(lp) != len(c):
            n = len(lp) if isinstance(lp, (list, tuple)) else type(lp).__name__
            raise RolloutFuncError(f"{where}: logprobs has {n} values for {len(c)} completion tokens")
        checked.prompt_ids.append(p)
        checked.completion_ids.append(c)
        checked.logprobs.append([_logprob(x, f"{where}: logprobs[{j}]") for j, x in enumerate(lp)])
        if env_mask is not None:
            m = env_mask[i]
            if not isinstance(m, (list, tuple)) or len(m) != len(c):
                n = len(m) if isinstance(m, (list, tuple)) else type(m).__name__
                raise RolloutFuncError(f"{where}: env_mask has {n} values for {len(c)} completion tokens")
            bad = [v for v in m if v not in (0, 1)]
            if bad:
                raise RolloutFuncError(f"{where}: env_mask holds {bad[0]!r}: 1 (the model wrote it) or 0 (the "
                                       "environment did) per token")
            checked.env_mask.append([int(v) for v in m])
    for key, values in out.items():
        if key in REQUIRED or key in NOT_REWARD_FIELDS:
            continue
        if isinstance(values, (list, tuple)):
            if len(values) != rows:
                raise RolloutFuncError(f"extra field {key!r} has {len(values)} values for {rows} rows: one per row "
                                       "(it goes to the reward functions with its row)")
            checked.extra[key] = list(values)
        else:
            checked.extra[key] = [values] * rows
    return checked


def model_turns(mask: list[int]) -> int:
    """Stretches of model tokens in a completion (1s in its env mask): the model's turns."""
    return sum(1 for j, v in enumerate(mask) if v and (j == 0 or not mask[j - 1]))


def stretches(ids: list[int], mask: list[int]) -> list[tuple[int, ...]]:
    """The model's stretches of a completion, as token tuples."""
    out, cur = [], []
    for t, v in zip(ids, mask):
        if v:
            cur.append(t)
        elif cur:
            out.append(tuple(cur))
            cur = []
    if cur:
        out.append(tuple(cur))
    return out


def unknown_model_tokens(rows: AgentRows, generated: list[tuple[int, ...]]) -> int:
    """Model tokens (env mask 1) the plugin's generation handle did not return: a stretch counts as known when it
    is the start of a completion the handle returned (a function may cut a turn at a stop string). Tokens
    generated elsewhere (the OpenAI routes, another server) have no recorded version."""
    unknown = 0
    for i, ids in enumerate(rows.completion_ids):
        for s in stretches(ids, rows.model_mask(i)):
            if not any(g[: len(s)] == s for g in generated):
                unknown += len(s)
    return unknown
