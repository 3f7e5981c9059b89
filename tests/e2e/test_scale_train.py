"""Several vLLM servers through `axolotl train` (server/group.py), as a user runs the configs/scale quickstarts:
two managed servers on consecutive ports, rollouts from both, every push to both and verified on EACH by its own
probe; one server killed and the other hung mid-run, each brought back while the other keeps serving; ipc with
two servers and one shared copy of the weights, trained by two DDP ranks; restart with two servers is run by two
trainer ranks under DeepSpeed ZeRO-3.

Each test starts its own two servers (`num_servers` is what is under test); marked `slow`."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from rewards.toy_agent import ENV_REPLY
from tests.conftest import free_ports
from tests.e2e.test_async_prefetch import _check_async
from tests.e2e.test_axolotl_train import gone, quickstart
from tests.e2e.test_server_faults import _api_servers, _finish, _records, _start_train, _wait_step

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
TOL = 1e-4  # fp32 quickstarts


def _two_server_run(tmp_path, tiny_model_dir, tiny_data_file, mode: str, steps: int, deepspeed: str | None = None,
                    trl: dict | None = None, **grpo):
    extra = {"deepspeed": deepspeed} if deepspeed else {}
    if trl:
        extra["trl"] = trl
    path, cfg = quickstart(tmp_path, tiny_model_dir, tiny_data_file, config=f"scale/quickstart_2servers_{mode}.yaml",
                           max_steps=steps, grpo=grpo, **extra)
    cfg["vllm"]["port"] = free_ports(2)
    import yaml

    path.write_text(yaml.safe_dump(cfg))
    return path, cfg


def _urls(cfg) -> list[str]:
    port = cfg["vllm"]["port"]
    return [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]


def _weight_files(procs) -> set[str]:
    """The shared weight files (ipc/shm.py) these processes map."""
    files = set()
    for q in procs:
        try:
            files |= {m.path for m in q.memory_maps() if "/weights-" in m.path}
        except psutil.Error:
            pass
    return files


def _assert_verified_on_both(cfg, steps: int) -> dict:
    recs = _records(cfg)
    assert [r["step"] for r in recs] == list(range(1, steps + 1))  # no step lost, none repeated
    synced = [r for r in recs if r["sync_logprob_diff"] is not None]
    assert synced
    for r in synced:  # every sync measured on each server, each within the tolerance
        assert len(r["sync_server_diffs"]) == 2 and all(d <= TOL for d in r["sync_server_diffs"]), r
    for r in recs:  # each step's rollout came from both servers (4 prompts x 8 split 2 + 2 groups)
        assert r["server_rows"] is not None and all(n > 0 for n in r["server_rows"]), r
    s = json.loads((Path(cfg["output_dir"]) / "grpo_summary.json").read_text())
    assert s["all_syncs_verified"] is True and s["steps"] == steps, s
    assert [x["url"] for x in s["servers"]] == _urls(cfg), s["servers"]
    for x in s["servers"]:
        assert x["rollouts"] > 0 and x["syncs"] == len(synced) and x["syncs_verified"] == x["syncs"], s["servers"]
    return s


def _listening(proc_pid: int, port: int) -> int | None:
    """The PID of the API server under `proc_pid` that listens on `port`."""
    for p in _api_servers(proc_pid):
        try:
            if f"--port {port}" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                return p.pid
        except psutil.Error:
            pass
    return None


def _kill_second_then_hang_first(proc, cfg, log: Path, kill_at: int, hang_at: int) -> tuple[int, int, float]:
    """Kills (-9) the second server once `kill_at` steps are recorded, hangs (SIGSTOP) the first once `hang_at`
    are; each time checks that only the server at fault was restarted. Returns (the hung server's PID, the killed
    one's successor's, seconds from the SIGSTOP to the next step recorded)."""
    port = cfg["vllm"]["port"]
    _wait_step(cfg, kill_at, proc, log)
    first, second = _listening(proc.pid, port), _listening(proc.pid, port + 1)
    assert first and second and first != second
    psutil.Process(second).send_signal(signal.SIGKILL)
    _wait_step(cfg, kill_at + 2, proc, log)
    assert _listening(proc.pid, port) == first  # the other server was left alone
    restarted = _listening(proc.pid, port + 1)
    assert restarted not in (None, second)
    _wait_step(cfg, hang_at, proc, log)
    psutil.Process(first).send_signal(signal.SIGSTOP)
    t_stop = time.monotonic()
    _wait_step(cfg, hang_at + 1, proc, log)
    detected_and_recovered_s = time.monotonic() - t_stop
    assert _listening(proc.pid, port + 1) == restarted  # the healthy one was left alone
    assert _listening(proc.pid, port) not in (None, first)
    return first, restarted, detected_and_recovered_s


def test_lora_sync_two_managed_servers_one_killed_the_other_hung_each_recovered(tmp_path, tiny_model_dir,
                                                                                tiny_data_file, cache_env):
    """lora_sync on two managed servers with async prefetch, 24 steps: the second server is killed (-9) at step 6,
    the first hung (SIGSTOP) at step 14, each while a rollout is prefetched in the background. Each time only the
    server at fault is restarted (the other keeps its PID), the adapter re-pushed to both and verified on both (by
    the main thread: the background thread never restores weights; the stale prefetched rollout is dropped); the
    hang is detected from /health within the hang deadline and the hung server stopped (it is ours); every step
    trained once, the lag bound held, generation overlapping training, the reward rising. (lora_sync's async run
    with a killed server is this one.)"""

    steps = 24
    path, cfg = _two_server_run(tmp_path, tiny_model_dir, tiny_data_file, "lora_sync", steps,
                                trl={"async_prefetch": True}, server_timeout=240, server_hang_timeout=10)
    log = tmp_path / "train.log"
    proc = _start_train(path, log)
    try:
        first, restarted, detected_and_recovered_s = _kill_second_then_hang_first(proc, cfg, log, 6, 14)
    finally:
        text = _finish(proc, log)
    assert proc.returncode == 0, text[-6000:]
    s = _assert_verified_on_both(cfg, steps)
    recs = _records(cfg)
    hits = [d for r in recs for d in r.get("server_outage_detail", [])]
    assert len(hits) == 2 and all(h["restarted"] for h in hits), hits
    assert hits[0]["servers"] == [_urls(cfg)[1]] and hits[0]["step"] >= 6, hits
    assert hits[1]["servers"] == [_urls(cfg)[0]] and "no answer to /health" in hits[1]["cause"], hits
    assert detected_and_recovered_s < 10 + 120, detected_and_recovered_s  # hang deadline + one restart
    assert gone(first, timeout=5)  # the hung server was stopped, not left behind
    assert s["reward_mean_last_20pct"] > s["reward_mean_first_20pct"] + 0.2, s
    assert gone(restarted, timeout=30)  # both of ours stopped at the end
    assert (Path(cfg["output_dir"]) / "vllm_server-1.log").exists()  # the second server's own log
    assert "recovered in" in text
    _check_async(cfg, text, steps)


def test_restart_two_managed_servers_two_zero3_ranks_one_killed_the_other_hung_each_recovered(
        tmp_path, tiny_model_dir, tiny_data_file, cache_env):
    """Full fine-tuning on two managed servers by two trainer ranks under DeepSpeed ZeRO-3 (one run for all three,
    to keep CI's time): every weight is gathered on both ranks for each push (sync/ranks.py), rank 0 writes it, both
    servers reload it in place; verified on each server at every push. The second server is killed (-9) at step 2,
    the first hung (SIGSTOP) at step 5: each time the ranks agree that the server was lost
    (server/rank_agreement.py), rank 0 restarts the one at fault (the other keeps its PID), rank 1 waits for its
    /health, both join the restore (a gathered push, verified on both servers), the rollouts lost are redone, and
    no rank is left waiting in a collective: every step trained once."""
    from transformers import AutoModelForCausalLM

    from tests.conftest import ROOT
    from tests.e2e.test_multiprocess_train import TWO_RANKS, zero3_gathered

    steps = 8
    path, cfg = _two_server_run(tmp_path, tiny_model_dir, tiny_data_file, "restart", steps,
                                deepspeed=str(ROOT / "deepspeed_configs/zero3.json"), server_timeout=240,
                                server_hang_timeout=10)
    log = tmp_path / "train.log"
    t0 = time.monotonic()
    proc = _start_train(path, log, TWO_RANKS)
    try:
        first, _, _ = _kill_second_then_hang_first(proc, cfg, log, 2, 5)
    finally:
        text = _finish(proc, log)
    print(f"two ZeRO-3 ranks, two servers, one killed and one hung: {time.monotonic() - t0:.0f} s")
    assert proc.returncode == 0, text[-6000:]
    assert "trainer rank 1 of 2 (DEEPSPEED ZeRO-3, cpu:0): joins rank 0's gathers" in text, text[-4000:]
    s = _assert_verified_on_both(cfg, steps)
    assert s["optimizer"] == "DeepSpeedZeroOptimizer_Stage3", s
    hits = [d for r in _records(cfg) for d in r.get("server_outage_detail", [])]
    assert len(hits) == 2 and all(h["restarted"] for h in hits), hits  # both recovered, each by a restart
    assert hits[0]["servers"] == [_urls(cfg)[1]] and hits[0]["step"] >= 2, hits
    assert hits[1]["servers"] == [_urls(cfg)[0]] and "no answer to /health" in hits[1]["cause"], hits
    assert all("weight push + probe" in h["redone"] for h in hits), hits
    assert text.count("trainer rank 1: the restarted vLLM server: it answers") == 2, text[-4000:]
    assert s["num_syncs"] == steps, s  # a push recorded for every step (an outage's step: its restore)
    assert gone(first, timeout=5)  # the hung server was stopped, not left behind
    params = list(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).parameters())  # tied weights once
    full, held = zero3_gathered(text, len(params))
    assert full == sum(p.numel() for p in params) and held < full * 0.6, (full, held)  # rank 0 holds ~half
    assert s["reward_mean_last_20pct"] > s["reward_mean_first_20pct"] + 0.2, s


def test_ipc_two_managed_servers_two_ddp_ranks_share_one_copy(tmp_path, tiny_model_dir, tiny_data_file, cache_env):
    """ipc with two servers and two trainer ranks (DDP, one run for both, to keep CI's time), the rollouts made by a
    multi-turn agent (trl.rollout_func: each rank's own call, generating on both servers): rank 0's model is the
    shared copy, the other rank keeps its replica; the second server maps the first's weight file (read from
    /proc/<pid>/maps of both server processes while training); the fence defaults to `server` with two ranks (the
    other rank may generate while rank 0's optimizer writes); rank 0 starts both servers; every step verified on
    both. Before the re-attach of sync/ipc.py `detached`, the probe stopped such a run at step 1 (0.215 nats):
    accelerate's device move had copied rank 0's parameters off the shared file."""
    from tests.e2e.test_multiprocess_train import TWO_RANKS, assert_two_ranks

    steps = 6
    path, cfg = _two_server_run(tmp_path, tiny_model_dir, tiny_data_file, "ipc", steps, ipc_fence=None,
                                trl={"rollout_func": "rewards.toy_agent.two_turns"})
    cfg["micro_batch_size"] = 16  # per rank: 2 prompts x 8
    import yaml

    path.write_text(yaml.safe_dump(cfg))
    port = cfg["vllm"]["port"]
    log = tmp_path / "train.log"
    proc = _start_train(path, log, TWO_RANKS)
    try:
        _wait_step(cfg, 3, proc, log)
        maps, server_pids = {}, set()
        for pid in (_listening(proc.pid, port), _listening(proc.pid, port + 1)):
            tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
            server_pids |= {q.pid for q in tree}
            maps[pid] = _weight_files(tree)
        others = [q for q in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
                  if q.pid not in server_pids]
        trainer_maps = _weight_files(others)
    finally:
        text = _finish(proc, log)
    assert proc.returncode == 0, text[-6000:]
    files = list(maps.values())
    assert len(files) == 2 and len(files[0]) == 1 and files[0] == files[1], maps  # ONE file, mapped by both
    assert next(iter(files[0])) in trainer_maps, (maps, trainer_maps)  # ... and by the trainer (rank 0)
    assert "1 more server(s) mapping the same file" in text
    assert_two_ranks(text, "MULTI_CPU")
    s = _assert_verified_on_both(cfg, steps)
    # the rollouts are the two-turn agent's (trl.rollout_func, rewards/toy_agent.py): each rank calls it with its
    # own 16 rows, through the handle, whose calls split across both servers; the record counts both ranks' rows
    for r in _records(cfg):
        assert r["agent_turns_mean"] == 2.0 and r["agent_generate_calls"] == 2 * 2, r
        assert r["agent_env_tokens"] == 32 * len(ENV_REPLY.encode()) and r["agent_unknown_origin_tokens"] == 0, r
        assert sum(r["server_rows"]) == 32 * 2 and r["policy_lag"] == 0, r  # every row's two turns, both servers
    assert s["reward_mean_last_20pct"] > s["reward_mean_first_20pct"] + 0.2, s
    started = re.findall(r"started managed vLLM server pid (\d+)", text)
    assert len(started) == 2, started  # both by rank 0
    # rank 0 only: at start, and once more after accelerate's move of the model to `cpu:0` (a copy) was found at
    # the first push — the probe of that push verified the re-attached weights
    assert text.count("parameters attached to") == 2 and text.count("moved off the shared copy") == 1, text[-3000:]
    assert all(gone(int(pid), timeout=5) for pid in started)
