import json
import math

import pytest
import torch

from grpo_plugin.reporting.metrics import STEP_FIELDS, MetricsWriter, report, summarize
from grpo_plugin.sync import probe


class Bigram(torch.nn.Module):
    """log p(next | current) from a fixed table: a model whose logprobs we know in closed form."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.nn.Parameter(table)

    def forward(self, input_ids):
        return type("Out", (), {"logits": self.table[input_ids]})()


def test_token_logprobs_matches_closed_form_and_restores_mode():
    table = torch.randn(5, 5)
    m = Bigram(table).train()
    ids = [0, 3, 1, 4]
    got = probe.token_logprobs(m, ids)
    want = [torch.log_softmax(table[a], -1)[b].item() for a, b in zip(ids, ids[1:])]
    assert got == pytest.approx(want, abs=1e-6)
    assert m.training
    hot = probe.token_logprobs(m, ids, temperature=2.0)
    assert hot == pytest.approx([torch.log_softmax(table[a] / 2, -1)[b].item() for a, b in zip(ids, ids[1:])],
                                abs=1e-6)


def test_logprob_diff_and_check():
    assert probe.logprob_diff([-1.0, -2.0], [-1.0, -2.5]) == pytest.approx((0.25, 0.5))
    probe.check(5e-5, 1e-4, mode="lora_sync", step=3)
    with pytest.raises(probe.SyncVerificationError, match="grpo.sync=lora_sync: weight sync at step 3"):
        probe.check(0.2, 1e-4, mode="lora_sync", step=3)
    with pytest.raises(probe.SyncVerificationError):
        probe.check(float("nan"), 1e-4, mode="lora_sync", step=1)
    with pytest.raises(probe.SyncVerificationError, match="length mismatch"):
        probe.logprob_diff([-1.0], [-1.0, -2.0])
    assert probe.logprob_diff([float("nan")], [0.0]) == (math.inf, math.inf)


def _rec(step, reward, sync_ms=10.0, diff=1e-7):
    return {"step": step, "reward_mean": reward, "reward_std": 0.1, "loss": 0.0, "sync_mode": "lora_sync",
            "sync_ms": sync_ms, "sync_logprob_diff": diff, "rollout_ms": 100.0, "step_ms": 200.0,
            "policy_lag": 0, "trainer_rss_mb": 500.0 + step}


def test_summary_and_files(tmp_path):
    w = MetricsWriter(tmp_path)
    for i in range(1, 11):
        w.write(_rec(i, i / 10, sync_ms=float(i)))
    s = summarize(w.records, mode="lora_sync", model="m", tolerance=1e-4)
    w.finish(s)
    lines = [json.loads(x) for x in (tmp_path / "grpo_metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 10 and set(STEP_FIELDS) <= set(lines[0])
    assert s["num_syncs"] == 10 and s["all_syncs_verified"] is True
    assert s["sync_ms_median"] == 5.5 and s["sync_ms_total"] == 55.0
    assert s["reward_mean_first_20pct"] == pytest.approx(0.15)
    assert s["reward_mean_last_20pct"] == pytest.approx(0.95)
    assert s["trainer_peak_rss_mb"] == 510.0
    assert json.loads((tmp_path / "grpo_summary.json").read_text())["steps"] == 10
    assert (tmp_path / "grpo_curves.png").stat().st_size > 1000


def test_summary_flags_unverified_sync():
    recs = [_rec(1, 0.1), _rec(2, 0.2, diff=None), _rec(3, 0.3, diff=0.5)]
    assert summarize(recs, mode="lora_sync", model="m", tolerance=1e-4)["all_syncs_verified"] is False


def test_summary_counts_a_verified_initial_state_apart_from_pushes():
    first = {**_rec(1, 0.1, sync_ms=0.0, diff=2e-7), "sync_pushed": False}  # server already on these weights
    recs = [first, _rec(2, 0.2, sync_ms=30.0), _rec(3, 0.3, sync_ms=0.0, diff=None), _rec(4, 0.4, sync_ms=40.0)]
    s = summarize(recs, mode="restart", model="m", tolerance=1e-4)
    assert s["num_syncs"] == 2 and s["num_verified_without_push"] == 1
    assert s["sync_ms_median"] == 35.0  # the no-push check does not drag the median to 0
    assert s["all_syncs_verified"] is True


def test_writer_refuses_incomplete_record(tmp_path):
    with pytest.raises(KeyError, match="policy_lag"):
        MetricsWriter(tmp_path).write({k: 0 for k in STEP_FIELDS if k != "policy_lag"})


def test_a_resumed_run_keeps_the_steps_before_its_checkpoint_and_replaces_the_rest(tmp_path):
    first = MetricsWriter(tmp_path)
    for i in range(1, 8):  # run 1 crashed after step 7; its last checkpoint was step 5
        first.write(_rec(i, 0.1))
    with (tmp_path / "grpo_metrics.jsonl").open("a") as f:
        f.write('{"step": 8, "rew')  # the line a kill cut short
    second = MetricsWriter(tmp_path)
    assert [r["step"] for r in second.records] == []  # nothing decided before the first record
    for i in range(6, 11):
        second.write(_rec(i, 0.9))
    lines = [json.loads(x) for x in (tmp_path / "grpo_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(1, 11))
    assert [r["reward_mean"] for r in lines] == [0.1] * 5 + [0.9] * 5  # steps 6-7 of run 1 were replaced
    assert second.records == lines and second.kept_from_earlier_run == 5


def test_a_fresh_run_starts_the_file_over(tmp_path):
    old = MetricsWriter(tmp_path)
    for i in range(1, 4):
        old.write(_rec(i, 0.1))
    new = MetricsWriter(tmp_path)
    new.write(_rec(1, 0.7))
    lines = [json.loads(x) for x in (tmp_path / "grpo_metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["reward_mean"]) for r in lines] == [(1, 0.7)] and new.kept_from_earlier_run == 0


def test_report_shows_the_atropos_line_only_for_atropos_runs(tmp_path):
    w = MetricsWriter(tmp_path)
    for i in range(1, 4):
        w.write(_rec(i, i / 4))
    w.finish(summarize(w.records, mode="lora_sync", model="m", tolerance=1e-4))
    assert "atropos:" not in report(tmp_path) and "policy lag" not in report(tmp_path)
    atropos = {"url": "http://127.0.0.1:8000", "batches_trained": 3, "rejected_groups": 2, "padding_rows": 5,
               "policy_lag_max": 2, "policy_lag_mean": 1.25, "policy_lag_source": ["ledger"]}
    w.finish(summarize(w.records, mode="lora_sync", model="m", tolerance=1e-4, extra={"atropos": atropos}))
    text = report(tmp_path)
    assert "atropos: 3 batches from http://127.0.0.1:8000 · rejected groups 2 · padding rows 5" in text
    assert "policy lag mean 1.25 · max 2 (ledger)" in text


def test_listening_pid_finds_our_own_listener():
    import os
    import socket

    from grpo_plugin.reporting.metrics import listening_pid

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert listening_pid(s.getsockname()[1]) == os.getpid()


def test_the_summary_names_bitsandbytes_optimizers_by_bits_and_paging():
    import bitsandbytes as bnb
    import torch

    from grpo_plugin.reporting.metrics import optimizer_name

    params = [torch.nn.Parameter(torch.zeros(4))]
    assert optimizer_name(torch.optim.AdamW(params)) == "AdamW"
    assert optimizer_name(bnb.optim.AdamW(params, optim_bits=8, is_paged=True)) == "bitsandbytes AdamW 8-bit paged"
    assert optimizer_name(bnb.optim.AdamW(params, optim_bits=8)) == "bitsandbytes AdamW 8-bit"
    wrapped = type("AcceleratedOptimizer", (), {"optimizer": torch.optim.SGD(params, lr=0.1)})()
    assert optimizer_name(wrapped) == "SGD"
    assert optimizer_name(None) is None
