"""`grpo.sync: ipc` through `axolotl train`, as a user runs the quickstart: with a managed server (the legacy
stack's smoke run) and from two terminals (`axolotl vllm-serve`, then `axolotl train`)."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from grpo_plugin.compat.host import host
from tests.e2e.test_axolotl_train import (
    gone,
    left_behind,
    managed_pid,
    quickstart,
    sampling_gaps,
    start_vllm_serve,
    sync_dirs,
    train,
)

pytestmark = pytest.mark.e2e


def check_ipc_quickstart(cfg: dict, log: str, steps: int) -> None:
    """An ipc quickstart run: the trainer trains the server's copy (none of its own), every step's optimizer
    write verified before the next rollout, sampled by exactly the weights trained, the reward rising."""
    assert cfg["grpo"]["sync"] == "ipc" and "adapter" not in cfg
    assert re.search(r"ipc: \d+ parameters attached to .*the trainer holds no copy of its own", log), log[-3000:]
    recs = [json.loads(x) for x in (Path(cfg["output_dir"]) / "grpo_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, steps + 1))
    assert all(r["sync_mode"] == "ipc" and r["policy_lag"] == 0 for r in recs)
    # step 1 verifies the initial shared weights; every later step's optimizer write is verified before rollout
    diffs = [r["sync_logprob_diff"] for r in recs]
    assert all(d is not None and d <= 1e-4 for d in diffs), diffs
    summary = json.loads((Path(cfg["output_dir"]) / "grpo_summary.json").read_text())
    assert summary["all_syncs_verified"] is True, summary
    assert summary["reward_mean_last_20pct"] > summary["reward_mean_first_20pct"] + 0.2, summary
    gaps = sampling_gaps(log)
    assert len(gaps) == steps and max(gaps) < 1e-4, gaps  # rollouts come from exactly the trained weights


# On the current stack, the two-terminal run below is this run too (20 steps, the same checks) and ipc's managed
# server runs in the fault run (tests/e2e/test_server_faults.py, killed and re-attached); the legacy stack, which
# runs neither, runs this one as its ipc smoke run.
@pytest.mark.smoke
@pytest.mark.skipif(host().stack != "legacy", reason="on this stack: test_vllm_serve_then_train_with_the_server_fence")
def test_quickstart_ipc_learns_on_one_shared_copy_and_verifies_every_step(tmp_path, tiny_model_dir,
                                                                          tiny_data_file, cache_env):
    steps = 20  # the tiny task's reward takes off around steps 3-10
    before = sync_dirs("ipc")
    path, cfg = quickstart(tmp_path, tiny_model_dir, tiny_data_file, "quickstart_ipc.yaml", max_steps=steps)
    proc = train(path, launcher=())  # the user's command as is
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    check_ipc_quickstart(cfg, log, steps)
    assert gone(managed_pid(log), timeout=5)
    assert not left_behind("ipc", before), "the shared weight file was left behind"


def test_vllm_serve_then_train_with_the_server_fence(tmp_path, tiny_model_dir, tiny_data_file, cache_env):
    """Two terminals: `axolotl vllm-serve` exports the shared weights (its own file, removed at Ctrl-C) and
    `axolotl train` attaches to them; every step is fenced with vLLM's /pause + /resume and verified. The ipc
    quickstart's run on this stack: 20 steps, learning."""
    steps = 20  # the tiny task's reward takes off around steps 3-10
    path, cfg = quickstart(tmp_path, tiny_model_dir, tiny_data_file, "quickstart_ipc.yaml", max_steps=steps,
                           grpo={"managed_server": False, "ipc_fence": "server"})
    serve_log, shared_dir = tmp_path / "serve.log", None
    serve = start_vllm_serve(path, serve_log)
    try:
        proc = train(path)
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, log[-5000:]
        m = re.search(r"weights shared in (\S+)\)", serve_log.read_text())
        assert m, serve_log.read_text()[-3000:]
        shared_dir = Path(m.group(1))
        assert any(shared_dir.glob("weights-*.bin")), "the serving server's shared file is missing"
        check_ipc_quickstart(cfg, log, steps)
        recs = [json.loads(x) for x in (Path(cfg["output_dir"]) / "grpo_metrics.jsonl").read_text().splitlines()]
        assert all(r["sync_ms"] > 1.0 for r in recs[1:]), recs  # /pause + /resume happened around each step
    finally:
        serve.send_signal(signal.SIGINT)
        serve.wait(timeout=90)
    assert shared_dir is not None and not shared_dir.exists(), "the shared weight file outlived the server"
