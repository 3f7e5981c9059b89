"""`grpo.sync: restart` through `axolotl train` with a managed server, as a user runs it. On the current stack this
run is the restart_reload run of tests/e2e/test_server_faults.py (its server hung mid-run), which makes these checks
too; the process strategy (`restart_strategy: process`) runs there as well, its managed server killed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from grpo_plugin.compat.host import host
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
    sampling_gaps,
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


def check_restart_quickstart(cfg: dict, recs: list[dict], log: str, steps: int) -> None:
    """The restart quickstart's run: every step pushed full weights (reloaded in place) and verified, sampled by
    exactly the weights trained, the reward and the eval reward rising."""
    assert cfg["grpo"]["sync"] == "restart" and "adapter" not in cfg
    assert [r["step"] for r in recs] == list(range(1, steps + 1))
    assert all(r["sync_mode"] == "restart" and r["sync_pushed"] and r["policy_lag"] == 0 for r in recs)
    diffs = [r["sync_logprob_diff"] for r in recs]
    assert all(d is not None and d <= 1e-4 for d in diffs), diffs
    summary = json.loads((Path(cfg["output_dir"]) / "grpo_summary.json").read_text())
    assert summary["all_syncs_verified"] is True and summary["num_syncs"] >= steps, summary
    assert summary["reward_mean_last_20pct"] > summary["reward_mean_first_20pct"] + 0.2, summary
    gaps = sampling_gaps(log)
    assert len(gaps) == steps and max(gaps) < 1e-4, gaps  # full-weight rollouts score as the trainer does
    assert_evaluated(Path(cfg["output_dir"]), summary, log, steps)


# On the current stack the managed restart_reload fault run (tests/e2e/test_server_faults.py) is this run too, with
# a hung server on top: this one runs on the legacy stack (its one restart run: CI runs no fault test there).
@pytest.mark.smoke
@pytest.mark.skipif(host().stack != "legacy", reason="on this stack: the restart_reload run of test_server_faults.py")
def test_quickstart_restart_reload_learns_and_verifies_every_sync(tmp_path, tiny_model_dir, tiny_data_file,
                                                                  cache_env):
    steps = 20  # the tiny task's reward takes off around steps 3-10
    before = sync_dirs("restart")
    # with an eval set (a full-weight mode: each evaluation samples the weights reloaded in place)
    path, cfg = quickstart(tmp_path, tiny_model_dir, tiny_data_file, "quickstart_restart.yaml", max_steps=steps,
                           **EVAL)
    log = _train(path)
    check_restart_quickstart(cfg, _records(cfg), log, steps)
    assert gone(managed_pid(log), timeout=5)
    assert not left_behind("restart", before), "the run left its sync directory behind"
