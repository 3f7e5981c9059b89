"""Two trainer processes (accelerate, CPU/gloo) with a managed server: the layout of the multi-GPU recipes.
Only global rank 0 starts the server and pushes + verifies; the other rank waits at the barrier."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.e2e.test_axolotl_train import BIN, env, gone, quickstart

pytestmark = pytest.mark.e2e


def test_two_trainer_processes_share_one_managed_server(tmp_path, tiny_model_dir, tiny_data_file, cache_env):
    steps = 3
    path, cfg = quickstart(tmp_path, tiny_model_dir, tiny_data_file, "quickstart_restart.yaml", max_steps=steps,
                           micro_batch_size=16)
    proc = subprocess.run([str(BIN / "axolotl"), "train", str(path), "--launcher", "accelerate", "--",
                           "--num_processes", "2", "--cpu"], cwd=ROOT, env=env(), text=True,
                          capture_output=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    started = re.findall(r"started managed vLLM server pid (\d+)", log)
    assert len(started) == 1, started  # rank 1 did not start a second server (it would hit "port in use")
    recs = [json.loads(x) for x in (Path(cfg["output_dir"]) / "grpo_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, steps + 1))  # one metrics writer: the main process
    assert all(r["sync_pushed"] and r["sync_logprob_diff"] <= 1e-4 for r in recs)
    assert gone(int(started[0]), timeout=5)
