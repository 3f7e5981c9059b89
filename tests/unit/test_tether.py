"""The managed vLLM server dies with the trainer, even when the trainer is SIGKILLed (server/tether.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from grpo_plugin.server.tether import tethered

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
