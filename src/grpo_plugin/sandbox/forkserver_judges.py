"""The slots' judge processes, in the fork server (standard library only: it runs inside the jail). A slot's judge
is started when the slot first needs one, serves that slot's jobs one at a time (a job's plain part in its own
process, the rest in a process forked for it: judge.py), and is replaced after 1000 jobs or when one of its jobs
over-ran (killed with its PID namespace: the job's process with it). Its verdict lines are parsed as untrusted, by
the run they are for."""

from __future__ import annotations

import marshal
import os

try:
    from . import wire
    from .forkserver_runs import ProtocolError, Run
except ImportError:  # in the jail: top-level modules beside forkserver.py
    import wire
    from forkserver_runs import ProtocolError, Run

JOBS_MOST = 1000  # jobs a judge serves before it is replaced (its memory, its CPU time)


class JudgeProcess:
    """A slot's judge process, as the server sees it: its control socket (jobs go out on it, each with its
    program's socket attached), its verdict pipe, the run it is judging."""

    def __init__(self, slot: int, ctrl, verdicts: int):
        self.slot, self.ctrl, self.verdicts = slot, ctrl, verdicts
        self.pid: int | None = None
        self.buf = b""  # a verdict line not yet whole
        self.run: Run | None = None
        self.jobs = 1
        self.gone = False


class Judges:
    """The judge process of each slot (`server`: the fork server, whose templates fork them and whose runs they
    judge)."""

    def __init__(self, server):
        self.server = server
        self.by_slot: dict[int, JudgeProcess] = {}

    def for_slot(self, slot: int) -> JudgeProcess:
        """The judge process serving `slot`'s jobs (one at a time), started if there is none."""
        j = self.by_slot.get(slot)
        if j is not None and j.jobs < JOBS_MOST:
            j.jobs += 1
            return j
        if j is not None:  # recycled now and then (its memory, and its CPU time)
            self.retire(j)
        ours, theirs = wire.socketpair()
        v_r, v_w = os.pipe()
        null = self.server.null
        try:
            # 0-2 /dev/null (what a test prints goes nowhere), 3 jobs (with their program's socket attached),
            # 4 verdicts
            self.server.template_of(slot).spawn(marshal.dumps(("judge", slot)),
                                                [null, null, null, theirs.fileno(), v_w], -1)
        finally:
            os.close(v_w)
            theirs.close()
        j = JudgeProcess(slot, ours, v_r)
        self.server.template_of(slot).starting.append((j, "judge"))
        os.set_blocking(v_r, False)
        self.server.watch.add(v_r, ("judge", j))
        self.by_slot[slot] = j
        return j

    def hand(self, slot: int, run: Run, job: bytes, program_end: int) -> None:
        """Hand `run`'s job (a framed message, with the program's end of its socket) to `slot`'s judge. A judge that
        ended between jobs (its socket refuses the job) is replaced, and the job goes to the new one."""
        for attempt in (0, 1):
            j = self.for_slot(slot)
            try:
                wire.send_message(j.ctrl, job, [program_end])
            except OSError:
                if attempt:
                    raise
                j.jobs -= 1
                self.retire(j)
                continue
            j.run, run.judge = run, j
            return

    def retire(self, j: JudgeProcess) -> None:
        """Kill a judge (one of its jobs over-ran, or it served enough): the slot gets a new one when needed."""
        if self.by_slot.get(j.slot) is j:
            del self.by_slot[j.slot]
        if j.gone:
            return
        j.gone = True
        self.server.watch.remove(j.verdicts)
        os.close(j.verdicts)
        j.ctrl.close()
        if j.pid is not None:
            self.server.template_of(j.slot).reap(j.pid)
            self.server.reaping[j.pid] = None

    def data(self, j: JudgeProcess, chunk: bytes) -> None:
        run = j.run
        buf = j.buf + chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line == b"Q":  # it ends after this job: the slot's next job goes to a new judge
                if self.by_slot.get(j.slot) is j:
                    del self.by_slot[j.slot]
                continue
            if run is None or run.ending is not None:
                continue
            if line == b"R":  # the program's process was lost in a test: the rest in a fresh one
                j.run = None
                self.server.finish(run, "the program's process ended")
                run = None
                continue
            if line == b"Z":
                j.run = None
                run.done = True
                self.server.finish(run, None)
                run = None
                continue
            try:
                run.on_verdict(line)
            except (ProtocolError, ValueError, IndexError, KeyError) as exc:
                self.server.finish(run, f"killed: the judge: {exc}")
        j.buf = buf[-4096:]

    def readable(self, j: JudgeProcess, chunk: bytes | None) -> None:
        """What its verdict pipe held (None: nothing yet; b"": it ended: its job fails, the slot gets a new one)."""
        if chunk:
            self.data(j, chunk)
        elif chunk is not None:
            if j.run is not None:
                run, j.run = j.run, None
                self.server.finish(run, "the judge process ended")
            self.retire(j)

    def started(self, j: JudgeProcess, forker, pid: int) -> None:
        """The template's answer to a judge's spawn: its pid, or -errno when the fork failed."""
        if pid < 0:
            j.pid = None
            if j.run is not None:
                self.server.finish(j.run, f"could not start its judge: fork: {os.strerror(-pid)}")
            self.retire(j)
            return
        j.pid = pid
        if j.gone:
            forker.reap(pid)
            self.server.reaping[pid] = None
