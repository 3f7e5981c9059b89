"""sync/ranks.py: under ZeRO-3 rank 0 leads each collective step of a sync and the other ranks follow. Here two
"ranks" are two threads joined by a broadcast that behaves like torch's (rank 0 sends, the others receive the
same object); the gather records what each rank gathered. The real thing (DeepSpeed ZeRO-3, two processes, gloo)
runs in tests/e2e/test_multiprocess_train.py."""

from __future__ import annotations

import contextlib
import queue
import threading
from types import SimpleNamespace

import pytest
import torch

from grpo_plugin.sync import probe
from grpo_plugin.sync.ranks import FollowerStopped, LeadFollow, OneCopy, for_accelerator, selected


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(11, 8)
        self.head = torch.nn.Linear(8, 11)
        self.emb.weight.requires_grad_(False)  # "base": only the head trains

    def forward(self, input_ids):
        return SimpleNamespace(logits=self.head(self.emb(input_ids)))


class _Bus:
    """torch.distributed.broadcast_object_list between two threads: rank 0's object reaches rank 1."""

    def __init__(self):
        self.q: queue.Queue = queue.Queue()

    def leader(self, obj):
        self.q.put(obj)
        return obj

    def follower(self, obj):
        assert obj is None
        return self.q.get(timeout=10)


def _recording_gather(log: list, rank: int):
    @contextlib.contextmanager
    def gather(model, reads):
        log.append((rank, [tuple(p.shape) for p in selected(model, reads)]))
        yield {"gathered": reads} if rank == 0 else {}

    return gather


def _run_pair(lead_body):
    bus, log, model = _Bus(), [], _Tiny()
    leader = LeadFollow(gather=_recording_gather(log, 0), broadcast=bus.leader)
    follower = LeadFollow(gather=_recording_gather(log, 1), broadcast=bus.follower)
    out = {}

    def follow():
        try:
            out["joined"] = follower.follow(model)
        except Exception as exc:  # noqa: BLE001 — the test inspects it
            out["error"] = exc

    t = threading.Thread(target=follow)
    t.start()
    try:
        with leader.leading():
            out["lead"] = lead_body(leader, model)
    except Exception as exc:  # noqa: BLE001
        out["lead_error"] = exc
    t.join(10)
    assert not t.is_alive(), "the follower did not end with the leader's sync"
    return out, log, model


def test_follower_joins_each_gather_and_forward_then_ends():
    ids = [1, 4, 2, 7, 3]

    def body(leader, model):
        with leader.gathered(model, "trainable") as got:
            assert got == {"gathered": "trainable"}  # what the gather yields is what the push reads
        lps = leader.logprobs(model, ids)
        with leader.gathered(model, "all"):
            pass
        return lps

    out, log, model = _run_pair(body)
    assert out["joined"] == 3
    # rank 0: the head (trainable), then emb.weight + the head (all), in model order
    assert [entry for entry in log if entry[0] == 0] == [(0, [(11, 8), (11,)]), (0, [(11, 8), (11, 8), (11,)])]
    assert [entry[1] for entry in log if entry[0] == 1] == [entry[1] for entry in log if entry[0] == 0]
    assert out["lead"] == probe.token_logprobs(model, ids)


def test_a_failed_sync_stops_the_followers_with_its_error():
    def body(leader, model):
        with leader.gathered(model, "all"):
            raise RuntimeError("server said 500")

    out, log, _ = _run_pair(body)
    assert isinstance(out["lead_error"], RuntimeError) and str(out["lead_error"]) == "server said 500"
    assert isinstance(out["error"], FollowerStopped)
    assert "rank 0's weight sync failed (RuntimeError: server said 500)" in str(out["error"])
    assert [r for r, _ in log] == [0, 1] or [r for r, _ in log] == [1, 0]  # both gathered before the failure


def test_an_unknown_step_is_an_error_not_a_hang():
    bus = _Bus()
    follower = LeadFollow(gather=_recording_gather([], 1), broadcast=bus.follower)
    bus.q.put(("reshape", 3))
    with pytest.raises(RuntimeError, match="unknown sync step 'reshape'"):
        follower.follow(_Tiny())


def test_one_copy_announces_nothing_and_scores_directly():
    model, ids = _Tiny(), [3, 1, 4, 1, 5]
    one = OneCopy()
    with one.leading(), one.gathered(model, "all") as got:
        assert got is None  # the push reads the model
        assert one.logprobs(model, ids) == probe.token_logprobs(model, ids)
    assert one.follow(model) is None and one.sharded is False


def test_selected_parameters():
    model = _Tiny()
    assert [tuple(p.shape) for p in selected(model, "trainable")] == [(11, 8), (11,)]
    assert len(selected(model, "all")) == 3
    with pytest.raises(ValueError, match="reads must be one of"):
        selected(model, "adapter")


@pytest.mark.parametrize(("stage", "fsdp2", "lead"), [(3, False, "ZeRO-3"), ("3", False, "ZeRO-3"), (2, False, None),
                                                      (None, False, None), (None, True, "FSDP2")])
def test_for_accelerator_leads_only_when_the_weights_are_sharded(stage, fsdp2, lead):
    plugin = None if stage is None else SimpleNamespace(zero_stage=stage)
    acc = SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin), num_processes=2, is_fsdp2=fsdp2)
    got = for_accelerator(acc)
    assert isinstance(got, LeadFollow if lead else OneCopy)
    assert lead is None or got.name == lead


def test_every_sync_and_wrapper_says_what_a_push_reads():
    """The trainer gathers `weight_sync.reads` around each push: the Atropos fence and the quantized-base wrapper
    pass their inner mode's answer on (a missing one broke every Atropos run once); so for `hands_files` (whether
    the servers must read or be sent a push's files)."""
    from grpo_plugin.sync.fence import FencedSync
    from grpo_plugin.sync.ipc import IpcSync
    from grpo_plugin.sync.lora import LoraSync
    from grpo_plugin.sync.restart import RestartSync
    from grpo_plugin.sync.served_base import ServedBase

    assert (LoraSync.reads, RestartSync.reads, IpcSync.reads) == ("trainable", "all", "all")
    assert (LoraSync.hands_files, RestartSync.hands_files, IpcSync.hands_files) == (True, True, False)
    lora = SimpleNamespace(mode="lora_sync", needs_initial_push=True, starts_server=False, reads="trainable",
                           writes_in_place=False, hands_files=True)
    full = SimpleNamespace(mode="restart", needs_initial_push=True, starts_server=False, reads="all",
                           writes_in_place=True, hands_files=True)
    assert ServedBase(lora, client=None).reads == "trainable"
    assert FencedSync(ServedBase(lora, client=None), fence=None).reads == "trainable"
    assert FencedSync(full, fence=None).reads == "all"
    assert FencedSync(ServedBase(lora, client=None), fence=None).hands_files is True
