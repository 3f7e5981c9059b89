"""`axolotl train` on code: HumanEval rows through rewards.code_transform and stdin/stdout contest rows (APPS,
CodeContests, Codeforces and LiveCodeBench shapes, tests/data/code/) through rewards.code_contest_transform, in one
run, scored by the sandboxed execution reward, the all-pass reward and the format reward (plus probes that both
test columns reach the rewards); every sync verified. The run uses the session's LoRA server unmanaged
(tests/conftest.py `vllm_server`): the server's own life is tested elsewhere."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.e2e.test_axolotl_train import quickstart, train

pytestmark = pytest.mark.e2e


def test_code_rewards_train_through_axolotl(tmp_path, tiny_model_dir, tiny_data_file, cache_env, vllm_server):
    from grpo_plugin.codedata.humaneval import rows

    data = tmp_path / "code.jsonl"
    short = sorted(rows(), key=lambda r: len(r["instruction"]))[:16]  # the tiny model's context is 512 tokens
    assert len(short[-1]["instruction"]) < 330
    data.write_text("".join(json.dumps(r) + "\n" for r in short))
    contests = tmp_path / "contests.jsonl"  # the stdin/stdout rows of every shape, 5 times: 20 of 36 rows
    fixtures = Path(__file__).resolve().parents[1] / "data" / "code"
    stdio = [line for name in ("apps.jsonl", "code_contests.jsonl", "codeforces.jsonl", "livecodebench.jsonl")
             for line in (fixtures / name).read_text().splitlines()
             if "fn_name" not in line and "functional" not in line]
    assert len(stdio) == 4  # one stdin/stdout row of each shape
    contests.write_text("\n".join(stdio * 5) + "\n")
    steps = 4
    path, cfg = quickstart(
        tmp_path, tiny_model_dir, tiny_data_file, server=vllm_server, max_steps=steps,
        trl={"reward_funcs": ["rewards.code.code_execution_reward", "rewards.code.soft_format_reward",
                              "rewards.code.code_all_pass_reward", "tests.e2e.code_probe_reward.test_cases_arrived",
                              "tests.e2e.code_probe_reward.contest_tests_arrived"],
             "reward_weights": [1.0, 0.1, 0.0, 0.0, 0.0], "max_completion_length": 24},
        micro_batch_size=16)
    cfg["datasets"] = [{"path": str(data), "ds_type": "json", "split": "train", "type": "rewards.code_transform"},
                       {"path": str(contests), "ds_type": "json", "split": "train",
                        "type": "rewards.code_contest_transform"}]
    path.write_text(__import__("yaml").safe_dump(cfg))
    proc = train(path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    recs = [json.loads(x) for x in (Path(cfg["output_dir"]) / "grpo_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, steps + 1))
    assert all(r["sync_logprob_diff"] is not None and r["sync_logprob_diff"] <= 1e-4 for r in recs)
    # each reward ran on every step (axolotl logs their means); the probe saw the transform's test_cases column
    for name in ("code_execution_reward", "soft_format_reward", "code_all_pass_reward"):
        values = [float(v) for v in re.findall(rf"'rewards/{name}/mean': '?([0-9.e-]+)", log)]
        assert len(values) == steps and all(0.0 <= v <= 1.0 for v in values), (name, values)
    probe = [float(v) for v in re.findall(r"'rewards/test_cases_arrived/mean': '?([0-9.e-]+)", log)]
    assert probe == [1.0] * steps, probe
    contest_share = [float(v) for v in re.findall(r"'rewards/contest_tests_arrived/mean': '?([0-9.e-]+)", log)]
    assert len(contest_share) == steps and sum(contest_share) > 0, contest_share  # contest rows were scored
    # the logged reward is TRL's: the functions weighted by reward_weights (the two probes, 1.0 and > 0 above, weigh
    # 0), the same figure as the metrics file's and the summary's (axolotl alone logs the unweighted sum)
    logged = [float(v) for v in re.findall(r"'reward': '?([0-9.e-]+)", log)]
    assert len(logged) == steps and all(abs(a - r["reward_mean"]) <= 1e-3 * max(1.0, abs(a))
                                        for a, r in zip(logged, recs)), (logged, [r["reward_mean"] for r in recs])
