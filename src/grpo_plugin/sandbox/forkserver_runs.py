"""A run, in the fork server: the processes running a job's tests [start, end) (the program's, and for assert and
call-based tests its slot's judge), their deadlines, and what they write, parsed as untrusted (standard library
only: it runs inside the jail). Deadlines: per test (the judge says when each starts; stdin/stdout: each output's
end starts the next; the time the program waited for its core is added) and one budget for the whole run."""

from __future__ import annotations

import os
import time

OUT_READ_CAP = 1024  # diagnostics kept per job (stderr)
OTHERS_MOST = 4  # programs beside one on its core whose turns count towards its time limit (client.default_workers)


class ProtocolError(Exception):
    pass


class Run:
    """The processes running `job`'s tests [start, end): the program's, and its judge (assert / call tests)."""

    def __init__(self, job, start, end, slot, nonce, limits, res: dict):
        self.job, self.start, self.end, self.slot, self.nonce = job, start, end, slot, nonce
        self.limits, self.res = limits, res  # res: the job's results record (its tests' statuses)
        self.stdio = job["mode"] == "stdio"
        self.pids: dict[str, int | None] = {"program": None}
        self.judge = None  # the forkserver_judges.JudgeProcess serving this run (assert / call tests)
        self.unreaped = len(self.pids)
        self.status: dict[str, int] = {}  # wait status of each process collected
        self.ending: str | None = None  # set (to why, "" for none) once it is being killed and collected
        self.fds: dict[str, int] = {}  # our read ends: "w" setup / stdio status, "out", "err"
        self.buf = {"w": b"", "out": bytearray(), "err": b""}
        self.out_from = 0  # where in buf["out"] a mark may start that was not looked for yet
        self.emit = None  # emit(test, stdout bytes): a stdin/stdout test's output, sent on as soon as it is whole
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

    # -- what the processes write
    def on_status(self, line: bytes) -> None:
        """A line on the program's status channel ('X' setup failure) or, stdin/stdout, a test's end."""
        parts = line.decode(errors="replace").split(" ", 3)
        res = self.res
        if parts[0] == "X":
            self.fail_rest("sandbox setup failed: " + line.decode(errors="replace")[2:300])
            return
        if not self.stdio or parts[0] != self.nonce:
            return
        kind, i = parts[1], int(parts[2])
        if i != self.current:
            raise ProtocolError(f"test {i} ended while test {self.current} ran")
        t = res["tests"][i]
        if kind == "T":
            t["status"] = "returned"
        elif kind == "F":
            t["status"], t["why"] = "failed", parts[3] if len(parts) > 3 else "failed"
        else:
            raise ProtocolError(f"unknown status {kind!r}")
        self.next_test(i)

    def next_test(self, i: int) -> None:
        if i + 1 < self.end:
            self.current = i + 1
            self.start_test(self.job["wall_s"][i + 1])
        else:
            self.current = None
            self.done = True

    def on_verdict(self, line: bytes) -> None:
        """A line from the judge (trusted code, confined; parsed strictly all the same)."""
        text = line.decode(errors="replace")
        kind, _, rest = text.partition(" ")
        res = self.res
        if kind == "D":
            self.defined = True
        elif kind == "S":
            i = int(rest)
            if not self.start <= i < self.end or (self.current is not None and i != self.current + 1) or \
                    (self.current is None and i != self.start):
                raise ProtocolError(f"test {i} started out of order")
            self.current = i
            self.start_test(self.job["wall_s"][i])
        elif kind in ("P", "F"):
            i_s, _, why = rest.partition(" ")
            i = int(i_s)
            if i != self.current:
                raise ProtocolError(f"a verdict for test {i} while test {self.current} ran")
            t = res["tests"][i]
            t["status"], t["why"] = ("passed", "passed") if kind == "P" else ("failed", why or "failed")
            if i + 1 >= self.end:
                self.done = True
        elif kind in ("E", "X"):
            self.fail_rest(("" if kind == "E" else "sandbox: ") + rest)
        else:
            raise ProtocolError(f"unknown verdict line {kind!r}")

    def waited_for_cpu(self, others: int) -> bool:
        """At a deadline: add to it the time the program's process spent runnable but waiting for its core since
        the last such look (the kernel's run-queue wait, /proc/<pid>/schedstat), up to k times the test's limit in
        all, k the other programs running on its core now (at most OTHERS_MOST). A limit bounds what the program
        does, not how busy its core is: a program that needs 0.4 s of CPU passes a 1 s limit with two others on its
        core, while one that sleeps or loops forever is stopped as before. Its own threads and processes earn it
        nothing: alone on its core it gets no extra time, and beside k others at most (k + 1) times the limit, in
        which a fair share gives it no more than the limit's worth of CPU. True when the deadline moved."""
        pid = self.pids.get("program")
        if not pid or others < 1:
            return False
        try:
            with open(f"/proc/{pid}/schedstat", "rb") as f:
                waited = int(f.read().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return False
        extra, self.waited = waited - self.waited, waited
        wall = self.limit()
        extra = min(extra, min(others, OTHERS_MOST) * wall - self.extended)
        if extra < 0.005:
            return False
        self.extended += extra
        self.deadline += extra
        self.hard_deadline += extra
        return True

    def timed_out(self, now: float, others: int) -> str | None:
        """Past a deadline: why it ends, or None when the time it waited for its core moved the deadline."""
        if now > self.hard_deadline:
            return f"timed out (the whole run's {self.budget:g} s budget)"
        if now > self.deadline and not self.waited_for_cpu(others):
            more = f" (+{self.extended:.2g} s it waited for a CPU)" if self.extended >= 0.01 else ""
            return f"timed out after {self.limit():g} s{more}"
        return None

    def settle(self, reason: str, output_cap: int) -> int | None:
        """Every process of the run is gone: its diagnostics kept, the test it died in failed (`reason`). Returns
        the test to go on from in a fresh run, None when the run's tests are all settled."""
        res = self.res
        diag = self.buf["err"] or (self.buf["out"] if not self.stdio else b"")
        if diag and not res["output"]:
            res["output"] = diag.decode(errors="replace")[:output_cap]
        if self.done:
            return None
        if not self.defined:
            self.fail_rest(f"{reason} (before the tests)")
            return None
        if self.current is None:
            return None
        t = res["tests"][self.current]
        status = self.status.get("program", -1)
        if self.stdio and not t["status"] and not self.ending and status >= 0 and os.WIFEXITED(status) \
                and os.WEXITSTATUS(status) == 0:
            # a stdin/stdout program that ended its own process with status 0 (os._exit(0) after printing, as
            # fast contest solutions do): what it printed is its answer, as for any judge
            t["status"] = "returned"
            self.emit(self.current, bytes(self.buf["out"]))
        if not t["status"]:
            t["status"], t["why"] = "killed", reason
        return self.current + 1 if self.current + 1 < self.end else None

    def fail_rest(self, why: str) -> None:
        for i in range(self.start, self.end):
            t = self.res["tests"][i]
            if not t["status"]:
                t["status"], t["why"] = "failed", why
        self.done = True

    def feed(self, which: str, chunk: bytes) -> str | None:
        try:
            self.on_data(which, chunk)
        except ProtocolError as exc:
            return f"killed: {exc}"
        except (ValueError, IndexError, KeyError) as exc:
            return f"killed: a malformed line ({type(exc).__name__})"
        return None

    def on_data(self, which: str, chunk: bytes) -> None:
        cap = self.limits
        if which == "w":
            buf = self.buf["w"] + chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                self.on_status(line)
            if len(buf) > 4096:
                raise ProtocolError("a status line longer than 4 KiB")
            self.buf["w"] = buf
        elif which == "out" and self.stdio:
            # bytes, bounded before anything reads them as text (the trainer decodes one test's output at a time)
            buf, mark = self.buf["out"], self.mark
            buf += chunk
            while (k := buf.find(mark, self.out_from)) >= 0:
                nl = buf.find(b"\n", k)
                if nl < 0:  # the end of the mark's line is still to come
                    self.out_from = k
                    break
                if self.current is not None:
                    self.emit(self.current, bytes(buf[:k]))
                line = bytes(buf[k + 1:nl])
                del buf[:nl + 1]
                self.out_from = 0
                self.on_status(line)
            else:  # no mark yet: the next search starts where one could begin (never read twice)
                self.out_from = max(0, len(buf) - len(mark) + 1)
            if len(buf) > cap["output_bytes"] + len(mark) + 64:
                raise ProtocolError(f"printed more than {cap['output_bytes'] >> 10} KiB")
        elif len(self.buf["err"]) < OUT_READ_CAP:  # diagnostics: the first KB, the rest read and dropped
            self.buf["err"] += chunk[:OUT_READ_CAP - len(self.buf["err"])]


def stdio_units(job: dict) -> list[tuple[dict, int, int]]:
    """A stdio job's tests, each in a process of its own: a test's input exists only in its own process (the
    others' are never opened there), nothing the program started during a test (a thread, a process) outlives it,
    and no test's time limit can lend its time to another's."""
    return [(job, i, i + 1) for i in range(len(job["tests"]))]


def stdin_files(job: dict, start: int, end: int, opened: list[int]) -> list[int]:
    """A memory file per stdin/stdout test [start, end), holding its input, read from the start (each appended to
    `opened` as it is made, for the caller to close)."""
    files = []
    for i in range(start, end):
        fd = os.memfd_create(f"stdin{i}", os.MFD_CLOEXEC)
        opened.append(fd)
        files.append(fd)
        data = job["tests"][i]["input"].encode()
        while data:
            data = data[os.write(fd, data):]
        os.lseek(fd, 0, os.SEEK_SET)
    return files
