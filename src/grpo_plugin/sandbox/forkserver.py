"""The sandbox's fork server, inside the jail (sandbox/jail.py). Started by sandbox/client.py as
`python -I -S -c "import forkserver; forkserver.main()" CONFIG` and fed jobs on stdin, one JSON line each;
answers one JSON line per job on stdout: per test a status (`passed`, `failed` with why, `killed`; stdin/stdout
tests: `returned` with the program's stdout, which the trainer compares).

The server (here) and its templates (template.py). The server reads jobs, compiles programs, keeps deadlines, reads
what the processes it started write and replies; it never forks after its start. A template per core, forked once
and pinned to its core, forks every process of its core's scratch slots (Cores), each PID 1 of its own PID
namespace, and collects them when told.

A job of assert or call-based tests gets two processes: the program's (program.py: it runs the program, then
answers calls into it) and a judge (judge.py: it runs the tests and sends the verdicts here). They talk over a
socket pair; this server hears only the judge's verdicts and the program's stdout/stderr (diagnostics). A
stdin/stdout job gets a process per test (its input exists only there); its stdout goes back to the
trainer, which compares it with the expected output (never sent here).

Here: the job loop (jobs in, processes started, what they write routed to their runs, deadlines kept, replies
out). Beside it, in the same process: forkserver_runs.py (a run's processes, deadlines and output parsing),
forkserver_slots.py (scratch slots and cores), forkserver_plan.py (programs and tests compiled, one-call tests found;
loaded once the templates are forked). What a forked process runs first: forked.py.
Everything a process writes is parsed as untrusted; one job's failure costs no other job.
"""

from __future__ import annotations

import _signal as signal  # the C half: the Python half builds enums every fork would carry
import binascii
import gc
import json
import marshal
import os
import re
import select
import sys
import time

try:
    from . import confine, forked, hugetext, libc, program, template, wire
    from .forkserver_judges import Judges
    from .forkserver_runs import OUT_READ_CAP, Run, stdin_files, stdio_units
    from .forkserver_slots import Cores, Slots
except ImportError:  # the fork server: forkserver.py imported as a top-level module, its siblings beside it
    import confine
    import forked
    import hugetext
    import libc
    import program
    import template
    import wire
    from forkserver_judges import Judges
    from forkserver_runs import OUT_READ_CAP, Run, stdin_files, stdio_units
    from forkserver_slots import Cores, Slots

# loaded once here, shared by every process the template forks (a program that imports one pays nothing). Not
# preloaded: modules that register an at-fork handler, which would then run in EVERY forked process (`threading`,
# `random`, and `tempfile` / `statistics`, which import it: ~0.45 ms of each process's CPU); a program that imports
# one pays its import (~1 ms) instead. Nor large modules programs rarely use: `ast`, `fractions`, `decimal`, and
# `ctypes` and `socket`, whose C halves the sandbox uses itself. Every fork copies the page tables of what the
# template holds and every exit unmaps them (1 MB more of it: +1.5-2% CPU per program).
PRELOAD = ("math", "re", "collections", "itertools", "functools", "heapq", "bisect", "string", "typing", "json",
           "operator", "copy", "enum", "datetime", "unicodedata", "array", "io", "struct", "_sitebuiltins")
HIDE_ROOT = "/grpo/empty"  # the empty directory and file bound over the packages' data (confine.hide_paths)
# programs that may need a /dev/shm (POSIX semaphores: multiprocessing's locks and pools): each gets its own
_SHM_USERS = re.compile(r"multiprocessing|concurrent\.futures|\bshared_memory\b")


class Watch:
    """The descriptors the server waits on (epoll, level-triggered: a descriptor stays ready until it is read or
    closed), each with what it is for."""

    def __init__(self):
        self.epoll = select.epoll()
        self.data: dict[int, object] = {}

    def add(self, fd: int, data) -> None:
        self.epoll.register(fd, select.EPOLLIN)
        self.data[fd] = data

    def remove(self, fd: int) -> None:
        if self.data.pop(fd, self) is not self:
            self.epoll.unregister(fd)

    def ready(self, timeout: float) -> list[tuple[int, object]]:
        """The descriptors ready now or within `timeout` seconds, with their data as it was then."""
        data = self.data
        return [(fd, data[fd]) for fd, _ in self.epoll.poll(timeout) if fd in data]


class ForkServer:
    """The job loop (module docstring)."""


    def __init__(self, config: dict):
        self.limits = config["limits"]
        self.workers = max(1, int(config["workers"]))
        self.root = config["scratch_root"]
        self.site_dirs = list(config.get("site_dirs", []))
        self.uids = config.get("uids", True)  # separate identities (the jail maps them), else capabilities dropped
        abi = int(config.get("landlock_abi", 0))
        self.landlock = confine.Landlock(abi, tuple(config["readable"])) if abi else None
        bpf = bytes.fromhex(config.get("seccomp", ""))
        self.seccomp = confine.Seccomp(bpf) if bpf else None
        self.queue: list[tuple[dict, int, int]] = []
        self.fd_run: dict[int, tuple[Run, str]] = {}
        self.results: dict[int, dict] = {}
        self.pending: dict[int, int] = {}
        self.children: set[Run] = set()
        self.watch = Watch()
        self.reaping: dict[int, Run] = {}
        self.cores = Cores(sorted(os.sched_getaffinity(0)))
        self.slots = Slots(self.root, self.workers, self.uids, int(config.get("slot_bytes", 0)), self.cores)
        self.unsent = False
        self.judges = Judges(self)
        self.plans = None  # forkserver_plan.Plans, once the templates are forked
        program.prepare_common(self.site_dirs)
        try:
            program.warm_up(self.slots.paths[0])
        except Exception as exc:  # noqa: BLE001 - only slower without it
            sys.stderr.write(f"sandbox: the warm-up failed: {type(exc).__name__}: {exc}\n")
        template._immortalize()
        libc.function("malloc_trim")(0)  # the free pages inside malloc's heap (what start-up freed) given back:
        # they would be in every forked process's page tables (10.2 instead of 10.3-11.6 MB, depending on where
        # the last live block of the heap happened to lie)
        gc.freeze()  # what the warm-up and this set-up made, out of the collector's young generations: a program's
        # process that collects never writes their headers (a copy-on-write fault per page)
        self.templates: list[template.Template] = []
        for core in self.cores.cores or [None]:  # one per core, each forking the processes of its core's slots
            self.templates.append(template.Template(self.forked_main, self.landlock, self.seccomp, core,
                                                    tuple(t.sock for t in self.templates)))
        for t in self.templates:
            self.watch.add(t.sock.fileno(), ("template", t))
        self.slots.on_new_dir = lambda k, path: self.template_of(k).scratch(k, path)
        for k, path in enumerate(self.slots.paths):
            self.slots.on_new_dir(k, path)
        self.null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)  # every child's stdin (and a judge's stderr)

    def forked_main(self, payload: bytes, fds: list[int], ruleset: int) -> None:
        """What a forked process runs (in it: never returns)."""
        forked.main(payload, fds, ruleset, self.limits, self.uids)

    def plan(self):
        """The test planner (forkserver_plan.Plans), loaded the first time it is needed: never in a template."""
        if self.plans is None:
            self.plans = forked.late_import("forkserver_plan").Plans()
        return self.plans

    def template_of(self, slot: int) -> template.Template:
        """The template that forks `slot`'s processes: the one on the slot's core."""
        return self.templates[slot % len(self.templates)]

    def spawn(self, job: dict, start: int, end: int) -> None:
        code = self.plan().program(job["code"])
        if isinstance(code, str):  # it does not compile: no test can run, no process is needed
            for t in self.results[job["id"]]["tests"][start:end]:
                t["status"], t["why"] = "failed", f"the program raised {code}"
            self.unit_done(job, start, end, "")
            return
        stdio = job["mode"] == "stdio"
        nonce = os.urandom(16).hex()
        cpu = max(1, int(sum(job["wall_s"][start:end]) + self.limits["wall_s"] + 1))
        slot = self.slots.take()
        forker = self.template_of(slot)
        run = Run(job, start, end, slot, nonce, self.limits, self.results[job["id"]])
        run.emit = lambda test, data, job_id=job["id"]: send_output(job_id, test, data)
        own_shm = _SHM_USERS.search(job["code"]) is not None
        ours: dict[str, int] = {}
        theirs: list[int] = []
        try:
            null = self.null
            out_r, out_w = os.pipe()
            w_r, w_w = os.pipe()
            ours.update(out=out_r, w=w_r)
            theirs += [out_w, w_w]
            if stdio:
                err_r, err_w = os.pipe()
                ours["err"] = err_r
                theirs.append(err_w)
                inputs = stdin_files(job, start, end, theirs)
                # 0 /dev/null, 1 stdout, 2 stderr, 3 status, 4.. inputs
                fds = [null, out_w, err_w, w_w, *inputs]
                payload = marshal.dumps(("program", "stdio", start, end, nonce, self.slots.paths[slot], cpu, code,
                                          slot, own_shm))
                forker.spawn(payload, fds, slot)
                forker.starting.append((run, "program"))
            else:
                rpc_c, rpc_j = wire.socketpair()
                theirs += [rpc_c.detach(), rpc_j.detach()]
                rc, rj = theirs[-2], theirs[-1]
                # the program: 0 /dev/null, 1-2 diagnostics, 3 its end of the socket, 4 setup status
                payload = marshal.dumps(("program", job["mode"], start, end, nonce, self.slots.paths[slot], cpu,
                                          code, slot, own_shm))
                forker.spawn(payload, [null, out_w, out_w, rc, w_w], slot)
                forker.starting.append((run, "program"))
                # the slot's judge (started when the slot first needs one, or after the last was replaced)
                text = json.dumps({k: job[k] for k in ("mode", "cases", "fn") if k in job})
                plans = self.plan()
                tests = [plans.test(t) for t in job["tests"][start:end]] if job["mode"] == "asserts" else []
                imports = plans.imports(job.get("source") or "")
                payload = marshal.dumps((text, start, end, tests, imports))
                self.judges.hand(slot, run, wire.frame(payload), rj)
        except OSError:
            if not forker.starting or forker.starting[-1][0] is not run:  # nothing started: the slot is free again
                for fd in ours.values():
                    os.close(fd)
                self.slots.free.append(slot)
                self.cores.give(slot)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        for k, r in ours.items():
            os.set_blocking(r, False)
            run.fds[k] = r
            self.fd_run[r] = (run, k)
            self.watch.add(r, (run, k))
        self.children.add(run)

    def drain(self, run: Run) -> str | None:
        for which, r in list(run.fds.items()):
            try:
                while chunk := os.read(r, 65536):
                    why = run.feed(which, chunk)
                    if why is not None:
                        return why
            except OSError:
                pass
        return None

    # -- ending a run
    def finish(self, run: Run, why: str | None) -> None:
        """Kill and collect the run's processes (their PID namespaces with them); `collected` goes on after."""
        if run.ending is not None:
            run.ending = run.ending or why or ""
            return
        run.ending = why or ""
        if run.judge is not None and run.judge.run is run:  # it ends before its judge said so: a new judge
            run.judge.run = None
            self.judges.retire(run.judge)
        for r in run.fds.values():
            if r in self.fd_run:
                self.watch.remove(r)
                del self.fd_run[r]
        for pid in run.pids.values():
            if pid is not None:
                self.template_of(run.slot).reap(pid)
                self.reaping[pid] = run

    def on_answer(self, forker: template.Template, kind: bytes, pid: int, status: int) -> None:
        if kind == b"P":
            run, role = forker.starting.popleft()
            if role == "judge":  # a judge record
                self.judges.started(run, forker, pid)
                return
            if pid < 0:
                run.pids[role] = 0
                run.unreaped -= 1
                run.fail_rest(f"could not start: fork: {os.strerror(-pid)}")
                self.finish(run, "could not start")
                if run.unreaped == 0:
                    self.collected(run)
                return
            run.pids[role] = pid
            if run.ending is not None:
                forker.reap(pid)
                self.reaping[pid] = run
        elif kind == b"X":
            run = self.reaping.pop(pid)
            if run is None:  # a judge
                return
            run.status[[r for r, p in run.pids.items() if p == pid][0]] = status
            run.unreaped -= 1
            if run.unreaped == 0:
                self.collected(run)

    def collected(self, run: Run) -> None:
        """Every process of the run is gone: read what they wrote, fail the test they died in, go on after it."""
        self.children.discard(run)
        why = run.ending or self.drain(run)
        for r in run.fds.values():
            try:
                os.close(r)
            except OSError:
                pass
        self.slots.release(run.slot)
        reason = why or "the program ended its process"
        resume = run.settle(reason, OUT_READ_CAP)
        if resume is not None:  # the tests after the one it died in, in a fresh run
            self.queue.insert(0, (run.job, resume, run.end))
            return
        self.unit_done(run.job, run.start, run.end, reason)

    def unit_done(self, job: dict, start: int, end: int, reason: str) -> None:
        for t in self.results[job["id"]]["tests"][start:end]:
            if not t["status"]:
                t["status"], t["why"] = "killed", reason
        self.pending[job["id"]] -= 1
        if self.pending[job["id"]] == 0:
            self.reply(job["id"])

    def reply(self, job_id: int) -> None:
        del self.pending[job_id]
        sys.stdout.write(json.dumps(self.results.pop(job_id)) + "\n")
        self.unsent = True

    def submit(self, job: dict) -> None:
        n = len(job["tests"] if job["mode"] != "calls" else job["cases"])
        job["wall_s"] = [float(w or self.limits["wall_s"]) for w in (job.get("wall_s") or [None] * n)]
        self.results[job["id"]] = {"id": job["id"], "output": "",
                                   "tests": [{"status": "", "why": ""} for _ in range(n)]}
        units = stdio_units(job) if job["mode"] == "stdio" else [(job, 0, n)] if n else []
        self.pending[job["id"]] = len(units)
        if not units:
            self.reply(job["id"])
        self.queue.extend(units)

    def serve(self) -> None:
        stdin = sys.stdin.fileno()
        os.set_blocking(stdin, False)
        self.watch.add(stdin, None)
        pending = b""
        open_input = True
        while open_input or self.queue or self.children:
            if self.queue and not self.slots.free and not self.children:
                job, start, end = self.queue.pop(0)
                self.unit_done(job, start, end, "could not start: no scratch directory")
                continue
            while self.queue and self.slots.free:
                job, start, end = self.queue.pop(0)
                try:
                    self.spawn(job, start, end)
                except OSError as exc:
                    self.unit_done(job, start, end, f"could not start: {exc}")
            if self.unsent:
                sys.stdout.flush()
                self.unsent = False
            now = time.monotonic()
            timeout = min((min(r.deadline, r.hard_deadline) for r in self.children if r.ending is None),
                          default=now + 1.0) - now
            for fd, data in self.watch.ready(max(0.0, min(timeout, 1.0))):
                if data is None:
                    chunk = os.read(stdin, 1 << 20)
                    if not chunk:
                        open_input = False
                        self.watch.remove(stdin)
                        continue
                    pending += chunk
                    while b"\n" in pending:
                        line, pending = pending.split(b"\n", 1)
                        if line.strip():
                            msg = json.loads(line)
                            self.submit({**msg["job"], "id": msg["id"]})
                    continue
                if data[0] == "template":
                    for answer in data[1].answers():
                        self.on_answer(data[1], *answer)
                    continue
                if data[0] == "judge":
                    self.judges.readable(data[1], _read(fd))
                    continue
                run, which = data
                if fd not in self.fd_run:
                    continue
                chunk = _read(fd)
                if chunk is None:
                    continue
                if chunk:
                    why = run.feed(which, chunk)
                    if why is not None:
                        self.finish(run, why)
                    elif run.done:
                        self.finish(run, None)
                    continue
                self.watch.remove(fd)
                del self.fd_run[fd]
                if which == "out" and run.stdio:
                    self.finish(run, None)  # the stdin/stdout program is done: collect the run
            now = time.monotonic()
            for run in list(self.children):
                if run.ending is None and (now > run.hard_deadline or now > run.deadline):
                    bad = self.drain(run)  # what it wrote last may end it first
                    beside = self.cores.beside(run.slot, len(self.children))
                    why = bad if bad is not None or run.done else run.timed_out(now, beside)
                    if why is not None or run.done:
                        self.finish(run, why)
        sys.stdout.flush()


def send_output(job_id: int, test: int, data: bytes) -> None:
    """A stdin/stdout test's output, to the trainer now (a line of its own, before its job's reply): the bytes as
    base64 (4/3 of their size whatever they hold; JSON would escape a control or invalid byte as 6 characters), so
    this process holds one test's output per running program, never a job's."""
    sys.stdout.write(f'{{"id": {job_id}, "out": {test}, "b64": "'
                     f'{binascii.b2a_base64(data, newline=False).decode("ascii")}"}}\n')
    sys.stdout.flush()


def _read(fd: int) -> bytes | None:
    """What a readable descriptor holds now: b"" at its end (or when it broke), None when nothing is there yet."""
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def main() -> None:
    config = json.loads(sys.argv[1])
    abi = confine.landlock_abi()
    if config.get("require_landlock", True) and abi == 0:
        sys.stdout.write(json.dumps({"missing": "landlock",
                                     "error": "no Landlock in this kernel (Linux >= 5.13 with landlock in its LSM "
                                              "list)"}) + "\n")
        sys.stdout.flush()
        return
    confine._PRCTL(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the fork server's memory is nobody's to read
    try:
        confine.hide_processes()
        hidepid = True
    except OSError as exc:
        hidepid = False
        sys.stderr.write(f"sandbox: /proc shows every process of the jail: {exc}\n")
    for why in confine.devices_read_only():
        sys.stderr.write(f"sandbox: a device stays writable as a file: {why}\n")
    hidden = -1  # the packages' data files (package_data.py): how many paths are hidden, -1 where none could be
    if config.get("hide"):
        try:
            with open(config["hide"], "rb") as f:
                dirs, files = json.loads(f.read())
            failed = confine.hide_paths(HIDE_ROOT, dirs, files)
            hidden = len(dirs) + len(files) - len(failed)
            for why in failed[:5]:
                sys.stderr.write(f"sandbox: a package's data stays visible: {why}\n")
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"sandbox: the packages' data files stay visible: {exc}\n")
    huge_text = 0
    if config.get("huge_text", True):  # first: what it allocates and frees leaves no holes the children fill
        try:
            huge_text = hugetext.remap_interpreter()
        except (OSError, ValueError, AttributeError) as exc:  # only slower without it
            sys.stderr.write(f"sandbox: the interpreter's code stays on small pages: {exc}\n")
    os.environ.clear()
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    gc.freeze()
    config["landlock_abi"] = abi
    try:
        server = ForkServer(config)
    except (OSError, ValueError, template.TemplateGone) as exc:
        sys.stdout.write(json.dumps({"error": f"the fork server could not start: {type(exc).__name__}: {exc}",
                                     "in_jail": True})
                         + "\n")
        sys.stdout.flush()
        return
    sys.stdout.write(json.dumps({"ready": True, "landlock_abi": abi, "pid": os.getpid(), "huge_text": huge_text,
                                 "slot_quotas": server.slots.quotas, "hidepid": hidepid, "hidden": hidden,
                                 "template_pids": [t.pid for t in server.templates]}) + "\n")
    sys.stdout.flush()
    server.serve()
