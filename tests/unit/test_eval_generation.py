"""Evaluation's generation backend (producers/evaluation.py): TRL's contract on the plugin's server client and
policy gate. The server is scripted here (what a `/v1/completions` answer holds); the e2e runs use a real one."""

from __future__ import annotations

import threading

import pytest

from grpo_plugin.producers.evaluation import EvalGeneration
from grpo_plugin.server.client import Completion
from grpo_plugin.sync.gate import PolicyGate


class ScriptedServer:
    """Answers `generate` with distinct tokens per (prompt, sample) and records what it was asked."""

    def __init__(self, gate: PolicyGate):
        self.gate, self.calls = gate, []

    def generate(self, prompts, *, model, n, **sampling):
        self.calls.append({"prompts": prompts, "model": model, "n": n, "in_use": self.gate.in_use(model),
                           **sampling})
        return [[Completion(token_ids=[100 + p, k], logprobs=[-0.5, -1.0 - k], finish_reason="stop")
                 for k in range(n)] for p in range(len(prompts))]


class Guard:
    def __init__(self):
        self.during = []

    def run(self, during, call):
        self.during.append(during)
        return call()


def make(step=10, served=None):
    gate = PolicyGate()
    server, guard = ScriptedServer(gate), Guard()
    pushes = []

    def bring_current():
        if gate.version != step:  # what the sync session does: push and publish this step's weights
            pushes.append(step)
            gate.publish(step, f"policy-v{step}")

    if served is not None:
        gate.publish(*served)
    gen = EvalGeneration(client=server, gate=gate, guard=guard, step=lambda: step, bring_current=bring_current,
                         sampling=lambda: {"max_tokens": 16, "temperature": 0.7}, lag_timeout=1.0)
    return gen, server, guard, pushes


def test_rows_follow_trls_contract_and_sample_the_current_version():
    gen, server, guard, pushes = make(step=10, served=(8, "policy-v8"))  # sync_interval left the server at 8
    prompts = [[1, 2]] * 3 + [[3, 4, 5]] * 3  # two prompts, num_generations_eval=3
    prompt_ids, completion_ids, logprobs, token_ids = gen.generate(prompts, None, 3)
    assert pushes == [10]  # brought to step 10 before sampling
    (call,) = server.calls
    assert call["prompts"] == [[1, 2], [3, 4, 5]] and call["n"] == 3 and call["model"] == "policy-v10"
    assert call["in_use"] and call["max_tokens"] == 16 and call["temperature"] == 0.7  # under a lease
    assert prompt_ids == prompts
    assert completion_ids == [[100, 0], [100, 1], [100, 2], [101, 0], [101, 1], [101, 2]]
    assert logprobs[4] == [[-0.5], [-2.0]] and token_ids[4] == [[101], [1]]
    assert guard.during == ["evaluation rollout"]  # an outage is recovered as a training rollout's is
    gen.generate(prompts, None, 3)
    assert pushes == [10]  # the server holds step 10 now: no second push


def test_sync_weights_brings_the_server_to_the_current_step():
    gen, _, _, pushes = make(step=4)
    gen.sync_weights()
    gen.sync_weights()
    assert pushes == [4]


def test_images_and_uneven_rows_are_refused_by_name():
    gen, server, _, _ = make(step=1)
    with pytest.raises(ValueError, match="images is not supported"):
        gen.generate([[1]] * 2, [object(), None], 2)
    with pytest.raises(ValueError, match="not a multiple of num_generations_eval=2"):
        gen.generate([[1]] * 3, None, 2)
    assert server.calls == []


def test_a_write_in_place_waits_for_the_evaluation_rollout():
    """An ipc step or a restart reload writes the served weights in place: not while evaluation samples."""
    gen, server, _, _ = make(step=2, served=(2, "base"))
    started, release = threading.Event(), threading.Event()
    generate = server.generate

    def slow(*a, **kw):
        started.set()
        release.wait(5)
        return generate(*a, **kw)

    server.generate = slow
    t = threading.Thread(target=gen.generate, args=([[1]] * 2, None, 2))
    t.start()
    assert started.wait(5)
    order = []
    w = threading.Thread(target=lambda: (gen.gate.writing(True).__enter__(), order.append("write")))
    w.start()
    w.join(0.3)
    assert order == []  # the write waits while the evaluation rollout holds its lease
    release.set()
    t.join(5)
    w.join(5)
    assert order == ["write"]
