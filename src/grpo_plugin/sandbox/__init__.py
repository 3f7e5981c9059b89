"""Running model-written code for rewards, with the kernel as the boundary. What it protects against: docs/code.md.

A module per process that runs it, prefixed with that process's name where the process has several:
- the trainer: client.py (`Sandbox`: starts the jail, sends jobs, judges stdin/stdout outputs), suites.py (test
  formats), verdicts.py (output comparison);
- the fork server, in the jail: forkserver.py (the job loop), forkserver_runs.py (a run's processes, deadlines, what
  they write), forkserver_slots.py (scratch slots, cores), forkserver_judges.py (the slots' judge processes),
  forkserver_plan.py (programs and tests compiled, one-call tests found);
- a template, one per core: template.py (forks every program and judge process of its core's slots);
- a forked process, first: forked.py (its confinement, then its role);
- a program's process: program.py (the program as plain CPython, then the calls a judge makes into it; or the
  stdin/stdout runs);
- a judge, a process per slot (a job's plain part in place, the rest in a process forked for it): judge.py (runs
  the tests, says the verdicts), judge_link.py (its connection to the program's process), judge_stand_ins.py
  (stand-ins for the program's objects);
- shared: wire.py (one message framing for every boundary), codec.py (values between a program and its judge),
  libc.py, hugetext.py.

The kernel layers, by who puts them in place:
- the jail (user, PID, mount, network, IPC, UTS namespaces; a read-only view of what CPython needs): jail.py, the
  bubblewrap command the trainer builds;
- the seccomp filter: built by jail.py in the trainer, loaded by template.py before its first fork;
- `/proc` with hidepid, read-only device mounts, a tmpfs per slot: confine.py, called by the fork server at its
  start (forkserver.py, forkserver_slots.py);
- a PID namespace, a session, an identity, no_new_privs, Landlock, limits per process: confine.py, called by each
  forked process on itself (forked.py).
"""

from grpo_plugin.sandbox.client import Limits, Sandbox, SandboxError, SandboxUnavailable
from grpo_plugin.sandbox.suites import AssertSuite, CallSuite, ProgramResult, StdioSuite

__all__ = ["AssertSuite", "CallSuite", "Limits", "ProgramResult", "Sandbox", "SandboxError", "SandboxUnavailable",
           "StdioSuite"]
