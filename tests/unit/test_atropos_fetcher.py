"""The background fetcher, with run-api faults injected by a scripted stand-in (the real run-api is exercised in
tests/integration/test_atropos_api.py): bounded prefetch, spool-before-queue, backoff, diagnosis, re-register."""

import json
import threading
import time

import pytest

from grpo_plugin.atropos import fetcher as fetcher_mod
from grpo_plugin.atropos.api import AtroposError, BatchReply, NotRegisteredError
from grpo_plugin.atropos.fetcher import AtroposTimeout, BatchFetcher
from grpo_plugin.atropos.spool import Spool, SpoolError


def groups(tag, group_size=2):
    return [{"tokens": [[tag, tag]] * group_size, "scores": [float(tag)] * group_size}]


class ScriptedAPI:
    """Answers /batch from a script: a list of groups, None (nothing ready) or an exception to raise."""

    def __init__(self, script, queued=0, env=True, example=None):
        self.script = list(script)
        self.calls = 0
        self.lock = threading.Lock()
        self.queued, self.env, self.example = queued, env, example

    def batch(self):
        with self.lock:
            self.calls += 1
            item = self.script.pop(0) if self.script else None
        if isinstance(item, BaseException):
            raise item
        return None if item is None else BatchReply(item, json.dumps({"batch": item}).encode())

    def status(self):
        return {"queue_size": self.queued}

    def env_registered(self, env_id=0):
        return self.env

    def latest_example(self):
        return self.example or {}


def make(api, tmp_path, capacity=1, batch_size=2, **kw):
    spool = Spool(tmp_path)
    f = BatchFetcher(api, spool, lambda seq, meta, r: (seq, r.groups[0]["tokens"][0][0]), capacity=capacity,
                     batch_size=batch_size, poll_interval=0.01, max_backoff=0.05, **kw)
    return f, spool


@pytest.fixture(autouse=True)
def quick_diagnosis(monkeypatch):
    monkeypatch.setattr(fetcher_mod, "DIAGNOSE_AFTER", 0.05)
    monkeypatch.setattr(fetcher_mod, "DIAGNOSE_EVERY", 0.05)


def wait_for(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return False


def test_prefetch_is_bounded_and_every_batch_is_spooled_before_it_is_queued(tmp_path):
    api = ScriptedAPI([groups(i) for i in range(5)])
    f, spool = make(api, tmp_path, capacity=2)
    f.start([])
    try:
        assert wait_for(lambda: f.queued == 2)
        time.sleep(0.2)
        assert api.calls == 2  # full queue: no more requests
        assert spool.counts() == (2, 0)
        assert f.get(1) == (0, 0)
        assert wait_for(lambda: f.queued == 2)
        assert api.calls == 3
        assert [f.get(1) for _ in range(2)] == [(1, 1), (2, 2)]
    finally:
        f.stop()


def test_replays_the_spool_before_asking_the_run_api(tmp_path):
    spool = Spool(tmp_path)
    old = [spool.add({}, json.dumps({"batch": groups(t)}).encode()) for t in (40, 41)]
    api = ScriptedAPI([groups(7)])
    f, _ = make(api, tmp_path, capacity=1)
    f.start(old)
    try:
        assert [f.get(1)[1] for _ in range(3)] == [40, 41, 7]
    finally:
        f.stop()


def test_backs_off_while_the_run_api_is_down_then_recovers(tmp_path):
    down = [AtroposError("connection refused")] * 6
    api = ScriptedAPI(down + [groups(3)])
    f, _ = make(api, tmp_path)
    f.start([])
    try:
        assert wait_for(lambda: "does not answer" in f.waiting_reason)
        assert f.get(5)[1] == 3
        assert api.calls == 7
    finally:
        f.stop()


def test_waiting_reason_says_no_environment_has_registered(tmp_path):
    f, _ = make(ScriptedAPI([], env=False), tmp_path)
    f.start([])
    try:
        assert wait_for(lambda: "no environment has registered" in f.waiting_reason)
        with pytest.raises(AtroposTimeout, match="no environment has registered"):
            f.get(wait_timeout=0.3)
    finally:
        f.stop()


def test_an_odd_group_is_a_counted_warning_and_the_batches_after_it_train(tmp_path):
    """An environment that sends a group of 3 while the batch takes 4: the wait says why (sizes named), it is
    counted, the run is not ended; when whole batches come again they are delivered."""
    api = ScriptedAPI([None] * 30 + [groups(4)], queued=3, example={"tokens": [[1, 2]] * 3})
    f, _ = make(api, tmp_path, batch_size=4)
    f.start([])
    try:
        assert wait_for(lambda: "latest group has 3 sequences" in f.waiting_reason and "batch of 4" in f.waiting_reason)
        assert f.odd_groups >= 1
        assert f.get(10)[1] == 4  # the fetcher kept going: the next batch arrives
    finally:
        f.stop()


def test_odd_groups_that_never_end_reach_wait_timeout_with_the_reason(tmp_path):
    api = ScriptedAPI([], queued=3, example={"tokens": [[1, 2]] * 3})
    f, _ = make(api, tmp_path, batch_size=4)
    f.start([])
    try:
        assert wait_for(lambda: f.odd_groups >= 1)
        with pytest.raises(AtroposTimeout, match="latest group has 3 sequences"):
            f.get(wait_timeout=0.5)
    finally:
        f.stop()


def test_partial_batch_is_explained(tmp_path):
    api = ScriptedAPI([], queued=1, example={"tokens": [[1, 2]] * 2})
    f, _ = make(api, tmp_path, batch_size=4)
    f.start([])
    try:
        assert wait_for(lambda: "1 group(s) queued" in f.waiting_reason)
    finally:
        f.stop()


def test_a_lost_registration_is_renewed(tmp_path):
    renewed = []
    api = ScriptedAPI([NotRegisteredError("Trainer not registered"), groups(5)])
    f, _ = make(api, tmp_path, reregister=lambda: renewed.append(True))
    f.start([])
    try:
        assert f.get(5)[1] == 5
        assert renewed == [True]
    finally:
        f.stop()


def test_a_spooled_batch_that_holds_no_batch_stops_with_its_path(tmp_path):
    spool = Spool(tmp_path)
    seq = spool.add({}, b'{"batch": null}')
    f, _ = make(ScriptedAPI([]), tmp_path)
    f.start([seq])
    try:
        with pytest.raises(SpoolError, match=f"{seq:09d}.batch holds no batch"):
            f.get(5)
    finally:
        f.stop()


def test_warm_up_runs_first_and_is_reported(tmp_path):
    seen = []
    f, _ = make(ScriptedAPI([groups(4)]), tmp_path)
    f.warm_up = lambda: seen.append(f.waiting_reason)
    f.start([])
    try:
        assert f.get(5)[1] == 4
        assert seen and "compiling the batch tensorisation kernels" in seen[0]
    finally:
        f.stop()


def test_an_error_in_the_thread_reaches_the_trainer(tmp_path):
    f, spool = make(ScriptedAPI([groups(1)]), tmp_path)
    f.prepare = lambda seq, meta, r: (_ for _ in ()).throw(ValueError("bad batch"))
    f.start([])
    try:
        with pytest.raises(ValueError, match="bad batch"):
            f.get(5)
        assert spool.counts() == (1, 0)  # it was on disk before preparing failed
    finally:
        f.stop()


def test_batches_whose_groups_are_all_rejected_count_toward_wait_timeout_and_the_error_says_so(tmp_path):
    """Groups keep coming but none can be trained (no inference_logprobs): the producer skips each such batch, the
    wait for a usable one still ends at wait_timeout (not restarted per batch), and the error names what arrived
    and why it was refused instead of saying that nothing came."""
    from types import SimpleNamespace

    from grpo_plugin.atropos.group_tensors import tensorize
    from grpo_plugin.producers.atropos import AtroposProducer

    bad = [{"tokens": [[1, 2, 3]] * 2, "masks": [[-100, 2, 3]] * 2, "scores": [0.0, 1.0]}]
    api = ScriptedAPI([bad] * 400)
    spool = Spool(tmp_path)
    f = BatchFetcher(api, spool, lambda seq, meta, r: SimpleNamespace(
        seq=seq, tensors=tensorize(r.groups, pad_token_id=0, vocab_size=100, max_len=64)),
        capacity=1, batch_size=2, poll_interval=0.01, max_backoff=0.05)
    producer = AtroposProducer.__new__(AtroposProducer)
    producer.settings, producer.fetcher, producer.spool = SimpleNamespace(wait_timeout=1.0, url="http://x"), f, spool
    producer.leads, producer.spec, producer.wait_timeout = True, SimpleNamespace(num_processes=1), 1.0
    f.start([])
    try:
        t0 = time.monotonic()
        with pytest.raises(AtroposTimeout) as err:
            producer.produce(None, 0)
        took = time.monotonic() - t0
    finally:
        f.stop()
    msg = str(err.value)
    assert "no usable Atropos batch within 1 s" in msg and "every group of each rejected" in msg, msg
    assert "inference_logprobs" in msg, msg  # the true reason
    arrived = int(msg.split("wait_timeout): ")[1].split(" ")[0])
    assert arrived >= 2 and api.calls > 2
    assert took < 5.0, took  # one wait_timeout (1 s) for them all, not one per batch (400 batches queued)
