"""The sandbox's fork server. Runs as `python -I -S zygote.py CONFIG_JSON` (standard library only, no site-packages,
an empty environment), started and fed by sandbox/host.py. It never runs model-written code itself: it forks one
child per program, and the child runs the program and its tests under every limit below.

Once, at start: no network (a new network namespace: only a loopback that is down), an empty environment, the
standard modules programs commonly import loaded once (a fork then costs ~1 ms instead of a Python start).

Per child (a program = the completion's code + its test functions, see asserts.py):
- its own session (process group), `RLIMIT_CPU`, `RLIMIT_AS` (memory), `RLIMIT_FSIZE` (output and files),
  `RLIMIT_NOFILE`, no core dumps; a wall-clock deadline per test enforced here (SIGKILL of its whole group);
- a private scratch directory as its working directory, removed when it ends; stdout/stderr go to a capped file
  there; stdin is /dev/null;
- an audit hook (PEP 578, cannot be removed from Python code) refusing: creating processes (fork, exec, spawn,
  system, subprocess) — the process-count limit, root included; signalling other processes; sockets; ctypes /
  cffi / mmap imports; writes, renames and deletions outside the scratch directory; reads outside the scratch
  directory and the standard library (so /proc/<pid>/environ, ~/.ssh, … are out of reach); frame and
  garbage-collector introspection (how code could find the harness's secret);
- pass/fail through a pipe only the harness writes to, each line carrying a random nonce the program never sees:
  a test passes only when the harness saw its test function RETURN. Output, exit status, `sys.exit`, `os._exit`,
  `atexit`, killing the zygote (refused) or crashing the interpreter cannot report a pass. A child that dies or
  overruns its deadline mid-test fails that test; the remaining tests run in a fresh child.
"""

from __future__ import annotations

import builtins
import json
import os
import resource
import selectors
import shutil
import signal
import sys
import tempfile
import time

PRELOAD = ("math", "re", "collections", "itertools", "functools", "heapq", "bisect", "string", "typing",
           "random", "json", "fractions", "decimal", "statistics", "operator", "copy", "dataclasses", "enum",
           "datetime", "hashlib", "textwrap", "unicodedata", "array", "queue")
BLOCKED_EVENTS = {
    "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "os.popen",
    "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill", "os.setns", "os.unshare",
    "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function", "ctypes.addressof",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._getframe", "sys._current_frames",
    "sys._current_exceptions", "sys._getframemodulename", "sys.settrace", "sys.setprofile",
    "os.chroot", "os.chown", "os.setxattr", "os.removexattr", "os.truncate", "os.link", "os.symlink",
    "shutil.chown", "resource.setrlimit", "resource.prlimit", "fcntl.ioctl", "msvcrt.open_osfhandle",
    "sys.remote_exec", "os.putenv", "os.unsetenv", "mmap.__new__", "code.__new__",
}
BLOCKED_IMPORTS = {"ctypes", "_ctypes", "cffi", "_cffi_backend", "mmap", "resource", "_posixsubprocess", "pty",
                   "multiprocessing", "_multiprocessing", "socket", "_socket", "ssl", "_ssl", "select", "fcntl",
                   "faulthandler", "tracemalloc", "_tracemalloc", "gc"}
FRAME_ATTRS = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "f_globals", "f_locals", "__code__",
               "gi_code", "cr_code", "f_builtins"}
OUT_READ_CAP = 4096


class SandboxViolation(PermissionError):
    pass


# ---- strict equality (the tests' `==` against plain values; see asserts.py) ----------------------------
_NUMBER_BASES = (bool, int, float, complex)
_exact = {bool, int, float, complex, str, bytes, type(None), list, tuple, dict, set, frozenset}


def _plain_base(x):
    for t in type(x).__mro__:
        if t in _exact:
            return t
    return None


def _number_value(x, base):
    # the builtin type's own slot: a subclass cannot override what these return
    if base is bool or base is int:
        return int.__int__(x)
    if base is float:
        return float.__float__(x)
    return complex(float.__float__(complex.real.__get__(x)), float.__float__(complex.imag.__get__(x)))


def strict_eq(actual, expected) -> bool:
    """`actual == expected` where `expected` is plain data, judged on `actual`'s builtin value: numbers compare
    across int/float/complex/bool as Python does, containers element by element, anything else is unequal."""
    eb, ab = _plain_base(expected), _plain_base(actual)
    if eb is None:  # not plain: the comparison was not rewritten by asserts.harden; be strict anyway
        return False
    if ab is None:
        return False
    if eb in _NUMBER_BASES:
        return ab in _NUMBER_BASES and _number_value(actual, ab) == _number_value(expected, eb)
    if eb is type(None):
        return actual is None
    if eb is str:
        return ab is str and str.__str__(actual) == expected
    if eb is bytes:
        return ab is bytes and bytes(bytes.__getitem__(actual, slice(None))) == expected
    if eb in (list, tuple):
        if ab is not eb:
            return False
        n = eb.__len__(actual)
        return n == len(expected) and all(strict_eq(eb.__getitem__(actual, i), expected[i]) for i in range(n))
    if eb is dict:
        if ab is not dict or dict.__len__(actual) != len(expected):
            return False
        items = list(dict.items(actual))
        return all(any(strict_eq(k, ek) and strict_eq(v, ev) for k, v in items) for ek, ev in expected.items())
    if eb in (set, frozenset):
        if ab not in (set, frozenset) or ab.__len__(actual) != len(expected):
            return False
        elems = list(ab.__iter__(actual))
        return all(any(strict_eq(e, x) for e in elems) for x in expected)
    return False


def strict_ne(actual, expected) -> bool:
    return _plain_base(actual) is not None and not strict_eq(actual, expected)


# ---- the child -----------------------------------------------------------------------------------------
def _audit_hook(scratch: str, readable: tuple[str, ...]):
    """The child's audit hook. Bound to locals: nothing the program can reach changes what it refuses."""
    blocked, blocked_imports, frame_attrs = frozenset(BLOCKED_EVENTS), frozenset(BLOCKED_IMPORTS), \
        frozenset(FRAME_ATTRS)
    scratch = os.path.realpath(scratch)
    fspath, realpath, isinstance_, str_, int_ = os.fspath, os.path.realpath, isinstance, str, int
    dev_ok = ("/dev/null", "/dev/urandom", "/dev/random", "/dev/zero")
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC

    def inside(path, roots) -> bool:
        p = realpath(fspath(path))
        return any(p == r or p.startswith(r + "/") for r in roots)

    def hook(event, args):
        if event in blocked:
            raise SandboxViolation(f"sandbox: {event} is not allowed")
        if event == "import":
            if args[0].partition(".")[0] in blocked_imports:
                raise SandboxViolation(f"sandbox: import {args[0]} is not allowed")
        elif event == "object.__getattr__" or event == "object.__setattr__":
            if args[1] in frame_attrs:
                raise SandboxViolation(f"sandbox: {args[1]} is not accessible")
        elif event == "open":
            path, mode, flags = args
            if path is None or isinstance_(path, int_):  # os.fdopen of an fd it already holds
                return
            path = fspath(path)
            if isinstance_(path, bytes):
                path = path.decode(errors="replace")
            writing = (isinstance_(mode, str_) and any(c in mode for c in "wax+")) or (flags & write_flags)
            if inside(path, (scratch,)):
                return
            if not writing and (path in dev_ok or inside(path, readable)):
                return
            raise SandboxViolation(f"sandbox: open({path!r}) is outside the sandbox")
        elif event in ("os.remove", "os.rmdir", "os.mkdir", "os.rename", "os.chmod", "os.utime", "os.chdir",
                       "shutil.rmtree", "shutil.move", "shutil.copyfile", "os.listdir", "os.scandir"):
            for a in args:
                if isinstance_(a, (str_, bytes)) or hasattr(a, "__fspath__"):
                    p = fspath(a)
                    if isinstance_(p, bytes):
                        p = p.decode(errors="replace")
                    if not inside(p, (scratch,)) and not (event in ("os.listdir", "os.scandir")
                                                           and inside(p, readable)):
                        raise SandboxViolation(f"sandbox: {event}({p!r}) is outside the sandbox")
    return hook


_PDEATHSIG = None  # libc's prctl, bound at start (ctypes is then dropped from sys.modules)


def _child(job: dict, start: int, nonce: str, w: int, scratch: str, limits: dict, readable) -> None:
    """In the forked child: limits, then the program, then its tests from `start`. Never returns."""
    write, exit_ = os.write, os._exit
    try:
        if _PDEATHSIG is not None:
            _PDEATHSIG(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: it dies with the zygote, whatever kills that
            if os.getppid() == 1:
                exit_(0)
        os.setsid()
        os.closerange(3, w)  # every inherited descriptor but the verdict pipe
        os.closerange(w + 1, limits["max_fd_scan"])
        os.chdir(scratch)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        out = os.open(os.path.join(scratch, ".out"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        cpu = max(1, int(limits["wall_s"] * (len(job["tests"]) - start + 1) + 1))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"], limits["memory_bytes"]))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits["output_bytes"], limits["output_bytes"]))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.environ.clear()
        import gc

        gc.disable()  # a short-lived child: no collector passes over the zygote's pages (and no cycles to free)
        namespace = {"__name__": "solution", "__builtins__": builtins}
        tests = []
        for src in job["tests"][start:]:
            if src is None:  # did not parse on the trainer side: fails without running
                tests.append(None)
                continue
            scope = {}
            exec(compile(src, "<test>", "exec"), namespace, scope)
            tests.append(scope["__grpo_test__"])
        program = compile(job["code"], "<completion>", "exec")
        eq, ne, base_exc = strict_eq, strict_ne, BaseException
        import types
        sys.modules["__main__"] = types.ModuleType("__main__")  # the zygote's globals are out of reach
        sys.addaudithook(_audit_hook(scratch, readable))
        del job, limits, readable
    except BaseException as exc:  # noqa: BLE001 - a setup failure is reported, not raised
        write(w, f"{nonce} X setup {type(exc).__name__}: {exc}\n".encode())
        exit_(0)
    try:
        exec(program, namespace)
    except base_exc as exc:  # noqa: BLE001
        write(w, f"{nonce} E {type(exc).__name__}\n".encode())
        exit_(0)
    write(w, f"{nonce} D\n".encode())
    for i, test in enumerate(tests, start):
        write(w, f"{nonce} S {i}\n".encode())
        if test is None:
            write(w, f"{nonce} F {i} SyntaxError\n".encode())
            continue
        try:
            test(eq, ne)
        except base_exc as exc:  # noqa: BLE001
            write(w, f"{nonce} F {i} {type(exc).__name__}\n".encode())
        else:
            write(w, f"{nonce} P {i}\n".encode())
    exit_(0)


# ---- the zygote ----------------------------------------------------------------------------------------
class _Run:
    """One child running job `job` from test `start`."""

    def __init__(self, job, start, pid, r, scratch, nonce, wall_s: float):
        self.job, self.start, self.pid, self.r, self.scratch, self.nonce = job, start, pid, r, scratch, nonce
        self.buf = b""
        self.current: int | None = None  # test running now (None: defining the program)
        self.deadline = time.monotonic() + wall_s
        self.done = False  # the harness reported the end (the program raised, or setup failed)
        self.defined = False  # the program's code ran to its end


class Zygote:
    def __init__(self, config: dict):
        self.limits = config["limits"]
        self.workers = max(1, int(config["workers"]))
        self.root = config["scratch_root"]
        # the standard library (the only code a program may import: no site-packages)
        self.readable = tuple(sorted({os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}))
        self.queue: list[dict] = []
        self.runs: dict[int, _Run] = {}
        self.results: dict[int, dict] = {}
        self.sel = selectors.DefaultSelector()

    def spawn(self, job: dict, start: int) -> None:
        r, w = os.pipe()
        scratch = tempfile.mkdtemp(prefix=f"job{job['id']}-", dir=self.root)
        nonce = os.urandom(16).hex()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _child(job, start, nonce, w, scratch, self.limits, self.readable)
        os.close(w)
        run = _Run(job, start, pid, r, scratch, nonce, self.limits["wall_s"])
        self.runs[r] = run
        self.sel.register(r, selectors.EVENT_READ, run)

    def on_line(self, run: _Run, line: bytes) -> None:
        parts = line.decode(errors="replace").split(" ")
        if parts[0] != run.nonce or len(parts) < 2:
            return  # not from the harness
        res = self.results[run.job["id"]]
        kind = parts[1]
        if kind == "S":
            run.current = int(parts[2])
            run.deadline = time.monotonic() + self.limits["wall_s"]
        elif kind in ("P", "F"):
            i = int(parts[2])
            res["passed"][i] = kind == "P"
            res["detail"][i] = "passed" if kind == "P" else (parts[3] if len(parts) > 3 else "failed")
            run.current = None
        elif kind in ("E", "X"):
            why = " ".join(parts[2:]) or "error"
            for i in range(run.start, len(res["passed"])):
                res["detail"][i] = ("the program raised " if kind == "E" else "sandbox setup failed: ") + why
            run.done = True
        elif kind == "D":
            run.defined = True
            run.deadline = time.monotonic() + self.limits["wall_s"]

    def finish(self, run: _Run, why: str | None) -> None:
        """The child ended (or is being killed): collect it, fail the test it died in, go on after it."""
        try:
            os.killpg(run.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(run.pid, 0)
        except ChildProcessError:
            pass
        self.sel.unregister(run.r)
        os.close(run.r)
        del self.runs[run.r]
        out = ""
        try:
            with open(os.path.join(run.scratch, ".out"), "rb") as fh:
                out = fh.read(OUT_READ_CAP).decode(errors="replace")
        except OSError:
            pass
        shutil.rmtree(run.scratch, ignore_errors=True)
        job, res = run.job, self.results[run.job["id"]]
        n = len(job["tests"])
        reason = why or "the program ended the process"
        if out and not res["output"]:
            res["output"] = out[:1000]
        if not run.done:
            if not run.defined:  # died while defining the program: no test can run
                for i in range(run.start, n):
                    res["passed"][i], res["detail"][i] = False, f"{reason} (before the tests)"
            elif run.current is not None:  # died in test `current`: it fails, the rest run in a fresh child
                res["passed"][run.current], res["detail"][run.current] = False, reason
                if run.current + 1 < n:
                    self.queue.insert(0, {**job, "_start": run.current + 1})
                    return  # the job goes on: its verdicts are sent when its last child ends
        for i in range(run.start, n):
            if res["passed"][i] is None:
                res["passed"][i], res["detail"][i] = False, res["detail"][i] or reason
        self.reply(job["id"])

    def reply(self, job_id: int) -> None:
        res = self.results.pop(job_id)
        res["passed"] = [bool(p) for p in res["passed"]]
        sys.stdout.write(json.dumps(res) + "\n")
        sys.stdout.flush()

    def submit(self, job: dict) -> None:
        n = len(job["tests"])
        self.results[job["id"]] = {"id": job["id"], "passed": [None] * n, "detail": [""] * n, "output": ""}
        if n == 0:
            self.reply(job["id"])
            return
        self.queue.append(job)

    def serve(self) -> None:
        stdin = sys.stdin.fileno()
        os.set_blocking(stdin, False)
        self.sel.register(stdin, selectors.EVENT_READ, None)
        pending = b""
        open_input = True
        while open_input or self.queue or self.runs:
            while self.queue and len(self.runs) < self.workers:
                job = self.queue.pop(0)
                self.spawn(job, job.pop("_start", 0))
            now = time.monotonic()
            timeout = min((r.deadline for r in self.runs.values()), default=now + 1.0) - now
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
                            self.submit(json.loads(line))
                    continue
                run = key.data
                try:
                    chunk = os.read(run.r, 65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    self.finish(run, None)
                    continue
                run.buf += chunk
                while b"\n" in run.buf:
                    line, run.buf = run.buf.split(b"\n", 1)
                    self.on_line(run, line)
            now = time.monotonic()
            for run in list(self.runs.values()):
                if now > run.deadline:
                    self.finish(run, f"timed out after {self.limits['wall_s']:g} s")


def _isolate_network() -> str:
    """A new network namespace for the zygote and every child it forks; what was done, or raise OSError."""
    unshare = getattr(os, "unshare", None)
    flags_net = getattr(os, "CLONE_NEWNET", 0x40000000)
    flags_user = getattr(os, "CLONE_NEWUSER", 0x10000000)
    if unshare is None:  # Python 3.11: libc's unshare through ctypes (the zygote only, before any child)
        import ctypes  # removed from sys.modules again in main(): no program finds it loaded

        libc = ctypes.CDLL(None, use_errno=True)

        def unshare(flags):
            if libc.unshare(flags) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
    try:
        unshare(flags_net)
        return "network namespace"
    except OSError:
        unshare(flags_user | flags_net)  # unprivileged: a user namespace makes the network one possible
        return "user + network namespace"


def main() -> None:
    global _PDEATHSIG
    config = json.loads(sys.argv[1])
    import ctypes

    _PDEATHSIG = ctypes.CDLL(None, use_errno=True).prctl
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
    sys.stdout.write(json.dumps({"ready": True, "isolation": isolation, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    Zygote(config).serve()


if __name__ == "__main__":
    main()
