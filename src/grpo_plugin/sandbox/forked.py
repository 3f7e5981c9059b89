"""What a process forked by a template runs first, in it (standard library only: it runs inside the jail): the
role it was forked for (a program's process or a judge), its confinement (confine.py: identity, Landlock, limits;
a program that uses multiprocessing first gets its own /dev/shm), then the role's own code. Nothing untrusted has
run before `confine.confine` returns."""

from __future__ import annotations

import _socket
import gc
import marshal
import os
import sys

try:
    from . import confine
    from . import program as program_
except ImportError:  # in the jail: top-level modules beside forkserver.py
    import confine
    import program as program_

_HERE = os.path.dirname(os.path.abspath(__file__))


def late_import(name: str):
    """A module of the sandbox's imported where it is first needed, after the templates are forked (the judge's code
    in a judge process before it is confined; the test planner in the server), never in a template: no program's
    process carries it (its page tables would be copied by every fork)."""
    if __package__:
        import importlib  # (imported as a package: the tests; in the jail the modules are top-level)

        return importlib.import_module(f"{__package__}.{name}")
    mod = sys.modules.get(name)
    if mod is None:
        sys.path.insert(0, _HERE)
        try:
            mod = __import__(name)
        finally:
            sys.path.remove(_HERE)
    return mod


def main(payload: bytes, fds: list[int], ruleset: int, server_limits: dict, uids: bool) -> None:
    """Run as what `payload` says (never returns): confine this process (confine.py), then serve as a judge
    (judge.py) or run a program (program.py). `fds` become 0, 1, 2, ... in order; `ruleset`: the slot's Landlock
    rules (-1: none, -2: none could be built); `uids`: the jail maps an identity per role (else capabilities are
    dropped and the jail's identity kept). A failure before anything untrusted ran is reported on the process's
    status descriptor, never raised."""
    role = "?"
    report = -1
    try:
        role, *rest = marshal.loads(payload)
        limits = dict(server_limits)
        if role == "judge":
            limits["cpu_s"], limits["nproc"], limits["output_bytes"] = 24 * 3600, 64, 0  # the server keeps time
            os.environ.update({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
            limits["memory_bytes"] = server_limits["judge_memory_bytes"]
            report = fds[4]
            if ruleset == -2:
                raise OSError("no Landlock ruleset could be built")
            for d in server_limits.get("cgroup_dirs", ()):  # its slot's judge budget (cgroups.py)
                confine.join_cgroup(f"{d}/judge-{rest[0]}")
            judge = late_import("judge")  # read while this process can still read the sandbox's directory
            confine.confine(confine.JUDGE_UID if uids else None, ruleset, fds, limits)
            report = 4
            os.chdir("/")
            judge.serve(_socket.socket(fileno=3), 4, limits)
        else:
            mode, start, end, nonce, scratch, cpu, program, slot, shm = rest
            limits["cpu_s"] = cpu
            report = fds[3] if mode == "stdio" else fds[4]
            if ruleset == -2:
                raise OSError("no Landlock ruleset for this scratch directory")
            for d in server_limits.get("cgroup_dirs", ()):  # its slot's memory, process and cpu budget (cgroups.py)
                confine.join_cgroup(f"{d}/slot-{slot}")
            if shm:
                confine.private_shm(scratch)
            confine.confine(confine.program_uid(slot) if uids else None, ruleset, fds, limits)
            report = 3 if mode == "stdio" else 4
            program_.prepare_interpreter(scratch)
            gc.enable()  # the template runs without collector passes; a program runs as Python does
            if mode == "stdio":
                os.close(3)
                program_.run_stdio(program, start, nonce, 4)  # one test per process (forkserver_runs.stdio_units)
            os.close(4)  # the setup channel: closed before the program runs
            program_.run_program(program, 3, server_limits["value_bytes"])
    except BaseException as exc:  # noqa: BLE001 - a setup failure is reported, not raised
        if report >= 0:
            try:
                os.write(report, f"X setup of the {role} process: {type(exc).__name__}: {exc}\n"[:400].encode())
            except OSError:
                pass
    os._exit(0)
