"""grpo.atropos end to end, as a user runs it: `python -m grpo_plugin.atropos.launch config.yaml` starts the real
Atropos run-api, `axolotl vllm-serve`, `axolotl train` and an Atropos environment (atroposlib BaseEnv) that
generates on our server's /generate route and posts scored groups."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from grpo_plugin.training.checkpoints import is_complete
from tests.conftest import ROOT, free_port
from tests.e2e.test_axolotl_train import FAST, env, gone
from tests.e2e.test_multiprocess_train import TWO_RANKS, assert_two_ranks

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # each run launches four processes: 2-4 min apiece
LAUNCH = [sys.executable, "-m", "grpo_plugin.atropos.launch"]


def atropos_config(tmp_path: Path, tiny_model_dir, tiny_data_file, *, full_weights: bool = False,
                   grpo: dict | None = None, atropos: dict | None = None, name: str = "quickstart_atropos.yaml",
                   **top) -> tuple[Path, dict]:
    cfg = yaml.safe_load((ROOT / "configs" / name).read_text())
    if cfg.get("deepspeed"):
        cfg["deepspeed"] = str(ROOT / cfg["deepspeed"])
    cfg["base_model"] = str(tiny_model_dir)
    cfg["output_dir"] = str(tmp_path / "out")
    cfg["vllm"]["port"] = free_port()
    block = cfg["grpo"]["atropos"]
    block.update(atropos or {}, url=f"http://127.0.0.1:{free_port()}")
    args = block["envs"][0]["args"]
    args[args.index("--env.data_path") + 1] = str(tiny_data_file)
    if full_weights:
        for key in ("adapter", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"):
            cfg.pop(key)
    cfg["grpo"].update(grpo or {})
    cfg.update(top)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, cfg


def launch_cmd(path: Path, *train_args: str) -> list[str]:
    """The Atropos launcher on `path`, its `axolotl train` without accelerate's launcher (FAST) plus `train_args`."""
    return [*LAUNCH, str(path), "--", *FAST, *train_args]


def launch(path: Path, *train_args: str, timeout: float = 900, two_ranks: bool = False) -> subprocess.CompletedProcess:
    """`two_ranks`: `axolotl train` through accelerate's launcher with two trainer processes."""
    cmd = [*LAUNCH, str(path), "--", *TWO_RANKS] if two_ranks else launch_cmd(path, *train_args)
    return subprocess.run(cmd, cwd=ROOT, env=env(), text=True, capture_output=True, timeout=timeout)


def started_pids(log: str) -> dict[str, int]:
    return {name: int(pid) for name, pid in re.findall(r"started (.+?) \(pid (\d+)\)", log)}


def records(cfg: dict) -> list[dict]:
    return [json.loads(x) for x in (Path(cfg["output_dir"]) / "grpo_metrics.jsonl").read_text().splitlines()]


def summary(cfg: dict) -> dict:
    return json.loads((Path(cfg["output_dir"]) / "grpo_summary.json").read_text())


def assert_everything_stopped(log: str) -> None:
    pids = started_pids(log)
    assert {"Atropos run-api", "trainer (axolotl train)", "environment 0 (grpo_plugin.atropos.prompt_env)"} <= set(
        pids), pids
    assert all(gone(pid, timeout=10) for pid in pids.values()), pids


def test_quickstart_and_third_party_environments_learn_on_every_route_on_two_zero3_ranks(
        tmp_path, tiny_model_dir, tiny_data_file, cache_env):
    """The quickstart on two trainer ranks under DeepSpeed ZeRO-3 (configs/scale/quickstart_atropos_2ranks_zero3.yaml:
    lora_sync, its own environment, a local eval set; rank 0 fetches each batch and hands it to rank 1, each trains
    half of its rows) with three environments beside it written as the Atropos project writes its own
    (tests/e2e/third_party_env.py: no code of the plugin's), one per route: atroposlib's managed server with
    chat_completion, with completion, and the plain OpenAI completions API naming the BASE model (the env builds
    tokens and logprobs from the reply). One launcher run (one test for both, to keep CI's time), the probe after
    every push answered while the four keep generating: every batch trained once in fetch order, every sync
    verified, the reward and the eval reward rising, and EACH environment's reward high at the end — including the
    OpenAI route's, which would stay at the untrained model's if its base-named requests sampled the base model
    instead of the adapter being trained. Its rows are not in the server's ledger: counted as of unknown origin,
    their lag a lower bound."""
    steps = 20  # the tiny task's reward takes off around steps 5-10
    # with a local eval set (16 digit prompts) scored by grpo.atropos.eval_reward_funcs at steps 0, 10 and 20
    evals = {"test_datasets": [{"path": str(tiny_data_file), "ds_type": "json", "split": "train[:16]"}],
             "eval_strategy": "steps", "eval_steps": 10, "eval_batch_size": 32}
    path, cfg = atropos_config(tmp_path, tiny_model_dir, tiny_data_file, max_steps=steps,
                               name="scale/quickstart_atropos_2ranks_zero3.yaml",
                               atropos={"eval_reward_funcs": ["rewards.toy.digit_reward"]}, **evals)
    cfg["grpo"]["atropos"]["envs"] += [
        {"module": "tests.e2e.third_party_env",
         "args": ["--env.data_path", str(tiny_data_file), "--env.route", route, "--env.max_batches_offpolicy", "1"]}
        for route in ("managed_chat", "managed_completion", "openai")]
    path.write_text(yaml.safe_dump(cfg))
    proc = launch(path, two_ranks=True)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert_two_ranks(log, "DEEPSPEED ZeRO-3", ("gathers", "joins"))
    # rank 0 alone registered, with both ranks' rows per step
    assert log.count("atropos: registered with the run-api at") == 1 and "32 sequences per batch" in log, log[-6000:]
    recs = records(cfg)
    assert [r["step"] for r in recs] == list(range(1, steps + 1))
    # every step trained a whole Atropos batch; none was rejected or padded
    assert all(r["atropos_rejected_groups"] == 0 and r["atropos_padding_rows"] == 0 for r in recs), recs
    assert all(r["atropos_groups"] == 4 for r in recs)
    assert [r["atropos_batch"] for r in recs] == list(range(steps))  # in fetch order, each once
    # every sync pushed and verified by the logprob probe; the lag of each batch is known: from the server ledger
    # (a batch of OpenAI-route groups only: a lower bound)
    assert all(r["sync_pushed"] and r["sync_logprob_diff"] is not None and r["sync_logprob_diff"] <= 1e-4
               for r in recs), [r["sync_logprob_diff"] for r in recs]
    sources = [r["policy_lag_source"] for r in recs]
    assert set(sources) <= {"ledger", "fetch_lower_bound"} and sources.count("ledger") >= steps // 2, sources
    assert all(r["policy_lag"] is not None for r in recs)
    assert recs[0]["policy_lag"] == 0 and max(r["policy_lag"] for r in recs) >= 1  # async: some batches lag
    assert len(re.findall(r"'grpo/policy_lag': \d+", log)) == steps
    s = summary(cfg)
    assert s["all_syncs_verified"] is True and s["optimizer"] == "DeepSpeedZeroOptimizer_Stage3", s
    a = s["atropos"]
    assert a["batches_trained"] == steps and a["rejected_groups"] == 0 and a["offpolicy_rejected_groups"] == 0, a
    assert a["unknown_origin_rows"] > 0, a  # the OpenAI route's rows: not generated through /generate
    assert len(a["envs"]) == 4, a["envs"]  # every environment sent groups that trained
    print("per environment:", a["envs"], "unknown-origin rows:", a["unknown_origin_rows"])
    assert s["reward_mean_last_20pct"] > s["reward_mean_first_20pct"] + 0.2, s
    # the untrained model's completions are ~5-10% digits: an environment whose samples did not come from the
    # policy being trained (the OpenAI route's base-named requests served by the base model) stays there. How many
    # groups each environment gets into the run, and when, depends on timing (one got 5 of them, and its last rows
    # came while the policy was still learning: 0.40; one started only once the policy had learned: 0.84 at its
    # start), so each must end well above the untrained model and not below its own start (within a group's noise)
    for env_id, e in a["envs"].items():
        last, first = e["reward_mean_last_20pct"], e["reward_mean_first_20pct"]
        assert last > 0.3 and last >= first - 0.1, (env_id, a["envs"])
    # the eval set, generated on the run's server with the evaluated step's weights, scored by the eval rewards
    evaluated = [json.loads(x) for x in (Path(cfg["output_dir"]) / "grpo_eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evaluated] == [0, 10, 20], evaluated
    assert evaluated[-1]["reward"] > evaluated[0]["reward"] + 0.3, evaluated
    assert "'eval_rewards/env_score/mean'" in log
    assert_everything_stopped(log)
    pids = started_pids(log)
    assert sum(name.startswith("environment") for name in pids) == 4, pids


# Full-weight training on Atropos batches: `ipc` (the mode whose writes Atropos's own generation must be fenced
# from). `restart` under Atropos is the same producer and the same fence wrapper (tests/unit: every sync mode
# through the Atropos fence, tests/unit/test_ranks.py); its e2e run was folded to keep CI in its budget
# (docs/testing.md).
def _wait_for(cond, timeout: float, what: str, proc: subprocess.Popen, log: Path):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        if proc.poll() is not None:
            pytest.fail(f"the launcher exited ({proc.returncode}) before {what}:\n{log.read_text()[-6000:]}")
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}:\n{log.read_text()[-6000:]}")


def test_killed_ipc_run_resumes_without_losing_or_repeating_a_batch_and_rejects_a_malformed_group(
        tmp_path, tiny_model_dir, tiny_data_file, cache_env):
    """Full weights shared with the server (ipc) on Atropos batches. Run 1 is killed (SIGKILL to `axolotl train`)
    mid-run, after a checkpoint; run 2 resumes from it: the batches trained after the checkpoint and those fetched
    but never trained are replayed from the spool, in order, before new ones. During run 2 a malformed group (a
    token id outside the vocabulary) is posted to the run-api: it is rejected with a reason, the other groups of
    its batch train, and the run completes; every sync of both runs verified. (lora_sync on Atropos batches: the
    two runs above.)"""
    steps = 12
    path, cfg = atropos_config(tmp_path, tiny_model_dir, tiny_data_file, full_weights=True, grpo={"sync": "ipc"},
                               max_steps=steps, learning_rate=1e-4, save_strategy="steps", save_steps=3,
                               auto_resume_from_checkpoints=True)
    out = Path(cfg["output_dir"])
    metrics = out / "grpo_metrics.jsonl"
    log1 = tmp_path / "run1.log"
    with log1.open("w") as fh:
        run1 = subprocess.Popen(launch_cmd(path), cwd=ROOT, env=env(), stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        _wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 5, 600,
                  "step 5 of run 1", run1, log1)
        trainer = started_pids(log1.read_text())["trainer (axolotl train)"]
        os.killpg(trainer, signal.SIGKILL)  # the trainer's own process group, started by our launcher
        assert run1.wait(timeout=180) != 0
    finally:
        if run1.poll() is None:
            os.killpg(run1.pid, signal.SIGINT)
            run1.wait(timeout=180)
    run1_recs = [json.loads(x) for x in metrics.read_text().splitlines()]
    # the kill may land while a checkpoint is being written: run 2 resumes from the newest COMPLETE one
    checkpoints = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*") if is_complete(p))
    assert checkpoints and checkpoints[-1] < len(run1_recs) + 1, (checkpoints, len(run1_recs))
    resumed_at = checkpoints[-1]
    spooled = sorted(p.name for p in (out / "atropos_spool").rglob("*.batch"))
    assert spooled, "run 1 left nothing in the spool"

    log2 = tmp_path / "run2.log"
    with log2.open("w") as fh:
        run2 = subprocess.Popen(launch_cmd(path), cwd=ROOT, env=env(), stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        _wait_for(lambda: "registered with the run-api" in log2.read_text(), 600, "run 2 to register", run2, log2)
        url = cfg["grpo"]["atropos"]["url"]
        bad = {"tokens": [[5, 6, 10 ** 6]] * 8, "masks": [[-100, 6, 10 ** 6]] * 8,
               "inference_logprobs": [[1.0, -0.5, -0.5]] * 8, "scores": [0.0] * 8}
        assert requests.post(f"{url}/scored_data", json=bad, timeout=10).status_code == 200
        assert run2.wait(timeout=900) == 0, log2.read_text()[-6000:]
    finally:
        if run2.poll() is None:
            os.killpg(run2.pid, signal.SIGINT)
            run2.wait(timeout=180)
    log = log2.read_text()
    assert f"resuming at step {resumed_at}" in log, log[-4000:]
    recs = records(cfg)  # run 1's lines up to the checkpoint, then run 2's
    assert [r["step"] for r in recs] == list(range(1, steps + 1))
    assert recs[:resumed_at] == run1_recs[:resumed_at]
    run2_recs = recs[resumed_at:]
    trained = [r["atropos_batch"] for r in recs]
    assert trained == list(range(len(trained))), trained  # every fetched batch once, in order: none lost or repeated
    s = summary(cfg)
    assert s["steps"] == steps and s["atropos"]["batches_trained"] == steps, s
    assert s["atropos"]["rejected_groups"] == 1, s
    assert re.search(r"rejected group \d+: tokens\[0\]\[2\] = 1000000 is not a token id", log), log[-4000:]
    hit = [r for r in run2_recs if r["atropos_rejected_groups"]]
    assert len(hit) == 1 and hit[0]["atropos_padding_rows"] == 8 and hit[0]["atropos_groups"] == 3, hit
    assert s["all_syncs_verified"] is True, s
    assert all(r["sync_mode"] == "ipc" for r in recs), recs
    # rows run 1's server generated and run 2 replays from the spool: that server's ledger went with it, so their
    # lag is a lower bound; everything else from the ledger
    sources = [r["policy_lag_source"] for r in recs]
    replayed = sources[resumed_at:].count("fetch_lower_bound")
    assert sources == ["ledger"] * resumed_at + ["fetch_lower_bound"] * replayed + ["ledger"] * (
        steps - resumed_at - replayed), sources
    assert all(r["sync_logprob_diff"] is not None and r["sync_logprob_diff"] <= 1e-4 for r in recs), recs
    assert_everything_stopped(log)
