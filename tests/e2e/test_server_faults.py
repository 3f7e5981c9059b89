"""A run survives its vLLM server (server/recovery.py), through `axolotl train` as a user runs it.

Faults are injected the way they happen on real machines: `kill -9` of the server's main process (a CUDA OOM,
a driver fault, the kernel's OOM killer), `SIGSTOP` (a hang: the process exists but answers nothing), and, for a
server started in another terminal, the test stopping it and starting a new one. The trainer must finish every
step, verify every sync (the post-sync probe), and record each outage.

Marked `slow` (each run lives through two or three server starts): `./scripts/test.sh -m "not slow"` leaves them
out locally; CI runs them. The async-prefetch outage runs with the async e2e test (tests/e2e/test_async_prefetch.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.conftest import ROOT
from tests.e2e import hosts
from tests.e2e.test_async_prefetch import _check_async
from tests.e2e.test_axolotl_train import (
    BIN,
    EVAL,
    FAST,
    env,
    gone,
    left_behind,
    managed_pid,
    quickstart,
    sync_dirs,
)
from tests.e2e.test_restart_train import check_restart_quickstart

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
TOL = 1e-4  # fp32 quickstarts


def _start_train(path: Path, log: Path, launcher: tuple[str, ...] = FAST) -> subprocess.Popen:
    """`axolotl train <path> [launcher args]` in its own session, output to `log`."""
    with log.open("w") as fh:
        return subprocess.Popen([str(BIN / "axolotl"), "train", str(path), *launcher], cwd=ROOT, env=env(),
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_file(path: Path, proc: subprocess.Popen, log: Path, timeout: float = 600) -> None:
    t0 = time.monotonic()
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"`axolotl train` exited ({proc.returncode}) before {path.name}:\n{log.read_text()[-6000:]}")
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"no {path.name} in {timeout} s:\n{log.read_text()[-6000:]}")
        time.sleep(0.1)


def _records(cfg) -> list[dict]:
    metrics = Path(cfg["output_dir"]) / "grpo_metrics.jsonl"
    return [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []


def _wait_step(cfg, n: int, proc: subprocess.Popen, log: Path, timeout: float = 600) -> None:
    t0 = time.monotonic()
    while len(_records(cfg)) < n:
        if proc.poll() is not None:
            pytest.fail(f"`axolotl train` exited ({proc.returncode}) before step {n}:\n{log.read_text()[-6000:]}")
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"step {n} not reached in {timeout} s:\n{log.read_text()[-6000:]}")
        time.sleep(0.2)


def _wait_upload(serve_log: Path, proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    """Until the server (its access log) has taken a file of a push begun after this call."""
    seen = serve_log.read_text().count('"PUT /grpo/files/')
    t0 = time.monotonic()
    while serve_log.read_text().count('"PUT /grpo/files/') == seen:
        if proc.poll() is not None or time.monotonic() - t0 > timeout:
            pytest.fail(f"no push began ({proc.poll()=}):\n{log.read_text()[-4000:]}")
        time.sleep(0.02)


def _api_servers(root_pid: int) -> list[psutil.Process]:
    """The vLLM API server processes started under `root_pid` (ours: the test started that process)."""
    out = []
    for p in psutil.Process(root_pid).children(recursive=True):
        try:
            if "vllm.entrypoints.openai.api_server" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            pass
    return out


def _server_of(proc: subprocess.Popen, timeout: float = 120) -> psutil.Process:
    """The one live vLLM API server under `axolotl train` (waits out a restart in progress)."""
    t0 = time.monotonic()
    while True:
        servers = []
        for p in _api_servers(proc.pid):
            try:
                if p.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_STOPPED):
                    servers.append(p)
            except psutil.Error:
                pass
        if len(servers) == 1:
            return servers[0]
        assert time.monotonic() - t0 < timeout, servers
        time.sleep(0.5)


def _finish(proc: subprocess.Popen, log: Path, timeout: float = 900) -> str:
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=120)
    return log.read_text()


def _train_killing_the_server_at(path: Path, cfg, log: Path, step: int) -> tuple[subprocess.Popen, str]:
    """`axolotl train` whose managed server is killed (-9) once `step` steps are recorded: (process, its log)."""
    proc = _start_train(path, log)
    try:
        _wait_step(cfg, step, proc, log)
        _server_of(proc).send_signal(signal.SIGKILL)
    finally:
        text = _finish(proc, log)
    return proc, text


def _assert_complete_and_verified(cfg, steps: int, outages: int) -> list[dict]:
    recs = _records(cfg)
    assert [r["step"] for r in recs] == list(range(1, steps + 1))  # no step lost, none repeated
    synced = [r for r in recs if r["sync_logprob_diff"] is not None]
    assert synced and all(r["sync_logprob_diff"] <= TOL for r in synced), [r["sync_logprob_diff"] for r in recs]
    assert sum(r["server_outages"] for r in recs) == outages, [r["server_outages"] for r in recs]
    for r in recs:
        if r["server_outages"]:
            # the step that lived through an outage trained on weights restored and verified on the new server
            assert r["sync_pushed"] and r["sync_logprob_diff"] <= TOL, r
            assert r["server_down_s"] > 0 and len(r["server_outage_detail"]) == r["server_outages"], r
    s = json.loads((Path(cfg["output_dir"]) / "grpo_summary.json").read_text())
    assert s["all_syncs_verified"] is True and s["steps"] == steps, s
    return recs


# Which fault each full-weight mode lives through: how an outage is detected (the process gone, or /health
# unanswered) is the same code for every mode, and lora_sync's run on two servers (test_scale_train.py) meets both;
# what differs per mode is how the new server gets the trainer's weights (an in-place reload, a restart on the
# written weights, a re-attach), which one outage exercises (one server start fewer per run than a kill and a hang
# each).
FAULTS = {"restart_reload": "hang", "restart_process": "kill", "ipc": "kill"}


@pytest.mark.parametrize("mode", list(FAULTS))
def test_full_weight_modes_survive_a_killed_or_hung_managed_server(mode, tmp_path, tiny_model_dir, tiny_data_file,
                                                                   cache_env):
    """kill -9 (or SIGSTOP: a hang) at step 4: the server restarted, the trainer's current weights put back
    (reload / a restart on the written weights / ipc re-attach), verified, every step trained. restart_process
    restarts the server at every push, which would replace a hung server before a rollout meets it: with
    sync_interval 6 and the kill at step 2, the recovery (itself such a push) comes first, and one regular push
    (6 steps after the recovery's) restarts the server later in the run. That run also holds what restart_process
    promises on its own: step 0 verified without a restart (the server started on the initial weights), only our
    own server restarted, nothing left in the sync directory."""
    config = "quickstart_ipc.yaml" if mode == "ipc" else "quickstart_restart.yaml"
    grpo: dict = {"server_hang_timeout": 10, "server_timeout": 240}  # a restart takes ~35 s here
    steps, fault_at = 20, 4  # the tiny task's reward takes off around steps 5-12
    # ipc's run is also ipc's async run (test_async_prefetch.py) and a multi-turn agent's whose server dies in the
    # middle of a rollout: the two-turn agent (tests/e2e/paused_agent.py) is killed between its turns at the
    # rollout of step fault_at + 1, prefetched in the background while step fault_at trains
    agent = mode == "ipc"
    trl = {"async_prefetch": True, "rollout_func": "tests.e2e.paused_agent.two_turns_paused_once"} if agent else {}
    if mode == "restart_process":  # every push is a 30 s restart here: fewer steps, no learning claim
        grpo.update(restart_strategy="process", sync_interval=6)
        steps, fault_at = 10, 2  # the recovery (a push) at step 3, the next regular push 6 steps after it
    # restart_reload's run is also the restart quickstart's, as a user runs it (the user's command, an eval set):
    # on this stack tests/e2e/test_restart_train.py is left to the legacy stack, which runs no fault test
    quick = mode == "restart_reload"
    before = sync_dirs("restart")
    path, cfg = quickstart(tmp_path, tiny_model_dir, tiny_data_file, config=config, max_steps=steps, grpo=grpo,
                           trl=trl, **(EVAL if quick else {}))
    log, out = tmp_path / "train.log", Path(cfg["output_dir"])
    if agent:
        out.mkdir(parents=True)
        (out / "pause_at_call").write_text(str(fault_at + 1))
    proc = _start_train(path, log, () if quick else FAST)
    try:
        if agent:  # the first turn of the rollout is sampled, the second not yet asked for
            _wait_file(out / "between_turns", proc, log)
        else:
            _wait_step(cfg, fault_at, proc, log)
        first = _server_of(proc)
        first.send_signal(signal.SIGSTOP if FAULTS[mode] == "hang" else signal.SIGKILL)
        if agent:
            assert gone(first.pid, timeout=30)
            (out / "go_on").touch()  # the second turn goes to a server that is no more
    finally:
        text = _finish(proc, log)
    assert proc.returncode == 0, text[-6000:]
    recs = _assert_complete_and_verified(cfg, steps, outages=1)
    hits = [r for r in recs if r["server_outages"]]
    # (the agent's rollout of step fault_at + 1 is cut while step fault_at trains: that step meets the outage)
    assert hits[0]["step"] >= fault_at if agent else hits[0]["step"] > fault_at, hits
    if FAULTS[mode] == "hang":
        assert "no answer to /health" in hits[0]["server_outage_detail"][0]["cause"], hits[0]
    if quick:  # what tests/e2e/test_restart_train.py checks of the quickstart
        check_restart_quickstart(cfg, recs, text, steps)
    assert gone(first.pid, timeout=5)  # a hung server is ours: stopped, not left behind
    s = json.loads((Path(cfg["output_dir"]) / "grpo_summary.json").read_text())
    if agent:
        for r in recs:  # every step trained a whole two-turn rollout, none the one cut between its turns
            assert r["agent_turns_mean"] == 2.0 and r["agent_generate_calls"] == 2, r
        calls = [int(x) for x in (out / "agent_calls").read_text().split()]
        assert calls == list(range(1, len(calls) + 1)) and len(calls) >= steps + 1, calls  # the cut one made again
        detail = hits[0]["server_outage_detail"][0]  # its second turn's request met the killed server
        assert detail["during"] == "rollout" and "exited with code -9" in detail["cause"], detail
        assert "rollout" in detail["redone"] and (out / "between_turns").read_text() == str(fault_at + 1), detail
    if mode == "ipc":
        assert text.count("re-attaching to the new server") == 1
        # async prefetch on the shared copy: rollouts generated while the step before trained, the lag bound
        # held across the re-attach (a rollout prefetched before the kill is dropped, not trained)
        _check_async(cfg, text, steps)
    if mode == "restart_process":
        # step 0: the managed server started on the initial weights, verified only (no restart)
        assert not recs[0]["sync_pushed"] and recs[0]["sync_ms"] == 0 and recs[0]["sync_logprob_diff"] <= TOL
        assert s["num_verified_without_push"] == 1, s
        # a regular push (not a recovery) after the outage: the server restarted on the trained weights
        regular = [r for r in recs[1:] if r["sync_pushed"] and not r["server_outages"]]
        assert regular and all(r["sync_ms"] > 1000 and r["sync_logprob_diff"] <= TOL for r in regular), recs
        assert "restarting vLLM on new weights" in text
        assert managed_pid(text) == first.pid  # the server killed here was the one it started
    else:  # 2 pushes in 10 steps is too few to learn the task
        assert s["reward_mean_last_20pct"] > s["reward_mean_first_20pct"] + 0.2, s
    if mode != "ipc":
        assert not left_behind("restart", before), "the run left its sync directory behind"


@pytest.mark.skipif(hosts.available() is not None, reason=f"two hosts: {hosts.available()}")
def test_unmanaged_server_on_another_host_killed_and_restarted_by_the_user(tmp_path, tiny_model_dir, tiny_data_file,
                                                                          cache_env):
    """Two hosts (tests/e2e/hosts.py: network, mount and PID namespaces of their own, joined by their own link; the
    server's host with a private /tmp and /dev/shm, the trainer's with a private /dev/shm): `axolotl vllm-serve` on
    host B, `axolotl train` (lora_sync, sync_interval 2) on host A naming B's address. Before the first push the
    trainer finds that the server cannot read its sync directory and sends every adapter version over the link.
    The server dies in the middle of a push (killed as soon as it took a push's first file); the trainer waits (it
    cannot restart what it did not start: it says so with the URL), the user starts it again on B, the trainer
    re-pushes, verifies and goes on. Later the link between the hosts drops for 6 s in the middle of another push
    (B's end of it down, then up): the run goes on, every push verified, no server restarted for it. The server keeps
    running after training until the user's Ctrl-C. (ipc's re-attach to a new server runs in the managed fault test and
    tests/integration/test_ipc_sync.py; ipc with a server on another host is refused before load.)"""
    steps = 12
    with hosts.Hosts() as net:
        path, cfg = quickstart(tmp_path, tiny_model_dir, tiny_data_file, max_steps=steps,
                               grpo={"managed_server": False, "server_hang_timeout": 10, "sync_interval": 2,
                                     "server_timeout": 240})  # a host that never serves fails in minutes
        cfg["vllm"]["host"] = net.addr("b")
        path.write_text(yaml.safe_dump(cfg))
        url = f"http://{net.addr('b')}:{cfg['vllm']['port']}"
        stage = tmp_path / "host-b"
        serve_cmd = [str(BIN / "axolotl"), "vllm-serve",
                     hosts.server_host_copy(stage, cfg, tiny_model_dir, tiny_data_file)]
        serve_logs = [tmp_path / "serve1.log", tmp_path / "serve2.log"]
        serve = net.popen("b", serve_cmd, log=serve_logs[0], env=env(), cwd=ROOT, private_tmp=stage)
        serve2 = None
        log = tmp_path / "train.log"
        # `axolotl train` waits for the server itself (with a progress line): started right away
        proc = net.popen("a", [str(BIN / "axolotl"), "train", str(path), *FAST], log=log, env=env(), cwd=ROOT)
        try:
            _wait_step(cfg, 4, proc, log)
            assert "vLLM server ready" in serve_logs[0].read_text()
            _wait_upload(serve_logs[0], proc, log)  # the next push has begun: its first file is there
            os.killpg(serve.pid, signal.SIGKILL)  # host B's server dies, all of it (its PID namespace)
            serve.wait(timeout=30)
            t0 = time.monotonic()
            while "waiting for it to come back" not in log.read_text():
                assert time.monotonic() - t0 < 120, log.read_text()[-4000:]
                assert proc.poll() is None, log.read_text()[-4000:]
                time.sleep(0.5)
            serve2 = net.popen("b", serve_cmd, log=serve_logs[1], env=env(), cwd=ROOT, private_tmp=stage)
            _wait_step(cfg, 8, proc, log)
            _wait_upload(serve_logs[1], proc, log)  # a push has begun: the link drops under it for 6 s
            net.link("b", False)
            time.sleep(6)
            net.link("b", True)
            text = _finish(proc, log)
            assert serve2.poll() is None  # an unmanaged server keeps running after training
        finally:
            if proc.poll() is None:
                text = _finish(proc, log)
            for s in (serve, serve2):
                if s is not None and s.poll() is None:
                    os.killpg(s.pid, signal.SIGINT)  # Ctrl-C in host B's terminal
                    s.wait(timeout=90)
    assert "stopping vLLM server" in serve_logs[1].read_text()
    assert proc.returncode == 0, text[-6000:]
    # the link's drop: recovered without a restart if a request of the push was cut (a reset, a stalled send), or
    # outlived by the connection; the server's death: one outage
    link = [o for r in _records(cfg) for o in r.get("server_outage_detail") or []
            if o["cause"].startswith("the link to the vLLM server failed")]
    assert all(not o["restarted"] and o["redone"][0] == "weight push + probe" for o in link), link
    recs = _assert_complete_and_verified(cfg, steps, outages=1 + len(link))
    hit = next(i for i, r in enumerate(recs) if r["server_outages"])
    assert not recs[hit]["server_outage_detail"][0]["restarted"]
    assert recs[hit]["server_outage_detail"][0] not in link
    assert "axolotl vllm-serve <config.yaml>" in text
    assert "recovered in" in text
    # sync_interval 2: pushes before steps 1, 3, 5 (global steps 0, 2, 4); the others train on 1-step-old rollouts
    # and record no sync (up to the outage, whose restore is a push of its own)
    calm = recs[:hit - hit % 2]
    assert len(calm) >= 4 and [r["policy_lag"] for r in calm] == [0, 1] * (len(calm) // 2), calm
    assert all(r["sync_ms"] > 0 and r["sync_logprob_diff"] <= TOL for r in calm[0::2])
    assert all(r["sync_ms"] == 0 and r["sync_logprob_diff"] is None for r in calm[1::2])
    assert all(r["policy_lag"] in (0, 1) for r in recs)
    assert f"the vLLM server at {url} cannot read the sync directory" in text  # found before the first push
    assert url in text[text.index("waiting for it to come back") - 400:][:800]  # the wait names the server
    summary = json.loads((Path(cfg["output_dir"]) / "grpo_summary.json").read_text())
    assert [x["weight_transport"] for x in summary["servers"]] == ["network"], summary["servers"]
    assert summary["servers"][0]["url"] == url
    assert summary["server_peak_rss_mb"] is None  # a server on another host is not measured (no local PID)


def test_restarts_exhausted_saves_a_checkpoint_that_resumes_with_a_verified_first_sync(
        tmp_path, tiny_model_dir, tiny_data_file, cache_env, vllm_server):
    """Run 1's managed server dies with `server_restarts: 0`: a checkpoint is saved and the resume command printed.
    Run 2 resumes from it against a server the user started (the session's, as `axolotl vllm-serve` would): the
    checkpoint's adapter is pushed and verified before its first rollout."""
    path, cfg = quickstart(tmp_path, tiny_model_dir, tiny_data_file, max_steps=10,
                           grpo={"server_restarts": 0})
    proc, text = _train_killing_the_server_at(path, cfg, tmp_path / "run1.log", 4)
    assert proc.returncode != 0
    assert "grpo.server_restarts is 0: the trainer does not restart it" in text, text[-4000:]
    out = Path(cfg["output_dir"])
    saved = sorted(out.glob("checkpoint-*"))
    assert len(saved) == 1, saved
    ckpt = saved[0]
    trained = int(ckpt.name.split("-")[1])
    assert trained >= 4 and (ckpt / "trainer_state.json").is_file() and (ckpt / "optimizer.pt").is_file()
    assert f"saved to {ckpt}" in text and f"resume_from_checkpoint: {ckpt}" in text, text[-3000:]
    run1 = _records(cfg)

    path2, _ = quickstart(tmp_path, tiny_model_dir, tiny_data_file, max_steps=trained + 3, server=vllm_server,
                          output_dir=str(out), resume_from_checkpoint=str(ckpt))
    log2 = tmp_path / "run2.log"
    proc2 = _start_train(path2, log2)
    text2 = _finish(proc2, log2)
    assert proc2.returncode == 0, text2[-6000:]
    recs = _records(cfg)
    assert [r["step"] for r in recs] == list(range(1, trained + 4))
    assert recs[:trained] == run1[:trained]
    first = recs[trained]  # the resumed run's first step: the checkpoint's weights pushed and verified first
    assert first["sync_pushed"] and first["sync_logprob_diff"] <= TOL, first
