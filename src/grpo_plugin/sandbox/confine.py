"""What a process forked by the sandbox's template does to itself before any untrusted byte reaches it: the kernel
layers that make it a jail within the jail. Standard library only (it runs inside the jail, in the fork server).

Inherited from the template, which set them before its first fork: a seccomp-bpf filter (no ptrace, no namespaces
but the template's own PID-namespace calls, no SysV IPC or keyrings, no kernel modules, mounts, BPF, perf,
io_uring; jail.seccomp_program) and `no_new_privs`. Then per process, in this order (each a kernel mechanism; none
can be undone by code running afterwards, native code included):
- its own PID namespace (made by the template: the process is PID 1 there and sees, signals, traces and
  reprioritises nothing but itself and what it forks; when it dies the kernel kills everything it left behind);
- a separate unprivileged identity: programs run as uid/gid 65534, judges as 65533 (where the jail was started by
  root; otherwise every capability is dropped and the identity is the jail's own): no capability left, so the
  PID-namespace calls the filter lets through are refused too;
- `no_new_privs` (again, where the filter is missing), then Landlock (files: read only what CPython reads, write
  only its own scratch directory; nothing executable; no TCP bind/connect; signals and abstract sockets scoped to
  itself);
- resource limits (CPU, address space, file size, descriptors, processes, no core dumps).
"""

from __future__ import annotations

import _signal as signal  # the C half: the Python half builds enums every fork would carry
import os
import resource
import stat
import struct
import sys

try:
    from . import libc
except ImportError:  # in the jail: a top-level module beside forkserver.py
    import libc

# resolved once, in the fork server; the same in every forked process
_SYSCALL, _PRCTL = libc.function("syscall", libc.c_long), libc.function("prctl")
_FORK = libc.function("fork", libc.c_int, [], keep_gil=True)  # the GIL held across it (bare=True below)

# the standard library's modules that register work for a forked child (os.register_at_fork): a process that has
# one of them loaded forks with os.fork, which runs that work
AT_FORK_MODULES = ("threading", "random", "logging", "asyncio.events", "concurrent.futures.thread")

X86 = os.uname().machine == "x86_64"
NR = {"unshare": 272 if X86 else 97, "setns": 308 if X86 else 268, "capset": 126 if X86 else 91,
      "seccomp": 317 if X86 else 277}
CLONE_NEWPID = 0x20000000
_LL_CREATE, _LL_ADD_RULE, _LL_RESTRICT = 444, 445, 446  # the same numbers on every Linux architecture
_FS = {name: 1 << bit for bit, name in enumerate((
    "execute", "write_file", "read_file", "read_dir", "remove_dir", "remove_file", "make_char", "make_dir",
    "make_reg", "make_sock", "make_fifo", "make_block", "make_sym", "refer", "truncate", "ioctl_dev"))}
_ABI_FS_BITS = {1: 13, 2: 14, 3: 15, 4: 15, 5: 16}  # rights each ABI version knows
JUDGE_UID = 65533
# each scratch slot's programs run under an id of their own (where the jail maps them: a root trainer): slots
# share neither files, nor a process budget (RLIMIT_NPROC counts per user), nor /proc entries (hidepid)
PROGRAM_UID_BASE, PROGRAM_IDS = 100000, 256


def program_uid(slot: int) -> int:
    return PROGRAM_UID_BASE + slot % PROGRAM_IDS


def _check(rc: int, what: str) -> int:
    if rc < 0:
        e = libc.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return rc


def unshare(flags: int) -> None:
    if hasattr(os, "unshare"):
        os.unshare(flags)
    else:  # Python 3.11
        _check(_SYSCALL(NR["unshare"], flags), "unshare")


def setns(fd: int, nstype: int) -> None:
    if hasattr(os, "setns"):
        os.setns(fd, nstype)
    else:
        _check(_SYSCALL(NR["setns"], fd, nstype), "setns")


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when it has none (or it is disabled)."""
    return max(0, int(_SYSCALL(_LL_CREATE, None, 0, 1)))  # LANDLOCK_CREATE_RULESET_VERSION


class Landlock:
    """Rulesets prepared once in the template: `readable` paths may be read (files and directories), `writable`
    ones read and written (files and directories made and removed in them; no devices, FIFOs, sockets or
    symlinks); nothing else, nothing executed, no TCP bind/connect, and (ABI >= 6) no signal to and no abstract
    socket of any process outside the domain."""

    def __init__(self, abi: int, readable: tuple[str, ...]):
        self.abi = abi
        fs_all = sum(v for v in _FS.values() if v < (1 << _ABI_FS_BITS.get(abi, 16)))
        self.attr = libc.buffer(struct.pack("=QQQ", fs_all, 0b11 if abi >= 4 else 0, 0b11 if abi >= 6 else 0))
        self.size = 24 if abi >= 6 else 16 if abi >= 4 else 8
        file_rights = _FS["read_file"] | _FS["write_file"] | (_FS["truncate"] if abi >= 3 else 0)
        self.scratch_rights = file_rights | _FS["read_dir"] | _FS["remove_dir"] | _FS["remove_file"] \
            | _FS["make_dir"] | _FS["make_reg"]
        self.static = []  # packed rules with their O_PATH descriptors (kept open here for every ruleset)
        for path in readable:
            self.static.append(self._rule(path, _FS["read_file"] | _FS["read_dir"]))
        for path in ("/dev/null",):
            self.static.append(self._rule(path, _FS["read_file"] | _FS["write_file"]))
        self.static = [r for r in self.static if r is not None]

    def _rule(self, path: str, rights: int):
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return None
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FS["read_file"] | _FS["write_file"] | _FS["truncate"]
        return libc.buffer(struct.pack("=Qi", rights, fd))

    def ruleset(self, writable: str | None) -> int:
        """A ruleset descriptor: these rules, and `writable` (a scratch directory) when given."""
        rs = _check(_SYSCALL(_LL_CREATE, self.attr, self.size, 0), "landlock_create_ruleset")
        try:
            rules = list(self.static)
            if writable is not None:
                sfd = os.open(writable, os.O_PATH | os.O_CLOEXEC)
                rules.append(libc.buffer(struct.pack("=Qi", self.scratch_rights, sfd)))
            else:
                sfd = -1
            try:
                for rule in rules:
                    _check(_SYSCALL(_LL_ADD_RULE, rs, 1, rule, 0), "landlock_add_rule")
            finally:
                if sfd >= 0:
                    os.close(sfd)
        except BaseException:
            os.close(rs)
            raise
        return rs


class Seccomp:
    """The seccomp-bpf program (built by the trainer with libseccomp, sent as bytes), ready to load: a
    `struct sock_fprog` pointing at it, made once in the template."""

    def __init__(self, bpf: bytes):
        if len(bpf) % 8 or not bpf:
            raise ValueError("a seccomp program is a whole number of 8-byte instructions")
        self.prog = libc.buffer(bpf, len(bpf))
        self.fprog = libc.buffer(struct.pack("=HxxxxxxQ", len(bpf) // 8, libc.addressof(self.prog)))

    def load(self) -> None:
        _check(_SYSCALL(NR["seccomp"], 1, 0, self.fprog), "seccomp(SECCOMP_SET_MODE_FILTER)")


def _drop_capabilities() -> None:
    """capset(2) to nothing: a process whose identity cannot change (the jail maps one user) keeps no capability."""
    header = libc.buffer(struct.pack("=Ii", 0x20080522, 0))  # _LINUX_CAPABILITY_VERSION_3, this process
    data = libc.buffer(bytes(24))  # effective, permitted, inheritable x 2: all zero
    _check(_SYSCALL(NR["capset"], header, data), "capset")


# limits the same for every process a template forks: set once in the template (inherited, and no process can
# raise a hard limit without the capabilities it gives up)
SHARED_LIMITS = ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_MSGQUEUE, 0), (resource.RLIMIT_MEMLOCK, 0))


def confine_template() -> None:
    """In the template, once, before it forks anything: what every process it forks inherits and keeps —
    `no_new_privs` and SHARED_LIMITS."""
    if _PRCTL(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError("prctl(PR_SET_NO_NEW_PRIVS) failed")
    for res, value in SHARED_LIMITS:
        resource.setrlimit(res, (value, value))


def confine(uid: int | None, ruleset: int, keep_fds: list[int], limits: dict) -> None:
    """Confine this (freshly forked) process for good. `uid`: the identity to take (None: keep the jail's,
    dropping every capability). `keep_fds` become 0, 1, 2, 3, ... in order; every other descriptor is closed.
    Inherited from the template (confine_template): `no_new_privs`, SHARED_LIMITS. Raises OSError when a layer
    cannot be put in place (the caller reports it; nothing untrusted has run)."""
    _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: it dies with the template, whatever kills that
    os.setsid()  # its own session and process group: setpriority(PRIO_PGRP, 0) or killpg(0) reach only itself
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # every capability goes with uid 0
    else:
        _drop_capabilities()
    _PRCTL(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no /proc/<pid>/mem, no ptrace by the same user
    if ruleset >= 0:
        _check(_SYSCALL(_LL_RESTRICT, ruleset, 0), "landlock_restrict_self")
    # descriptors: keep_fds -> 0..n-1, the rest closed (the Landlock rule paths, the template's socket, ...)
    n = len(keep_fds)
    clear = min(keep_fds, default=n) >= n and len(set(keep_fds)) == n  # the usual case: none in another's way
    for k, fd in enumerate(keep_fds if clear else [os.dup(fd) for fd in keep_fds]):
        os.dup2(fd, k)
    os.closerange(n, limits["max_fd_scan"])
    # RLIMIT_NOFILE after the moves above: a stdin/stdout program's inputs are up to 200 descriptors, twice over
    # while they move
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    for res, value in ((resource.RLIMIT_AS, limits["memory_bytes"]), (resource.RLIMIT_FSIZE, limits["output_bytes"]),
                       (resource.RLIMIT_NOFILE, 256), (resource.RLIMIT_NPROC, limits["nproc"])):
        resource.setrlimit(res, (value, value))


def join_cgroup(path: str) -> None:
    """This process (and all it forks from now on) into the cgroup at `path` (a slot's, sandbox/cgroups.py)."""
    fd = os.open(f"{path}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, b"0")
    finally:
        os.close(fd)


_MOUNT = libc.function("mount")
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096


def mount_tmpfs(path: str, size_bytes: int, inodes: int) -> None:
    """A tmpfs of its own at `path` (the fork server's, before any process is forked there): root's, mode 0711."""
    opts = f"size={size_bytes},nr_inodes={inodes},mode=0711".encode()
    _check(_MOUNT(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts), f"mount {path}")


def hide_paths(empty_root: str, dirs: list[str], files: list[str]) -> list[str]:
    """An empty directory over each of `dirs` and an empty file over each of `files`: bind mounts of a small
    tmpfs made read-only at `empty_root` (the fork server's, at its start, in the jail's mount namespace, which every
    process forked later shares: the packages' data files, package_data.py). Returns what could not be hidden."""
    mount_tmpfs(empty_root, 1 << 16, 16)
    os.chmod(empty_root, 0o755)
    os.mkdir(f"{empty_root}/dir", 0o555)
    os.close(os.open(f"{empty_root}/file", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o444))
    _check(_MOUNT(None, empty_root.encode(), None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None),
           f"remount {empty_root} read-only")
    failed = []
    for source, paths in ((f"{empty_root}/dir", dirs), (f"{empty_root}/file", files)):
        src = source.encode()
        for path in paths:
            if _MOUNT(src, path.encode(), None, MS_BIND, None) != 0:
                failed.append(f"{path}: {os.strerror(libc.get_errno())}")
    return failed


CLONE_NEWNS = 0x00020000


def private_shm(scratch: str) -> None:
    """This process in a mount namespace of its own whose /dev/shm is its scratch directory: POSIX semaphores and
    shared memory (multiprocessing's locks and queues) are files of its own scratch, under its own quota and
    Landlock rule; no other process sees them. Done by a program's process before it is confined (it still holds
    the template's capabilities)."""
    unshare(CLONE_NEWNS)
    _check(_MOUNT(scratch.encode(), b"/dev/shm", None, MS_BIND, None), "bind its scratch directory on /dev/shm")


def hide_processes() -> None:
    """The jail's /proc remounted so that each user sees only its own processes (hidepid=invisible; the fork
    server's group, 0, sees all: it reads its programs' scheduling statistics): a program learns nothing of the
    other programs or the judges, not even that they exist."""
    _check(_MOUNT(b"proc", b"/proc", b"proc", MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  b"hidepid=invisible,gid=0"), "remount /proc")


DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")


def devices_read_only() -> list[str]:
    """The device nodes the jail binds from the machine, remounted read-only as mounts (they still read and write
    as devices): no chmod, utime or xattr of the machine's /dev/null from inside. Returns those it could not."""
    failed = []
    for dev in DEVICES:
        if os.path.exists(dev) and _MOUNT(None, dev.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID,
                                          None) != 0:
            failed.append(f"{dev}: {os.strerror(libc.get_errno())}")
    return failed


def can_fork_bare() -> bool:
    """Whether this process may fork with libc's fork() alone (fork_in_new_pid_namespace(bare=True)): a single
    thread, and nothing loaded that registers work for the child (AT_FORK_MODULES)."""
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:  # no /proc to tell: os.fork, which needs none of this
        return False
    return threads == 1 and not any(m in sys.modules for m in AT_FORK_MODULES)


def fork_bare() -> int:
    """libc's fork() alone (where can_fork_bare() said so: see fork_in_new_pid_namespace)."""
    pid = _FORK()
    if pid < 0:
        raise OSError(libc.get_errno(), "fork failed")
    return pid


def fork_in_new_pid_namespace(pidns_fd: int, bare: bool = False) -> int:
    """fork(), the child as PID 1 of a new PID namespace (the caller's own namespace restored after). Needs
    CAP_SYS_ADMIN in the jail's user namespace (the template's only use of it).

    `bare` (only where can_fork_bare() said so): libc's fork() without os.fork's bookkeeping around it. os.fork
    re-creates the interpreter's locks in the child, runs the work modules registered for fork (none is loaded
    here) and, in the parent, reads /proc/self/stat to warn about threads (there is one): ~26 page faults and
    ~60 us in every child, ~20 us in the parent, for a process whose locks were all free when it forked (one
    thread, holding the GIL across the call) and stay as they were."""
    unshare(CLONE_NEWPID)
    pid = -1
    try:
        pid = fork_bare() if bare else os.fork()
        return pid
    finally:
        if pid != 0:  # not in the child: it may not (and need not) go back, and a failed call costs it ~10 us
            try:
                setns(pidns_fd, CLONE_NEWPID)
            except OSError:
                pass
