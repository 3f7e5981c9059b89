"""Streaming's parts without a server: the gate's interrupts (sync/gate.py), the group stream (producers/stream.py),
a continuation's settings (producers/inflight.py) and the step's figures (producers/streaming.py)."""

from __future__ import annotations

import threading
import time

import pytest

from grpo_plugin.producers.inflight import Sampled, continuation_seed, rest_of
from grpo_plugin.producers.stream import Failed, GroupStream, StreamStats
from grpo_plugin.producers.streaming import StreamedGroup, stream_fields
from grpo_plugin.server.client import Completion
from grpo_plugin.sync.gate import PolicyGate


class Server:
    """Stands in for the server's generation: each request runs until interrupted (the fault the gate injects)."""

    def __init__(self):
        self.interrupted = threading.Event()
        self.calls = 0

    def interrupt(self):
        self.calls += 1
        self.interrupted.set()


def _hold(gate, **kw):
    """A lease held in a thread until `release` is set; the lease itself in `box`."""
    box, release = {}, threading.Event()

    def run():
        with gate.lease(**kw) as lease:
            box["lease"] = lease
            release.wait(10)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    while "lease" not in box:
        time.sleep(0.001)
    return t, release, box


def test_a_write_interrupts_the_rollouts_instead_of_waiting_for_them():
    server = Server()
    gate = PolicyGate(interrupt=server.interrupt)
    gate.publish(0, "m")
    t, release, _ = _hold(gate, interruptible=True)
    threading.Thread(target=lambda: (server.interrupted.wait(10), release.set()), daemon=True).start()
    gate.begin_write()  # returns only once the interrupted request gave its lease back
    gate.end_write()
    assert server.calls >= 1 and gate.interrupts >= 1
    t.join(5)


def test_a_probe_lease_is_never_interrupted_and_a_write_without_interrupt_waits():
    server = Server()
    gate = PolicyGate(interrupt=server.interrupt)
    gate.publish(0, "m")
    t, release, _ = _hold(gate)  # the probe's plain lease
    done = threading.Event()
    threading.Thread(target=lambda: (gate.begin_write(), done.set()), daemon=True).start()
    time.sleep(0.3)
    assert not done.is_set() and server.calls == 0  # waits for the probe, interrupts nothing
    release.set()
    assert done.wait(5)
    gate.end_write()
    assert server.calls == 0
    t.join(5)
    plain = PolicyGate()  # no streaming: an interruptible request is just a lease a write waits for
    plain.publish(0, "m")
    t2, release2, box = _hold(plain, interruptible=True)
    assert box["lease"].interruptible is False
    release2.set()
    t2.join(5)


def test_a_publish_beside_the_old_weights_interrupts_only_older_rollouts():
    server = Server()
    gate = PolicyGate(interrupt=server.interrupt)
    gate.publish(3, "v3")
    t, release, box = _hold(gate, interruptible=True)
    assert box["lease"].version == 3
    gate.publish(3, "v3")  # the same version again (every rank publishes after a push): nothing older runs
    assert server.calls == 0
    gate.publish(4, "v4")  # lora_sync: a new adapter beside the old
    assert server.calls == 1
    release.set()
    t.join(5)


def _stream(make, rows=8, g=2, capacity=3, **kw):
    batches = iter(range(1000))

    def next_rows():
        b = next(batches)
        return [{"prompt": f"b{b}p{i // g}", "i": i} for i in range(rows)]

    return GroupStream(make, next_rows, g, capacity, **kw)


def test_groups_come_out_in_the_order_they_finish_and_the_stream_holds_no_more_than_its_capacity():
    delays = {"b0p0": 0.6, "b0p1": 0.05, "b0p2": 0.1, "b0p3": 0.05}
    running, most = [0], [0]
    lock = threading.Lock()

    def make(work):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(delays.get(work.rows[0]["prompt"], 0.01))
        with lock:
            running[0] -= 1
        return work.rows[0]["prompt"]

    stream = _stream(make, capacity=3)
    first, stats = stream.take(2, lambda g: True)
    assert "b0p0" not in first  # the slow group does not hold the batch
    taken = list(first)
    while "b0p0" not in taken and len(taken) < 500:  # the tail trains later: after groups that started after it
        taken += stream.take(1, lambda g: True)[0]
    assert "b0p0" in taken and taken.index("b0p0") > taken.index("b1p0")
    assert most[0] <= 3
    assert len(stats.group_s) == 2
    stream.close()


def test_a_refused_group_is_generated_again_then_dropped_and_both_are_counted():
    made = []

    def make(work):
        made.append((work.rows[0]["prompt"], work.regenerations))
        return work.rows[0]["prompt"]

    stream = _stream(make, capacity=1, regenerations=2)
    groups, stats = stream.take(1, lambda g: g != "b0p0")
    assert groups == ["b0p1"]
    assert [m for m in made if m[0] == "b0p0"] == [("b0p0", 0), ("b0p0", 1), ("b0p0", 2)]
    assert (stats.regenerated, stats.dropped) == (2, 1)
    stream.close()


def test_a_failure_reaches_the_taker_and_a_reset_starts_the_groups_again():
    fail = {"on": True}

    def make(work):
        if fail["on"] and work.rows[0]["prompt"] == "b0p0":
            raise ConnectionError("server gone")
        return work.rows[0]["prompt"]

    stream = _stream(make, capacity=1)
    out, _ = stream.take(2, lambda g: True)
    assert len(out) == 1 and isinstance(out[0], Failed) and "server gone" in str(out[0].error)
    fail["on"] = False
    stream.reset()
    again, _ = stream.take(3, lambda g: True)
    assert len(again) == 3 and all(isinstance(g, str) for g in again)
    stream.close()


def test_a_prompt_sampler_that_fails_reaches_the_taker():
    stream = GroupStream(lambda w: w, lambda: [{"prompt": "x"}] * 3, 2, 1)  # 3 rows for groups of 2
    out, _ = stream.take(1, lambda g: True)
    assert isinstance(out[0], Failed) and "not a multiple of num_generations=2" in str(out[0].error)
    stream.close()


def test_a_continuation_gets_the_rest_of_the_budget_and_a_seed_of_its_own():
    sampling = {"max_tokens": 10, "temperature": 1.0, "extra": {"min_tokens": 4, "stop_token_ids": [2]}}
    assert rest_of(sampling, 3) == {"max_tokens": 7, "temperature": 1.0,
                                    "extra": {"min_tokens": 1, "stop_token_ids": [2]}}
    assert rest_of(sampling, 6)["extra"]["min_tokens"] == 0
    assert rest_of(sampling, 10) is None
    assert rest_of({"max_tokens": 5, "extra": None}, 2) == {"max_tokens": 3, "extra": None}
    assert sampling["max_tokens"] == 10  # not changed in place
    seeds = {continuation_seed(7, i, d) for i in range(4) for d in (0, 5, 9)}
    assert len(seeds) == 12 and all(0 <= s < 2 ** 31 for s in seeds)
    assert continuation_seed(7, 1, 5) == continuation_seed(7, 1, 5)


def test_every_token_keeps_the_version_and_logprob_that_sampled_it():
    s = Sampled()
    s.extend(Completion([5, 6, 7], [-0.1, -0.2, -0.3], "abort"), 3)
    assert s.interrupted
    s.extend(Completion([8, 9], [-0.4, -0.5], "stop", server=1), 4)
    assert (s.token_ids, s.versions, s.logprobs) == ([5, 6, 7, 8, 9], [3, 3, 3, 4, 4], [-0.1, -0.2, -0.3, -0.4, -0.5])
    assert (s.finish_reason, s.server, s.requests, s.interrupted) == ("stop", 1, 2, False)


def test_the_steps_figures_count_tokens_by_lag_and_version():
    def sampled(versions):
        return Sampled(token_ids=list(range(len(versions))), logprobs=[0.0] * len(versions), versions=versions,
                       finish_reason="stop", requests=len(set(versions)) or 1)

    groups = [StreamedGroup([{}], [1], [sampled([3, 3, 4]), sampled([4])]),
              StreamedGroup([{}], [1], [sampled([2, 4, 4, 4]), sampled([])])]
    assert (groups[0].oldest, groups[0].newest, groups[1].oldest) == (3, 4, 2)
    stats = StreamStats(regenerated=1, dropped=0, idle_s=0.25, group_s=[1.0, 3.0])
    f = stream_fields(groups, 5, stats, interrupts=2)
    assert f["token_lag_hist"] == {"1": 5, "2": 2, "3": 1}
    assert f["tokens_per_version"] == {"2": 1, "3": 2, "4": 5}
    assert sum(f["token_lag_hist"].values()) == 8 and f["token_lag_max"] == 3
    assert f["token_lag_mean"] == pytest.approx((5 + 4 + 3) / 8, abs=1e-4)
    assert (f["stream_regenerated"], f["stream_continued"], f["stream_interrupts"]) == (1, 2, 2)
    assert (f["stream_idle_ms"], f["group_s_max"], f["completion_tokens_max"]) == (250.0, 3.0, 4)


def test_streaming_is_accepted_alone_and_refused_with_agents_atropos_lag_0_and_several_ranks(monkeypatch):
    from grpo_plugin.config.checks import check_cross_keys
    from grpo_plugin.config.schema import GRPOSettings

    base = {"rl": "grpo", "grpo": {"sync": "restart"}, "trl": {"streaming_partial_batch": True}}
    check_cross_keys(base)  # accepted
    assert GRPOSettings(sync="restart").stream_lag_bound == 4
    assert GRPOSettings(sync="restart", max_policy_lag=2).stream_lag_bound == 2
    with pytest.raises(ValueError, match=r"streaming_partial_batch with trl\.rollout_func: the plugin streams its "
                                         r"own single-turn rollouts only"):
        check_cross_keys({**base, "trl": {**base["trl"], "rollout_func": "rewards.toy_agent.two_turns"}})
    with pytest.raises(ValueError, match=r"with grpo\.tools"):
        check_cross_keys({**base, "grpo": {"sync": "restart", "tools": ["rewards.toy_tools.lookup"]}})
    with pytest.raises(ValueError, match=r"max_policy_lag: 0: a rollout that runs across a push would never be "):
        check_cross_keys({**base, "grpo": {"sync": "restart", "max_policy_lag": 0}})
    with pytest.raises(ValueError, match=r"streaming_min_groups"):
        check_cross_keys({**base, "trl": {**base["trl"], "streaming_min_groups": 2}})
    with pytest.raises(ValueError, match=r"grpo\.stream_groups applies to trl\.streaming_partial_batch: true only"):
        check_cross_keys({"rl": "grpo", "grpo": {"sync": "restart", "stream_groups": 4}})
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"with 2 trainer ranks: streaming runs on one rank"):
        check_cross_keys(base)
