"""Atropos with several trainer ranks (producers/atropos.py, atropos/onpolicy.py): rank 0 alone fetches and hands
each step's batch to every rank, each rank trains its own rows of it, the loss is normalised by the whole batch's
tokens, the on-policy check judges groups whose rows sit on different ranks, and a failure on rank 0 reaches the
other ranks as an error naming it. The ranks are threads here and the collectives a stand-in that makes them meet
(the e2e run in tests/e2e/test_atropos_train.py uses two real processes and gloo)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from grpo_plugin.atropos import onpolicy
from grpo_plugin.atropos.fetcher import AtroposTimeout
from grpo_plugin.atropos.group_tensors import tensorize
from grpo_plugin.producers.atropos import AtroposProducer, PreparedBatch, _Taken, rank_rows, wait_bound
from grpo_plugin.producers.rollout import ROLLOUT_KEY
from tests.unit.test_atropos_onpolicy import STEP, _batch, _origin


class StandIn:
    """Collectives between threads that stand for trainer ranks: each call returns once every rank made it."""

    def __init__(self, n: int):
        self.n, self.slots, self.barrier = n, [None] * n, threading.Barrier(n, timeout=20)

    def _meet(self, rank: int, value):
        self.slots[rank] = value
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out

    def broadcast(self, rank: int, value):
        return self._meet(rank, value)[0]

    def gather_object(self, rank: int, values: list) -> list:
        return [v for part in self._meet(rank, values) for v in part]


def _on_ranks(n: int, fn) -> list:
    """fn(rank) on n threads; each one's result (or the exception it raised) in rank order."""
    out = [None] * n

    def run(rank):
        try:
            out[rank] = fn(rank)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            out[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


@pytest.mark.parametrize("sequences,local,ranks", [(8, 4, 2), (5, 3, 2), (6, 2, 3), (1, 4, 2)])
def test_rank_rows_cover_the_batch_once_and_pad_only_at_its_end(sequences, local, ranks):
    parts = [rank_rows(sequences, local, ranks, r) for r in range(ranks)]
    idx = torch.cat([i for i, _ in parts])
    real = torch.cat([m for _, m in parts])
    assert len(idx) == local * ranks
    assert idx[real].tolist() == list(range(sequences))  # every real row once, in order
    assert real.tolist() == [True] * sequences + [False] * (local * ranks - sequences)


def _batch_of(groups: list[list[float]]) -> PreparedBatch:
    """A batch of groups of two sequences (prompt 1, 2; completion 3, 4 + score-dependent token)."""
    raw = [{"tokens": [[1, 2, 3, 4 + i] for i in range(2)], "masks": [[-100, -100, 3, 4 + i] for i in range(2)],
            "scores": scores, "inference_logprobs": [[1.0, 1.0, -0.5, -0.5]] * 2} for scores in groups]
    t = tensorize(raw, pad_token_id=0, vocab_size=100, max_len=16)
    n = t.num_sequences
    return PreparedBatch(seq=4, meta={"synced_version": 0}, tensors=t, versions=[0] * n, env_ids=[0] * n,
                         prompts=[f"p{i}" for i in range(n)], completions=[f"c{i}" for i in range(n)],
                         completion_ids=[[3, 4]] * n, groups_received=len(groups))


def _producers(ranks: int, local: int, collective: StandIn, take) -> list[AtroposProducer]:
    out = []
    for rank in range(ranks):
        spec = SimpleNamespace(num_processes=ranks, process_index=rank, device="cpu",
                               broadcast_object=lambda v, rank=rank: collective.broadcast(rank, v))
        p = AtroposProducer.__new__(AtroposProducer)
        p.spec, p.leads, p.local_batch, p.global_batch = spec, rank == 0, local, local * ranks
        p.settings = SimpleNamespace(offpolicy_warn=0.05, offpolicy_reject=0.5)
        p._offpolicy_warned = set()
        p._take = take if rank == 0 else (lambda step: pytest.fail("only rank 0 fetches"))
        out.append(p)
    return out


def test_every_rank_trains_its_own_rows_of_rank_0s_batch_normalised_by_the_whole_batch():
    item = _batch_of([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # 6 sequences; 2 ranks x 4 rows: 2 padding rows
    collective = StandIn(2)
    producers = _producers(2, 4, collective, lambda step: _Taken(item=item, rejected=1, wait_ms=5.0, queued=2))
    out = _on_ranks(2, lambda r: producers[r].produce(None, 3)._data)
    assert not any(isinstance(o, Exception) for o in out), out
    assert [o["_deferred_prompts"] for o in out] == [["p0", "p1", "p2", "p3"], ["p4", "p5", "p0", "p1"]]
    scores = [[x["atropos_score"] for x in o["_deferred_inputs"]] for o in out]
    assert scores == [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, None, None]]  # the padding rows have none
    assert out[1]["completion_mask"][2:].sum() == 0  # and attend to nothing, train nothing
    trained = int(item.tensors.train_mask.sum())
    assert [int(o["num_items_in_batch"]) for o in out] == [trained, trained]  # every rank's tokens, on each rank
    records = [o[ROLLOUT_KEY] for o in out]
    assert [r.real_rows for r in records] == [6, 6] and records[1].batch.padding_rows == 2
    assert records[1].batch.queued == 2 and records[1].batch.rejected_groups == 1  # rank 0's figures everywhere
    assert [r.origin.first_row for r in records] == [0, 4] and [r.origin.says for r in records] == [True, False]
    # each rank's advantages are its rows' (the group-normalised ones of the batch), zero on padding rows
    whole = item.tensors.advantages
    assert torch.equal(records[0].advantages, whole[:4]) and torch.equal(records[1].advantages[:2], whole[4:])
    assert records[1].advantages[2:].abs().sum() == 0


def test_a_failure_on_rank_0_stops_every_rank_with_its_reason():
    def take(step):
        raise AtroposTimeout("no Atropos batch within 5 s (grpo.atropos.wait_timeout)")

    producers = _producers(2, 4, StandIn(2), take)
    out = _on_ranks(2, lambda r: producers[r].produce(None, 0))
    assert isinstance(out[0], AtroposTimeout) and "within 5 s" in str(out[0])
    assert isinstance(out[1], AtroposTimeout), out[1]
    assert "trainer rank 0, which fetches every rank's Atropos batch, stopped: AtroposTimeout: no Atropos batch" \
        in str(out[1])


def test_a_group_split_across_ranks_is_judged_whole_and_zeroed_on_both(capsys):
    # 3 groups of 4 from envs 0, 1, 2; env 1 sampled at another temperature than it said. 2 ranks x 6 rows:
    # group 1 (rows 4-7) has two rows on each rank
    trainer, env, mask = _batch([1.0, 2.0, 1.0])
    collective = StandIn(2)

    def rank(r):
        rows = slice(6 * r, 6 * r + 6)
        origin = _origin(3)
        origin.first_row = 6 * r
        data = {"old_per_token_logps": trainer[rows], "sampling_per_token_logps": env[rows],
                "completion_mask": mask[rows]}
        advantages = torch.arange(1.0, 13.0)[rows].clone()
        found = onpolicy.apply(origin, data, advantages, 12, lambda v: collective.gather_object(r, v))
        return advantages.tolist(), found

    (adv0, found0), (adv1, found1) = _on_ranks(2, rank)
    assert adv0 == [1.0, 2.0, 3.0, 4.0, 0.0, 0.0] and adv1 == [0.0, 0.0, 9.0, 10.0, 11.0, 12.0]
    assert found0 == found1 and [c.rejected_groups for c in found0] == [(), (1,), ()]
    assert found0[1].lag0_rows == 4  # the whole group, not a rank's half of it
    assert capsys.readouterr().err.count(f"env_id 1: rejected group(s) [1] of step {STEP}") == 1  # rank 0 says it


def test_with_several_ranks_rank_0_stops_waiting_before_the_collective_times_out(capsys):
    from grpo_plugin.config.schema import AtroposSettings

    default = AtroposSettings()
    assert wait_bound(default, 1, 1800) == 1800.0  # one rank: the setting as it is
    assert wait_bound(default, 2, 1800) == 1740.0 and capsys.readouterr().err == ""  # the default: quietly bounded
    assert wait_bound(AtroposSettings(wait_timeout=600), 2, 1800) == 600.0
    assert wait_bound(AtroposSettings(wait_timeout=0), 2, 7200) == 7140.0  # "forever" cannot outlast the others
    assert "so rank 0 waits at most 7140 s. Raise ddp_timeout" in capsys.readouterr().err
