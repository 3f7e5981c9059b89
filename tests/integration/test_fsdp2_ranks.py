"""FSDP2 `restart` with two CPU ranks (gloo) against the session's full-weight vLLM server, through sync/ranks.py's
FSDP2 gather (torch's `get_model_state_dict(full_state_dict=True, cpu_offload=True)`) on a model sharded by torch's
own `fully_shard`: each push reads the full weights on rank 0 and the probe's forward runs on both ranks. (FSDP2
`lora_sync` runs through `axolotl train` in tests/e2e/test_multiprocess_train.py; this covers full weights in ~15 s
on the shared server.) The worker, tests/integration/fsdp2_ranks.py, also takes `lora_sync`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, free_port

pytestmark = pytest.mark.integration
TOL = 1e-4


def _two_ranks(mode: str, model_dir, url: str, tmp_path) -> dict:
    out = tmp_path / "report.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'src'}")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(free_port()), str(ROOT / "tests/integration/fsdp2_ranks.py"), mode,
                           str(model_dir), url, str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    log = proc.stdout + proc.stderr
    assert "FSDP2: each push gathers" in log and "(rank 0 holds" in log, log[-3000:]
    return json.loads(out.read_text())


def _assert_pushed_trained_weights(report: dict) -> None:
    assert len(report["diffs"]) == 2 and all(d <= TOL for d in report["diffs"]), report["diffs"]
    first, second = report["probe"]
    assert max(abs(a - b) for a, b in zip(first, second)) > 1e-3  # the second step changed what was pushed


def test_fsdp2_restart_two_cpu_ranks(tiny_model_dir, full_weight_server, tmp_path):
    report = _two_ranks("restart", tiny_model_dir, full_weight_server[1].base_url, tmp_path)
    _assert_pushed_trained_weights(report)
    assert report["rank0_entries"] > 0  # rank 0 got the full state dict
