"""sync/gate.py: leases pin a version, in-place writes exclude every generation, the lag bound waits."""

from __future__ import annotations

import threading
import time

import pytest

from grpo_plugin.sync.gate import PolicyGate, PolicyLagTimeout


def _in_thread(fn):
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_a_lease_pins_the_version_and_name_published_before_it():
    gate = PolicyGate()
    gate.publish(3, "policy-v3")
    with gate.lease() as lease:
        gate.publish(4, "policy-v4")  # lora_sync: a new name next to the old one, no waiting
        assert (lease.version, lease.model) == (3, "policy-v3")
        assert gate.in_use("policy-v3") and not gate.in_use("policy-v4")
    assert not gate.in_use("policy-v3")


def test_a_write_waits_for_the_generation_in_flight_and_blocks_new_ones():
    gate = PolicyGate()
    gate.publish(0, "base")
    events = []
    lease = gate.lease()
    lease.__enter__()
    writer, _ = _in_thread(lambda: (gate.begin_write(), events.append("write"), gate.publish(1, "base"),
                                    gate.end_write()))
    time.sleep(0.2)
    assert events == []  # the rollout in flight is not overwritten
    reader, got = _in_thread(lambda: gate.lease().__enter__().version)
    time.sleep(0.2)
    assert "value" not in got  # a new rollout queues behind the waiting write (no starvation of pushes)
    events.append("rollout done")
    lease.__exit__(None, None, None)
    writer.join(5)
    reader.join(5)
    assert events == ["rollout done", "write"]
    assert got["value"] == 1  # the queued rollout samples with the version the write published


def test_lease_waits_for_the_version_the_lag_bound_needs():
    gate = PolicyGate()
    gate.publish(4, "base")
    t, got = _in_thread(lambda: gate.lease(min_version=5).__enter__().version)
    time.sleep(0.2)
    assert "value" not in got
    gate.publish(5, "base")
    t.join(5)
    assert got["value"] == 5
    with pytest.raises(PolicyLagTimeout, match="policy version 9"), gate.lease(min_version=9, timeout=0.1):
        pass


def test_an_exclusive_false_write_does_not_wait():
    gate = PolicyGate()
    gate.publish(0, "a")
    with gate.lease(), gate.writing(exclusive=False):
        gate.publish(1, "b")
    assert gate.version == 1


def test_closing_the_gate_ends_a_rollout_waiting_for_a_version_that_will_not_come():
    """The run's last prefetched rollout may wait for a push that never happens (sync_interval > 1): at the end of
    the run it must give up, or the interpreter waits for its thread at exit."""
    from grpo_plugin.sync.gate import GateClosed

    gate = PolicyGate()
    gate.publish(8, "base")
    t, got = _in_thread(lambda: gate.lease(min_version=9, timeout=60).__enter__())
    time.sleep(0.2)
    assert t.is_alive()
    gate.close()
    t.join(5)
    assert not t.is_alive() and isinstance(got.get("error"), GateClosed)
    with gate.lease() as lease:  # a version already there is still leased (a rollout in flight finishes)
        assert lease.version == 8
