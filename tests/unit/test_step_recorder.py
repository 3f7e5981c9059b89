"""recorder.py and producers/rollout.py without a trainer: what one step's record holds, what is kept across steps,
and what a rollout's record adds (the trainer feeds the recorder these calls on its main thread)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from grpo_plugin.producers.local import ITEMS_LOCAL, sum_over_ranks
from grpo_plugin.producers.rollout import ROLLOUT_KEY, AtroposBatch, PolicyLag, Rollout, record_of
from grpo_plugin.reporting.metrics import STEP_FIELDS
from grpo_plugin.reporting.recorder import StepRecorder, atropos_summary
from grpo_plugin.sync.base import SyncResult


def test_a_step_record_holds_the_contract_fields_and_the_next_step_starts_afresh():
    rec = StepRecorder()
    rec.synced(SyncResult(step=4, sync_ms=12.3456, verify_ms=2.0, logprob_diff=1e-6))
    rec.took(Rollout(wait_ms=10.0, generate_ms=30.0, policy_version=4, server_rows=[3, 5]), synced_version=4)
    rec.took(Rollout(wait_ms=5.0, generate_ms=1.0, policy_version=4, server_rows=[1, 1]), synced_version=4)
    rec.scored(torch.tensor([1.0, 0.0, 1.0, 0.0]))
    rec.add_loss(0.5)
    rec.add_loss(1.5)
    first = rec.record(5, 100.0, mode="lora_sync", outages=[{"down_s": 1.25}, {"down_s": 0.5}])
    assert set(STEP_FIELDS) <= set(first)
    assert first["step"] == 5 and first["sync_mode"] == "lora_sync" and first["sync_pushed"] is True
    assert first["sync_ms"] == 12.346 and first["verify_ms"] == 2.0 and first["sync_logprob_diff"] == 1e-6
    assert first["rollout_ms"] == 15.0 and first["generate_ms"] == 31.0 and first["server_rows"] == [4, 6]
    assert first["loss"] == 1.0 and first["reward_mean"] == 0.5 and first["policy_lag"] == 0
    assert first["sync_server_diffs"] == [1e-6]
    assert first["server_outages"] == 2 and first["server_down_s"] == 1.75 and len(first["server_outage_detail"]) == 2
    assert rec.log_fields() == {"grpo/sync_ms": 12.346, "grpo/sync_logprob_diff": 1e-6, "grpo/rollout_ms": 15.0,
                                "grpo/policy_lag": 0}

    # a step trained on the same rollout's micro-batches: no sync, no new rollout, no loss recorded
    second = rec.record(6, 50.0, mode="lora_sync", outages=[])
    assert second["sync_ms"] == 0.0 and second["sync_logprob_diff"] is None and second["sync_pushed"] is False
    assert second["rollout_ms"] == 0.0 and second["server_rows"] is None and second["loss"] is None
    assert "server_outage_detail" not in second and second["server_outages"] == 0
    # the rollout's version and rewards are kept: the step trains on that rollout
    assert second["policy_lag"] == 1 and second["reward_mean"] == 0.5


def test_an_atropos_rollout_brings_its_own_lag_batch_and_advantages():
    adv = torch.tensor([0.5, -0.5, 0.0, 0.0])
    rollout = Rollout(wait_ms=7.0, advantages=adv, real_rows=2, lag=PolicyLag(max=2, mean=1.5, source="ledger"),
                      batch=AtroposBatch(seq=3, groups=1, rejected_groups=1, padding_rows=2, queued=4))
    data = {"advantages": torch.zeros(4)}
    rewards = rollout.scored_rewards(data, torch.tensor([1.0, 0.0, float("nan"), float("nan")]))
    assert data["advantages"] is adv and rewards.tolist() == [1.0, 0.0]  # padding rows have no score

    rec = StepRecorder()
    rec.took(rollout, synced_version=9)  # the producer did not know the version: the server's is kept
    rec.scored(rewards)
    out = rec.record(10, 1.0, mode="ipc", outages=[])
    assert out["policy_lag"] == 2 and out["policy_lag_mean"] == 1.5 and out["policy_lag_source"] == "ledger"
    assert (out["atropos_batch"], out["atropos_groups"], out["atropos_rejected_groups"], out["atropos_padding_rows"],
            out["atropos_queued"]) == (3, 1, 1, 2, 4)
    assert rec.log_fields()["grpo/atropos_rejected_groups"] == 1
    summary = atropos_summary([out], type("S", (), {"atropos": type("A", (), {"url": "http://x"})()})())
    assert summary["atropos"]["batches_trained"] == 1 and summary["atropos"]["padding_rows"] == 2


def test_rewards_and_advantages_stay_axolotls_without_the_producers_own():
    data = {"advantages": torch.ones(2)}
    rewards = Rollout(wait_ms=0.0).scored_rewards(data, torch.tensor([1.0, 2.0]))
    assert rewards.tolist() == [1.0, 2.0] and data["advantages"].tolist() == [1.0, 1.0]


def test_a_rollout_carries_its_record_under_one_key():
    record = Rollout(wait_ms=3.0, generate_ms=4.0, policy_version=2, server_rows=[8])
    data = {ROLLOUT_KEY: record, "completion_ids": torch.zeros(8, 2)}
    assert record_of(data) is record
    with pytest.raises(KeyError, match="without its record"):
        record_of({"completion_ids": torch.zeros(8, 2)})




def test_each_environments_rows_and_reward_are_recorded_per_step_and_summarised():
    """Atropos with several environments: each step's record says how many rows each env_id had trained and their
    mean reward (padding rows excluded); the summary gives each environment's reward at the start and the end."""
    from grpo_plugin.atropos.onpolicy import Origin
    from grpo_plugin.reporting.recorder import envs_summary

    records = []
    for step, (r0, r1) in enumerate([(0.0, 0.5), (0.2, 0.5), (0.4, 0.5), (0.6, 0.5), (0.8, 0.5)]):
        origin = Origin(step=step, env_ids=[0, 0, 1, 1], groups=[0, 0, 1, 1], versions=None, warn=0.05, reject=0.5)
        rollout = Rollout(wait_ms=0.0, advantages=torch.zeros(6), real_rows=4, origin=origin)
        data = {"advantages": torch.zeros(6)}
        rollout.scored_rewards(data, torch.tensor([r0, r0, r1, r1 + 0.5, float("nan"), float("nan")]))
        rec = StepRecorder()
        rec.took(rollout, synced_version=step)
        rec.scored(torch.tensor([r0]), rollout)
        records.append(rec.record(step + 1, 1.0, mode="lora_sync", outages=[]))
    assert records[0]["atropos_envs"] == {"0": {"rows": 2, "reward_mean": 0.0}, "1": {"rows": 2, "reward_mean": 0.75}}
    envs = envs_summary(records)
    assert envs["0"] == {"rows": 10, "steps": 5, "reward_mean_first_20pct": 0.0, "reward_mean_last_20pct": 0.8}
    assert envs["1"]["reward_mean_first_20pct"] == envs["1"]["reward_mean_last_20pct"] == 0.75


def test_a_record_with_several_ranks_counts_the_whole_batch():
    """Each rank makes its share of the step's rollout; the record rank 0 keeps sums the counts of every rank (what
    local.sum_over_ranks gathers), and averages the per-rollout means and rates (equal rows per rank)."""
    rank0 = {"agent_turns_mean": 2.0, "agent_model_tokens": 200, "agent_env_tokens": 128, "agent_truncated": 3,
             "agent_tool_call_rate": 0.5, "agent_tool/lookup/calls": 4}
    rank1 = {"agent_turns_mean": 3.0, "agent_model_tokens": 260, "agent_env_tokens": 256, "agent_truncated": 0,
             "agent_tool_call_rate": 1.0, "agent_tool/search/calls": 2}
    record = Rollout(wait_ms=1.0, server_rows=[10, 6], agent=dict(rank0))
    data = {"num_items_in_batch": torch.tensor(200), ROLLOUT_KEY: record, ITEMS_LOCAL: True}
    gathered = []

    def gather_object(objs):  # the collective: this rank's value among every rank's, in rank order
        gathered.append(objs)
        return objs + [([7, 9], dict(rank1))]

    spec = SimpleNamespace(num_processes=2, gather=lambda t: torch.stack([t, torch.tensor(260)]),
                           gather_object=gather_object)
    sum_over_ranks(data, spec)
    assert gathered == [[([10, 6], rank0)]] and ITEMS_LOCAL not in data
    assert int(data["num_items_in_batch"]) == 460
    assert record.server_rows == [17, 15]
    assert record.agent == {"agent_turns_mean": 2.5, "agent_model_tokens": 460, "agent_env_tokens": 384,
                            "agent_truncated": 3, "agent_tool_call_rate": 0.75, "agent_tool/lookup/calls": 4,
                            "agent_tool/search/calls": 2}
    one = Rollout(wait_ms=1.0, server_rows=[4], agent=None)  # a single-turn rollout: no agent figures appear
    one.add_other_ranks([([4], None), ([5], None)])
    assert one.server_rows == [9] and one.agent is None
