"""The `/generate` route Atropos environments call (`server_type: vllm`), on a real vLLM-CPU server, through
atroposlib's own client: token ids and per-token logprobs of the CURRENT policy (base model, or the announced
LoRA adapter), temperature applied as the trainer applies it, and the policy-version ledger."""

from __future__ import annotations

import asyncio

import pytest
import requests

from grpo_plugin.in_vllm.ledger import fingerprint
from grpo_plugin.server.client import ServerError
from grpo_plugin.sync import probe
from grpo_plugin.sync.lora import LoraSync
from tests.integration.conftest import perturb_lora

pytestmark = pytest.mark.integration


def atropos_server(client, tiny_model_dir):
    """atroposlib's VLLMServer, as an environment with `server_type: vllm` builds it."""
    from atroposlib.envs.server_handling.server_baseline import APIServerConfig
    from atroposlib.envs.server_handling.vllm_server import VLLMServer

    return VLLMServer(APIServerConfig(model_name=str(tiny_model_dir), base_url=f"{client.base_url}/v1",
                                      api_key="unused", server_type="vllm", tokenizer_name=str(tiny_model_dir),
                                      health_check=False, timeout=120))


def hf_model(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)


def pushed_adapter(client, peft_trainer, request, name: str, seed: int) -> LoraSync:
    """The trainer's adapter, changed (seeded) and loaded into the session server under `name`; unloaded, and the
    server's announced policy cleared, when the test ends."""
    sync = LoraSync(client, adapter_name=name)
    request.addfinalizer(sync.close)
    request.addfinalizer(lambda: client.set_policy(0, None))
    sync.prepare(peft_trainer)
    perturb_lora(peft_trainer.model, scale=0.2, seed=seed)
    sync.push(0)
    return sync


@pytest.fixture
def base_policy(vllm_server):
    """The server generates with its base model and no announced version (reset after each test)."""
    _, client = vllm_server
    requests.post(f"{client.base_url}/grpo/policy", json={"version": 0, "model": None}, timeout=10)
    yield client
    requests.post(f"{client.base_url}/grpo/policy", json={"version": 0, "model": None}, timeout=10)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_atroposlib_client_gets_tokens_and_logprobs_of_the_base_model(base_policy, tiny_model_dir, probe_ids,
                                                                      temperature):
    client = base_policy
    server = atropos_server(client, tiny_model_dir)
    prompt = probe_ids[:7]
    prompt_tokens, outputs, logprobs, finish = asyncio.run(server.tokens_and_logprobs_completion(
        input_ids=list(prompt), n=4, max_tokens=8, temperature=temperature))
    assert prompt_tokens == prompt and len(outputs) == len(logprobs) == len(finish) == 4
    model = hf_model(tiny_model_dir)
    for ids, lps, reason in zip(outputs, logprobs, finish):
        assert 1 <= len(ids) == len(lps) <= 8 and reason in ("stop", "length")
        # the logprobs are the sampled tokens' under logits / temperature, as the trainer scores them
        want = probe.token_logprobs(model, prompt + ids, temperature=temperature)[len(prompt) - 1:]
        assert max(abs(a - b) for a, b in zip(lps, want)) < 1e-4


def test_generate_uses_the_announced_adapter_and_records_its_version(vllm_server, peft_trainer, probe_ids,
                                                                     tiny_model_dir, request):
    _, client = vllm_server
    sync = pushed_adapter(client, peft_trainer, request, "t-generate-route", seed=11)
    client.set_policy(7, sync.generation_model)
    server = atropos_server(client, tiny_model_dir)
    prompt = probe_ids[:6]
    _, outputs, logprobs, _ = asyncio.run(server.tokens_and_logprobs_completion(
        input_ids=list(prompt), n=3, max_tokens=6, temperature=1.0))
    base = hf_model(tiny_model_dir)
    for ids, lps in zip(outputs, logprobs):
        adapter = probe.token_logprobs(peft_trainer.model, prompt + ids)[len(prompt) - 1:]
        assert max(abs(a - b) for a, b in zip(lps, adapter)) < 1e-4  # the adapter's, not the base model's
        base_lps = probe.token_logprobs(base, prompt + ids)[len(prompt) - 1:]
        assert max(abs(a - b) for a, b in zip(lps, base_lps)) > 1e-3
    # the ledger knows which policy produced each full sequence (what Atropos puts in `tokens`)
    fps = [fingerprint(prompt + ids) for ids in outputs] + [fingerprint(prompt + [1, 2, 3])]
    assert client.policy_versions(fps) == [7, 7, 7, None]


def test_prompt_logprobs_path_and_sampled_token_first(base_policy, tiny_model_dir, probe_ids):
    client = base_policy
    server = atropos_server(client, tiny_model_dir)
    got = asyncio.run(server.get_logprobs(input_ids=list(probe_ids[:9]), top_k=3))
    assert got["prompt_tokens"] == probe_ids[:9]
    assert len(got["prompt_topk_logprobs"]) == 9
    # every position after the first: the top 3 plus the prompt token itself (vLLM adds it when not in the top 3)
    for tok, ids, lps in zip(probe_ids[1:9], got["prompt_topk_token_ids"][1:], got["prompt_topk_logprobs"][1:]):
        assert tok in ids and 3 <= len(ids) == len(lps) <= 4
    # with top-k logprobs, the sampled token still comes first in each position
    body = requests.post(f"{client.base_url}/generate", json={
        "prompt": {"prompt_token_ids": probe_ids[:5]}, "logprobs": 3, "max_tokens": 4, "temperature": 1.0,
        "n": 2}, timeout=60).json()
    for ids, per_token in zip(body["token_ids"], body["logprobs"]):
        assert [int(next(iter(pos[0]))) for pos in per_token] == ids
        assert all(len(pos) >= 3 for pos in per_token)


@pytest.mark.parametrize("payload, status, message", [
    ({"max_tokens": 4}, 400, "`prompt` must be"),
    ({"prompt": {"prompt_token_ids": []}}, 400, "non-empty list of token ids"),
    ({"prompt": {"prompt_token_ids": [1, 2]}, "no_such_param": 1}, 400, "bad sampling parameters"),
    ({"prompt": {"prompt_token_ids": [1, 2]}, "temperature": -1}, 400, "bad sampling parameters"),
    ({"prompt": {"prompt_token_ids": [1, 2]}, "model": "nope"}, 404, "model 'nope' is not served"),
    ({"prompt": {"prompt_token_ids": [1, 2]}, "stream": True}, 400, "streaming is not supported"),
    ({"prompt": {"prompt_token_ids": [5] * 600}}, 400, "/generate:"),  # longer than max_model_len 512
    ({"prompt": {"prompt_token_ids": [1, 10**6]}}, 400, "/generate:"),  # not in the vocabulary
])
def test_bad_generate_requests_get_clear_errors(base_policy, payload, status, message):
    resp = requests.post(f"{base_policy.base_url}/generate", json=payload, timeout=60)
    assert resp.status_code == status, resp.text
    assert message in resp.json()["error"]
    assert base_policy.healthy()  # a bad request never hurts the server


def test_bad_policy_announcements_are_refused(base_policy):
    with pytest.raises(ServerError, match="is not served"):
        base_policy.set_policy(3, "no-such-adapter")
    resp = requests.post(f"{base_policy.base_url}/grpo/policy", json={"version": -2}, timeout=10)
    assert resp.status_code == 400 and "integer >= 0" in resp.json()["error"]
    assert requests.get(f"{base_policy.base_url}/grpo/policy", timeout=10).json()["version"] == 0


def test_openai_routes_naming_the_base_model_are_served_by_the_announced_adapter(vllm_server, peft_trainer,
                                                                                 probe_ids, request):
    """Atropos environments (and their evals) often call /v1/completions or /v1/chat/completions with the base
    model's name: in lora_sync that must sample the current policy, not the base model."""
    _, client = vllm_server
    base = client.base_model()
    client.set_policy(0, None)
    base_lps = client.prompt_logprobs(probe_ids, model=base)  # no adapter announced: the base model
    sync = pushed_adapter(client, peft_trainer, request, "t-openai-route", seed=12)
    adapter_lps = client.prompt_logprobs(probe_ids, model=sync.generation_model)
    assert max(abs(a - b) for a, b in zip(adapter_lps, base_lps)) > 1e-3  # the two really differ
    client.set_policy(5, sync.generation_model)
    named_base = client.prompt_logprobs(probe_ids, model=base)
    assert max(abs(a - b) for a, b in zip(named_base, adapter_lps)) < 1e-5  # the policy, not the base model
    body = requests.post(f"{client.base_url}/v1/completions", json={"prompt": probe_ids, "max_tokens": 2},
                         timeout=60).json()  # no model named at all: the policy too
    assert body["model"] == sync.generation_model, body
    chat = requests.post(f"{client.base_url}/v1/chat/completions", timeout=60, json={
        "model": base, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    if chat.status_code == 200:  # the tiny tokenizer may have no chat template; the route is rewritten either way
        assert chat.json()["model"] == sync.generation_model
    named_adapter = client.prompt_logprobs(probe_ids, model=sync.generation_model)
    assert named_adapter == adapter_lps  # a request naming an adapter passes unchanged


def test_the_probe_also_checks_requests_naming_the_base_model(vllm_server, peft_trainer, probe_ids, request):
    """Atropos with lora_sync: the post-sync probe also asks under the base model's name (what environments'
    OpenAI-route calls send). With the adapter announced it passes; when base-named requests are NOT served by the
    pushed adapter (here: nothing announced, so the route leaves them to the base model) the push fails saying so."""
    from grpo_plugin.sync.base import SyncResult
    from grpo_plugin.sync.verify import ProbeVerifier

    _, client = vllm_server
    sync = pushed_adapter(client, peft_trainer, request, "t-probe-base-name", seed=13)
    verifier = ProbeVerifier(client, probe_ids, 1e-4, "lora_sync", also_base=True)
    client.set_policy(1, sync.generation_model)
    ok = verifier.verify(peft_trainer.model, sync.generation_model, SyncResult(step=1, sync_ms=0.0))
    assert ok.logprob_diff <= 1e-4 and verifier.named_gap is not None and verifier.named_gap <= 1e-4
    client.set_policy(1, None)  # the base model's name now samples the base model
    with pytest.raises(probe.SyncVerificationError, match="Requests naming the base model .* were not answered by "
                                                          "the pushed policy"):
        verifier.verify(peft_trainer.model, sync.generation_model, SyncResult(step=2, sync_ms=0.0))
    # without the extra check the same push verifies: the adapter itself is right
    plain = ProbeVerifier(client, probe_ids, 1e-4, "lora_sync")
    assert plain.verify(peft_trainer.model, sync.generation_model, SyncResult(step=2, sync_ms=0.0)).logprob_diff <= 1e-4


def test_a_rollouts_base_url_pins_its_version_and_unknown_names_are_refused(vllm_server, peft_trainer, probe_ids,
                                                                           request):
    """A third-party agent (an OpenAI client taking the first name of /v1/models: the base model) posting to its
    rollout's `trainer.grpo_generation.base_url` samples the version the rollout's lease holds, even while another
    version is announced (lora_sync with a push during a prefetched rollout); the adapter's name without its version
    is the announced policy; a model the server does not serve is refused naming the one to use."""
    from urllib.parse import quote

    from grpo_plugin.config.server import LEASE_PREFIX
    from grpo_plugin.server.client import VLLMServerClient

    _, client = vllm_server
    base = client.base_model()
    old = pushed_adapter(client, peft_trainer, request, "t-lease", seed=21)
    first = old.generation_model
    first_lps = client.prompt_logprobs(probe_ids, model=first)
    perturb_lora(peft_trainer.model, scale=0.2, seed=22)
    old.push(1)  # a second version, announced: the newest policy
    newest = old.generation_model
    client.set_policy(1, newest)
    newest_lps = client.prompt_logprobs(probe_ids, model=newest)
    assert max(abs(a - b) for a, b in zip(first_lps, newest_lps)) > 1e-3
    leased = VLLMServerClient(f"{client.base_url}{LEASE_PREFIX}{quote(first, safe='')}")
    listed = requests.get(f"{leased.base_url}/v1/models", timeout=30).json()["data"][0]["id"]
    assert listed == base  # what an OpenAI client picks
    for name in (listed, "t-lease"):  # the base's name, the adapter's without a version: the lease's version
        lps = leased.prompt_logprobs(probe_ids, model=name)
        assert max(abs(a - b) for a, b in zip(lps, first_lps)) < 1e-5, name
    # on the plain URL the same names sample the announced (newest) version
    for name in (base, "t-lease"):
        lps = client.prompt_logprobs(probe_ids, model=name)
        assert max(abs(a - b) for a, b in zip(lps, newest_lps)) < 1e-5, name
    # restart and ipc pin the base model, whose name is its path: one percent-encoded segment of the URL; pinned,
    # the base's name samples the base model (neither adapter version), though an adapter is announced
    pinned_base = VLLMServerClient(f"{client.base_url}{LEASE_PREFIX}{quote(base, safe='')}")
    base_lps = pinned_base.prompt_logprobs(probe_ids, model=base)
    assert "/" in base and all(max(abs(a - b) for a, b in zip(base_lps, other)) > 1e-3
                               for other in (first_lps, newest_lps))
    refused = requests.post(f"{leased.base_url}/v1/completions", json={"model": "gpt-4o", "prompt": "a",
                                                                        "max_tokens": 1}, timeout=30)
    assert refused.status_code == 404 and f"name '{first}'" in refused.json()["error"], refused.text
    refused = requests.post(f"{client.base_url}/v1/completions", json={"model": "gpt-4o", "prompt": "a",
                                                                        "max_tokens": 1}, timeout=30)
    assert refused.status_code == 404 and f"name '{newest}'" in refused.json()["error"], refused.text
