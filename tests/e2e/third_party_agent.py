"""A third-party `trl.rollout_func` as users bring them (tests/e2e/test_agent_train.py): the rollouts of
rewards/toy_agent.py, the first turn through the plugin's handle, the second through the server's OpenAI
completions route the way an OpenAI client configured with the server's address does it: the model is the first
name `/v1/models` lists (the BASE model; NeMo Gym configs name the base model too). In lora_sync that name must
sample the adapter being trained.

From step `OFF_POLICY_FROM` on, its second turn samples at another temperature than the trainer's (an agent with
sampling settings of its own): off-policy, which the plugin's lag-0 check must stop.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import requests

from rewards.toy_agent import TURN_TOKENS, rollouts

OFF_POLICY_FROM = 16  # the optimizer step (trainer.state.global_step) from which turn 2 samples at OFF_TEMPERATURE
OFF_TEMPERATURE = 2.0  # a low one would hardly show on the trained tiny model: its turns are near-certain


def handle_then_openai(prompts: list, trainer) -> dict:
    gen = trainer.grpo_generation
    parts = urlsplit(gen.base_url)
    server = f"{parts.scheme}://{parts.netloc}"  # the server's address, as the agent's own config would name it
    model = requests.get(f"{server}/v1/models", timeout=60).json()["data"][0]["id"]
    off = trainer.state.global_step >= OFF_POLICY_FROM
    calls = {"n": 0}

    def turn(prompt_ids, n):
        calls["n"] += 1
        if calls["n"] == 1:
            return [(c.token_ids, c.logprobs) for g in gen.generate(prompt_ids, n=n, max_tokens=TURN_TOKENS)
                    for c in g]
        reply = requests.post(f"{server}/v1/completions", timeout=300, json={
            "model": model, "prompt": prompt_ids, "n": n, "max_tokens": TURN_TOKENS,
            "temperature": OFF_TEMPERATURE if off else trainer.temperature, "logprobs": 0,
            "return_tokens_as_token_ids": True, "skip_special_tokens": False})
        reply.raise_for_status()
        choices = sorted(reply.json()["choices"], key=lambda c: c["index"])
        return [([int(t.split(":", 1)[1]) for t in c["logprobs"]["tokens"]], list(c["logprobs"]["token_logprobs"]))
                for c in choices]

    return rollouts(prompts, trainer, turn)
