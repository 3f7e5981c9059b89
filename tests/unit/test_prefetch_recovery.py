"""producers/prefetch.py on axolotl's real AsyncDataProducer: what a failed prefetched rollout leads to.
The inner producer and the guard are stand-ins (the faults are injected there); the prefetch logic is real."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch
from axolotl.core.trainers.grpo.async_trainer import ProducerConfig, RolloutDataset

from grpo_plugin.producers.prefetch import PrefetchingProducer
from grpo_plugin.producers.rollout import ROLLOUT_KEY, Rollout, record_of


class _Inner:
    """Produces a one-row rollout per step; `fail_steps`: steps whose production raises `error` (in the
    background thread, like a request to a dead server)."""

    def __init__(self, fail_steps=(), error=None):
        self.config = ProducerConfig(async_prefetch=True, prefetch_depth=1)
        self.fail_steps, self.error = set(fail_steps), error
        self.calls: list[tuple[int, bool]] = []  # (step, on the main thread)

    def produce(self, model, global_step, **kwargs):
        self.calls.append((global_step, threading.current_thread() is threading.main_thread()))
        if global_step in self.fail_steps:
            self.fail_steps.discard(global_step)
            raise self.error
        return RolloutDataset({"x": torch.tensor([float(global_step)]), ROLLOUT_KEY: Rollout(wait_ms=0.0)})


class _Guard:
    enabled = True

    def __init__(self, lost: bool, serving: bool = True):
        self.lost, self.outages, self.recovered, self._serving = lost, [], 0, serving

    def is_lost(self, exc):
        return "server gone" if self.lost else None

    def serving(self):
        return self._serving

    def recover(self, during, why):
        self.recovered += 1
        self.outages.append(why)

    def caller_agrees(self):  # one rank: nothing to agree on
        return contextlib.nullcontext()

    def agree(self, during, why):
        return why


def _steps(producer, n):
    out = []
    for step in range(n):
        ds = producer.produce(None, step)
        assert record_of(ds._data).wait_ms >= 0
        out.append(int(ds._data["x"][0]))
    producer.shutdown()
    return out


def test_a_rollout_lost_with_its_server_is_recovered_on_the_main_thread_and_produced_again():
    inner, guard = _Inner(fail_steps={2}, error=ConnectionError("boom")), _Guard(lost=True)
    assert _steps(PrefetchingProducer(inner, guard=guard), 4) == [0, 1, 2, 3]  # each step its own rollout
    assert guard.recovered == 1
    assert (2, True) in inner.calls  # step 2 produced again on the main thread, after the recovery


def test_a_failure_from_before_a_recovery_is_stale_not_an_error():
    inner, guard = _Inner(fail_steps={2}, error=ConnectionError("old server")), _Guard(lost=False)
    producer = PrefetchingProducer(inner, guard=guard)
    assert [int(producer.produce(None, s)._data["x"][0]) for s in (0, 1)] == [0, 1]
    guard.outages.append("a push recovered the server meanwhile")  # the main thread's own recovery
    assert int(producer.produce(None, 2)._data["x"][0]) == 2
    producer.shutdown()
    assert guard.recovered == 0


def test_a_real_error_with_a_healthy_server_is_raised():
    inner, guard = _Inner(fail_steps={2}, error=ValueError("bad rollout")), _Guard(lost=False)
    with pytest.raises(ValueError, match="bad rollout"):
        _steps(PrefetchingProducer(inner, guard=guard), 4)
    assert guard.recovered == 0


def test_a_background_hang_report_of_an_outage_the_main_thread_recovered_is_not_a_second_outage():
    """The background rollout's own watch saw the hang too (ServerLost: `is_lost` says lost) while the main thread's
    push recovered it; every server serves now: the report is stale. Before this, the guard recovered a second time
    and, finding nothing lost, restarted every server (a CI failure: the healthy server of two was restarted)."""
    inner, guard = _Inner(fail_steps={2}, error=ConnectionError("no answer to /health for 14 s")), _Guard(lost=True)
    producer = PrefetchingProducer(inner, guard=guard)
    assert [int(producer.produce(None, s)._data["x"][0]) for s in (0, 1)] == [0, 1]
    guard.outages.append("the push recovered the hung server")
    assert int(producer.produce(None, 2)._data["x"][0]) == 2
    producer.shutdown()
    assert guard.recovered == 0 and (2, True) in inner.calls  # produced again on the main thread, no recovery


def test_a_loss_after_a_recovery_with_a_server_still_down_is_recovered():
    inner, guard = _Inner(fail_steps={2}, error=ConnectionError("boom")), _Guard(lost=True, serving=False)
    producer = PrefetchingProducer(inner, guard=guard)
    assert [int(producer.produce(None, s)._data["x"][0]) for s in (0, 1)] == [0, 1]
    guard.outages.append("an earlier outage")
    assert int(producer.produce(None, 2)._data["x"][0]) == 2
    producer.shutdown()
    assert guard.recovered == 1
