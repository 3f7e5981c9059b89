"""An Atropos environment written the way the Atropos project writes its own (modelled on atropos's
`environments/gsm8k_server.py`): a `BaseEnv` subclass with `config_init`, `setup`, `get_next_item`,
`collect_trajectories` and `score`, scores from a reward, groups whose scores are all equal dropped (they teach
nothing), and nothing from the grpo_plugin. It generates by one of three routes, picked by `--env.route`:

- `managed_chat`: `self.server.managed_server(...)` + `chat_completion` (chat messages through the tokenizer's chat
  template; tokens, masks and logprobs tracked by atroposlib);
- `managed_completion`: the same with `completion` on the raw prompt;
- `openai`: the plain OpenAI completions API (`self.server.completion`, which names the BASE model as envs do) with
  `logprobs` and vLLM's `return_token_ids`, the env building tokens, masks and `inference_logprobs` itself.

Used by tests/e2e/test_atropos_train.py through `python -m grpo_plugin.atropos.launch` (its `envs:` entry runs
`python -m tests.e2e.third_party_env serve ...` from the repo root).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from pydantic import Field

from rewards.toy import digit_fraction

ROUTES = ("managed_chat", "managed_completion", "openai")


class DigitsConfig(BaseEnvConfig):
    data_path: str = Field(default="", description="JSONL with one {\"prompt\": str} per line")
    route: str = Field(default="managed_completion", description=f"one of {ROUTES}")
    max_tokens: int = Field(default=16)
    temperature: float = Field(default=1.0)


class DigitsEnv(BaseEnv):
    name = "digits"
    env_config_cls = DigitsConfig

    @classmethod
    def config_init(cls) -> tuple[DigitsConfig, list[APIServerConfig]]:
        env = DigitsConfig(group_size=8, use_wandb=False, wandb_name=cls.name, total_steps=-1,
                           max_num_workers_per_node=4, steps_per_eval=10**9, include_messages=False)
        server = APIServerConfig(model_name="model", base_url="http://127.0.0.1:8001/v1", api_key="none",
                                 server_type="vllm", num_requests_for_eval=0)
        return env, [server]

    async def setup(self) -> None:
        if self.config.route not in ROUTES:
            raise ValueError(f"--env.route {self.config.route!r}: one of {ROUTES}")
        lines = Path(self.config.data_path).read_text().splitlines()
        self.prompts = [json.loads(x)["prompt"] for x in lines if x.strip()]
        self.rng = random.Random(0)

    async def get_next_item(self) -> str:
        return self.rng.choice(self.prompts)

    async def collect_trajectories(self, item: str) -> tuple[ScoredDataGroup | None, list]:
        n, max_tokens, temperature = self.config.group_size, self.config.max_tokens, self.config.temperature
        if self.config.route == "openai":
            return self.score(item, await self._openai(item, n, max_tokens, temperature)), []
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            if self.config.route == "managed_chat":
                await managed.chat_completion(messages=[{"role": "user", "content": item}], n=n,
                                              max_tokens=max_tokens, temperature=temperature)
            else:
                await managed.completion(prompt=item, n=n, max_tokens=max_tokens, temperature=temperature)
            nodes = managed.get_state()["nodes"]
        rollouts = []
        for node in nodes:
            start = next((i for i, m in enumerate(node.masked_tokens) if m != -100), len(node.tokens))
            rollouts.append((node.tokens, node.masked_tokens, node.logprobs,
                             self.tokenizer.decode(node.tokens[start:], skip_special_tokens=True)))
        return self.score(item, rollouts), []

    async def _openai(self, item: str, n: int, max_tokens: int, temperature: float) -> list[tuple]:
        """/v1/completions: the server's own token ids (vLLM's return_token_ids) and sampled logprobs, so the tokens
        trained are the tokens sampled (re-tokenizing the text may not give them back)."""
        reply = await self.server.completion(prompt=item, n=n, max_tokens=max_tokens, temperature=temperature,
                                             logprobs=0, extra_body={"return_token_ids": True})
        rollouts = []
        for choice in reply.choices:
            extra = choice.model_extra or {}
            prompt_ids, ids = list(extra["prompt_token_ids"]), list(extra["token_ids"])
            logprobs = list(choice.logprobs.token_logprobs)
            rollouts.append((prompt_ids + ids, [-100] * len(prompt_ids) + ids, [1.0] * len(prompt_ids) + logprobs,
                             choice.text))
        return rollouts

    def score(self, item: str, rollouts: list[tuple]) -> ScoredDataGroup | None:
        scores = [digit_fraction(text) for *_, text in rollouts]
        if len(set(scores)) == 1:  # as atropos's own environments do: an all-equal group teaches nothing
            return None
        return ScoredDataGroup(tokens=[r[0] for r in rollouts], masks=[r[1] for r in rollouts],
                               inference_logprobs=[r[2] for r in rollouts], scores=scores,
                               generation_params={"temperature": self.config.temperature})

    async def evaluate(self, *args, **kwargs) -> None:
        return None


if __name__ == "__main__":
    DigitsEnv.cli()
