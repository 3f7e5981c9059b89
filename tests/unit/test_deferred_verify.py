"""sync/verify.py without a server: the trainer half scores both probe checks with one forward pass, and the
deferred verification keeps its lease until the server half ended, whatever the outcome. The server is a
stand-in here (its replies and its faults are injected); tests/integration/test_restart_sync.py runs the same
objects against a real vLLM server."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from grpo_plugin.server.client import ServerLost
from grpo_plugin.sync import probe
from grpo_plugin.sync.base import SyncResult
from grpo_plugin.sync.gate import PolicyGate
from grpo_plugin.sync.verify import DeferredVerifier, ProbeReply, ProbeVerifier


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from grpo_plugin.demo.tiny import build_model

    path = build_model(tmp_path_factory.mktemp("m") / "tiny")
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)


PROBE = [5, 17, 99, 3, 42, 42, 7, 120, 64, 11]
GEN = [33, 34, 35, 36, 37, 38, 39, 40]


def _reply(model, verifier: ProbeVerifier) -> ProbeReply:
    """What a server holding exactly `model`'s weights answers: each check from its own forward pass."""
    full = probe.token_logprobs(model, verifier.gen_prompt + GEN)
    return ProbeReply(probe.token_logprobs(model, PROBE), list(GEN), full[len(verifier.gen_prompt) - 1:])


@pytest.mark.parametrize("max_len", [None, 12])  # 12: the generation's prompt is shorter than the probe
def test_one_forward_scores_both_checks(model, max_len):
    verifier = ProbeVerifier(client=None, probe_ids=PROBE, tolerance=1e-4, mode="restart", max_len=max_len)
    assert verifier.gen_prompt[: min(len(PROBE), len(verifier.gen_prompt))] == PROBE[: len(verifier.gen_prompt)]
    reply = _reply(model, verifier)
    mean, mx = verifier.score(model, reply)
    assert mx <= 1e-5, mx  # separate forwards vs the merged one: same weights, same numbers
    bad_prompt = ProbeReply([x + (0.01 if i == 4 else 0.0) for i, x in enumerate(reply.prompt_logprobs)],
                            reply.gen_token_ids, reply.gen_logprobs)
    assert verifier.score(model, bad_prompt)[1] == pytest.approx(0.01, abs=1e-5)
    bad_gen = ProbeReply(reply.prompt_logprobs, reply.gen_token_ids, [x - 0.5 for x in reply.gen_logprobs])
    assert verifier.score(model, bad_gen)[0] == pytest.approx(0.5, abs=1e-5)


class _Client:
    """Answers the probe as `model` would, once `go` is set; or raises `fail`."""

    def __init__(self, model, verifier, fail: Exception | None = None):
        self.base_url, self.timeout, self.watch = "http://127.0.0.1:1", 5.0, None
        self.model, self.verifier, self.fail, self.go = model, verifier, fail, threading.Event()

    def prompt_logprobs(self, ids, *, model):
        self.go.wait(10)
        if self.fail is not None:
            raise self.fail
        return probe.token_logprobs(self.model, ids)

    def generate(self, prompts, *, model, **kw):
        full = probe.token_logprobs(self.model, prompts[0] + GEN)
        return [[SimpleNamespace(token_ids=list(GEN), logprobs=full[len(prompts[0]) - 1:])]]


def _deferred(model, fail=None):
    verifier = ProbeVerifier(client=None, probe_ids=PROBE, tolerance=1e-4, mode="restart")
    client = _Client(model, verifier, fail)
    verifier.client = client
    gate = PolicyGate()
    deferred = DeferredVerifier(verifier, gate, client=client)
    return deferred, gate, client


def test_the_lease_holds_until_the_server_answered_and_a_write_waits_for_it(model):
    deferred, gate, client = _deferred(model)
    gate.publish(3, "m")
    deferred.start(SyncResult(step=3, sync_ms=1.0))
    assert deferred.version == 3 and gate.in_use("m")
    wrote = threading.Event()
    writer = threading.Thread(target=lambda: (gate.begin_write(), wrote.set(), gate.end_write()))
    writer.start()
    assert not wrote.wait(0.3)  # the server has not answered: an in-place write must wait
    client.go.set()
    result = deferred.finish(model)
    writer.join(5)
    assert wrote.is_set() and not gate.in_use("m") and deferred.version is None
    assert result.logprob_diff <= 1e-5 and result.verify_ms > 0
    assert deferred.finish(model) is None  # nothing pending any more
    deferred.close()


def test_weights_changed_after_the_push_fail_the_check_with_the_step(model):
    deferred, gate, client = _deferred(model)
    gate.publish(7, "m")
    deferred.start(SyncResult(step=7, sync_ms=1.0))
    client.go.set()
    other = type(model)(model.config)  # the trainer's weights are not what the server computed with
    with pytest.raises(probe.SyncVerificationError, match="weight sync at step 7 did NOT take effect"):
        deferred.finish(other)
    assert not gate.in_use("m")
    deferred.close()


def test_a_lost_server_reaches_finish_as_is_and_the_lease_is_released(model):
    deferred, gate, client = _deferred(model, fail=ServerLost("the managed vLLM server exited"))
    gate.publish(1, "m")
    deferred.start(SyncResult(step=1, sync_ms=1.0))
    client.go.set()
    with pytest.raises(ServerLost):
        deferred.finish(model)
    assert not gate.in_use("m")
    # discard (a restore verified the weights itself): the late answer is dropped, the lease still released
    client2_deferred, gate2, client2 = _deferred(model)
    gate2.publish(2, "m")
    client2_deferred.start(SyncResult(step=2, sync_ms=1.0))
    client2_deferred.discard()
    assert client2_deferred.version is None
    client2.go.set()
    gate2.begin_write()  # returns once the discarded request ended
    gate2.end_write()
    deferred.close()
    client2_deferred.close()


def test_the_trainer_recovers_a_server_lost_under_its_verification_and_drops_prefetched_rollouts(model):
    """SyncSession.finish_verification on stand-ins: a lost server is recovered through the guard and the
    prefetch queue is dropped (True); a mismatch is raised, never recovered."""
    from grpo_plugin.sync.base import ModelHandle
    from grpo_plugin.sync.session import SyncSession

    class _Guard:
        enabled = True

        def __init__(self):
            self.recovered = []

        def is_lost(self, exc):
            return str(exc) if isinstance(exc, ServerLost) else None

        def recover(self, during, why, redo=True):
            self.recovered.append((during, why, redo))

    dropped = []
    deferred, gate, client = _deferred(model, fail=ServerLost("gone"))
    session = SimpleNamespace(deferred=deferred, guard=_Guard(), forget_prefetched=lambda: dropped.append(True),
                              model=ModelHandle.of(model))
    assert SyncSession.finish_verification(session) is False  # nothing pending
    gate.publish(4, "m")
    deferred.start(SyncResult(step=4, sync_ms=1.0))
    client.go.set()
    assert SyncSession.finish_verification(session) is True
    assert session.guard.recovered == [("verification of the pushed weights", "gone", False)] and dropped == [True]

    deferred2, gate2, client2 = _deferred(model)
    session.deferred, session.model = deferred2, ModelHandle.of(type(model)(model.config))
    gate2.publish(5, "m")
    deferred2.start(SyncResult(step=5, sync_ms=1.0))
    client2.go.set()
    with pytest.raises(probe.SyncVerificationError):
        SyncSession.finish_verification(session)
    assert len(session.guard.recovered) == 1
    deferred.close()
    deferred2.close()
