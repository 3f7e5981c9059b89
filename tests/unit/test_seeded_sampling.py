"""grpo.seeded_sampling: a seed per prompt (producers/seeds.py), one request per prompt carrying it
(server/client.py, server/group.py), servers without chunked prefill on CPU, and the config rules."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from grpo_plugin.config.checks import check_cross_keys
from grpo_plugin.config.lookups import run_config
from grpo_plugin.producers.seeds import PromptSeeds
from grpo_plugin.server.client import VLLMServerClient
from grpo_plugin.server.group import ServerGroup
from grpo_plugin.server.process import spec_from


def test_a_prompts_seed_is_fixed_by_the_run_and_differs_by_step_purpose_rank_prompt_and_repeat():
    prompts = [[1, 2, 3], [4, 5], [1, 2, 3]]
    seeds = PromptSeeds(42)("train", 3, prompts)
    assert seeds == PromptSeeds(42)("train", 3, prompts)  # another run of the same config
    assert len(set(seeds)) == 3  # the repeated prompt gets a seed of its own
    assert all(0 <= s < 2 ** 31 for s in seeds)
    for other in (PromptSeeds(43)("train", 3, prompts), PromptSeeds(42)("train", 4, prompts),
                  PromptSeeds(42)("eval", 3, prompts), PromptSeeds(42, rank=1)("train", 3, prompts)):
        assert not set(other) & set(seeds)
    assert PromptSeeds(42)("train", 3, prompts[1:2]) == seeds[1:2]  # a prompt's seed does not depend on the others


class _Completions(BaseHTTPRequestHandler):
    """A stand-in for vLLM's /v1/completions: records each request, answers one token per sample."""
    seen: list[dict] = []
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            self.seen.append(body)
        n, prompts = body["n"], body["prompt"]
        choices = [{"index": i * n + k, "logprobs": {"tokens": [f"token_id:{p[0] + (body.get('seed') or 0) + k}"],
                                                      "token_logprobs": [-1.0]}, "finish_reason": "length"}
                   for i, p in enumerate(prompts) for k in range(n)]
        out = json.dumps({"choices": choices}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture
def stand_ins():
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _Completions) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    _Completions.seen = []
    yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    for s in servers:
        s.shutdown()


def test_each_prompt_goes_in_a_request_of_its_own_with_its_seed_and_comes_back_in_order(stand_ins):
    client = VLLMServerClient(stand_ins[0])
    prompts = [[100], [200], [300]]
    groups = client.generate(prompts, model="m", n=2, max_tokens=1, seeds=[10, 20, 30])
    assert [[c.token_ids[0] for c in g] for g in groups] == [[110, 111], [220, 221], [330, 331]]
    assert sorted((r["prompt"], r["seed"]) for r in _Completions.seen) == [([[100]], 10), ([[200]], 20),
                                                                          ([[300]], 30)]
    with pytest.raises(ValueError, match="one seed per prompt"):
        client.generate(prompts, model="m", n=2, max_tokens=1, seeds=[1])
    _Completions.seen = []
    client.generate(prompts, model="m", n=2, max_tokens=1)  # unseeded: one request for the batch, no seed
    assert [(r["prompt"], r.get("seed")) for r in _Completions.seen] == [([[100], [200], [300]], None)]


def test_several_servers_each_prompt_keeps_its_seed(stand_ins):
    group = ServerGroup([VLLMServerClient(u) for u in stand_ins])
    prompts = [[100], [200], [300], [400]]
    groups = group.generate(prompts, model="m", n=1, max_tokens=1, seeds=[1, 2, 3, 4])
    assert [g[0].token_ids[0] for g in groups] == [101, 202, 303, 404]
    assert sorted(g[0].server for g in groups) == [0, 0, 1, 1]  # split over both


def _cfg(**grpo):
    return {"rl": "grpo", "base_model": "m", "adapter": "lora", "seed": 3, "vllm": {"max_model_len": 512},
            "grpo": {"sync": "lora_sync", **grpo}}


def test_the_plugins_cpu_servers_run_without_chunked_prefill_when_seeded():
    cmd = spec_from(run_config(_cfg(seeded_sampling=True))).command()
    assert "--no-enable-chunked-prefill" in cmd and cmd[cmd.index("--max-num-batched-tokens") + 1] == "512"
    plain = spec_from(run_config(_cfg())).command()
    assert "--no-enable-chunked-prefill" not in plain and "--max-num-batched-tokens" not in plain


def test_config_rules():
    check_cross_keys(_cfg(seeded_sampling=True))  # accepted
    with pytest.raises(ValueError, match="grpo.seeded_sampling needs vllm.max_model_len"):
        check_cross_keys({**_cfg(seeded_sampling=True), "vllm": {}})
    with pytest.raises(ValueError, match="grpo.seeded_sampling with grpo.tools: .*does not seed"):
        check_cross_keys(_cfg(seeded_sampling=True, tools=["rewards.toy.lookup"]))
    with pytest.raises(ValueError, match="grpo.seeded_sampling with trl.rollout_func"):
        check_cross_keys({**_cfg(seeded_sampling=True), "trl": {"rollout_func": "m.f"}})


def test_a_cpu_server_with_chunked_prefill_is_refused_at_start_naming_it():
    from types import SimpleNamespace

    from grpo_plugin.server.client import ServerError
    from grpo_plugin.server.connect import require_whole_prefills

    def server(device: str, chunked: bool):  # what /server_info says (vllm_config as JSON)
        config = {"device_config": {"device": device}, "scheduler_config": {"enable_chunked_prefill": chunked}}
        return SimpleNamespace(base_url=f"http://{device}-{chunked}:8000", server_info=lambda: {"vllm_config": config})

    require_whole_prefills(server("cpu", False))
    require_whole_prefills(server("cuda", True))  # CUDA generators rewind after a split prefill
    with pytest.raises(ServerError, match=r"server at http://cpu-True:8000 runs chunked prefill.*axolotl vllm-serve"):
        require_whole_prefills(SimpleNamespace(replicas=[server("cpu", False), server("cpu", True)]))
