"""The GSM8K pieces inside a real `axolotl train` on CPU: the transform and both rewards by import path, the
weighted multi-reward aggregation and reward workers, on this plugin's trainer (tiny model, full fine-tune), on the
session's full-weight server (tests/conftest.py `full_weight_server`), unmanaged. Its optimizer is Adafactor, the
memory-lean choice for full fine-tuning (factored second moments, no first moment): every push of what it trained
verified."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.e2e.test_axolotl_train import quickstart, train
from tests.unit.test_gsm8k import _rows

pytestmark = pytest.mark.e2e


def test_gsm8k_transform_and_rewards_train_through_axolotl(tmp_path, tiny_model_dir, cache_env,
                                                           full_weight_server):
    rows = [r for r in _rows("test") if len(r["question"]) < 250][:64]  # the tiny model's context is 512
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    steps = 3
    path, cfg = quickstart(
        tmp_path, tiny_model_dir, data, "quickstart_restart.yaml", server=full_weight_server, max_steps=steps,
        optimizer="adafactor",
        datasets=[{"path": str(data), "ds_type": "json", "split": "train", "type": "rewards.gsm8k_transform",
                   "system_prompt": "Answer as #### N."}],
        trl={"reward_funcs": ["rewards.gsm8k.accuracy_reward", "rewards.gsm8k.format_reward"],
             "reward_weights": [1.0, 0.2], "multi_objective_aggregation": "normalize_then_sum",
             "reward_num_workers": 2},
    )
    proc = train(path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    for name in ("accuracy_reward", "format_reward"):  # both rewards ran on every step
        assert len(re.findall(rf"'rewards/{name}/mean': '([^']+)'", log)) == steps, name
    recs = [json.loads(x) for x in (Path(cfg["output_dir"]) / "grpo_metrics.jsonl").read_text().splitlines()]
    assert len(recs) == steps and all(r["sync_logprob_diff"] <= 1e-4 for r in recs)
    assert all(r["reward_mean"] is not None for r in recs)
    summary = json.loads((Path(cfg["output_dir"]) / "grpo_summary.json").read_text())
    assert summary["optimizer"] == "Adafactor", summary["optimizer"]
    assert summary["all_syncs_verified"] is True and summary["num_syncs"] == steps, summary
