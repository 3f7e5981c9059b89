"""The sandbox's template process (one per core, pinned to it): forked once from the fork server (forkserver.py) when
everything a child needs is loaded, it forks a child per request — each one PID 1 of a new PID namespace — and
collects it when asked, and does nothing else: each page a process writes while children share its memory must be
copied first (a copy-on-write fault), so the process that forks does as little as possible and never the server's
bookkeeping. Standard library only."""

from __future__ import annotations

import _signal as signal  # the C half: the Python half builds enums every fork would carry
import _socket  # the C half of `socket`: the Python half (its enums, `selectors`) is ~0.25 MB every fork copies
import collections
import gc
import mmap
import os
import select
import struct
import sys

try:
    from . import confine, libc, wire
except ImportError:  # in the jail: top-level modules beside forkserver.py
    import confine
    import libc
    import wire

# server -> template: (kind, size of what follows or pid, scratch slot); template -> server: (kind, pid or -errno,
# wait status)
_HEAD, _ANSWER = struct.Struct("=cQq"), struct.Struct("=cqq")


def _immortalize() -> int:
    """Make every object loaded so far immortal (PEP 683, Python >= 3.12: reference counts of such objects are never
    written), just before the template is forked: a child that uses a module, a function or a constant then writes
    nothing to the page it lies on (each write to a page shared with the template costs a copy-on-write fault).
    These objects live as long as the template anyway. Returns how many (0 on Python 3.11)."""
    if sys.version_info < (3, 12) or sys.maxsize < 2 ** 32:
        return 0
    immortal = 0xFFFFFFFF  # _Py_IMMORTAL_REFCNT on a 64-bit build
    set_refcnt = libc.c_long.from_address  # the reference count: a Py_ssize_t at the object's address
    getrefcount, get_referents, made = sys.getrefcount, gc.get_referents, 0
    stack = gc.get_objects()
    stack.extend(sys.modules.values())
    while stack:  # no set of what was seen (it would stay in this process's memory): immortal means seen
        obj = stack.pop()
        if getrefcount(obj) >= immortal:
            continue
        set_refcnt(id(obj)).value = immortal
        made += 1
        stack.extend(get_referents(obj))
    return made


def _collect(pid: int, pidfd: int) -> bytes:
    """Collect child `pid` (ended, or about to: it was sent SIGKILL): the answer ("X", pid, wait status)."""
    if pidfd >= 0:
        os.close(pidfd)
    try:
        status = os.waitpid(pid, 0)[1]
    except ChildProcessError:
        status = -1
    return _ANSWER.pack(b"X", pid, status)


class TemplateGone(Exception):
    pass


class Template:
    """The process that forks the children, as the server sees it."""

    def __init__(self, child_main, landlock: confine.Landlock | None, seccomp: confine.Seccomp | None = None,
                 core: int | None = None, others: tuple = ()):
        """child_main(payload, fds, ruleset): what a child runs (never returns). `seccomp`: loaded in the template
        before it forks anything (every child inherits it). `core`: the one core this template and every child it
        forks run on (None: any); `others`: the server's sockets to other templates (closed in this one). Spawn
        requests are answered in order."""
        ours, theirs = wire.socketpair()
        server = os.getpid()
        pid = os.fork()
        if pid == 0:
            ours.close()
            for other in others:
                other.close()
            try:
                _template_loop(theirs, server, child_main, landlock, seccomp, core)
            finally:
                os._exit(0)
        theirs.close()
        self.sock, self.pid, self.buf = ours, pid, b""
        self.starting: collections.deque = collections.deque()  # the server's records of spawns not yet answered
        # back once every layer it holds for its children is in place (no_new_privs, limits, seccomp, its core): a
        # sandbox that says it is ready has them all; a template that could not set them is gone, said here
        try:
            ready = ours.recv(_ANSWER.size, _socket.MSG_WAITALL)
            kind, n, _ = _ANSWER.unpack(ready) if len(ready) == _ANSWER.size else (b"", 0, 0)
            why = ours.recv(n, _socket.MSG_WAITALL).decode(errors="replace") if kind == b"N" and n > 0 else ""
        except OSError as exc:
            raise TemplateGone(f"the template process is gone before it was ready ({exc})") from None
        if kind != b"Y":
            raise TemplateGone(why or "the template process ended before it was ready")

    def spawn(self, payload: bytes, fds: list[int], slot: int) -> None:
        """Ask for a child running `payload` with `fds` in scratch directory `slot` (-1: none; a judge). Answered,
        in order, by ("P", pid, 0), or ("P", -errno, 0) when fork failed."""
        self._send(_HEAD.pack(b"S", len(payload), slot), fds, payload)

    def scratch(self, slot: int, path: str) -> None:
        """Scratch directory `slot` is `path` (its Landlock ruleset is built there, once)."""
        data = path.encode()
        self._send(_HEAD.pack(b"L", len(data), slot), (), data)

    def reap(self, pid: int) -> None:
        """Kill child `pid` (PID 1 of its namespace: everything it started dies with it) and collect it. Answered
        by ("X", pid, wait status) (status -1: unknown) once it has ended: answers to later requests may come
        first."""
        self._send(_HEAD.pack(b"R", pid, 0))

    def _send(self, head: bytes, fds=(), payload: bytes = b"") -> None:
        try:
            wire.send_message(self.sock, head + payload if payload else head, fds)
        except OSError as exc:
            raise TemplateGone(f"the template process is gone ({exc})") from None

    def answers(self) -> list[tuple[bytes, int, int]]:
        try:
            data = self.sock.recv(1 << 16, _socket.MSG_DONTWAIT)
        except BlockingIOError:
            return []
        if not data:
            raise TemplateGone("the template process is gone")
        self.buf += data
        n = len(self.buf) - len(self.buf) % _ANSWER.size
        out = [_ANSWER.unpack_from(self.buf, k) for k in range(0, n, _ANSWER.size)]
        self.buf = self.buf[n:]
        return out


def _not_ready(sock, why: str) -> None:
    """The template cannot hold a layer for its children: it says why (Template.__init__ raises it) and ends."""
    sys.stderr.write(f"sandbox: {why}\n")
    data = why.encode()[:4096]
    sock.send(_ANSWER.pack(b"N", len(data), 0) + data)


def _template_loop(sock, server: int, child_main, landlock: confine.Landlock | None,
                   seccomp: confine.Seccomp | None, core: int | None = None) -> None:
    """Fork on request, reap on request, nothing else. It dies with the server."""
    confine._PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != server:
        return
    if core is not None:  # its children are born on this core and stay there (no move after they start)
        try:
            os.sched_setaffinity(0, (core,))
        except OSError:
            pass
    # once, for every process forked from here (loading a filter costs ~0.1 ms a process); nothing is forked
    # without them: the server sees the template gone, the trainer this
    try:
        confine.confine_template()
    except OSError as exc:
        return _not_ready(sock, f"the template could not set no_new_privs and its limits: {exc}")
    if seccomp is not None:
        try:
            seccomp.load()
        except OSError as exc:
            return _not_ready(sock, f"the template could not load the seccomp filter: {exc}")
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)  # not the server's pipes to the trainer: the trainer must see them close when the server ends
    os.dup2(null, 1)
    os.close(null)
    gc.disable()
    pidns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    recv, recv_into, send, close = sock.recv, sock.recv_into, sock.send, os.close
    waitall = _socket.MSG_WAITALL
    fork, bare = confine.fork_in_new_pid_namespace, confine.can_fork_bare()
    head_size, unpack, pack = _HEAD.size, _HEAD.unpack, _ANSWER.pack
    rulesets: dict[int, int] = {}  # scratch slot -> its Landlock ruleset (-1: none could be built)
    try:
        rulesets[-1] = landlock.ruleset(None) if landlock is not None else -1  # the judges': read only
    except OSError:
        rulesets[-1] = -2
    dying: dict[int, int] = {}  # pidfd -> pid: killed, collected when its pidfd says it has ended
    send(pack(b"Y", os.getpid(), 0))  # ready: every layer above is in place (Template.__init__ waits for this)
    while True:
        if dying:  # never blocks on a dying child (its memory's teardown takes a while): forks go on meanwhile
            ready = select.select([sock, *dying], [], [])[0]
            for fd in ready:
                if fd is not sock:
                    send(_collect(dying.pop(fd), fd))
            if sock not in ready:
                continue
        head, fds = wire.recv_fds(sock, head_size, 256)
        if len(head) < head_size:
            head += recv(head_size - len(head), waitall) if head else b""
            if len(head) < head_size:  # the server is gone
                return
        kind, n, slot = unpack(head)
        if kind == b"S":
            # the payload (a program's code, a judge's role) in pages of its own, never in the heap: the child takes
            # them with it and this process unmaps them once it has forked, so no later child is born holding
            # another's code (freed heap memory keeps its bytes, and every child inherits the heap)
            payload = mmap.mmap(-1, max(n, 1))
            if n and recv_into(payload, n, waitall) != n:
                return  # the server is gone
            try:
                answer = fork(pidns, bare)
            except OSError as exc:
                answer = -(exc.errno or 1)
            if answer == 0:  # the child: PID 1 of its own namespace
                child_main(memoryview(payload)[:n], fds, rulesets.get(slot, -2))
                os._exit(0)
            payload.close()
            for fd in fds:
                close(fd)
            answer = pack(b"P", answer, 0)
        elif kind == b"R":
            try:
                os.kill(n, signal.SIGKILL)
            except OSError:
                pass
            try:
                pidfd = os.pidfd_open(n)
            except OSError:  # not our child, or already collected
                answer = _collect(n, -1)
            else:
                dying[pidfd] = n
                continue
        elif kind == b"L":
            path = recv(n, waitall).decode()
            old = rulesets.pop(slot, -1)
            if old >= 0:
                close(old)
            try:
                rulesets[slot] = landlock.ruleset(path) if landlock is not None else -1
            except OSError:
                rulesets[slot] = -2  # its children fail their setup, saying so
            continue
        else:
            return
        send(answer)
