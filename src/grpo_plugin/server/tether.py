"""`python -m grpo_plugin.server.tether PARENT_PID CMD...`: exec CMD so that it gets SIGTERM when the process
that started it dies, even by SIGKILL (PR_SET_PDEATHSIG survives exec).

Set here, in a process of its own, and not with `Popen(preexec_fn=...)`: a preexec_fn runs Python between fork and
exec, and in a trainer with threads (HTTP clients, an abandoned request waking up as its server is stopped) the
child can deadlock there on a lock another thread held at the fork — a server that never prints a line.
Kept free of imports beyond the standard library: it runs before every server start.

The signal is tied to the THREAD that started us (Linux semantics): start servers from a thread that lives as long
as the server should (the trainer's main thread)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def tethered(cmd: list[str]) -> list[str]:
    """CMD wrapped so that it dies with this process."""
    return [sys.executable, "-m", __name__, str(os.getpid()), *cmd]


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].isdigit():
        sys.exit("usage: python -m grpo_plugin.server.tether PARENT_PID CMD [ARGS...]")
    parent, cmd = int(argv[0]), argv[1:]
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        sys.exit(f"grpo_plugin.server.tether: prctl(PR_SET_PDEATHSIG) failed (errno {ctypes.get_errno()})")
    if os.getppid() != parent:  # the parent died before the prctl: nobody will ever signal us
        sys.exit(f"grpo_plugin.server.tether: parent {parent} is gone; not starting {cmd[0]}")
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
