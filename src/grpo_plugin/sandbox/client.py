"""The trainer side of the sandbox: starts the fork server (forkserver.py) once, sends it programs, collects verdicts.

    sandbox = Sandbox(Limits(wall_s=2, memory_mb=2048))
    results = sandbox.run([(code, ["assert f(1) == 2", ...]), ...])   # one ProgramResult per program
    results[0].passed -> [True, False, ...]; results[0].score -> 0.5
    sandbox.run_suites([StdioSuite(code, [("1 2\n", "3\n")]), CallSuite(code, "add", [([1, 2], 3)])])

Assert and call-based tests are judged in the jail by a judge process, stdin/stdout outputs compared here
(suites.py); the expected side of a test never enters a program's process.

Programs of one call run in parallel (`workers`, default: 2 per core this process may use + 6, at most 5 per
core: default_workers). The fork server runs in a bubblewrap jail (jail.py) that dies with this process, and
checks at start what it needs from the machine: a missing layer is a `SandboxUnavailable` that says which, what
that exposes and what to do.
"""

from __future__ import annotations

import binascii
import json
import logging
import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from grpo_plugin.sandbox import cgroups, package_data
from grpo_plugin.sandbox import jail as jail_mod
from grpo_plugin.sandbox.jail import SCRATCH, SCRIPT_DIR, Jail, JailUnavailable, accepted_missing
from grpo_plugin.sandbox.suites import AssertSuite, ProgramResult, Suite

FORK_SERVER = Path(__file__).with_name("forkserver.py")
_log = logging.getLogger(__name__)
HIDE_PLAN = "/grpo/hide.json"  # what the fork server hides (package_data.py), as the jail shows it
_EXPOSES = {
    "identity": "programs would share the trainer's user id: inside their own namespaces they still see no other "
                "process and no file outside the jail, but kernel limits counted per user (processes, signals "
                "queued) are shared with the trainer",
    "landlock": "inside the jail a program could read the other programs' scratch directories and write to them",
    "seccomp": "programs could call kernel interfaces no program needs (ptrace of their own children, SysV IPC "
               "shared between programs, keyrings, BPF, io_uring): more kernel attack surface and state a program "
               "could leave for a later one",
}


def _layer_missing(layer: str, why: str) -> SandboxUnavailable:
    return SandboxUnavailable(
        f"the code sandbox cannot run on this machine: {why}. Its {layer!r} layer is missing ({_EXPOSES[layer]}). "
        f"To run without it anyway, set GRPO_SANDBOX_ACCEPT_MISSING={layer}. {_HELP}")


def _launch(script_dir: str) -> str:
    """The fork server's start inside the jail: forkserver.py imported as a module (its bytecode cached), its
    directory then taken off the import path."""
    return f"import sys; sys.path.insert(0, {script_dir!r}); import forkserver as f; del sys.path[0]; f.main()"


class SandboxError(RuntimeError):
    """The fork server failed (it is restarted once per call before this is raised)."""


class SandboxUnavailable(SandboxError):
    """This machine cannot provide the isolation the sandbox promises."""


@dataclass(frozen=True)
class Limits:
    wall_s: float = 2.0  # per test, and for running the program's own code before the tests (+ the time the
    # program waited for its core while others shared it: forkserver_runs.py waited_for_cpu)
    memory_mb: int = 2048  # address space of each program process (RLIMIT_AS)
    output_kb: int = 1024  # most a program may print per test (stdout), and largest file it may write
    value_kb: int = 16384  # largest value one call into the program may return
    job_kb: int = 65536  # all the values of one program's tests together
    scratch_mb: int = 64  # each running program's scratch space (its slot's own tmpfs; see docs/code.md)
    judge_memory_mb: int = 2048  # address space of each judge process
    processes: int = 64  # processes and threads a program may have at once (RLIMIT_NPROC of its slot's user)

    def to_json(self) -> dict:
        return {"wall_s": float(self.wall_s), "memory_bytes": int(self.memory_mb) << 20,
                "output_bytes": int(self.output_kb) << 10, "value_bytes": int(self.value_kb) << 10,
                "job_bytes": int(self.job_kb) << 10, "judge_memory_bytes": int(self.judge_memory_mb) << 20,
                "nproc": int(self.processes), "max_fd_scan": 1024}


_HELP = "See docs/code.md#what-the-sandbox-needs."


def default_workers(cores: int) -> int:
    """Programs at once: 2 per core + 6, at most 5 per core. More programs than cores: while one waits on the
    fork server (started, collected) another runs on its core, and the server handles more events per wake-up
    (2-core VM, bench batch: 6 slots take ~6% less time than 3, 8 ~3% less than 6, 10 ~2% less than 8; 12 no
    less than 10). At most 5 per core: a program's time limit counts the time it waited for its core beside up to
    4 others (forkserver_runs.py waited_for_cpu). Each slot's program and judge share a core; each program may use
    `Limits.memory_mb`."""
    cores = max(1, cores)
    return min(2 * cores + 6, 5 * cores)


class Sandbox:
    def __init__(self, limits: Limits | None = None, workers: int | None = None, huge_text: bool | None = None):
        """`huge_text`: the interpreter's code on huge pages in the fork server (hugetext.py; default: on, unless
        GRPO_SANDBOX_HUGE_TEXT=0)."""
        self.limits = limits or Limits()
        self.huge_text = os.environ.get("GRPO_SANDBOX_HUGE_TEXT", "1") != "0" if huge_text is None else huge_text
        self.huge_text_bytes = 0  # what the fork server put on huge pages
        self.workers = workers or default_workers(len(os.sched_getaffinity(0)))
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._jail: Jail | None = None
        self._next_id = 0
        self.last_unique = 0  # programs the last batch actually ran (after dedupe)
        self.isolation = ""
        self.missing: list[str] = []  # layers this sandbox runs without (accepted by GRPO_SANDBOX_ACCEPT_MISSING)
        self.slot_cgroups: cgroups.SlotCgroups | None = None  # the slots' memory and pids cgroups (cgroups.py)
        self.cgroups_missing = ""  # why there are none, where there are none
        self._start()

    # ---- the fork server ------------------------------------------------------------------------
    def _start(self) -> None:
        try:
            accepted = accepted_missing()
        except ValueError as exc:
            raise SandboxUnavailable(str(exc)) from None
        missing: list[str] = []

        def lacking(layer: str, why: str) -> None:
            if layer not in accepted:
                raise _layer_missing(layer, why)
            missing.append(layer)

        try:
            seccomp = jail_mod.seccomp_program()
        except JailUnavailable as exc:
            lacking("seccomp", str(exc))
            seccomp = b""
        jail = Jail.for_this_interpreter(str(FORK_SERVER.parent), self.limits.scratch_mb)
        try:
            jail.prepare_identities()
        except JailUnavailable as exc:
            lacking("identity", str(exc))
        # a program's processes together: its memory (and its scratch files' pages) and its process count; a
        # judge's the same with its own budget; a cpu cgroup each where the kernel offers one
        self.slot_cgroups, self.cgroups_missing = cgroups.make(
            self.workers, (self.limits.memory_mb + self.limits.scratch_mb) << 20, self.limits.processes,
            self.limits.judge_memory_mb << 20)
        if self.slot_cgroups is not None and self.slot_cgroups.cpu_missing:
            _log.warning("code sandbox: no cpu cgroup per slot (%s): a program's processes share its core with "
                         "the programs beside it by the kernel's default grouping", self.slot_cgroups.cpu_missing)
        limits = self.limits.to_json()
        if self.slot_cgroups is not None:
            jail.binds = self.slot_cgroups.binds()
            limits["cgroup_dirs"] = self.slot_cgroups.jail_dirs()
        # the packages' data files, hidden in the jail by the fork server (package_data.py)
        hide = tempfile.NamedTemporaryFile("w", suffix=".json")  # noqa: SIM115 - removed once the server read it
        to_hide = package_data.hidden(package_data.package_roots(jail.landlock_readable(), jail.site_dirs))
        json.dump(to_hide, hide)
        hide.flush()
        jail.binds += ["--ro-bind", hide.name, HIDE_PLAN]
        try:
            cmd, fds = jail.command([jail.python, "-I", "-S", "-c", _launch(SCRIPT_DIR), json.dumps({
                "limits": limits, "workers": self.workers, "scratch_root": SCRATCH,
                "require_landlock": "landlock" not in accepted, "readable": jail.landlock_readable(),
                "site_dirs": jail.site_dirs, "uids": jail.userns_fd >= 0, "seccomp": seccomp.hex(),
                "slot_bytes": int(self.limits.scratch_mb) << 20, "hide": HIDE_PLAN,
                "huge_text": self.huge_text})])
        except JailUnavailable as exc:
            jail.close()
            hide.close()
            self._remove_cgroups()
            raise SandboxUnavailable(f"the code sandbox cannot run on this machine: {exc}. {_HELP}") from None
        jail_mod.compile_modules(str(FORK_SERVER.parent))
        self._jail = jail
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - as long-lived as the fork server
        self._proc = subprocess.Popen(  # noqa: S603
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, pass_fds=fds, env={},
            start_new_session=True)
        jail.close()  # bwrap holds the user namespace now
        hello = self._proc.stdout.readline()
        hide.close()
        try:
            msg = json.loads(hello)
        except ValueError:
            msg = {"error": f"the jail did not start: {self._stderr_tail() or hello!r}"}
        if msg.get("missing") == "landlock":
            self.close()
            raise _layer_missing("landlock", str(msg.get("error")))
        if not msg.get("ready"):
            self.close()
            error = str(msg.get("error"))
            jail_hint = "" if msg.get("in_jail") else (  # said from inside the jail: the namespaces were not the cause
                " It runs programs in a bubblewrap jail, which needs user namespaces (root, or `sysctl "
                "kernel.unprivileged_userns_clone=1`; in Docker/Podman a seccomp profile that allows "
                "`unshare`/`clone` with namespace flags).")
            raise SandboxUnavailable(f"the code sandbox cannot run on this machine: {error}.{jail_hint} " + _HELP)
        abi = int(msg.get("landlock_abi", 0))
        if abi == 0:
            missing.append("landlock")
        self.missing = missing
        layers = ["bubblewrap jail (user, PID, mount, network, IPC, UTS namespaces)", "a PID namespace per process",
                  "a uid per scratch slot for programs, 65533 for judges" if "identity" not in missing else
                  "every capability dropped (no separate uid)", "a session and process group per process",
                  "no_new_privs"]
        self.slot_quotas = int(msg.get("slot_quotas", 0))
        if self.slot_quotas == self.workers:
            layers.append(f"a {self.limits.scratch_mb} MiB tmpfs per scratch slot")
        if self.slot_cgroups is not None:
            layers.append(f"a memory ({self.limits.memory_mb + self.limits.scratch_mb} MiB) and pids "
                          f"({self.limits.processes}) cgroup per slot")
            layers.append(f"a memory ({self.limits.judge_memory_mb} MiB) and pids cgroup per judge")
            if not self.slot_cgroups.cpu_missing:
                layers.append("a cpu cgroup per slot and per judge (equal weights)")
        self.hidden_package_data = int(msg.get("hidden", -1))
        to_hide_count = len(to_hide[0]) + len(to_hide[1])
        if self.hidden_package_data < to_hide_count:
            _log.warning("code sandbox: %d of the installed packages' data paths stay visible in the jail (%s)",
                         to_hide_count - max(0, self.hidden_package_data),
                         self._stderr_tail()[-300:].strip() or "no reason given")
        if self.hidden_package_data >= 0:
            layers.append(f"packages' data files hidden ({self.hidden_package_data} paths)")
        if msg.get("hidepid"):
            layers.append("/proc shows each user only its own processes")
        if abi:
            layers.append(f"Landlock ABI {abi}")
        if seccomp:
            refused = len(jail_mod.DENIED) + len(jail_mod.LIMITED)
            layers.append(f"seccomp ({refused} syscalls refused, inherited from the template)")
        layers.append("rlimits")
        self.isolation = " + ".join(layers)
        self.huge_text_bytes = int(msg.get("huge_text", 0))
        self.jail_pid = self._proc.pid  # bwrap, as this process sees it
        self.fork_server_pid = jail_mod.outer_pid(self._proc.pid, msg["pid"]) or -1
        self.template_pids = [jail_mod.outer_pid(self._proc.pid, p) or -1 for p in msg["template_pids"]]
        self.template_pid = self.template_pids[0]  # one per core where there are several (forkserver_slots.py Cores)

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
        if self._jail is not None:
            self._jail.close()
        self._remove_cgroups()

    def _remove_cgroups(self) -> None:
        made, self.slot_cgroups = self.slot_cgroups, None
        if made is not None:
            made.remove()

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
        groups: list[list[int]] = []  # job -> the suites it was sent for (the same code and tests)
        for k, s in enumerate(suites):
            text = json.dumps(s.job(), sort_keys=True)
            key = text if dedupe else k
            if key not in place:
                place[key] = len(sent)
                sent.append(text)
                groups.append([])
            groups[place[key]].append(k)
        results: list = [None] * len(suites)
        matches: dict[int, dict[int, bool]] = {}  # suite -> test -> whether its output matched

        def output(job: int, test: int, data: bytes) -> None:  # a stdin/stdout test's output, compared now
            for k in groups[job]:
                verdict = getattr(suites[k], "output_verdict", None)
                if verdict is not None:
                    matches.setdefault(k, {})[test] = verdict(test, data)

        def judge(job: int, reply: dict) -> None:  # each suite judges with its own comparison
            for k in groups[job]:
                got = matches.pop(k, {})
                tests = [dict(t, match=got[i]) if i in got else t for i, t in enumerate(reply["tests"])]
                results[k] = suites[k].judge({**reply, "tests": tests})

        with self._lock:
            try:
                self._exchange(sent, judge, output)
            except SandboxError:
                self.close()
                self._start()  # once: a fork server that died is replaced, the batch run again
                matches.clear()
                self._exchange(sent, judge, output)
        self.last_unique = len(sent)
        return results

    def _exchange(self, jobs: list[str], judge, output=None) -> None:
        """Send jobs (each already JSON) to the fork server; `judge(k, reply)` is called for job k's reply as it
        arrives, and `output(k, test, stdout)` for each stdin/stdout test's output (bytes) before it, as that
        arrives; each is dropped then: the trainer holds one test's output at a time, whatever the batch's
        size."""
        if self._proc is None or self._proc.poll() is not None:
            raise SandboxError(f"the sandbox's fork server is not running: {self._stderr_tail()}")
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
        answered: set[int] = set()
        while len(answered) < len(jobs):
            line = self._proc.stdout.readline()
            if not line:
                raise SandboxError(f"the sandbox's fork server exited: {self._stderr_tail()}")
            msg = json.loads(line)
            del line
            k = msg["id"] - first
            if "out" in msg:
                if output is not None:
                    output(k, int(msg["out"]), binascii.a2b_base64(msg.pop("b64")))
                continue
            judge(k, msg)
            answered.add(k)
            del msg
        writer.join()
        if failed:
            raise SandboxError(f"could not send programs to the fork server: {failed[0]}")
