"""Processes that die with the process that started them, even when it is SIGKILLed (PR_SET_PDEATHSIG):

- `python -m grpo_plugin.server.tether PARENT_PID CMD...` execs CMD so that it gets SIGTERM when PARENT dies
  (the signal survives exec): the managed vLLM server and the trainer.
- `python -m grpo_plugin.server.tether --keep PARENT_PID CMD...` stays as CMD's parent and takes CMD's whole tree
  with it: it is a child subreaper (what CMD's processes leave behind, even in sessions of their own, is
  re-parented to it), and when PARENT dies, when it gets SIGTERM, or when CMD ends, it sends SIGTERM to every
  process of the tree, SIGKILL to what is left after `KEEP_GRACE_S`, and exits with CMD's status. The Atropos
  launcher starts each of its commands so (a run-api, a server, a trainer, environments: nothing outlives it).
  SIGINT is left to CMD (the launcher's Ctrl-C to a process group reaches both).

Set here, in a process of its own, and not with `Popen(preexec_fn=...)`: a preexec_fn runs Python between fork and
exec, and in a trainer with threads (HTTP clients, an abandoned request waking up as its server is stopped) the
child can deadlock there on a lock another thread held at the fork — a server that never prints a line.
Kept free of imports beyond the standard library: it runs before every server start.

The death signal is tied to the THREAD that started us (Linux semantics): start servers from a thread that lives
as long as the server should (the trainer's main thread)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
KEEP_GRACE_S = 5.0


def tethered(cmd: list[str]) -> list[str]:
    """CMD wrapped so that it dies with this process."""
    return [sys.executable, "-m", __name__, str(os.getpid()), *cmd]


def kept(cmd: list[str]) -> list[str]:
    """CMD wrapped so that it and every process it starts die with this process."""
    return [sys.executable, "-m", __name__, "--keep", str(os.getpid()), *cmd]


def _tie_to(parent: int, what: str) -> ctypes.CDLL:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        sys.exit(f"grpo_plugin.server.tether: prctl(PR_SET_PDEATHSIG) failed (errno {ctypes.get_errno()})")
    if os.getppid() != parent:  # the parent died before the prctl: nobody will ever signal us
        sys.exit(f"grpo_plugin.server.tether: parent {parent} is gone; not starting {what}")
    return libc


def _descendants(root: int) -> list[int]:
    """Every live process below `root`, from /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
    out, stack = [], [root]
    while stack:
        for pid in children.get(stack.pop(), ()):
            out.append(pid)
            stack.append(pid)
    return out


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
            if sig == signal.SIGTERM:
                os.kill(pid, signal.SIGCONT)  # a stopped process handles its SIGTERM only once continued
        except OSError:
            pass


def _reap() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def end_tree(grace: float = KEEP_GRACE_S) -> None:
    """SIGTERM every process below this one, SIGKILL what is left after `grace` seconds; collect them all."""
    me = os.getpid()
    for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        _signal_all(_descendants(me), sig)
        deadline = time.monotonic() + wait_s
        while _descendants(me) and time.monotonic() < deadline:
            _reap()  # ours (the command, orphans re-parented to us) are collected here; a zombie still counts
            time.sleep(0.05)
    _reap()


class _Ending(Exception):
    pass


def _raise_ending(signum, frame):
    raise _Ending


def keep(parent: int, cmd: list[str]) -> int:
    libc = _tie_to(parent, cmd[0])
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGTERM, _raise_ending)
    signal.signal(signal.SIGINT, lambda s, f: None)  # a handler, not SIG_IGN: CMD must not inherit an ignored SIGINT
    try:
        child = os.posix_spawnp(cmd[0], cmd, os.environ)
    except OSError as exc:
        sys.exit(f"grpo_plugin.server.tether: cannot start {cmd[0]}: {exc}")
    code = 128 + signal.SIGTERM
    try:
        while True:
            pid, status = os.waitpid(-1, 0)  # CMD, or an orphan of its tree re-parented to us
            if pid == child:
                code = os.waitstatus_to_exitcode(status)
                code = 128 - code if code < 0 else code
                break
    except _Ending:
        pass
    except ChildProcessError:
        pass
    signal.signal(signal.SIGTERM, lambda s, f: None)  # ending already
    end_tree()
    return code


def main(argv: list[str]) -> None:
    keeping = bool(argv) and argv[0] == "--keep"
    argv = argv[1:] if keeping else argv
    if len(argv) < 2 or not argv[0].isdigit():
        sys.exit("usage: python -m grpo_plugin.server.tether [--keep] PARENT_PID CMD [ARGS...]")
    parent, cmd = int(argv[0]), argv[1:]
    if keeping:
        sys.exit(keep(parent, cmd))
    _tie_to(parent, cmd[0])
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
