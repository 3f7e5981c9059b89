"""`grpo.sync: ipc` through `axolotl train` with a managed server, as a user runs the quickstart."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from grpo_plugin.sync.storage import default_sync_root
from tests.conftest import ROOT
from tests.e2e.test_axolotl_train import BIN, env, gone, managed_pid, quickstart

pytestmark = pytest.mark.e2e


def test_quickstart_ipc_learns_on_one_shared_copy_and_verifies_every_step(tmp_path, tiny_model_dir,
                                                                          tiny_data_file, cache_env):
    steps = 30
    before = set(default_sync_root().glob("grpo_plugin-ipc-*"))
    path, cfg = quickstart(tmp_path, tiny_model_dir, tiny_data_file, "quickstart_ipc.yaml", max_steps=steps)
    assert cfg["grpo"]["sync"] == "ipc" and "adapter" not in cfg
    proc = subprocess.run([str(BIN / "axolotl"), "train", str(path)], cwd=ROOT, env=env(), text=True,
                          capture_output=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    assert re.search(r"ipc: \d+ parameters attached to .*the trainer holds no copy of its own", log)
    recs = [json.loads(x) for x in (Path(cfg["output_dir"]) / "grpo_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, steps + 1))
    assert all(r["sync_mode"] == "ipc" and r["policy_lag"] == 0 for r in recs)
    # step 1 verifies the initial shared weights; every later step's optimizer write is verified before rollout
    diffs = [r["sync_logprob_diff"] for r in recs]
    assert all(d is not None and d <= 1e-4 for d in diffs), diffs
    summary = json.loads((Path(cfg["output_dir"]) / "grpo_summary.json").read_text())
    assert summary["all_syncs_verified"] is True, summary
    assert summary["reward_mean_last_20pct"] > summary["reward_mean_first_20pct"] + 0.2, summary
    gaps = [float(x) for x in re.findall(r"'sampling/sampling_logp_difference/mean': '([^']+)'", log)]
    assert len(gaps) == steps and max(gaps) < 1e-4, gaps  # rollouts come from exactly the trained weights
    assert gone(managed_pid(log), timeout=5)
    assert set(default_sync_root().glob("grpo_plugin-ipc-*")) <= before, "the shared weight file was left behind"
