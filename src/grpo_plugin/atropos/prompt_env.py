"""An Atropos environment (atroposlib BaseEnv): prompts from a JSONL file, completions sampled on the
grpo_plugin's vLLM server, scored by a TRL-style reward function named by import path — the same functions
local GRPO runs use (`rewards.toy.digit_reward`, `rewards.gsm8k.accuracy_reward`, ...).

Completions are generated through atroposlib's ManagedServer with `server_type: vllm`, i.e. the server's
`/generate` route (in_vllm/routes.py): every group carries token ids, masks and the sampling logprobs
(`inference_logprobs`) the trainer's importance-sampling correction needs, and `generation_params.temperature`.

Run it (from the repo root, so `rewards.*` import; `python -m grpo_plugin.atropos.launch` does this for you):

    python -m grpo_plugin.atropos.prompt_env serve \\
        --env.data_path demo/data/digits.jsonl --env.reward rewards.toy.digit_reward \\
        --env.tokenizer_name demo/tiny-qwen2 --env.rollout_server_url http://127.0.0.1:8000 \\
        --openai.base_url http://127.0.0.1:8001/v1 --openai.model_name demo/tiny-qwen2 \\
        --openai.tokenizer_name demo/tiny-qwen2 --openai.server_type vllm --openai.api_key none
"""

from __future__ import annotations

import importlib
import json
import random
from pathlib import Path

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from pydantic import Field


class PromptEnvConfig(BaseEnvConfig):
    data_path: str = Field(default="", description="JSONL file with one {\"prompt\": str} object per line.")
    reward: str = Field(default="rewards.toy.digit_reward",
                        description="Import path of a TRL-style reward function f(prompts, completions, **kw).")
    max_tokens: int = Field(default=16, description="Most tokens sampled per completion.")
    temperature: float = Field(default=1.0, description="Sampling temperature (sent with each group).")
    seed: int = Field(default=0, description="Seed of the prompt order.")


def load_reward(path: str):
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"--env.reward {path!r}: expected an import path like rewards.toy.digit_reward")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--env.reward {path!r} cannot be imported ({exc}); run from the directory that holds "
                         f"`{module.split('.')[0]}`") from exc


class PromptRewardEnv(BaseEnv):
    name = "prompt_reward"
    env_config_cls = PromptEnvConfig

    @classmethod
    def config_init(cls) -> tuple[PromptEnvConfig, list[APIServerConfig]]:
        # wandb_name doubles as the name the env registers under (run-api's /register-env requires one)
        env = PromptEnvConfig(group_size=8, use_wandb=False, wandb_name=cls.name, total_steps=-1,
                              max_num_workers_per_node=4, ensure_scores_are_not_same=False,
                              include_messages=False, steps_per_eval=10**9)
        server = APIServerConfig(model_name="model", base_url="http://127.0.0.1:8001/v1", api_key="none",
                                 server_type="vllm", num_requests_for_eval=0)
        return env, [server]

    async def setup(self) -> None:
        path = Path(self.config.data_path)
        if not path.is_file():
            raise FileNotFoundError(f"--env.data_path {self.config.data_path!r} is not a file")
        with path.open() as fh:
            self.prompts = [json.loads(line)["prompt"] for line in fh if line.strip()]
        if not self.prompts:
            raise ValueError(f"--env.data_path {path} holds no prompts")
        self.reward_fn = load_reward(self.config.reward)
        self.rng = random.Random(self.config.seed)
        self.order: list[str] = []

    async def get_next_item(self) -> str:
        if not self.order:
            self.order = list(self.prompts)
            self.rng.shuffle(self.order)
        return self.order.pop()

    async def collect_trajectories(self, item: str) -> tuple[ScoredDataGroup | None, list]:
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            await managed.completion(prompt=item, n=self.config.group_size, max_tokens=self.config.max_tokens,
                                     temperature=self.config.temperature)
            nodes = managed.get_state()["nodes"]
        completions = []
        for node in nodes:
            start = next((i for i, m in enumerate(node.masked_tokens) if m != -100), len(node.tokens))
            completions.append(self.tokenizer.decode(node.tokens[start:], skip_special_tokens=True))
        scores = [float(s) for s in self.reward_fn(prompts=[item] * len(nodes), completions=completions)]
        group = ScoredDataGroup(
            tokens=[n.tokens for n in nodes], masks=[n.masked_tokens for n in nodes],
            inference_logprobs=[n.logprobs for n in nodes], scores=scores,
            generation_params={"temperature": self.config.temperature})
        return group, []

    async def evaluate(self, *args, **kwargs) -> None:
        return None


if __name__ == "__main__":
    PromptRewardEnv.cli()
