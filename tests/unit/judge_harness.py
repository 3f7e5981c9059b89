"""One job through the judge with the program's service in a plain forked process (no jail): the lines the judge
says. Shared by the tests of calls sent ahead and of jobs judged in place."""

from __future__ import annotations

import copy
import os
import socket
import tempfile
import textwrap

from grpo_plugin.sandbox import forkserver_plan, judge
from grpo_plugin.sandbox import program as child

LIMITS = {"value_bytes": 16 << 20, "job_bytes": 64 << 20}
_SCRATCH = tempfile.TemporaryDirectory(prefix="grpo-judge-harness-")  # the programs' working directory

COUNTER = """
n = 0
def f(x=0):
    global n
    n += 1
    return n + x
"""


def job_lines(code: str, tests=None, calls=None, leave=None) -> list[str]:
    """The lines the judge says for one job: `tests` (assert tests) or `calls` ((fn, [(args, expected), ...]));
    `leave`: judge.run_judge's (None: the whole job out of place)."""
    code = textwrap.dedent(code)
    if calls is not None:
        fn, cases = calls
        job = {"mode": "calls", "fn": fn, "cases": copy.deepcopy([[list(a) if isinstance(a, (list, tuple)) else a, e]
                                                                  for a, e in cases])}  # (a call may change them)
    else:
        job = {"mode": "asserts", "compiled": [forkserver_plan.compile_test(t) for t in tests],
               "imports": forkserver_plan.program_imports(code)}
    n = len(job.get("cases") or job.get("compiled"))
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the program's process
        try:
            ours.close()
            os.chdir(_SCRATCH.name)  # (programs write files where they run)
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(devnull, 1)
            child.run_program(compile(code, "solution.py", "exec"), theirs.fileno(), LIMITS["value_bytes"])
        finally:
            os._exit(0)
    theirs.close()
    r, w = os.pipe()
    try:
        judge.run_judge(job, 0, n, ours.fileno(), w, LIMITS, leave)
    finally:
        ours.close()
        os.close(w)
        os.waitpid(pid, 0)
    out = b""
    while chunk := os.read(r, 1 << 16):
        out += chunk
    os.close(r)
    return out.decode().splitlines()


def verdicts(lines: list[str]) -> list[bool]:
    return [line.startswith("P ") for line in lines if line[:2] in ("P ", "F ")]


def compare_places(jobs: list[dict]) -> dict:
    """Each job (`code` with `tests` or `calls`) judged in place and wholly out of place: how many, how many left
    their place, and the jobs whose lines differ."""
    moved, differ = 0, []
    for job in jobs:
        left: list[int] = []

        def leave(left=left) -> bool:  # the rest of the job in this same process
            left.append(1)
            return True

        calls = tuple(job["calls"]) if job.get("calls") else None
        in_place = job_lines(job["code"], job.get("tests"), calls, leave)
        out_of_place = job_lines(job["code"], job.get("tests"), calls)
        moved += len(left)
        if in_place != out_of_place:
            differ.append({"name": job["name"], "in_place": in_place, "out_of_place": out_of_place})
    return {"jobs": len(jobs), "moved": moved, "differ": differ}


if __name__ == "__main__":  # compare_places in a process of its own: JSON jobs on stdin, the result on stdout
    import json
    import sys

    json.dump(compare_places(json.load(sys.stdin)), sys.stdout)
