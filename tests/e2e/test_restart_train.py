"""`grpo.sync: restart` through `axolotl train` with a managed server, as a user runs it. The process strategy
(`restart_strategy: process`) runs through `axolotl train` in tests/e2e/test_server_faults.py, where its managed
server is also killed and hung."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.e2e.test_axolotl_train import (
    BIN,
    EVAL,
    assert_evaluated,
    env,
    gone,
    left_behind,
    managed_pid,
    quickstart,
    sync_dirs,
)

pytestmark = pytest.mark.e2e


def _train(path: Path) -> str:
    proc = subprocess.run([str(BIN / "axolotl"), "train", str(path)], cwd=ROOT, env=env(), text=True,
                          capture_output=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    return log


def _records(cfg) -> list[dict]:
    return [json.loads(x) for x in (Path(cfg["output_dir"]) / "grpo_metrics.jsonl").read_text().splitlines()]


@pytest.mark.smoke
def test_quickstart_restart_reload_learns_and_verifies_every_sync(tmp_path, tiny_model_dir, tiny_data_file,
                                                                  cache_env):
    steps = 20  # the tiny task's reward takes off around steps 3-10
    before = sync_dirs("restart")
    # with an eval set (a full-weight mode: each evaluation samples the weights reloaded in place)
    path, cfg = quickstart(tmp_path, tiny_model_dir, tiny_data_file, "quickstart_restart.yaml", max_steps=steps,
                           **EVAL)
    assert cfg["grpo"]["sync"] == "restart" and "adapter" not in cfg
    log = _train(path)
    recs = _records(cfg)
    assert [r["step"] for r in recs] == list(range(1, steps + 1))
    assert all(r["sync_mode"] == "restart" and r["sync_pushed"] and r["policy_lag"] == 0 for r in recs)
    diffs = [r["sync_logprob_diff"] for r in recs]
    assert all(d is not None and d <= 1e-4 for d in diffs), diffs
    summary = json.loads((Path(cfg["output_dir"]) / "grpo_summary.json").read_text())
    assert summary["all_syncs_verified"] is True and summary["num_syncs"] == steps
    assert summary["reward_mean_last_20pct"] > summary["reward_mean_first_20pct"] + 0.2, summary
    gaps = [float(x) for x in re.findall(r"'sampling/sampling_logp_difference/mean': '([^']+)'", log)]
    assert len(gaps) == steps and max(gaps) < 1e-4, gaps  # full-weight rollouts score as the trainer does
    assert gone(managed_pid(log), timeout=5)
    assert not left_behind("restart", before), "the run left its sync directory behind"
    assert_evaluated(Path(cfg["output_dir"]), summary, log, steps)
