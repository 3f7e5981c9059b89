"""The managed vLLM server dies with the trainer, even when the trainer is SIGKILLed (server/tether.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from grpo_plugin.server.tether import kept, tethered

_MIDDLE = textwrap.dedent("""
    import subprocess, sys, time
    from grpo_plugin.server.tether import tethered
    child = subprocess.Popen(tethered([sys.executable, "-c", "import time; time.sleep(120)"]))
    print(child.pid, flush=True)
    time.sleep(120)
""")


def test_tethered_child_dies_when_its_parent_is_sigkilled():
    middle = subprocess.Popen([sys.executable, "-c", _MIDDLE], stdout=subprocess.PIPE, text=True)
    try:
        child = psutil.Process(int(middle.stdout.readline()))
        deadline = time.monotonic() + 20  # wait for the exec: the tether's own command line is gone
        while "grpo_plugin.server.tether" in " ".join(child.cmdline()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert child.is_running()
        middle.send_signal(signal.SIGKILL)
        middle.wait(10)
        gone, _ = psutil.wait_procs([child], timeout=10)
        assert gone, "the tethered child outlived its SIGKILLed parent"
    finally:
        if middle.poll() is None:
            middle.kill()


def test_tether_refuses_when_its_parent_is_already_gone():
    not_our_parent = os.getppid()  # the tether's parent is this process, not ours
    out = subprocess.run([sys.executable, "-m", "grpo_plugin.server.tether", str(not_our_parent), "true"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "is gone; not starting true" in out.stderr


def test_tethered_command_keeps_the_command_and_names_this_process():
    cmd = tethered(["vllm", "--port", "1"])
    assert cmd[-3:] == ["vllm", "--port", "1"] and cmd[cmd.index("grpo_plugin.server.tether") + 1] == str(os.getpid())


_LAUNCHER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from grpo_plugin.atropos.launch import Launch
    from grpo_plugin.config.lookups import run_config
    run = Launch(Path("cfg.yaml"), run_config({"output_dir": sys.argv[1]}), [])
    # a command that starts a process in a session of its own (as servers and trainers do) and one plain one
    escaper = ("import os, subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
               "time.sleep(120)'], start_new_session=True); print(p.pid, flush=True); time.sleep(120)")
    a = run._start("escaper", [sys.executable, "-c", escaper], Path(sys.argv[1]) / "a.log")
    b = run._start("sleeper", [sys.executable, "-c", "import time; time.sleep(120)"], None)
    print(a.pid, b.pid, flush=True)
    time.sleep(120)
""")


def _tree(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    return []


def test_nothing_the_atropos_launcher_started_outlives_its_sigkill(tmp_path):
    """The launcher (python -m grpo_plugin.atropos.launch) SIGKILLed: every process it started, and what those
    started in sessions of their own, is gone within 10 s."""
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
    procs: list[psutil.Process] = []
    try:
        kept_pids = [int(x) for x in launcher.stdout.readline().split()]
        deadline = time.monotonic() + 30
        log = tmp_path / "a.log"
        while not (log.exists() and log.read_text().strip()):  # the escaper's own child has started
            assert time.monotonic() < deadline, "the escaper never started its child"
            time.sleep(0.05)
        escaped = psutil.Process(int(log.read_text().split()[0]))
        procs = [q for pid in kept_pids for q in _tree(pid)] + [escaped]
        assert len(procs) >= 3 and all(p.is_running() for p in procs)  # 2 commands (and what wraps them), 1 escaped
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        _, alive = psutil.wait_procs(procs, timeout=10)
        assert not alive, f"processes outlived the SIGKILLed launcher: {[(p.pid, p.cmdline()) for p in alive]}"
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for p in procs:  # ours, started by this test: ended by pid
            with contextlib.suppress(psutil.Error):
                p.kill()


def test_a_kept_command_ends_with_its_status_and_takes_its_leftovers_with_it():
    leftover = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
                " start_new_session=True); print(p.pid, flush=True); sys.exit(3)")
    out = subprocess.run(kept([sys.executable, "-c", leftover]), capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, out.stderr
    orphan = int(out.stdout.split()[0])
    assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE
