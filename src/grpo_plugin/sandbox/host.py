"""The trainer side of the sandbox: starts the fork server (zygote.py) once, sends it programs, collects verdicts.

    sandbox = Sandbox(Limits(wall_s=2, memory_mb=2048))
    results = sandbox.run([(code, ["assert f(1) == 2", ...]), ...])   # one ProgramResult per program
    results[0].passed -> [True, False, ...]; results[0].score -> 0.5
    sandbox.run_suites([StdioSuite(code, [("1 2\n", "3\n")]), CallSuite(code, "add", [([1, 2], 3)])])

The verdicts are made here (suites.py, judge.py) from what the program's process computed; the fork server never
holds an expected value, so no program can read one.

Programs of one call run in parallel (`workers`, default: the cores this process may use + 1). The fork server
is started with an empty environment, without site-packages, tied to this process (it and every child die with
it, even on SIGKILL), and checks at start what it needs from the machine: a failure is a `SandboxUnavailable`
that says what is missing and what to do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from grpo_plugin.sandbox.suites import AssertSuite, ProgramResult, Suite

ZYGOTE = Path(__file__).with_name("zygote.py")


def _launch(script: Path) -> str:
    """The fork server's start: `script` imported as a module (its bytecode cached: compiling the ~1000-line script
    at every start left ~4.7 MB of the compiler's memory in the process, which every fork then copied the page
    tables of), then taken off the import path (the programs' Landlock rules make readable only what is on it)."""
    return (f"import sys; sys.path.insert(0, {str(script.parent)!r}); import {script.stem} as z; "
            f"del sys.path[0]; z.main()")


class SandboxError(RuntimeError):
    """The fork server failed (it is restarted once per call before this is raised)."""


class SandboxUnavailable(SandboxError):
    """This machine cannot provide the isolation the sandbox promises."""


@dataclass(frozen=True)
class Limits:
    wall_s: float = 2.0  # per test, and for running the program's own code before the tests
    memory_mb: int = 2048  # address space of each program (RLIMIT_AS)
    output_kb: int = 1024  # most a program may print per test (stdout), and largest file it may write
    value_kb: int = 16384  # largest value a test's call may return (sent back as plain data)
    files: int = 256  # files a program may write or make (each at most output_kb): its share of the disk

    def to_json(self) -> dict:
        return {"wall_s": float(self.wall_s), "memory_bytes": int(self.memory_mb) << 20,
                "output_bytes": int(self.output_kb) << 10, "value_bytes": int(self.value_kb) << 10,
                "max_files": int(self.files), "max_fd_scan": 1024}


class Sandbox:
    def __init__(self, limits: Limits | None = None, workers: int | None = None,
                 require_landlock: bool | None = None):
        self.limits = limits or Limits()
        # one more program than cores: the fork server itself (forking, reaping, verdicts) takes a share of a core
        self.workers = workers or len(os.sched_getaffinity(0)) + 1
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._scratch: tempfile.TemporaryDirectory | None = None
        self._next_id = 0
        self.last_unique = 0  # programs the last batch actually ran (after dedupe)
        self.isolation = ""
        # kernel-enforced file confinement (Landlock): required unless GRPO_SANDBOX_REQUIRE_LANDLOCK=0, which
        # leaves only the audit hook's path checks (weaker: docs/code.md)
        self.require_landlock = require_landlock if require_landlock is not None else \
            os.environ.get("GRPO_SANDBOX_REQUIRE_LANDLOCK", "1") != "0"
        self._start()

    # ---- the fork server ------------------------------------------------------------------------
    def _start(self) -> None:
        from grpo_plugin.server.tether import tethered

        self._scratch = tempfile.TemporaryDirectory(prefix="grpo-sandbox-")
        os.chmod(self._scratch.name, 0o700)
        config = {"limits": self.limits.to_json(), "workers": self.workers, "scratch_root": self._scratch.name,
                  "require_landlock": self.require_landlock}
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - as long-lived as the fork server
        # no environment but LD_BIND_NOW (cleared at its start): every library call resolved once, in the fork
        # server, not on first use in each child (the dynamic linker's lazy binding writes a page the child shares)
        self._proc = subprocess.Popen(  # noqa: S603
            tethered([sys.executable, "-I", "-S", "-c", _launch(ZYGOTE), json.dumps(config)]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env={"LD_BIND_NOW": "1"},
            start_new_session=True, cwd=self._scratch.name)
        hello = self._proc.stdout.readline()
        try:
            msg = json.loads(hello)
        except ValueError:
            msg = {"error": f"the fork server did not start: {self._stderr_tail() or hello!r}"}
        if not msg.get("ready"):
            self.close()
            err = str(msg.get("error"))
            if msg.get("missing") == "landlock":
                raise SandboxUnavailable(
                    f"the code sandbox cannot run on this machine: {err}. It confines the programs' files with "
                    "Landlock (Linux >= 5.13, `landlock` in the kernel's `lsm=` list; in a container, a seccomp "
                    "profile that allows the landlock_* syscalls). To run with the audit hook's path checks only "
                    "(weaker), set GRPO_SANDBOX_REQUIRE_LANDLOCK=0. See docs/code.md#what-the-sandbox-needs.")
            raise SandboxUnavailable(
                f"the code sandbox cannot run on this machine: {err}. It needs a new network "
                "namespace for the programs it runs: run as root, or enable unprivileged user namespaces "
                "(`sysctl kernel.unprivileged_userns_clone=1`; in Docker/Podman: `--security-opt seccomp=unconfined`"
                " or a runtime that allows user namespaces). See docs/code.md#what-the-sandbox-needs.")
        self.isolation = msg["isolation"]
        self.zygote_pid = msg["pid"]
        self.template_pid = msg["template_pid"]  # the fork server's process that forks the children

    def _stderr_tail(self) -> str:
        try:
            self._stderr.seek(0)
            return self._stderr.read()[-2000:].decode(errors="replace")
        except (OSError, ValueError):
            return ""

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(timeout=10)  # it finishes what it runs, then exits
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- running programs -----------------------------------------------------------------------
    def run(self, programs: list[tuple[str, list[str]]]) -> list[ProgramResult]:
        """Run every program against its own assert-style tests; one ProgramResult each, in order. A test that does
        not parse fails (detail 'SyntaxError in the test'); it never stops the others."""
        return self.run_suites([AssertSuite(str(code), [str(t) for t in tests]) for code, tests in programs])

    def run_suites(self, suites: list[Suite], dedupe: bool = True) -> list[ProgramResult]:
        """Run programs in any test format (suites.py); one ProgramResult each, in order. `dedupe`: a program
        that is the same code with the same tests as another of the batch (a GRPO group often samples one
        completion several times) runs once and both get its verdicts (a program that draws random numbers then
        scores the same for both, rather than once each)."""
        sent: list[str] = []  # each job serialized once: its dedupe key and its payload
        place: dict = {}
        order: list[int] = []  # suite -> its reply among the jobs sent
        for k, s in enumerate(suites):
            text = json.dumps(s.job(), sort_keys=True)
            key = text if dedupe else k
            if key not in place:
                place[key] = len(sent)
                sent.append(text)
            order.append(place[key])
        with self._lock:
            try:
                replies = self._exchange(sent)
            except SandboxError:
                self.close()
                self._start()  # once: a fork server that died is replaced, the batch run again
                replies = self._exchange(sent)
        self.last_unique = len(sent)
        return [s.judge(replies[i]) for s, i in zip(suites, order)]

    def _exchange(self, jobs: list[str]) -> list[dict]:
        """Send jobs (each already JSON) to the fork server; its replies, in order."""
        if self._proc is None or self._proc.poll() is not None:
            raise SandboxError("the sandbox's fork server is not running")
        first = self._next_id
        self._next_id += len(jobs)
        payload = "".join(f'{{"id": {first + k}, "job": {job}}}\n' for k, job in enumerate(jobs)).encode()
        failed: list[BaseException] = []

        def feed():  # a thread: the fork server answers while it is still being fed
            try:
                self._proc.stdin.write(payload)
                self._proc.stdin.flush()
            except (OSError, ValueError) as exc:
                failed.append(exc)

        writer = threading.Thread(target=feed, daemon=True)
        writer.start()
        replies: dict[int, dict] = {}
        while len(replies) < len(jobs):
            line = self._proc.stdout.readline()
            if not line:
                raise SandboxError(f"the sandbox's fork server exited: {self._stderr_tail()}")
            msg = json.loads(line)
            replies[msg["id"] - first] = msg
        writer.join()
        if failed:
            raise SandboxError(f"could not send programs to the fork server: {failed[0]}")
        return [replies[k] for k in range(len(jobs))]
