"""The CPU demo's multi-turn agent, as a TRL `rollout_func` (`trl.rollout_func: rewards.toy_agent.two_turns`).

Each rollout has two model turns with an environment reply between them: the model answers the prompt, the
environment says "again:" (tokens the model did not write: `env_mask` 0, never trained), the model answers once more
seeing its first answer and the reply. The reward (`rewards.toy.digit_reward`) scores the whole completion's text;
the reply holds no digit, so only the model's turns earn it.

Generation goes through the plugin's handle, `trainer.grpo_generation`: token ids in, completions with the server's
sampling logprobs out, sampled by the weights being trained. `two_turns_openai` makes the same rollout through the
server's OpenAI completions route instead (as NeMo Gym's agents do), naming `trainer.grpo_generation.model`.
"""

from __future__ import annotations

import requests

ENV_REPLY = "\nagain: "
TURN_TOKENS = 8  # each model turn's length limit


def _prompt_ids(tokenizer, prompts: list) -> list[list[int]]:
    if isinstance(prompts[0], list):  # chat messages
        return [list(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True)) for p in prompts]
    return [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]


def rollouts(prompts: list, trainer, turn) -> dict:
    """Two turns per row; `turn(prompt_ids, n)` -> (token ids, logprobs) per sample, n per prompt in a row. The
    rows hold each prompt num_generations times in a row: the first turn asks for them together (n per distinct
    prompt: the server reads each prompt once), the second turn per row."""
    tok, g = trainer.processing_class, trainer.num_generations
    prompt_ids = _prompt_ids(tok, prompts)
    reply = tok(ENV_REPLY, add_special_tokens=False)["input_ids"]
    first = turn(prompt_ids[::g], g) if len(prompts) % g == 0 else turn(prompt_ids, 1)
    second = turn([p + ids + reply for p, (ids, _) in zip(prompt_ids, first)], 1)
    out = {"prompt_ids": prompt_ids, "completion_ids": [], "logprobs": [], "env_mask": [], "turns": []}
    for (ids1, lp1), (ids2, lp2) in zip(first, second):
        out["completion_ids"].append(ids1 + reply + ids2)
        out["logprobs"].append(lp1 + [0.0] * len(reply) + lp2)
        out["env_mask"].append([1] * len(ids1) + [0] * len(reply) + [1] * len(ids2))
        out["turns"].append(2)
    return out


def two_turns(prompts: list, trainer) -> dict:
    """One two-turn rollout per prompt row, generated through the plugin's handle."""
    gen = trainer.grpo_generation

    def turn(prompt_ids, n):
        return [(c.token_ids, c.logprobs) for g in gen.generate(prompt_ids, n=n, max_tokens=TURN_TOKENS) for c in g]

    return rollouts(prompts, trainer, turn)


def two_turns_openai(prompts: list, trainer) -> dict:
    """The same rollouts through the server's OpenAI completions route (token ids in, `token_id:<id>` tokens and
    their logprobs out), naming the model the handle says samples the weights being trained."""
    gen = trainer.grpo_generation

    def turn(prompt_ids, n):
        reply = requests.post(f"{gen.base_url}/v1/completions", timeout=300, json={
            "model": gen.model, "prompt": prompt_ids, "n": n, "max_tokens": TURN_TOKENS,
            "temperature": trainer.temperature, "logprobs": 0, "return_tokens_as_token_ids": True,
            "skip_special_tokens": False})
        reply.raise_for_status()
        choices = sorted(reply.json()["choices"], key=lambda c: c["index"])  # prompt i's samples: i*n ... i*n+n-1
        return [([int(t.split(":", 1)[1]) for t in c["logprobs"]["tokens"]], list(c["logprobs"]["token_logprobs"]))
                for c in choices]

    return rollouts(prompts, trainer, turn)
