"""The sandbox's fork server, inside the jail (sandbox/jail.py). Started by sandbox/host.py as
`python -I -S -c "import zygote; zygote.main()" CONFIG` and fed jobs on stdin, one JSON line each; answers one JSON
line per job on stdout: per test a status (`passed`, `failed` with why, `killed`; stdin/stdout tests: `returned`
with the program's stdout, which the trainer compares).

The server (here) and its templates (template.py). The server reads jobs, compiles programs, keeps deadlines, reads
what the processes it started write and replies; it never forks after its start. A template per core, forked once
and pinned to its core, forks every process of its core's scratch slots (Cores), each PID 1 of its own PID
namespace, and collects them when told.

A job of assert or call-based tests gets two processes: the program's (child.py: it runs the program, then
answers calls into it) and a judge (judge.py: it runs the tests and sends the verdicts here). They talk over a
socket pair; this server hears only the judge's verdicts and the program's stdout/stderr (diagnostics). A
stdin/stdout job gets one process: the program runs once per test; its stdout, split per test, goes back to the
trainer, which compares it with the expected output (never sent here).

Deadlines: per test (the judge says when each starts; stdin/stdout: each output's end starts the next; the time the
program waited for its core is added) and one budget for the whole job, enforced here whatever the processes write:
both killed (their PID namespaces with them), the test fails, the job's other tests run in a fresh pair.
Everything a process writes is parsed as untrusted; one job's failure costs no other job.
"""

from __future__ import annotations

import _signal as signal  # the C half: the Python half builds enums every fork would carry
import _socket
import gc
import json
import marshal
import os
import re
import select
import sys
import time
import warnings

try:
    from . import child, confine, hugetext, libc, template
except ImportError:  # the fork server: zygote.py imported as a top-level module, its siblings beside it
    import child
    import confine
    import hugetext
    import libc
    import template

_HERE = os.path.dirname(os.path.abspath(__file__))


def _judge():
    """judge.py, imported where it is first needed: in the server once the templates are forked (it plans the
    tests), in a judge process before it is confined (it runs them); never in a template, so that no program's
    process carries it (~0.25 MB whose page tables every fork would copy)."""
    if __package__:
        from . import judge
        return judge
    mod = sys.modules.get("judge")
    if mod is None:
        sys.path.insert(0, _HERE)
        try:
            import judge as mod
        finally:
            sys.path.remove(_HERE)
    return mod

# loaded once here, shared by every process the template forks (a program that imports one pays nothing). Not
# preloaded: modules that register an at-fork handler, which would then run in EVERY forked process (`threading`,
# `random`, and `tempfile` / `statistics`, which import it: ~0.45 ms of each process's CPU); a program that imports
# one pays its import (~1 ms) instead. Nor large modules programs rarely use: `ast`, `fractions`, `decimal`, and
# `ctypes` and `socket`, whose C halves the sandbox uses itself. Every fork copies the page tables of what the
# template holds and every exit unmaps them (1 MB more of it: +1.5-2% CPU per program).
PRELOAD = ("math", "re", "collections", "itertools", "functools", "heapq", "bisect", "string", "typing", "json",
           "operator", "copy", "enum", "datetime", "unicodedata", "array", "io", "struct", "_sitebuiltins")
OUT_READ_CAP = 1024  # diagnostics kept per job (stderr)
# programs that may need a /dev/shm (POSIX semaphores: multiprocessing's locks and pools): each gets its own
_SHM_USERS = re.compile(r"multiprocessing|concurrent\.futures|\bshared_memory\b")
OTHERS_MOST = 4  # programs beside one on its core whose turns count towards its time limit (host.default_workers)


class ProtocolError(Exception):
    pass


class _Run:
    """The processes running `job`'s tests [start, end): the program's, and its judge (assert / call tests)."""

    def __init__(self, job, start, end, slot, nonce, limits):
        self.job, self.start, self.end, self.slot, self.nonce = job, start, end, slot, nonce
        self.stdio = job["mode"] == "stdio"
        self.pids: dict[str, int | None] = {"program": None}
        self.judge: dict | None = None  # the judge serving this run (assert / call tests)
        self.unreaped = len(self.pids)
        self.status: dict[str, int] = {}  # wait status of each process collected
        self.ending: str | None = None  # set (to why, "" for none) once it is being killed and collected
        self.fds: dict[str, int] = {}  # our read ends: "w" setup / stdio status, "out", "err"
        self.buf = {"w": b"", "out": b"", "err": b""}
        self.current: int | None = start if self.stdio else None
        wall = job["wall_s"]
        self.deadline = time.monotonic() + (wall[start] if self.stdio else limits["wall_s"])
        self.budget = sum(wall[start:end]) + limits["wall_s"] + 1.0
        self.hard_deadline = time.monotonic() + self.budget
        self.done = False  # nothing more will run (the program raised, setup failed, the judge ended)
        self.defined = self.stdio  # the program ran to its end (stdio: the tests start at once)
        self.mark = b"\0" + nonce.encode() + b" "
        self.waited = 0.0  # seconds the program's process waited for a CPU, already added to its deadlines
        self.extended = 0.0  # added to the current deadline for that

    def limit(self) -> float:
        """The running test's time limit."""
        return self.job["wall_s"][self.current or self.start]

    def start_test(self, wall: float) -> None:
        self.deadline = time.monotonic() + wall
        self.extended = 0.0


class Cores:
    """Each scratch slot's core, where its program and its judge both run: they call each other in turn (a
    request and a reply per call into the program), and on one core each call hands over with a plain switch,
    where across two cores each side pays a wake-up of the other core (about 2.5x the CPU per call on a 2-core
    VM). Slots are spread evenly over the cores this process may use, and a job takes a free slot on the core
    running the fewest programs. No pinning when there is a single core."""

    def __init__(self, cores: list[int]):
        self.cores = cores if len(cores) > 1 else []
        self.load = dict.fromkeys(self.cores, 0)

    def of(self, slot: int) -> int | None:
        return self.cores[slot % len(self.cores)] if self.cores else None

    def take(self, free: list[int]) -> int:
        """Take a slot out of `free` (not empty): one on the least loaded core."""
        k = min(range(len(free)), key=lambda i: self.load[self.of(free[i])]) if self.cores else len(free) - 1
        slot = free.pop(k)
        if self.cores:
            self.load[self.of(slot)] += 1
        return slot

    def give(self, slot: int) -> None:
        if self.cores:
            self.load[self.of(slot)] -= 1


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


class Zygote:
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
        self.fd_run: dict[int, tuple[_Run, str]] = {}
        self.results: dict[int, dict] = {}
        self.pending: dict[int, int] = {}
        self.children: set[_Run] = set()
        self.watch = Watch()
        self.reaping: dict[int, _Run] = {}
        self.quota_bytes = int(config.get("slot_bytes", 0))
        self.slot_roots = [self.slot_root(k) for k in range(self.workers)]
        self.quotas = sum(os.path.ismount(r) for r in self.slot_roots)  # slots with a file system of their own
        self.slots = [self.new_slot(k) for k in range(self.workers)]
        self.free = list(range(self.workers))
        self.unsent = False
        self.judges: dict[int, dict] = {}  # scratch slot -> its judge process
        self.programs: dict[str, object] = {}  # source -> code object (a batch repeats its programs)
        self.tests: dict[str, object] = {}  # test source -> (code object, names used as modules)
        self.program_imports: dict[str, dict] = {}
        self.cores = Cores(sorted(os.sched_getaffinity(0)))
        child.prepare_common(self.site_dirs)
        try:
            child.warm_up(self.slots[0])
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
            self.templates.append(template.Template(self.child_main, self.landlock, self.seccomp, core,
                                                    tuple(t.sock for t in self.templates)))
        for t in self.templates:
            self.watch.add(t.sock.fileno(), ("template", t))
        for k, path in enumerate(self.slots):
            self.template_of(k).scratch(k, path)
        self.null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)  # every child's stdin (and a judge's stderr)

    # -- what a forked process runs (in it: never returns)
    def child_main(self, payload: bytes, fds: list[int], ruleset: int) -> None:
        role = "?"
        report = -1
        try:
            role, *rest = marshal.loads(payload)
            limits = dict(self.limits)
            if role == "judge":
                limits["cpu_s"], limits["nproc"], limits["output_bytes"] = 24 * 3600, 64, 0  # the server keeps time
                os.environ.update({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
                limits["memory_bytes"] = self.limits["judge_memory_bytes"]
                report = fds[4]
                if ruleset == -2:
                    raise OSError("no Landlock ruleset could be built")
                judge = _judge()  # read while this process can still read the sandbox's directory
                confine.confine(confine.JUDGE_UID if self.uids else None, ruleset, fds, limits)
                report = 4
                os.chdir("/")
                judge.serve(_socket.socket(fileno=3), 4, limits)
            else:
                mode, start, end, nonce, scratch, cpu, program, slot, shm = rest
                limits["cpu_s"] = cpu
                report = fds[3] if mode == "stdio" else fds[4]
                if ruleset == -2:
                    raise OSError("no Landlock ruleset for this scratch directory")
                if shm:
                    confine.private_shm(scratch)
                confine.confine(confine.program_uid(slot) if self.uids else None, ruleset, fds, limits)
                report = 3 if mode == "stdio" else 4
                child.prepare_interpreter(scratch)
                gc.enable()  # the template runs without collector passes; a program runs as Python does
                if mode == "stdio":
                    os.close(3)
                    inputs = list(range(4, 4 + end - start))
                    child.run_stdio(program, start, end, nonce, inputs)
                os.close(4)  # the setup channel: closed before the program runs
                child.run_program(program, 3, self.limits["value_bytes"])
        except BaseException as exc:  # noqa: BLE001 - a setup failure is reported, not raised
            if report >= 0:
                try:
                    os.write(report, f"X setup of the {role} process: {type(exc).__name__}: {exc}\n"[:400].encode())
                except OSError:
                    pass
        os._exit(0)

    def template_of(self, slot: int) -> template.Template:
        """The template that forks `slot`'s processes: the one on the slot's core."""
        return self.templates[slot % len(self.templates)]

    def program(self, job: dict):
        """The job's program compiled here (once per distinct source), or the name of what compiling it raised."""
        src = job["code"]
        code = self.programs.get(src)
        if code is None:
            if len(self.programs) > 4096:
                self.programs.clear()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    code = compile(src, "solution.py", "exec", dont_inherit=True)
            except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as exc:
                code = type(exc).__name__
            self.programs[src] = code
        return code

    def test(self, src: str):
        """A test compiled here, once per distinct source (a batch repeats its tests): (code, the names it uses
        only as modules), or None when it does not parse."""
        hit = self.tests.get(src, False)
        if hit is False:
            if len(self.tests) > 16384:
                self.tests.clear()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    hit = _judge().compile_test(src)
            except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
                hit = None
            self.tests[src] = hit
        return hit

    def imports(self, source: str) -> dict:
        hit = self.program_imports.get(source)
        if hit is None:
            if len(self.program_imports) > 4096:
                self.program_imports.clear()
            hit = self.program_imports[source] = _judge().program_imports(source)
        return hit

    def judge_for(self, slot: int) -> dict:
        """The judge process serving `slot`'s jobs (one at a time), started if there is none."""
        j = self.judges.get(slot)
        if j is not None and j["jobs"] < 1000:
            j["jobs"] += 1
            return j
        if j is not None:  # recycled now and then (its memory, and its CPU time)
            self.retire(j)
        ours, theirs = template.socketpair()
        v_r, v_w = os.pipe()
        try:
            # 0-2 /dev/null (what a test prints goes nowhere), 3 jobs (with their program's socket attached),
            # 4 verdicts
            self.template_of(slot).spawn(marshal.dumps(("judge",)),
                                         [self.null, self.null, self.null, theirs.fileno(), v_w], -1)
        finally:
            os.close(v_w)
            theirs.close()
        j = {"slot": slot, "pid": None, "ctrl": ours, "v": v_r, "buf": b"", "run": None, "jobs": 1, "gone": False}
        self.template_of(slot).starting.append((j, "judge"))
        os.set_blocking(v_r, False)
        self.watch.add(v_r, ("judge", j))
        self.judges[slot] = j
        return j

    def retire(self, j: dict) -> None:
        """Kill a judge (one of its jobs over-ran, or it served enough): the slot gets a new one when needed."""
        if self.judges.get(j["slot"]) is j:
            del self.judges[j["slot"]]
        if j["gone"]:
            return
        j["gone"] = True
        self.watch.remove(j["v"])
        os.close(j["v"])
        j["ctrl"].close()
        if j["pid"] is not None:
            self.template_of(j["slot"]).reap(j["pid"])
            self.reaping[j["pid"]] = None

    def on_judge_data(self, j: dict, chunk: bytes) -> None:
        run = j["run"]
        buf = j["buf"] + chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if run is None or run.ending is not None:
                continue
            if line == b"R":  # the program's process was lost in a test: the rest in a fresh one
                j["run"] = None
                self.finish(run, "the program's process ended")
                run = None
                continue
            if line == b"Z":
                j["run"] = None
                run.done = True
                self.finish(run, None)
                run = None
                continue
            try:
                self.on_verdict(run, line)
            except (ProtocolError, ValueError, IndexError, KeyError) as exc:
                self.finish(run, f"killed: the judge: {exc}")
        j["buf"] = buf[-4096:]

    def slot_root(self, k: int) -> str:
        """Slot k's own file system (a tmpfs of `slot_bytes`, at most 16k files): one program filling its scratch
        leaves the others theirs. Where no tmpfs can be mounted, a directory of the jail's shared one."""
        path = os.path.join(self.root, f"s{k}")
        os.mkdir(path, 0o711)
        if self.quota_bytes:
            try:
                confine.mount_tmpfs(path, self.quota_bytes, 16384)
            except OSError as exc:
                sys.stderr.write(f"sandbox: slot {k} shares the jail's scratch space: {exc}\n")
        return path

    def new_slot(self, k: int) -> str:
        """A fresh scratch directory for slot k's next program, under a name no other program can guess or list
        (the slot's root is not readable): nothing a program did to its directory (its mode, xattrs, times, what
        it left) reaches the next one."""
        path = os.path.join(self.slot_roots[k], os.urandom(12).hex())
        os.mkdir(path, 0o700)
        if self.uids:
            os.chown(path, confine.program_uid(k), confine.program_uid(k))
        return path

    def spawn(self, job: dict, start: int, end: int) -> None:
        program = self.program(job)
        if isinstance(program, str):  # it does not compile: no test can run, no process is needed
            for t in self.results[job["id"]]["tests"][start:end]:
                t["status"], t["why"] = "failed", f"the program raised {program}"
            self.unit_done(job, start, end, "")
            return
        stdio = job["mode"] == "stdio"
        nonce = os.urandom(16).hex()
        cpu = max(1, int(sum(job["wall_s"][start:end]) + self.limits["wall_s"] + 1))
        slot = self.cores.take(self.free)
        forker = self.template_of(slot)
        run = _Run(job, start, end, slot, nonce, self.limits)
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
                inputs = []
                for i in range(start, end):
                    fd = os.memfd_create(f"stdin{i}", os.MFD_CLOEXEC)
                    theirs.append(fd)
                    inputs.append(fd)
                    data = job["tests"][i]["input"].encode()
                    while data:
                        data = data[os.write(fd, data):]
                    os.lseek(fd, 0, os.SEEK_SET)
                # 0 /dev/null, 1 stdout, 2 stderr, 3 status, 4.. inputs
                fds = [null, out_w, err_w, w_w, *inputs]
                payload = marshal.dumps(("program", "stdio", start, end, nonce, self.slots[slot], cpu, program,
                                          slot, _SHM_USERS.search(job["code"]) is not None))
                forker.spawn(payload, fds, slot)
                forker.starting.append((run, "program"))
            else:
                rpc_c, rpc_j = template.socketpair()
                theirs += [rpc_c.detach(), rpc_j.detach()]
                rc, rj = theirs[-2], theirs[-1]
                # the program: 0 /dev/null, 1-2 diagnostics, 3 its end of the socket, 4 setup status
                payload = marshal.dumps(("program", job["mode"], start, end, nonce, self.slots[slot], cpu, program,
                                          slot, _SHM_USERS.search(job["code"]) is not None))
                forker.spawn(payload, [null, out_w, out_w, rc, w_w], slot)
                forker.starting.append((run, "program"))
                # the slot's judge (started when the slot first needs one, or after the last was replaced)
                text = json.dumps({k: job[k] for k in ("mode", "cases", "fn") if k in job})
                tests = [self.test(t) for t in job["tests"][start:end]] if job["mode"] == "asserts" else []
                imports = self.imports(job.get("source") or "")
                judge_ = self.judge_for(slot)
                payload = marshal.dumps((text, start, end, tests, imports))
                template.send_message(judge_["ctrl"], len(payload).to_bytes(4, "little") + payload, [rj])
                judge_["run"] = run
                run.judge = judge_
        except OSError:
            if not forker.starting or forker.starting[-1][0] is not run:  # nothing started: the slot is free again
                for fd in ours.values():
                    os.close(fd)
                self.free.append(slot)
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

    # -- what the processes write
    def on_status(self, run: _Run, line: bytes) -> None:
        """A line on the program's status channel ('X' setup failure) or, stdin/stdout, a test's end."""
        parts = line.decode(errors="replace").split(" ", 3)
        res = self.results[run.job["id"]]
        if parts[0] == "X":
            self.fail_rest(run, "sandbox setup failed: " + line.decode(errors="replace")[2:300])
            return
        if not run.stdio or parts[0] != run.nonce:
            return
        kind, i = parts[1], int(parts[2])
        if i != run.current:
            raise ProtocolError(f"test {i} ended while test {run.current} ran")
        t = res["tests"][i]
        if kind == "T":
            t["status"] = "returned"
        elif kind == "F":
            t["status"], t["why"] = "failed", parts[3] if len(parts) > 3 else "failed"
        else:
            raise ProtocolError(f"unknown status {kind!r}")
        self.next_test(run, i)

    def next_test(self, run: _Run, i: int) -> None:
        if i + 1 < run.end:
            run.current = i + 1
            run.start_test(run.job["wall_s"][i + 1])
        else:
            run.current = None
            run.done = True

    def on_verdict(self, run: _Run, line: bytes) -> None:
        """A line from the judge (trusted code, confined; parsed strictly all the same)."""
        text = line.decode(errors="replace")
        kind, _, rest = text.partition(" ")
        res = self.results[run.job["id"]]
        if kind == "D":
            run.defined = True
        elif kind == "S":
            i = int(rest)
            if not run.start <= i < run.end or (run.current is not None and i != run.current + 1) or \
                    (run.current is None and i != run.start):
                raise ProtocolError(f"test {i} started out of order")
            run.current = i
            run.start_test(run.job["wall_s"][i])
        elif kind in ("P", "F"):
            i_s, _, why = rest.partition(" ")
            i = int(i_s)
            if i != run.current:
                raise ProtocolError(f"a verdict for test {i} while test {run.current} ran")
            t = res["tests"][i]
            t["status"], t["why"] = ("passed", "passed") if kind == "P" else ("failed", why or "failed")
            if i + 1 >= run.end:
                run.done = True
        elif kind in ("E", "X"):
            self.fail_rest(run, ("" if kind == "E" else "sandbox: ") + rest)
        else:
            raise ProtocolError(f"unknown verdict line {kind!r}")

    def waited_for_cpu(self, run: _Run) -> bool:
        """At a deadline: add to it the time the program's process spent runnable but waiting for its core since
        the last such look (the kernel's run-queue wait, /proc/<pid>/schedstat), up to k times the test's limit in
        all, k the other programs running on its core now (at most OTHERS_MOST). A limit bounds what the program
        does, not how busy its core is: a program that needs 0.4 s of CPU passes a 1 s limit with two others on its
        core, while one that sleeps or loops forever is stopped as before. Its own threads and processes earn it
        nothing: alone on its core it gets no extra time, and beside k others at most (k + 1) times the limit, in
        which a fair share gives it no more than the limit's worth of CPU. True when the deadline moved."""
        pid = run.pids.get("program")
        others = (self.cores.load[self.cores.of(run.slot)] if self.cores.cores else len(self.children)) - 1
        if not pid or others < 1:
            return False
        try:
            with open(f"/proc/{pid}/schedstat", "rb") as f:
                waited = int(f.read().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return False
        extra, run.waited = waited - run.waited, waited
        wall = run.limit()
        extra = min(extra, min(others, OTHERS_MOST) * wall - run.extended)
        if extra < 0.005:
            return False
        run.extended += extra
        run.deadline += extra
        run.hard_deadline += extra
        return True

    def fail_rest(self, run: _Run, why: str) -> None:
        for i in range(run.start, run.end):
            t = self.results[run.job["id"]]["tests"][i]
            if not t["status"]:
                t["status"], t["why"] = "failed", why
        run.done = True

    def feed(self, run: _Run, which: str, chunk: bytes) -> str | None:
        try:
            self.on_data(run, which, chunk)
        except ProtocolError as exc:
            return f"killed: {exc}"
        except (ValueError, IndexError, KeyError) as exc:
            return f"killed: a malformed line ({type(exc).__name__})"
        return None

    def on_data(self, run: _Run, which: str, chunk: bytes) -> None:
        cap = self.limits
        if which == "w":
            buf = run.buf["w"] + chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                self.on_status(run, line)
            if len(buf) > 4096:
                raise ProtocolError("a status line longer than 4 KiB")
            run.buf["w"] = buf
        elif which == "out" and run.stdio:
            buf, mark = run.buf["out"] + chunk, run.mark
            while (k := buf.find(mark)) >= 0 and (nl := buf.find(b"\n", k)) >= 0:
                if run.current is not None:
                    self.results[run.job["id"]]["tests"][run.current]["stdout"] = buf[:k].decode(errors="replace")
                self.on_status(run, buf[k + 1:nl])
                buf = buf[nl + 1:]
            run.buf["out"] = buf
            if len(buf) > cap["output_bytes"] + len(mark) + 64:
                raise ProtocolError(f"printed more than {cap['output_bytes'] >> 10} KiB")
        elif len(run.buf["err"]) < OUT_READ_CAP:  # diagnostics: the first KB, the rest read and dropped
            run.buf["err"] += chunk[:OUT_READ_CAP - len(run.buf["err"])]

    def drain(self, run: _Run) -> str | None:
        for which, r in list(run.fds.items()):
            try:
                while chunk := os.read(r, 65536):
                    why = self.feed(run, which, chunk)
                    if why is not None:
                        return why
            except OSError:
                pass
        return None

    # -- ending a run
    def finish(self, run: _Run, why: str | None) -> None:
        """Kill and collect the run's processes (their PID namespaces with them); `collected` goes on after."""
        if run.ending is not None:
            run.ending = run.ending or why or ""
            return
        run.ending = why or ""
        if run.judge is not None and run.judge["run"] is run:  # it ends before its judge said so: a new judge
            run.judge["run"] = None
            self.retire(run.judge)
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
                j = run
                if pid < 0:
                    j["pid"] = None
                    if j["run"] is not None:
                        self.finish(j["run"], f"could not start its judge: fork: {os.strerror(-pid)}")
                    self.retire(j)
                    return
                j["pid"] = pid
                if j["gone"]:
                    forker.reap(pid)
                    self.reaping[pid] = None
                return
            if pid < 0:
                run.pids[role] = 0
                run.unreaped -= 1
                self.fail_rest(run, f"could not start: fork: {os.strerror(-pid)}")
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

    def collected(self, run: _Run) -> None:
        """Every process of the run is gone: read what they wrote, fail the test they died in, go on after it."""
        self.children.discard(run)
        why = run.ending or self.drain(run)
        for r in run.fds.values():
            try:
                os.close(r)
            except OSError:
                pass
        self.release(run.slot)
        job, res = run.job, self.results[run.job["id"]]
        reason = why or "the program ended its process"
        diag = run.buf["err"] or (run.buf["out"] if not run.stdio else b"")
        if diag and not res["output"]:
            res["output"] = diag.decode(errors="replace")[:OUT_READ_CAP]
        if not run.done:
            if not run.defined:
                self.fail_rest(run, f"{reason} (before the tests)")
            elif run.current is not None:
                t = res["tests"][run.current]
                status = run.status.get("program", -1)
                if run.stdio and not t["status"] and not run.ending and status >= 0 and os.WIFEXITED(status) \
                        and os.WEXITSTATUS(status) == 0:
                    # a stdin/stdout program that ended its own process with status 0 (os._exit(0) after printing,
                    # as fast contest solutions do): what it printed is its answer, as for any judge
                    t["status"], t["stdout"] = "returned", run.buf["out"].decode(errors="replace")
                if not t["status"]:
                    t["status"], t["why"] = "killed", reason
                if run.current + 1 < run.end:
                    self.queue.insert(0, (job, run.current + 1, run.end))
                    return
        self.unit_done(job, run.start, run.end, reason)

    def release(self, slot: int) -> None:
        """Remove the program's scratch directory and make the slot's next one (new_slot)."""
        self.cores.give(slot)
        path = self.slots[slot]
        try:
            _remove_tree(path)
        except Exception as exc:  # noqa: BLE001 - what stays takes room in the slot, never the next program's view
            sys.stderr.write(f"sandbox: could not remove {path}: {exc}\n")
        try:
            self.slots[slot] = self.new_slot(slot)
            self.template_of(slot).scratch(slot, self.slots[slot])
        except OSError as exc:
            sys.stderr.write(f"sandbox: slot {slot} has no scratch directory: {exc}\n")
            return
        self.free.append(slot)

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
        units = self.stdio_units(job) if job["mode"] == "stdio" else [(job, 0, n)] if n else []
        self.pending[job["id"]] = len(units)
        if not units:
            self.reply(job["id"])
        self.queue.extend(units)

    @staticmethod
    def stdio_units(job: dict, most_input: int = 16 << 20, most_tests: int = 200) -> list[tuple[dict, int, int]]:
        """A stdio job's tests in processes of at most `most_input` bytes of input (memory files made before it
        starts) and `most_tests` tests (a descriptor each, passed in one message), in order."""
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
        self.watch.add(stdin, None)
        pending = b""
        open_input = True
        while open_input or self.queue or self.children:
            if self.queue and not self.free and not self.children:
                job, start, end = self.queue.pop(0)
                self.unit_done(job, start, end, "could not start: no scratch directory")
                continue
            while self.queue and self.free:
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
                    j = data[1]
                    chunk = _read(fd)
                    if chunk is None:
                        continue
                    if chunk:
                        self.on_judge_data(j, chunk)
                    else:  # the judge died: its job fails, the slot gets a new one
                        if j["run"] is not None:
                            r, j["run"] = j["run"], None
                            self.finish(r, "the judge process ended")
                        self.retire(j)
                    continue
                run, which = data
                if fd not in self.fd_run:
                    continue
                chunk = _read(fd)
                if chunk is None:
                    continue
                if chunk:
                    why = self.feed(run, which, chunk)
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
                    bad = self.drain(run)
                    if bad is not None:
                        self.finish(run, bad)
                    elif run.done:
                        self.finish(run, None)
                    elif now > run.hard_deadline:
                        self.finish(run, f"timed out (the whole run's {run.budget:g} s budget)")
                    elif now > run.deadline and not self.waited_for_cpu(run):
                        wall = run.limit()
                        more = f" (+{run.extended:.2g} s it waited for a CPU)" if run.extended >= 0.01 else ""
                        self.finish(run, f"timed out after {wall:g} s{more}")
        sys.stdout.flush()


def _read(fd: int) -> bytes | None:
    """What a readable descriptor holds now: b"" at its end (or when it broke), None when nothing is there yet."""
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _remove_tree(root: str) -> None:
    """Remove a scratch directory however deep, never following a link out of it; a directory
    whose permissions the program took away is given them back first. Raises OSError if something stays."""
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
        os.rmdir(path)
        stack.pop()


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
        hidden = True
    except OSError as exc:
        hidden = False
        sys.stderr.write(f"sandbox: /proc shows every process of the jail: {exc}\n")
    for why in confine.devices_read_only():
        sys.stderr.write(f"sandbox: a device stays writable as a file: {why}\n")
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
        zygote = Zygote(config)
    except (OSError, ValueError) as exc:
        sys.stdout.write(json.dumps({"error": f"the fork server could not start: {type(exc).__name__}: {exc}"})
                         + "\n")
        sys.stdout.flush()
        return
    sys.stdout.write(json.dumps({"ready": True, "landlock_abi": abi, "pid": os.getpid(), "huge_text": huge_text,
                                 "slot_quotas": zygote.quotas, "hidepid": hidden,
                                 "template_pids": [t.pid for t in zygote.templates]}) + "\n")
    sys.stdout.flush()
    zygote.serve()


if __name__ == "__main__":
    main()
