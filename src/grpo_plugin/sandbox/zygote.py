"""The sandbox's fork server. Started by sandbox/host.py as `python -I -S -c "import zygote; zygote.main()" CONFIG`
(standard library only, no site-packages, an empty environment; imported, so its bytecode is cached) and fed by
it. It never runs model-written code itself and never judges: it runs one child per program (stdin/stdout tests
too: one run each), collects what the child computed, and sends that to the trainer side, which judges
(sandbox/judge.py). Nothing a job carries here holds an expected value: the tests' expected sides stay in the
trainer, so no child can read them, whatever it reaches in memory.

Two processes, three modules (standard library only; the launcher imports them from this directory, then takes
it off the import path). The server (`Zygote`, here) reads jobs, compiles programs, keeps deadlines, reads the
children's pipes and replies; it never forks after its start, so the pages its bookkeeping writes stay its own.
The template (template.py), forked once from the server when everything a child needs is loaded, only forks a
child per request and collects it when asked: each page a process writes while children share its memory must
be copied first, so the one that forks does as little as possible. What a child runs: child.py.

Once, at start: no network (a new network namespace: only a loopback that is down), an empty environment, the
standard modules programs commonly import loaded once and made immortal (Python >= 3.12: no child writes their
reference counts), one scratch directory per worker with its Landlock ruleset.

Per child:
- Landlock (kernel-enforced, applied to the child and everything it could start): files may be read only in the
  standard library and /dev/{null,zero,urandom,random}; read and written only in its scratch directory (no other
  program runs there meanwhile; no FIFOs, sockets, device nodes or symlinks there); nothing may be executed; no
  TCP bind/connect; no signal to, and no abstract socket of, any process outside the child. A refused operation
  is the kernel's PermissionError, which the program can catch, as on a locked-down machine;
- its own process group, `RLIMIT_CPU`, `RLIMIT_AS` (memory), `RLIMIT_FSIZE` (files), `RLIMIT_NOFILE`, no core
  dumps; a wall-clock deadline per test and one for the whole run, both enforced here (SIGKILL of its group);
- stdout and stderr are pipes read here: capped (a program that floods is killed), never a file it could replace;
  stdin is its test's input (stdin/stdout tests: a memory file per test, all run in the child one after the
  other) or /dev/null;
- an audit hook (PEP 578, cannot be removed from Python code) refusing, with PermissionError: creating processes
  (also for root, where `RLIMIT_NPROC` does not apply), signalling processes, sockets, raising a resource limit,
  frame and garbage-collector introspection, ctypes, more than `max_files` files written (with RLIMIT_FSIZE: a
  bounded share of the disk); the path checks below Landlock's, as a second layer;
- every line it sends is parsed here as untrusted: a line without the child's nonce is ignored, a malformed one
  ends that child (its test fails), test and slot numbers are checked, sizes are capped. One child's failure, or
  this server failing to clean up after it, costs only that child's tests.
"""

from __future__ import annotations

import collections
import json
import marshal
import os
import selectors
import signal
import sys
import time
import warnings

try:
    from . import child, template
except ImportError:  # the fork server: zygote.py imported as a top-level module, its siblings beside it
    import child
    import template

PRELOAD = ("math", "re", "collections", "itertools", "functools", "heapq", "bisect", "string", "typing",
           "json", "fractions", "decimal", "operator", "copy", "enum", "datetime", "unicodedata", "array", "io",
           "select", "gc")
# What a fork costs grows with this process's memory (page tables copied at fork, torn down at exit): 0.06 ms per
# MB per program. Not preloaded for that reason, being rare in solutions, each costing the program that imports it
# its import instead (measured in a child): dataclasses (1.4 MB: it loads inspect, ast, dis, ...; 11 ms), socket
# (0.5 MB; 5 ms), hashlib (0.6 MB, OpenSSL; 5 ms), textwrap (3.5 ms): 2.6 MB less for every program.
# Not preloaded either: subprocess (it would bind _posixsubprocess.fork_exec: fork+exec, not audited), and every module
# that registers an at-fork handler, which would then run in EVERY child: `threading` (and `queue`, which imports
# it) and `random` (and `statistics`, `tempfile`, which import it) cost ~0.45 ms of each child's CPU that way (a
# fork+exit of this server: 0.7 ms of child CPU with them loaded, 0.2 without). A program that imports them
# pays its import (~1 ms) instead (tests/unit/test_sandbox.py checks none of them is loaded here).
OUT_READ_CAP = 1024  # diagnostics kept per job (stderr, and stdout for calls)


# ---- the zygote ----------------------------------------------------------------------------------------
class ProtocolError(Exception):
    pass


class _Run:
    """One child running `job`'s tests [start, end)."""

    def __init__(self, job, start, end, fds, slot, nonce, limits):
        self.job, self.start, self.end, self.slot, self.nonce = job, start, end, slot, nonce
        self.pid: int | None = None  # the template's answer
        self.ending: str | None = None  # set (to why, "" for none) once it is being killed and collected
        self.fds = fds  # our read ends: {"w": verdicts, "out": stdout, "err": stderr}
        self.buf = {"w": b"", "out": b"", "err": b""}
        self.current: int | None = start if job["mode"] == "stdio" else None
        wall = job["wall_s"]
        self.deadline = time.monotonic() + (wall[start] if job["mode"] == "stdio" else limits["wall_s"])
        # the whole run, however the child paces its lines: every test's budget + the program's own
        self.budget = sum(wall[start:end]) + limits["wall_s"] + 1.0
        self.hard_deadline = time.monotonic() + self.budget
        self.done = False  # the program raised / setup failed: nothing more will run
        self.defined = job["mode"] == "stdio"  # the program's code ran to its end (stdio: tests start at once)
        self.mark = b"\0" + nonce.encode() + b" "  # stdio: ends a test's output, followed by its status line

class Zygote:
    def __init__(self, config: dict):
        self.limits = config["limits"]
        self.workers = max(1, int(config["workers"]))
        self.root = config["scratch_root"]
        self.root_real = os.path.realpath(self.root)
        # the standard library (the only code a program may import: no site-packages)
        self.readable = tuple(sorted({os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}))
        abi = int(config.get("landlock_abi", 0))
        self.landlock = child.Landlock(abi, self.readable) if abi else None
        self.test_code: dict[str, object] = {}  # test source -> code object (a batch repeats its tests)
        self.queue: list[tuple[dict, int, int]] = []
        self.runs: dict[int, tuple[_Run, str]] = {}  # fd -> (run, which pipe)
        self.results: dict[int, dict] = {}
        self.pending: dict[int, int] = {}  # job id -> units not finished
        self.children: set[_Run] = set()  # running
        self.sel = selectors.DefaultSelector()
        self.starting: collections.deque[_Run] = collections.deque()  # asked of the template, pid not yet known
        self.reaping: dict[int, _Run] = {}  # pid -> run the template is asked to collect
        # one scratch directory per program running at once, reused (emptied after each): ext4 spends ~20% of this
        # server's time making and removing a directory per program (it searches for a not recently freed inode)
        self.slots = [self.new_slot(k) for k in range(self.workers)]
        self.free = list(range(self.workers))
        self.unsent = False  # replies written, not yet flushed
        limits, landlock = self.limits, self.landlock
        statics = child._child_statics(self.readable, limits["max_files"])  # built before any program runs
        template._immortalize()
        self.template = template.Template(
            lambda payload, fds, ruleset: child._child(payload, fds, ruleset, limits, landlock, statics), landlock)
        self.sel.register(self.template.sock, selectors.EVENT_READ, "template")
        for k, path in enumerate(self.slots):
            self.template.scratch(k, path)

    def compiled(self, src: str | None):
        if src is None:
            return None
        code = self.test_code.get(src)
        if code is None:
            if len(self.test_code) > 16384:
                self.test_code.clear()
            try:
                code = compile(src, "<test>", "exec", dont_inherit=True)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                return None
            self.test_code[src] = code
        return code

    def program(self, job: dict):
        """The job's program compiled (here, once per job: this process never forks, so the compiler's allocations
        cost no copy-on-write faults), or the name of the exception compiling it raised."""
        if "_program" not in job:
            try:
                with warnings.catch_warnings():  # a SyntaxWarning would go to this server's stderr, per program
                    warnings.simplefilter("ignore")
                    # dont_inherit: not this module's `from __future__ import annotations` (with it, an annotation
                    # naming what the program never imported passed: real Python raises NameError)
                    job["_program"] = compile(job["code"], "<completion>", "exec", dont_inherit=True)
            except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as exc:
                job["_program"] = type(exc).__name__
        return job["_program"]

    # -- children
    def new_slot(self, k: int) -> str:
        path = os.path.join(self.root, f"slot{k}-{time.monotonic_ns()}")  # a fresh name if one is replaced
        os.mkdir(path, 0o700)
        return path

    def spawn(self, job: dict, start: int, end: int) -> None:
        program = self.program(job)
        if isinstance(program, str):  # it does not compile: no test can run, no child is needed
            for t in self.results[job["id"]]["tests"][start:end]:
                t["status"], t["why"] = "raised", f"the program raised {program}"
            self.unit_done(job, start, end, "")
            return
        inputs = []  # stdio: each test's input as a memory file (no file made on disk per test)
        if job["mode"] == "stdio":
            try:
                for i in range(start, end):
                    fd = os.memfd_create(f"stdin{i}", os.MFD_CLOEXEC)
                    inputs.append(fd)
                    data = job["tests"][i]["input"].encode()
                    while data:
                        data = data[os.write(fd, data):]
                    os.lseek(fd, 0, os.SEEK_SET)
            except OSError:
                for fd in inputs:
                    os.close(fd)
                raise
        # stdio: stdout is the answer, stderr diagnostics; otherwise both are diagnostics, on one pipe
        pipes = {k: os.pipe() for k in (("w", "out", "err") if job["mode"] == "stdio" else ("w", "out"))}
        nonce = os.urandom(16).hex()
        test_code = [self.compiled(t.get("child")) for t in job["tests"][start:end]] if job["mode"] != "stdio" else []
        cpu = max(1, int(sum(job["wall_s"][start:end]) + self.limits["wall_s"] + 1))
        slot = self.free.pop()
        scratch = self.slots[slot]
        payload = marshal.dumps((job["mode"], start, end, nonce, scratch,
                                 os.path.join(self.root_real, os.path.basename(scratch)), cpu, program, test_code,
                                 self.template.pid))
        theirs = [wr for _, wr in pipes.values()] + inputs  # the child's ends: the template passes them on
        try:
            self.template.spawn(payload, theirs, slot)
        finally:
            for fd in theirs:
                os.close(fd)
        fds = {}
        for k, (r, _) in pipes.items():
            os.set_blocking(r, False)
            fds[k] = r
        run = _Run(job, start, end, fds, slot, nonce, self.limits)
        self.starting.append(run)
        self.children.add(run)
        for k, r in fds.items():
            self.runs[r] = (run, k)
            self.sel.register(r, selectors.EVENT_READ, (run, k))

    def on_line(self, run: _Run, line: bytes) -> None:
        """A line from the child's verdict pipe: untrusted. Raises ProtocolError for a malformed one."""
        parts = line.decode(errors="replace").split(" ", 4)
        if parts[0] != run.nonce or len(parts) < 2:
            return  # not from the harness
        res = self.results[run.job["id"]]
        kind = parts[1]

        def index(s: str) -> int:
            i = int(s)
            if not run.start <= i < run.end:
                raise ProtocolError(f"test {i} is not one this child runs")
            return i

        if kind in ("V", "R", "U"):
            i, k = index(parts[2]), int(parts[3])
            if i != run.current or not 0 <= k < run.job["tests"][i].get("slots", 0):
                raise ProtocolError(f"slot {k} of test {i} out of place")
            res["tests"][i]["slots"][str(k)] = [kind, parts[4] if len(parts) > 4 else ""]
        elif kind in ("P", "T", "F"):
            i = index(parts[2])
            if i != run.current:
                raise ProtocolError(f"test {i} ended while test {run.current} ran")
            t = res["tests"][i]
            t["status"] = {"P": "passed", "T": "returned", "F": "raised"}[kind]
            t["why"] = " ".join(parts[3:]) if kind == "F" else ""
            if i + 1 < run.end:  # the next test starts now
                run.current = i + 1
                run.deadline = time.monotonic() + run.job["wall_s"][i + 1]
            else:
                run.current = None
        elif kind in ("E", "X"):
            why = " ".join(parts[2:]) or "error"
            for i in range(run.start, run.end):
                if not res["tests"][i]["status"]:
                    res["tests"][i]["status"] = "raised"
                    res["tests"][i]["why"] = ("the program raised " if kind == "E" else "sandbox setup failed: ") + why
            run.done = True
        elif kind == "D":
            if run.defined or run.job["mode"] == "stdio":
                raise ProtocolError("the program ended twice")
            run.defined = True
            run.current = run.start
            run.deadline = time.monotonic() + run.job["wall_s"][run.start]
        else:
            raise ProtocolError(f"unknown line kind {kind!r}")

    def feed(self, run: _Run, which: str, chunk: bytes) -> str | None:
        """on_data, with what a child's bad bytes mean: None, or why the child must be killed."""
        try:
            self.on_data(run, which, chunk)
        except ProtocolError as exc:
            return f"killed: {exc}"
        except (ValueError, IndexError, KeyError) as exc:
            return f"killed: a malformed line from the program's process ({type(exc).__name__})"
        return None

    def on_data(self, run: _Run, which: str, chunk: bytes) -> None:
        cap = self.limits
        if which == "w":
            run.buf["w"] += chunk
            while b"\n" in run.buf["w"]:
                line, run.buf["w"] = run.buf["w"].split(b"\n", 1)
                self.on_line(run, line)
            if len(run.buf["w"]) > cap["value_bytes"]:
                raise ProtocolError(f"a result larger than {cap['value_bytes'] >> 10} KiB")
        elif which == "out" and run.job["mode"] == "stdio":  # the answers (calls mode: 'out' is diagnostics)
            buf, mark = run.buf["out"] + chunk, run.mark
            while (k := buf.find(mark)) >= 0 and (nl := buf.find(b"\n", k)) >= 0:  # test `current` ended
                if run.current is not None:
                    self.results[run.job["id"]]["tests"][run.current]["stdout"] = buf[:k].decode(errors="replace")
                self.on_line(run, buf[k + 1:nl])
                buf = buf[nl + 1:]
            run.buf["out"] = buf
            if len(buf) > cap["output_bytes"] + len(mark) + 64:
                raise ProtocolError(f"printed more than {cap['output_bytes'] >> 10} KiB")
        elif len(run.buf["err"]) < OUT_READ_CAP:  # diagnostics: the first KB, the rest read and dropped
            run.buf["err"] += chunk[:OUT_READ_CAP - len(run.buf["err"])]

    def drain(self, run: _Run) -> str | None:
        """Read what the child's pipes hold now (it may have ended a test just before its deadline); None, or why
        the child must be killed."""
        for which, r in run.fds.items():
            try:
                while chunk := os.read(r, 65536):
                    why = self.feed(run, which, chunk)
                    if why is not None:
                        return why
            except OSError:  # nothing more now (BlockingIOError), or the pipe is gone
                pass
        return None

    def finish(self, run: _Run, why: str | None) -> None:
        """The child ended (or must be killed): its parent, the template, kills and collects it; `collected`
        goes on when it answers."""
        if run.ending is not None:
            run.ending = run.ending or why or ""
            return
        run.ending = why or ""
        for r in run.fds.values():  # read once it is gone (`collected`), not watched meanwhile
            if r in self.runs:
                self.sel.unregister(r)
                del self.runs[r]
        if run.pid is not None:  # else asked as soon as the template says which process it is
            self.template.reap(run.pid)
            self.reaping[run.pid] = run

    def on_answer(self, kind: bytes, pid: int, status: int) -> None:
        if kind == b"P":
            run = self.starting.popleft()
            if pid < 0:  # fork failed: nothing ran
                run.pid, run.defined, run.done = 0, True, True
                self.collected(run, -1, f"could not start: fork: {os.strerror(-pid)}")
                return
            run.pid = pid
            if run.ending is not None:  # it ended before its pid was known here
                self.template.reap(pid)
                self.reaping[pid] = run
        elif kind == b"X":
            run = self.reaping.pop(pid)
            self.collected(run, status, run.ending or None)

    def collected(self, run: _Run, status: int, why: str | None) -> None:
        """The child is gone: read what it wrote, fail the test it died in, go on after it."""
        self.children.discard(run)
        bad = self.drain(run)  # what it wrote before it ended
        why = why or bad
        for r in run.fds.values():
            try:
                os.close(r)
            except OSError:
                pass
        self.release(run.slot)
        job, res = run.job, self.results[run.job["id"]]
        reason = why or "the program ended the process"
        diag = run.buf["err"].decode(errors="replace")
        if diag and not res["output"]:
            res["output"] = diag[:OUT_READ_CAP]
        if not run.done:
            if not run.defined:  # died while defining the program: no test can run
                for i in range(run.start, run.end):
                    if not res["tests"][i]["status"]:
                        res["tests"][i]["status"], res["tests"][i]["why"] = "killed", f"{reason} (before the tests)"
            elif run.current is not None:  # died in test `current`: it fails, the rest run in a fresh child
                t = res["tests"][run.current]
                if job["mode"] == "stdio" and why is None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                    # a stdio program that ended its own process with status 0 (os._exit(0) after printing, as
                    # fast contest solutions do): what it printed is its answer, as for any judge
                    t["status"], t["stdout"] = "returned", run.buf["out"].decode(errors="replace")
                else:
                    t["status"], t["why"] = "killed", reason
                if run.current + 1 < run.end:
                    self.queue.insert(0, (job, run.current + 1, run.end))
                    return
        self.unit_done(job, run.start, run.end, reason)

    def release(self, slot: int) -> None:
        """Empty a scratch directory for the next program (its program is dead: nothing writes there any more); one
        that cannot be emptied is set aside (removed with the root at the end) and replaced."""
        path = self.slots[slot]
        try:
            _remove_tree(path, keep_root=True)
        except Exception as exc:  # noqa: BLE001 - never costs the zygote or another job
            sys.stderr.write(f"sandbox: could not empty {path}: {exc}\n")
            try:
                os.rename(path, path + ".left")
                self.slots[slot] = self.new_slot(slot)
                self.template.scratch(slot, self.slots[slot])
            except OSError as exc2:
                sys.stderr.write(f"sandbox: could not replace {path}: {exc2}\n")
                return  # this slot stays out of use
        self.free.append(slot)

    def unit_done(self, job: dict, start: int, end: int, reason: str) -> None:
        """Tests [start, end) of `job` are over: those without a verdict fail with `reason`; the job's reply goes
        out when its last unit is done."""
        for t in self.results[job["id"]]["tests"][start:end]:
            if not t["status"]:
                t["status"], t["why"] = "killed", reason
        self.pending[job["id"]] -= 1
        if self.pending[job["id"]] == 0:
            self.reply(job["id"])

    def reply(self, job_id: int) -> None:
        """The job's result to the trainer (sent before this server next waits: one write for all that ended)."""
        del self.pending[job_id]
        sys.stdout.write(json.dumps(self.results.pop(job_id)) + "\n")
        self.unsent = True

    def submit(self, job: dict) -> None:
        n = len(job["tests"])
        job.setdefault("mode", "calls")
        job["wall_s"] = [float(t.get("wall_s") or self.limits["wall_s"]) for t in job["tests"]]
        self.results[job["id"]] = {"id": job["id"], "output": "",
                                   "tests": [{"status": "", "why": "", "slots": {}} for _ in range(n)]}
        units = self.stdio_units(job) if job["mode"] == "stdio" else [(job, 0, n)] if n else []
        self.pending[job["id"]] = len(units)
        if not units:
            self.reply(job["id"])
        self.queue.extend(units)

    @staticmethod
    def stdio_units(job: dict, most_input: int = 16 << 20, most_tests: int = 200) -> list[tuple[dict, int, int]]:
        """A stdio job's tests in children of at most `most_input` bytes of input each (in memory files made before
        it starts) and at most `most_tests` tests (a descriptor each, passed in one message: the kernel takes up to
        253), in order; one child for all of them in the usual case."""
        units, first, size = [], 0, 0
        for i, t in enumerate(job["tests"]):
            n = len(t["input"])
            if i > first and (size + n > most_input or i - first >= most_tests):
                units.append((job, first, i))
                first, size = i, 0
            size += n
        if job["tests"]:
            units.append((job, first, len(job["tests"])))
        return units

    def serve(self) -> None:
        stdin = sys.stdin.fileno()
        os.set_blocking(stdin, False)
        self.sel.register(stdin, selectors.EVENT_READ, None)
        pending = b""
        open_input = True
        while open_input or self.queue or self.children:
            if self.queue and not self.free and not self.children:  # every scratch directory lost: cannot happen
                job, start, end = self.queue.pop(0)
                self.unit_done(job, start, end, "could not start: no scratch directory")
                continue
            while self.queue and self.free:  # a free scratch directory: fewer than `workers` children run
                job, start, end = self.queue.pop(0)
                try:
                    self.spawn(job, start, end)
                except OSError as exc:  # no scratch dir, no pipe, no fork: this unit fails, the server goes on
                    self.unit_done(job, start, end, f"could not start: {exc}")
            if self.unsent:
                sys.stdout.flush()
                self.unsent = False
            now = time.monotonic()
            timeout = min((min(r.deadline, r.hard_deadline) for r in self.children if r.ending is None),
                          default=now + 1.0) - now
            for key, _ in self.sel.select(max(0.0, min(timeout, 1.0))):
                if key.data is None:
                    chunk = os.read(stdin, 1 << 20)
                    if not chunk:
                        open_input = False
                        self.sel.unregister(stdin)
                        continue
                    pending += chunk
                    while b"\n" in pending:
                        line, pending = pending.split(b"\n", 1)
                        if line.strip():
                            msg = json.loads(line)  # {"id": N, "job": {...}}
                            self.submit({**msg["job"], "id": msg["id"]})
                    continue
                if key.data == "template":
                    for answer in self.template.answers():
                        self.on_answer(*answer)
                    continue
                run, which = key.data
                if key.fd not in self.runs:
                    continue  # finished by an earlier event of this round
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if chunk:
                    why = self.feed(run, which, chunk)
                    if why is not None:
                        self.finish(run, why)
                    continue
                if which == "w":  # the harness's end: collect the child (and what its other pipes still hold)
                    self.finish(run, None)
                    continue
                self.sel.unregister(key.fd)
                del self.runs[key.fd]
                os.close(key.fd)
                run.fds = {k: v for k, v in run.fds.items() if v != key.fd}
            now = time.monotonic()
            for run in list(self.children):
                if run.ending is None and (now > run.hard_deadline or now > run.deadline):
                    bad = self.drain(run)  # a test that ended just in time advanced the deadline
                    if bad is not None:
                        self.finish(run, bad)
                    elif now > run.hard_deadline:
                        self.finish(run, f"timed out (the whole run's {run.budget:g} s budget)")
                    elif now > run.deadline:
                        self.finish(run, f"timed out after {run.job['wall_s'][run.current or run.start]:g} s")
        sys.stdout.flush()


def _remove_tree(root: str, keep_root: bool = False) -> None:
    """Remove a scratch directory (or only what it holds) however deep the program made it (no recursion: a
    10 000-deep tree is fine), never following a link out of it; a directory whose permissions the program took
    away is given them back first (it is this server's own). Raises OSError if something cannot be removed."""
    def listing(path):
        try:
            return list(os.scandir(path))
        except PermissionError:
            os.chmod(path, 0o700)
            return list(os.scandir(path))

    stack = [root]
    while stack:
        path = stack[-1]
        try:
            entries = listing(path)
        except FileNotFoundError:
            stack.pop()
            continue
        subdirs = [e.path for e in entries if e.is_dir(follow_symlinks=False)]
        for e in entries:
            if not e.is_dir(follow_symlinks=False):
                try:
                    os.unlink(e.path)
                except FileNotFoundError:
                    pass
                except PermissionError:
                    os.chmod(path, 0o700)
                    os.unlink(e.path)
        if subdirs:
            stack.extend(subdirs)
            continue
        if path != root or not keep_root:
            os.rmdir(path)
        stack.pop()


def _isolate_network() -> str:
    """A new network namespace for the zygote and every child it forks; what was done, or raise OSError."""
    unshare = getattr(os, "unshare", None)
    flags_net = getattr(os, "CLONE_NEWNET", 0x40000000)
    flags_user = getattr(os, "CLONE_NEWUSER", 0x10000000)
    if unshare is None:  # Python 3.11: libc's unshare (the zygote only, before any child)
        import ctypes

        def unshare(flags):
            if child._SYSCALL(272 if os.uname().machine == "x86_64" else 97, flags) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
    try:
        unshare(flags_net)
        return "network namespace"
    except OSError:
        unshare(flags_user | flags_net)  # unprivileged: a user namespace makes the network one possible
        return "user + network namespace"


def main() -> None:
    config = json.loads(sys.argv[1])
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    child._SYSCALL, child._PRCTL = libc.syscall, libc.prctl  # the children drop them before any program runs
    child._SYSCALL.restype = ctypes.c_long
    child._make_buffer = ctypes.create_string_buffer
    template._REFCNT[0] = ctypes.c_ssize_t.from_address
    abi = child.landlock_abi()
    if config.get("require_landlock", True) and abi == 0:
        sys.stdout.write(json.dumps({"missing": "landlock",
                                     "error": "no Landlock in this kernel (Linux >= 5.13 with landlock in its LSM "
                                              "list): files could not be confined by the kernel"}) + "\n")
        sys.stdout.flush()
        return
    try:
        isolation = _isolate_network()
    except OSError as exc:
        sys.stdout.write(json.dumps({"error": f"no network isolation: unshare(CLONE_NEWNET) and "
                                              f"unshare(CLONE_NEWUSER|CLONE_NEWNET) both failed ({exc})"}) + "\n")
        sys.stdout.flush()
        return
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
        del sys.modules[name]
    os.environ.clear()
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    import gc

    gc.freeze()  # what is loaded now stays untouched by collections: fewer copy-on-write pages per child
    config["landlock_abi"] = abi
    zygote = Zygote(config)
    sys.stdout.write(json.dumps({"ready": True, "isolation": isolation + (f" + Landlock ABI {abi}" if abi else ""),
                                 "landlock_abi": abi, "pid": os.getpid(), "template_pid": zygote.template.pid})
                     + "\n")
    sys.stdout.flush()
    zygote.serve()


if __name__ == "__main__":
    main()
