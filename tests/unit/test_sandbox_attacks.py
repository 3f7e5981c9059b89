"""Attacks on the code sandbox (issue 36), written as NATIVE code wherever a route allows it: the program loads libc
with ctypes and makes the calls itself (`libc.kill`, `libc.syscall(...)`, ...), next to the Python route for the same
operation. The threat model is a program that runs arbitrary native code with its process's rights: the KERNEL must
refuse, not a Python policy.

How every test here judges:
- The oracle is an EXTERNAL observation made by this test: a secret it holds is never printed (a StdioSuite whose
  expected output IS the secret scores 0), files outside are unchanged (content, mode, owner, mtime, still there),
  processes it watches are unchanged (alive, not stopped, not traced, same nice / affinity / policy / limits / I/O
  priority), its sockets received nothing, no process of the program remains, the next program finds nothing. What a
  program prints about its own success is used for diagnostics only.
- Each attack program is a StdioSuite whose input names the route to try ("<route> <target>"), so that one route the
  kernel answers by killing the process (seccomp) does not hide the others; its first case, "native", prints
  `native-ok` only if ctypes loaded libc in the program. Every native test asserts that case LAST, after the
  protection checks: on a sandbox that refuses `import ctypes` a native attack was never tried, and the test fails
  saying so instead of passing for the wrong reason.
- Some tests also run a few "sanity" routes against the program's OWN files (its scratch directory): they must work,
  which shows the route's code is right and the refusal outside is the boundary's, not a bug in the attack.
- Every batch carries honest programs (asserts, call-based, stdin/stdout) that must keep score 1.0.

Safety (these tests also run against older sandboxes that are no kernel boundary): signals that stop or kill go only
to processes this test started (the sandbox's fork server and template: SIGSTOP, resumed by a watchdog; a `sleep` it
started: SIGKILL / SIGSTOP); the trainer (this process) gets only SIGUSR2, whose handler records receipt, and no
ptrace request that stops it. Pids 1..64 are probed read-only (signal 0, get* calls): never pid -1 or 0. Every
change an attack manages outside (mode, times, nice, affinity, policy, limits, files) is undone by the test before
it fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import queue
import resource
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from grpo_plugin.sandbox import AssertSuite, CallSuite, Limits, Sandbox, StdioSuite, confine

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)

# ---- the honest programs every batch carries ---------------------------------------------------------------------
ADD = "def add(a, b):\n    return a + b\n"
ADD_STDIO = "a, b = map(int, input().split())\nprint(a + b)\n"
TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 5) == 5"]
CALLS = [([1, 2], 3), ([2, 2], 4), ([0, 5], 5)]
STDIO = [("1 2\n", "3"), ("2 2\n", "4"), ("0 5\n", "5")]


def honest() -> list:
    return [AssertSuite(ADD, TESTS), CallSuite(ADD, "add", CALLS), StdioSuite(ADD_STDIO, STDIO)]


def run_with_honest(sb: Sandbox, suites: list) -> list:
    """Run the attack suites with the honest trio in the same batch; the honest ones must keep their verdicts."""
    res = sb.run_suites(list(suites) + honest())
    attack, good = res[:len(suites)], res[len(suites):]
    lost = [(r.passed, r.detail) for r in good if r.score != 1.0]
    assert not lost, f"an honest program in the attacker's batch lost its verdict: {lost}"
    return attack


# ---- the attack programs' common parts ---------------------------------------------------------------------------
# raw system call numbers, for the routes that bypass libc's wrappers
NR = {
    "x86_64": {"read": 0, "write": 1, "openat": 257, "openat2": 437, "kill": 62, "tkill": 200, "tgkill": 234,
               "rt_sigqueueinfo": 129, "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438,
               "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "getpriority": 140,
               "setpriority": 141, "sched_setaffinity": 203, "sched_getaffinity": 204, "sched_setscheduler": 144,
               "sched_getscheduler": 145, "prlimit64": 302, "ioprio_set": 251, "ioprio_get": 252, "clone": 56,
               "setsid": 112, "socket": 41, "connect": 42, "sendto": 44, "fchmodat": 268, "fchmodat2": 452,
               "utimensat": 280, "unlinkat": 263, "renameat2": 316, "mkdirat": 258, "open_by_handle_at": 304,
               "unshare": 272, "setns": 308},
    "aarch64": {"read": 63, "write": 64, "openat": 56, "openat2": 437, "kill": 129, "tkill": 130, "tgkill": 131,
                "rt_sigqueueinfo": 138, "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438,
                "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "getpriority": 141,
                "setpriority": 140, "sched_setaffinity": 122, "sched_getaffinity": 123, "sched_setscheduler": 119,
                "sched_getscheduler": 120, "prlimit64": 261, "ioprio_set": 30, "ioprio_get": 31, "clone": 220,
                "setsid": 157, "socket": 198, "connect": 203, "sendto": 206, "fchmodat": 53, "fchmodat2": 452,
                "utimensat": 88, "unlinkat": 35, "renameat2": 276, "mkdirat": 34, "open_by_handle_at": 265,
                "unshare": 97, "setns": 268},
}

PRELUDE = r'''
import os, sys, struct, time
try:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    NATIVE = libc.getpid() == os.getpid()
    WHY = "" if NATIVE else "libc.getpid() != os.getpid()"
except BaseException as exc:
    ctypes = libc = None
    NATIVE, WHY = False, repr(exc)
NR = @NR@.get(os.uname().machine, {})
AT_FDCWD = -100


def _args(args):
    return [ctypes.c_long(a) if isinstance(a, int) else a for a in args]


def sc(name, *args):
    """A raw system call; OSError with the kernel's errno."""
    if not NATIVE:
        raise RuntimeError("native route unavailable: " + WHY)
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(NR[name]), *_args(args))
    if r == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def lc(fn, *args):
    """A libc function that returns -1 and sets errno on failure."""
    if not NATIVE:
        raise RuntimeError("native route unavailable: " + WHY)
    ctypes.set_errno(0)
    r = getattr(libc, fn)(*_args(args))
    if r == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


ROUTES = {}


def route(fn):
    ROUTES[fn.__name__] = fn
    return fn
'''

DISPATCH = r'''

def _main():
    line = sys.stdin.readline().split()
    if line == ["native"]:
        print("native-ok" if NATIVE else "native-missing")
        if not NATIVE:
            print("native route unavailable:", WHY, file=sys.stderr)
        return
    name, target = line[0], (line[1] if len(line) > 1 else "")
    try:
        out = ROUTES[name](target)
    except BaseException as exc:
        out = "refused " + type(exc).__name__ + ": " + str(exc)
    print(out, flush=True)
    print(name, target, "->", str(out)[:80], file=sys.stderr, flush=True)


_main()
'''


def program(body: str, **values) -> str:
    """An attack program: the prelude (ctypes, libc, raw syscalls), `body` (its routes) with each @NAME@ replaced by
    repr(value), and the dispatch (stdin: "native" or "<route> <target>")."""
    src = PRELUDE + body + DISPATCH
    values.setdefault("NR", NR)
    for key, value in values.items():
        src = src.replace(f"@{key}@", repr(value))
    assert "@" not in src.replace("@route", ""), "a placeholder was left unfilled"
    return src


NATIVE_CASE = ("native\n", "native-ok")


def assert_native_tried(res, what: str) -> None:
    """The native route was available in the program (its first case printed native-ok): the attack was tried."""
    assert res.passed[0], (
        f"{what}: the native route was NOT available in the program (ctypes / libc did not load: {res.detail[0]}; "
        f"stderr: {res.output[:300]!r}), so the native attack was not tried and this test shows nothing about a "
        "kernel boundary (a sandbox that refuses `import ctypes` is a Python policy)")


def native_probe() -> StdioSuite:
    """A one-case program that says whether ctypes loads libc (for the attacks that are not route programs)."""
    return StdioSuite(program(""), [NATIVE_CASE])


# ---- fixtures -------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sb():
    sandbox = Sandbox(Limits(wall_s=2))
    try:
        yield sandbox
    finally:
        sandbox.close()


@pytest.fixture
def outside():
    """A directory outside the sandbox, as a user's files are: 0o755, its files 0o644."""
    d = Path(tempfile.mkdtemp(prefix="grpo-attack-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        for p in (d, Path(str(d) + ".moved")):
            if p.exists():
                for sub in [p, *p.rglob("*")]:
                    if not sub.is_symlink():
                        with contextlib.suppress(OSError):
                            os.chmod(sub, 0o700)
                shutil.rmtree(p, ignore_errors=True)


@pytest.fixture
def sleeper():
    """An unrelated process (the attacker knows its pid), killed by the test at the end."""
    proc = subprocess.Popen(["sleep", "60"])  # noqa: S607
    try:
        yield proc
    finally:
        with contextlib.suppress(OSError):
            os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def routes_that_said_ok(res, cases) -> list[str]:
    """Diagnostics: which routes the program reported as done (its claim, never the oracle)."""
    return [c[0].strip() for c, ok in zip(cases, res.passed) if ok and c[1] == "ok"]


# ==== files ==========================================================================================================
N_READ = 1 << 16

READ_BODY = r'''
import hashlib
TARGETS = @TARGETS@
HANDLES = @HANDLES@
TRAINER, ZYGOTE = @TRAINER@, @ZYGOTE@
OWN = @OWN@
N = @N@


def path(t):
    if t == "own":  # a file of the program's own, in its scratch directory (the sanity routes)
        p = os.path.abspath("own.txt")
        if not os.path.exists(p):
            with open(p, "w") as f:
                f.write(OWN)
        return p
    return TARGETS[t]


def digest(data):
    return hashlib.sha256(data).hexdigest()


def native_read(fd):
    buf = ctypes.create_string_buffer(N)
    n = lc("read", fd, buf, N)
    return digest(buf.raw[:n])


@route
def py_open(t):
    with open(path(t), "rb") as f:
        return digest(f.read(N))


@route
def py_dirfd(t):
    p = path(t)
    d = os.open(os.path.dirname(p), os.O_RDONLY | os.O_DIRECTORY)
    return digest(os.read(os.open(os.path.basename(p), os.O_RDONLY, dir_fd=d), N))


@route
def libc_open(t):
    return native_read(lc("open", path(t).encode(), os.O_RDONLY))


@route
def sys_openat(t):
    return native_read(sc("openat", AT_FDCWD, path(t).encode(), os.O_RDONLY, 0))


@route
def sys_openat2(t):
    how = struct.pack("QQQ", os.O_RDONLY, 0, 0)
    return native_read(sc("openat2", AT_FDCWD, path(t).encode(), how, len(how)))


def via_proc(pid, t):
    with open(f"/proc/{pid}/root" + path(t), "rb") as f:
        return digest(f.read(N))


@route
def proc_trainer_root(t):
    return via_proc(TRAINER, t)


@route
def proc_zygote_root(t):
    return via_proc(ZYGOTE, t)


@route
def proc_init_root(t):
    return via_proc(1, t)


@route
def py_symlink(t):
    os.symlink(path(t), "alias")
    with open("alias", "rb") as f:
        return digest(f.read(N))


@route
def py_hardlink(t):
    os.link(path(t), "hard")
    with open("hard", "rb") as f:
        return digest(f.read(N))


@route
def libc_link(t):
    lc("link", path(t).encode(), b"hard2")
    return native_read(lc("open", b"hard2", os.O_RDONLY))


@route
def by_handle(t):
    """open_by_handle_at with the file handle the test computed outside ("shocker"): no path walk at all."""
    h = HANDLES.get(t)
    if not h:
        return "no handle for " + t
    raw = bytes.fromhex(h[1])
    fh = ctypes.create_string_buffer(struct.pack("Ii", len(raw), h[0]) + raw)
    last = None
    for mount in ("/", os.path.dirname(path(t)), "/tmp", "."):
        try:
            mfd = os.open(mount, os.O_RDONLY | os.O_DIRECTORY)
            return native_read(sc("open_by_handle_at", mfd, fh, os.O_RDONLY))
        except OSError as exc:
            last = exc
    raise last
'''

READ_ROUTES = ["py_open", "py_dirfd", "libc_open", "sys_openat", "sys_openat2", "proc_trainer_root",
               "proc_zygote_root", "proc_init_root", "py_symlink", "py_hardlink", "libc_link", "by_handle"]
READ_SANITY = ["py_open", "py_dirfd", "libc_open", "sys_openat"]  # ordinary reads of the program's own file


def file_handle(path: str):
    """[handle_type, handle hex] of a file (name_to_handle_at), or None where the filesystem has none."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(8 + 128)
    struct.pack_into("I", buf, 0, 128)
    mount_id = ctypes.c_int()
    if libc.name_to_handle_at(-100, path.encode(), buf, ctypes.byref(mount_id), 0) != 0:
        return None
    nbytes, htype = struct.unpack_from("Ii", buf, 0)
    return [htype, buf.raw[8:8 + nbytes].hex()]


def test_reading_outside_leaks_nothing(sb, outside):
    """A secret file the test made outside, /etc/passwd, the trainer's /proc/<pid>/environ and the repo's data,
    through 12 routes each (Python, libc, raw openat/openat2, /proc/<pid>/root of the trainer, the fork server and
    init, symlink, hard link, open_by_handle_at): the program prints what it read (sha256 of the first 64 KB); the
    expected output IS the file's digest, so a case that passes leaked it."""
    secret = outside / "secret.txt"
    secret.write_text("trainer-secret-" + os.urandom(16).hex())
    secret.chmod(0o644)
    targets = {"secret": str(secret), "passwd": "/etc/passwd", "environ": f"/proc/{os.getpid()}/environ",
               "repo": str(ROOT / "tests" / "data" / "code" / "apps.jsonl")}
    digests = {}
    for name, p in targets.items():
        with open(p, "rb") as f:  # the trainer's environ: this process's own
            digests[name] = sha(f.read(N_READ))
    own = "own-" + os.urandom(8).hex()
    code = program(READ_BODY, TARGETS=targets, HANDLES={k: file_handle(p) for k, p in targets.items()},
                   TRAINER=os.getpid(), ZYGOTE=sb.fork_server_pid, OWN=own, N=N_READ)
    attacks = [(f"{r} {t}\n", digests[t]) for t in targets for r in READ_ROUTES]
    sanity = [(f"{r} own\n", sha(own.encode())) for r in READ_SANITY]
    cases = [NATIVE_CASE, *attacks, *sanity]
    (res,) = run_with_honest(sb, [StdioSuite(code, cases)])
    leaked = [c[0].strip() for c, ok in zip(cases[1:1 + len(attacks)], res.passed[1:1 + len(attacks)]) if ok]
    assert not leaked, f"a file outside the program's scratch directory was read: {leaked}"
    assert_native_tried(res, "reading outside")
    broken = [(c[0].strip(), d) for c, ok, d in zip(sanity, res.passed[-len(sanity):], res.detail[-len(sanity):])
              if not ok]
    assert not broken, f"the read routes fail on the program's OWN file (route bug or over-strict sandbox): {broken}"


WRITE_BODY = r'''
TARGETS = @TARGETS@
TOKEN = @TOKEN@


def path(t):
    if t == "own":
        p = os.path.abspath("own.txt")
        if not os.path.exists(p):
            with open(p, "w") as f:
                f.write("own")
        return p
    if t == "owndir":
        p = os.path.abspath("owndir")
        os.makedirs(p, exist_ok=True)
        return p
    return TARGETS[t]


def parent_fd(p):
    return os.open(os.path.dirname(p), os.O_RDONLY | os.O_DIRECTORY)


def any_fd(p):
    last = None
    for flags in (os.O_RDONLY, os.O_WRONLY, getattr(os, "O_PATH", 0)):
        try:
            return os.open(p, flags)
        except OSError as exc:
            last = exc
    raise last


def inside(t, suffix):
    return os.path.join(path(t), TOKEN + suffix)


@route
def py_write(t):
    with open(path(t), "a") as f:
        f.write("X")
    return "ok"


@route
def py_trunc(t):
    os.truncate(path(t), 0)
    return "ok"


@route
def libc_write(t):
    fd = lc("open", path(t).encode(), os.O_WRONLY | os.O_APPEND)
    lc("write", fd, b"X", 1)
    return "ok"


@route
def sys_write(t):
    fd = sc("openat", AT_FDCWD, path(t).encode(), os.O_WRONLY | os.O_APPEND, 0)
    sc("write", fd, b"X", 1)
    return "ok"


@route
def libc_truncate(t):
    lc("truncate", path(t).encode(), 0)
    return "ok"


@route
def py_chmod(t):
    os.chmod(path(t), 0o777)
    return "ok"


@route
def py_chmod_dirfd(t):
    p = path(t)
    os.chmod(os.path.basename(p), 0o777, dir_fd=parent_fd(p))
    return "ok"


@route
def py_fchmod(t):
    os.fchmod(any_fd(path(t)), 0o777)
    return "ok"


@route
def libc_chmod(t):
    lc("chmod", path(t).encode(), 0o777)
    return "ok"


@route
def libc_fchmod(t):
    lc("fchmod", any_fd(path(t)), 0o777)
    return "ok"


@route
def sys_fchmodat(t):
    p = path(t)
    sc("fchmodat", parent_fd(p), os.path.basename(p).encode(), 0o777)
    return "ok"


@route
def sys_fchmodat2(t):
    p = path(t)
    sc("fchmodat2", parent_fd(p), os.path.basename(p).encode(), 0o777, 0)
    return "ok"


@route
def py_chown(t):
    os.chown(path(t), 65534, 65534)
    return "ok"


@route
def libc_chown(t):
    lc("chown", path(t).encode(), 65534, 65534)
    return "ok"


@route
def py_utime(t):
    os.utime(path(t), (1, 1))
    return "ok"


@route
def py_utime_dirfd(t):
    p = path(t)
    os.utime(os.path.basename(p), (1, 1), dir_fd=parent_fd(p))
    return "ok"


@route
def py_futime(t):
    os.utime(any_fd(path(t)), (1, 1))
    return "ok"


@route
def sys_utimensat(t):
    times = ctypes.create_string_buffer(struct.pack("qqqq", 1, 0, 1, 0))
    sc("utimensat", AT_FDCWD, path(t).encode(), times, 0)
    return "ok"


@route
def py_unlink(t):
    os.unlink(path(t))
    return "ok"


@route
def py_unlink_dirfd(t):
    p = path(t)
    os.unlink(os.path.basename(p), dir_fd=parent_fd(p))
    return "ok"


@route
def libc_unlink(t):
    lc("unlink", path(t).encode())
    return "ok"


@route
def sys_unlinkat(t):
    p = path(t)
    sc("unlinkat", parent_fd(p), os.path.basename(p).encode(), 0)
    return "ok"


@route
def py_rename(t):
    os.rename(path(t), path(t) + ".moved")
    return "ok"


@route
def libc_rename(t):
    lc("rename", path(t).encode(), (path(t) + ".moved").encode())
    return "ok"


@route
def sys_renameat2(t):
    sc("renameat2", AT_FDCWD, path(t).encode(), AT_FDCWD, (path(t) + ".moved").encode(), 0)
    return "ok"


@route
def py_rename_in(t):
    os.rename(path(t), os.path.abspath("stolen"))
    return "ok"


@route
def py_create(t):
    with open(inside(t, ".py"), "w") as f:
        f.write("X")
    return "ok"


@route
def libc_create(t):
    lc("open", inside(t, ".pth").encode(), os.O_WRONLY | os.O_CREAT, 0o644)
    return "ok"


@route
def sys_mkdir(t):
    sc("mkdirat", AT_FDCWD, inside(t, "-d").encode(), 0o755)
    return "ok"


@route
def py_mkfifo(t):
    os.mkfifo(inside(t, "-fifo"))
    return "ok"


@route
def py_symlink_in(t):
    os.symlink("/etc/passwd", inside(t, "-link"))
    return "ok"


@route
def py_link_in(t):
    os.link(path("own"), inside(t, "-hard"))
    return "ok"
'''

FILE_ROUTES = ["py_write", "py_trunc", "libc_write", "sys_write", "libc_truncate", "py_chmod", "py_chmod_dirfd",
               "py_fchmod", "libc_chmod", "libc_fchmod", "sys_fchmodat", "sys_fchmodat2", "py_chown", "libc_chown",
               "py_utime", "py_utime_dirfd", "py_futime", "sys_utimensat", "py_unlink", "py_unlink_dirfd",
               "libc_unlink", "sys_unlinkat", "py_rename", "libc_rename", "sys_renameat2", "py_rename_in"]
DIR_ROUTES = ["py_chmod", "py_chmod_dirfd", "libc_chmod", "sys_fchmodat", "py_fchmod", "py_utime",
              "sys_utimensat", "py_create", "libc_create", "sys_mkdir", "py_mkfifo", "py_symlink_in", "py_link_in",
              "py_rename"]
REPO_ROUTES = ["py_write", "libc_write", "sys_write", "py_chmod", "py_chmod_dirfd", "py_fchmod", "libc_fchmod",
               "sys_fchmodat", "py_chown", "py_utime", "py_utime_dirfd", "sys_utimensat", "py_unlink",
               "libc_rename", "py_rename_in"]
CREATE_ROUTES = ["py_create", "libc_create", "sys_mkdir", "py_symlink_in"]
WRITE_SANITY = [("own", r) for r in ("py_write", "libc_write", "sys_write", "py_chmod", "py_fchmod", "sys_fchmodat",
                                     "py_utime", "sys_utimensat", "libc_rename", "libc_unlink")] + \
               [("owndir", r) for r in ("py_create", "libc_create")]


def snapshot(p: Path):
    """What a write, chmod, chown, utime, delete or rename would change."""
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return None
    data = p.read_bytes() if stat.S_ISREG(st.st_mode) else sorted(os.listdir(p))
    return (data, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns, st.st_ino)


def restore_file(p: Path, snap) -> None:
    """Undo what an attack did to a file outside (before the test fails)."""
    for moved in (Path(str(p) + ".moved"),):
        if moved.exists() and not p.exists():
            os.rename(moved, p)
    data, mode, uid, gid, mtime, _ = snap
    if not p.exists() or p.read_bytes() != data:
        p.write_bytes(data)
    os.chown(p, uid, gid)
    os.chmod(p, mode)
    os.utime(p, ns=(mtime, mtime))


def test_writing_outside_changes_nothing(sb, outside):
    """Write, truncate, chmod (os.chmod, with dir_fd, fchmod via an fd, libc, fchmodat/fchmodat2), chown, utime
    (path, dir_fd, fd, utimensat), delete, rename, create (file, .pth, dir, fifo, symlink, hard link) against: a file
    and a directory the test made outside (0o644 / 0o755), the repo's own data (tests/data/code), the venv's
    site-packages. Oracle: content, mode, owner, mtime, inode and listing before and after."""
    victim = outside / "victim.txt"
    victim.write_text("keep me\n")
    victim.chmod(0o644)
    repo_file = ROOT / "tests" / "data" / "code" / "README.md"
    repo_dir = repo_file.parent
    site = Path(sysconfig.get_paths()["purelib"])
    token = "grpo-attack-" + os.urandom(6).hex()
    targets = {"victim": str(victim), "dir": str(outside), "repo": str(repo_file), "repodir": str(repo_dir),
               "site": str(site)}
    code = program(WRITE_BODY, TARGETS=targets, TOKEN=token)
    attacks = ([("victim", r) for r in FILE_ROUTES] + [("dir", r) for r in DIR_ROUTES]
               + [("repo", r) for r in REPO_ROUTES] + [("repodir", r) for r in CREATE_ROUTES]
               + [("site", r) for r in CREATE_ROUTES])
    cases = [NATIVE_CASE] + [(f"{r} {t}\n", "ok") for t, r in attacks + WRITE_SANITY]
    watched = {"victim": victim, "repo": repo_file}
    before = {k: snapshot(p) for k, p in watched.items()}
    dir_before = snapshot(outside)
    try:
        (res,) = run_with_honest(sb, [StdioSuite(code, cases)])
    finally:
        after = {k: snapshot(p) for k, p in watched.items()}
        dir_after = snapshot(Path(outside))
        created = [str(p) for d in (repo_dir, site, outside) for p in d.glob(token + "*")]
        moved = [str(p) for p in (Path(str(outside) + ".moved"), Path(str(repo_file) + ".moved")) if p.exists()]
        if Path(str(outside) + ".moved").exists() and not outside.exists():
            os.rename(str(outside) + ".moved", outside)
        for k, p in watched.items():  # undo before failing
            if after[k] != before[k]:
                restore_file(p, before[k])
        if (outside.exists() and stat.S_IMODE(os.stat(outside).st_mode) != 0o755):
            os.chmod(outside, 0o755)
        for p in created:
            with contextlib.suppress(OSError):
                shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
    changed = {k: (before[k][1:], after[k] and after[k][1:]) for k in watched if before[k] != after[k]}
    breaches = [what for bad, what in [
        (changed, f"files changed (restored now; (mode, uid, gid, mtime, inode) before -> after): {changed}"),
        (dir_after != dir_before, f"the directory outside changed: {dir_before} -> {dir_after}"),
        (created or moved, f"made outside: {created + moved}")] if bad]
    assert not breaches, f"writing outside: {breaches}; routes that said ok: " \
                         f"{routes_that_said_ok(res, cases[1:len(attacks) + 1])}"
    assert_native_tried(res, "writing outside")
    sanity = cases[len(attacks) + 1:]
    broken = [c[0].strip() for c, ok in zip(sanity, res.passed[len(attacks) + 1:]) if not ok]
    assert not broken, f"the write routes fail on the program's OWN files (route bug or over-strict sandbox): {broken}"


# ==== processes ======================================================================================================
# the trainer's secret, in this process's memory: the address is given to the attacker
_SECRET = ("trainer-secret-" + os.urandom(12).hex()).encode()
_SECRET_AT = id(_SECRET) + sys.getsizeof(b"") - 1  # PyBytesObject.ob_sval

PROC_BODY = r'''
import signal, resource
T = @TARGETS@            # name -> pid
SIGNALS = @SIGNALS@      # name -> the signal its "kill" routes send
SECRET_AT, SECRET_LEN = @SECRET_AT@, @SECRET_LEN@
PIPE_W = @PIPE_W@
AFFINITY = @AFFINITY@    # name -> the cores the affinity routes set (not the ones it has: a change shows)

if NATIVE:
    class IOV(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _queue(pid, s):
    info = ctypes.create_string_buffer(struct.pack("iii", s, 0, -1) + bytes(116))  # si_code SI_QUEUE
    sc("rt_sigqueueinfo", pid, s, info)


SIGNALERS = {
    "py_kill": lambda pid, s: os.kill(pid, s),
    "libc_kill": lambda pid, s: lc("kill", pid, s),
    "sys_kill": lambda pid, s: sc("kill", pid, s),
    "sys_tgkill": lambda pid, s: sc("tgkill", pid, pid, s),
    "sys_tkill": lambda pid, s: sc("tkill", pid, s),
    "sys_sigqueue": _queue,
    "sys_pidfd_signal": lambda pid, s: sc("pidfd_send_signal", sc("pidfd_open", pid, 0), s, 0, 0),
    "py_pidfd_signal": lambda pid, s: signal.pidfd_send_signal(os.pidfd_open(pid), s),
}
for _name, _fn in SIGNALERS.items():
    ROUTES[_name] = (lambda fn: lambda t: (fn(T[t], SIGNALS[t]), "ok")[1])(_fn)
    ROUTES[_name + "_stop"] = (lambda fn: lambda t: (fn(T[t], signal.SIGSTOP), "ok")[1])(_fn)


@route
def py_setpriority(t):
    os.setpriority(os.PRIO_PROCESS, T[t], 19)
    return "ok"


@route
def libc_setpriority(t):
    lc("setpriority", 0, T[t], 19)
    return "ok"


@route
def sys_setpriority(t):
    sc("setpriority", 0, T[t], 19)
    return "ok"


@route
def py_affinity(t):
    os.sched_setaffinity(T[t], set(AFFINITY[t]))
    return "ok"


@route
def sys_affinity(t):
    sc("sched_setaffinity", T[t], 8, ctypes.byref(ctypes.c_ulong(sum(1 << c for c in AFFINITY[t]))))
    return "ok"


@route
def py_scheduler(t):
    os.sched_setscheduler(T[t], os.SCHED_IDLE, os.sched_param(0))
    return "ok"


@route
def sys_scheduler(t):
    sc("sched_setscheduler", T[t], 5, ctypes.byref(ctypes.c_int(0)))  # SCHED_IDLE
    return "ok"


def _hard(pid):
    try:
        return resource.prlimit(pid, resource.RLIMIT_MSGQUEUE)[1]
    except BaseException:
        return 819200


@route
def py_prlimit(t):
    resource.prlimit(T[t], resource.RLIMIT_MSGQUEUE, (4096, _hard(T[t])))
    return "ok"


@route
def libc_prlimit(t):
    lc("prlimit", T[t], 12, (ctypes.c_ulong * 2)(4096, _hard(T[t])), None)  # RLIMIT_MSGQUEUE
    return "ok"


@route
def sys_ioprio(t):
    sc("ioprio_set", 1, T[t], 3 << 13)  # IOPRIO_WHO_PROCESS, class idle
    return "ok"


@route
def sys_seize(t):
    sc("ptrace", 0x4206, T[t], 0, 0)  # PTRACE_SEIZE: traced, not stopped
    time.sleep(0.3)
    return "ok"


@route
def libc_seize(t):
    lc("ptrace", 0x4206, T[t], 0, 0)
    time.sleep(0.3)
    return "ok"


@route
def sys_attach(t):
    sc("ptrace", 16, T[t], 0, 0)  # PTRACE_ATTACH: stops it
    for _ in range(30):
        try:
            if os.waitpid(T[t], os.WNOHANG | 0x40000000)[0]:  # __WALL
                break
        except OSError:
            break
        time.sleep(0.01)
    time.sleep(0.2)
    try:
        sc("ptrace", 17, T[t], 0, 0)  # PTRACE_DETACH, no signal
    except OSError:
        pass
    return "ok"


@route
def sys_vm_readv(t):
    buf = ctypes.create_string_buffer(SECRET_LEN)
    local, remote = IOV(ctypes.cast(buf, ctypes.c_void_p).value, SECRET_LEN), IOV(SECRET_AT, SECRET_LEN)
    n = sc("process_vm_readv", T[t], ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    return buf.raw[:n].decode(errors="replace")


@route
def sys_vm_writev(t):
    data = ctypes.create_string_buffer(b"PWNED")
    local, remote = IOV(ctypes.cast(data, ctypes.c_void_p).value, 5), IOV(SECRET_AT, 5)
    sc("process_vm_writev", T[t], ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    return "ok"


@route
def py_procmem_read(t):
    with open(f"/proc/{T[t]}/mem", "rb", buffering=0) as f:
        f.seek(SECRET_AT)
        return f.read(SECRET_LEN).decode(errors="replace")


@route
def py_procmem_write(t):
    with open(f"/proc/{T[t]}/mem", "r+b", buffering=0) as f:
        f.seek(SECRET_AT)
        f.write(b"PWNED")
    return "ok"


@route
def sys_pidfd_getfd(t):
    fd = sc("pidfd_getfd", sc("pidfd_open", T[t], 0), PIPE_W, 0)  # steal the trainer's pipe
    os.write(fd, b"stolen")
    return "ok"
'''

SIGNAL_ROUTES = ["py_kill", "libc_kill", "sys_kill", "sys_tgkill", "sys_tkill", "sys_sigqueue", "sys_pidfd_signal",
                 "py_pidfd_signal"]
TUNE_ROUTES = ["py_setpriority", "libc_setpriority", "sys_setpriority", "py_affinity", "sys_affinity",
               "py_scheduler", "sys_scheduler", "py_prlimit", "libc_prlimit", "sys_ioprio"]
READ_SECRET_ROUTES = ["sys_vm_readv", "py_procmem_read"]
TRAINER_ROUTES = ["sys_vm_writev", "py_procmem_write", "sys_pidfd_getfd"]


def _libc():
    lib = ctypes.CDLL(None, use_errno=True)
    lib.syscall.restype = ctypes.c_long
    return lib


def ioprio(pid: int) -> int:
    return _libc().syscall(NR[os.uname().machine]["ioprio_get"], 1, pid)


def proc_status(pid: int) -> dict | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return None


def tuning(pid: int) -> dict:
    """What an attacker would change about a process from outside it."""
    return {"nice": os.getpriority(os.PRIO_PROCESS, pid), "affinity": sorted(os.sched_getaffinity(pid)),
            "policy": os.sched_getscheduler(pid), "msgqueue": resource.prlimit(pid, resource.RLIMIT_MSGQUEUE),
            "ioprio": ioprio(pid)}


def restore_tuning(pid: int, was: dict) -> None:
    with contextlib.suppress(OSError):
        os.sched_setscheduler(pid, was["policy"], os.sched_param(0))
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, was["nice"])
    with contextlib.suppress(OSError):
        os.sched_setaffinity(pid, was["affinity"])
    with contextlib.suppress(OSError, ValueError):
        resource.prlimit(pid, resource.RLIMIT_MSGQUEUE, was["msgqueue"])
    _libc().syscall(NR[os.uname().machine]["ioprio_set"], 1, pid, was["ioprio"])


class Watchdog(threading.Thread):
    """Watches processes while a batch runs: stopped or traced is recorded; a stopped process this test started is
    resumed (SIGCONT) so the batch can finish."""

    def __init__(self, pids: dict[str, int], resume: set[str]):
        super().__init__(daemon=True)
        self.pids, self.resume = pids, resume
        self.events: set[str] = set()
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            for name, pid in self.pids.items():
                st = proc_status(pid)
                if st is None:
                    continue
                if st.get("TracerPid", "0").strip() != "0":
                    self.events.add(f"{name} traced by pid {st['TracerPid'].strip()}")
                if st.get("State", " ")[:1] in ("T", "t"):
                    self.events.add(f"{name} stopped ({st['State']})")
                    if name in self.resume:
                        os.kill(pid, signal.SIGCONT)
            time.sleep(0.005)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.join()


def test_processes_outside_cannot_be_signalled_traced_or_reprioritised(sb, sleeper):
    """The trainer (this process), the fork server, its template and an unrelated process, by pid: signals (kill,
    tgkill, tkill, rt_sigqueueinfo, pidfd_send_signal; libc and raw), ptrace (SEIZE; ATTACH except on the trainer),
    process_vm_readv / process_vm_writev and /proc/<pid>/mem on the trainer's secret, pidfd_getfd of the trainer's
    pipe, setpriority 19, sched_setaffinity to other cores, SCHED_IDLE, prlimit, ioprio_set. Oracles, all outside:
    a SIGUSR2 handler here, the watchdog (stopped / TracerPid), alive, nice / affinity / policy / RLIMIT_MSGQUEUE /
    I/O priority before and after, the secret's bytes, the pipe."""
    received = []
    old_handler = signal.signal(signal.SIGUSR2, lambda s, f: received.append(s))
    r_fd, w_fd = os.pipe()
    os.set_blocking(r_fd, False)
    templates = {f"template{k or ''}": p for k, p in enumerate(sb.template_pids)}  # one per core
    pids = {"trainer": os.getpid(), "zygote": sb.fork_server_pid, **templates, "sleeper": sleeper.pid}
    signals = {"trainer": int(signal.SIGUSR2), "zygote": int(signal.SIGSTOP), "sleeper": int(signal.SIGKILL),
               **dict.fromkeys(templates, int(signal.SIGSTOP))}
    cores = sorted(os.sched_getaffinity(0))
    affinity = {t: cores[:1] if sorted(os.sched_getaffinity(p)) != cores[:1] else cores for t, p in pids.items()}
    code = program(PROC_BODY, TARGETS=pids, SIGNALS=signals, SECRET_AT=_SECRET_AT, SECRET_LEN=len(_SECRET),
                   PIPE_W=w_fd, AFFINITY=affinity)
    secret = _SECRET.decode()
    cases = [NATIVE_CASE]
    for t in pids:
        routes = SIGNAL_ROUTES + TUNE_ROUTES + ["sys_seize", "libc_seize"]
        if t != "trainer":
            routes += ["sys_attach"]
        if t == "sleeper":
            routes = [r + "_stop" for r in ("py_kill", "sys_tkill", "sys_sigqueue")] + routes
        cases += [(f"{r} {t}\n", "ok") for r in routes]
        if t == "trainer":
            cases += [(f"{r} trainer\n", secret) for r in READ_SECRET_ROUTES]
            cases += [(f"{r} trainer\n", "ok") for r in TRAINER_ROUTES]
    before = {t: tuning(p) for t, p in pids.items()}
    secret_before = _SECRET.hex()  # a copy: bytes(x) of a bytes is x itself
    try:
        with Watchdog(pids, resume={"zygote", "sleeper", *templates}) as dog:
            (res,) = run_with_honest(sb, [StdioSuite(code, cases)])
            time.sleep(0.05)  # a signal in flight
    finally:
        signal.signal(signal.SIGUSR2, old_handler)
        after = {t: (tuning(p) if psutil.pid_exists(p) else None) for t, p in pids.items()}
        for t, p in pids.items():
            if after[t] is not None and after[t] != before[t]:
                restore_tuning(p, before[t])
        try:
            stolen = os.read(r_fd, 100)
        except BlockingIOError:
            stolen = b""
        os.close(r_fd)
        os.close(w_fd)
    changed = {t: (before[t], after[t]) for t in pids if after[t] != before[t]}
    leaked = [c[0].strip() for c, ok in zip(cases, res.passed) if ok and c[1] == secret]
    breaches = [what for bad, what in [
        (received, f"the trainer received {len(received)} signal(s)"),
        (dog.events, f"stopped or traced: {sorted(dog.events)}"),
        (sleeper.poll() is not None, f"the unrelated process was killed (status {sleeper.returncode})"),
        (not all(psutil.pid_exists(p) for p in [sb.fork_server_pid, *sb.template_pids]), "the fork server was killed"),
        (changed, f"reprioritised (restored now): {changed}"),
        (_SECRET.hex() != secret_before, "the trainer's memory was written"),
        (stolen, f"the program wrote through the trainer's pipe: {stolen!r}"),
        (leaked, f"the trainer's memory was read: {leaked}")] if bad]
    assert not breaches, f"processes outside were reached: {breaches}; routes that said ok: " \
                         f"{routes_that_said_ok(res, cases)}"
    assert_native_tried(res, "processes outside")
    # the fork server still serves
    assert sb.run_suites([AssertSuite(ADD, TESTS)])[0].score == 1.0


PIDSCAN_BODY = r'''
import errno  # noqa
OWN = os.getpid()
BOGUS = 1 << 22  # above any pid: "no such process" as the kernel says it


def _vm(p):
    buf = ctypes.create_string_buffer(1)
    iov = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p).value, 1)
    remote = (ctypes.c_void_p * 2)(0x10000, 1)
    sc("process_vm_readv", p, iov, 1, remote, 1, 0)


PROBES = {  # read-only: nothing here changes the process named
    "py_kill0": lambda p: os.kill(p, 0),
    "libc_kill0": lambda p: lc("kill", p, 0),
    "sys_getpriority": lambda p: sc("getpriority", 0, p),
    "sys_getaffinity": lambda p: sc("sched_getaffinity", p, 128, ctypes.create_string_buffer(128)),
    "sys_getscheduler": lambda p: sc("sched_getscheduler", p),
    "libc_prlimit_read": lambda p: lc("prlimit", p, 7, None, ctypes.create_string_buffer(16)),
    "sys_pidfd_open": lambda p: sc("pidfd_open", p, 0),
    "sys_vm_readv": _vm,
    "py_getpriority": lambda p: os.getpriority(os.PRIO_PROCESS, p),
    "py_getaffinity": lambda p: os.sched_getaffinity(p),
}


def outcome(probe, p):
    try:
        probe(p)
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    except BaseException as exc:
        return type(exc).__name__


def scan(t):
    probe = PROBES[t]
    absent = outcome(probe, BOGUS)
    seen = [f"{p}:{outcome(probe, p)}" for p in range(1, 65) if p != OWN and outcome(probe, p) != absent]
    return " ".join(seen) or "none"


for _name in PROBES:
    ROUTES[_name] = (lambda name: lambda t: scan(name))(_name)


@route
def proc_list(t):
    try:
        names = os.listdir("/proc")
    except PermissionError:  # refused: it names nothing
        return "none"
    seen = sorted(int(n) for n in names if n.isdigit() and int(n) != OWN)
    return " ".join(map(str, seen)) or "none"
'''


def test_the_program_cannot_name_other_processes(sb):
    """Read-only probes of pids 1..64 (signal 0, getpriority, sched_getaffinity, sched_getscheduler, prlimit read,
    pidfd_open, process_vm_readv; libc, raw and Python): a pid answers differently from a pid above pid_max only if
    it exists where the program can name it. Expected: none but its own (the program in a PID namespace of its own).
    The listing of /proc likewise. (A design that gives each program a reaper of its own as pid 1 of its namespace
    would show pid 1 here: name it in the expected output then, never the fork server's processes.)"""
    scan_routes = ["py_kill0", "libc_kill0", "sys_getpriority", "sys_getaffinity", "sys_getscheduler",
                   "libc_prlimit_read", "sys_pidfd_open", "sys_vm_readv", "py_getpriority", "py_getaffinity",
                   "proc_list"]
    cases = [NATIVE_CASE] + [(f"{r}\n", "none") for r in scan_routes]
    (res,) = run_with_honest(sb, [StdioSuite(program(PIDSCAN_BODY), cases)])
    named = [c[0].strip() for c, ok in zip(cases[1:], res.passed[1:]) if not ok]
    assert not named, f"the program can name other processes by pid (routes: {named}); stderr: {res.output[:600]}"
    assert_native_tried(res, "naming pids 1..64")


# ==== namespaces and privileges ======================================================================================
NS_BODY = r'''
NEWNS, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET = 0x20000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000
FLAGS = {"user": NEWUSER, "pid": NEWPID, "mount": NEWNS, "net": NEWNET, "ipc": NEWIPC, "uts": NEWUTS,
         "user_pid": NEWUSER | NEWPID}


@route
def sys_unshare(t):
    sc("unshare", FLAGS[t])
    return "ok"


@route
def py_unshare(t):
    os.unshare(FLAGS[t])
    return "ok"


@route
def sys_setns(t):
    fd = os.open(f"/proc/self/ns/{t}", os.O_RDONLY)
    sc("setns", fd, FLAGS[t])
    return "ok"


@route
def sys_clone(t):  # a child in new namespaces: it exits at once; the parent reports
    pid = sc("clone", FLAGS[t] | 17, 0, 0, 0, 0)  # | SIGCHLD
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return "ok"


@route
def status(t):  # what the kernel says of this process: PR_GET_SECCOMP, PR_GET_NO_NEW_PRIVS, capget(2)
    head = ctypes.create_string_buffer(struct.pack("=Ii", 0x20080522, 0))
    data = ctypes.create_string_buffer(24)
    lc("capget", head, data)
    eff0, prm0, _, eff1, prm1, _ = struct.unpack("=6I", data.raw)
    return f"seccomp={libc.prctl(21, 0, 0, 0, 0)} nnp={libc.prctl(39, 0, 0, 0, 0)} cap_eff={eff0 | eff1 << 32:x} " \
           f"cap_prm={prm0 | prm1 << 32:x}"
'''


def test_no_namespace_or_capability_can_be_gained(sb):
    """A new user namespace would give the program every capability inside it (then mounts, new PID and network
    namespaces...). Every route to a namespace is refused with EPERM: the seccomp filter (inherited from the template,
    which alone may use `unshare` / `setns` with exactly CLONE_NEWPID) refuses the rest, and the program holds no
    capability, so the kernel refuses those two as well. The oracle is what the kernel answered the program (no effect
    of a namespace is visible outside it): each route prints its error, and the kernel's own view of the process
    (prctl, capget) shows the filter, no_new_privs and no capability."""
    cases = [NATIVE_CASE]
    for route, targets in (("sys_unshare", ("user", "pid", "mount", "net", "ipc", "uts", "user_pid")),
                           # os.unshare: Python >= 3.12 (the programs run on this interpreter)
                           ("py_unshare", ("user", "pid") if hasattr(os, "unshare") else ()),
                           ("sys_setns", ("pid", "user", "net")),
                           ("sys_clone", ("user", "pid", "net"))):
        cases += [(f"{route} {t}\n", "refused PermissionError: [Errno 1] Operation not permitted") for t in targets]
    cases.append(("status\n", "seccomp=2 nnp=1 cap_eff=0 cap_prm=0"))
    (res,) = run_with_honest(sb, [StdioSuite(program(NS_BODY), cases)])
    gained = [c[0].strip() for c, ok in zip(cases[1:], res.passed[1:]) if not ok]
    assert not gained, f"a namespace or capability route was not refused as expected: {gained}; {res.detail}; " \
                       f"stderr: {res.output[:800]}"
    assert_native_tried(res, "namespaces")


# ==== network ========================================================================================================
NET_BODY = r'''
import socket
PORT, UDP_PORT, ABSTRACT, UNIX_PATH = @PORT@, @UDP_PORT@, @ABSTRACT@, @UNIX_PATH@
MSG = b"attack"


def sockaddr_in(port):
    return ctypes.create_string_buffer(struct.pack("=HH4s8x", socket.AF_INET, socket.htons(port),
                                                   socket.inet_aton("127.0.0.1")))


def sockaddr_un(name):
    raw = struct.pack("=H", socket.AF_UNIX) + name
    return ctypes.create_string_buffer(raw, len(raw))


@route
def py_tcp(t):
    s = socket.create_connection(("127.0.0.1", PORT), timeout=1)
    s.sendall(MSG)
    return "ok"


@route
def libc_tcp(t):
    fd = lc("socket", socket.AF_INET, socket.SOCK_STREAM, 0)
    lc("connect", fd, sockaddr_in(PORT), 16)
    lc("write", fd, MSG, len(MSG))
    return "ok"


@route
def sys_tcp(t):
    fd = sc("socket", socket.AF_INET, socket.SOCK_STREAM, 0)
    sc("connect", fd, sockaddr_in(PORT), 16)
    sc("write", fd, MSG, len(MSG))
    return "ok"


@route
def py_udp(t):
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(MSG, ("127.0.0.1", UDP_PORT))
    return "ok"


@route
def libc_udp(t):
    fd = lc("socket", socket.AF_INET, socket.SOCK_DGRAM, 0)
    lc("sendto", fd, MSG, len(MSG), 0, sockaddr_in(UDP_PORT), 16)
    return "ok"


@route
def sys_udp(t):
    fd = sc("socket", socket.AF_INET, socket.SOCK_DGRAM, 0)
    sc("sendto", fd, MSG, len(MSG), 0, sockaddr_in(UDP_PORT), 16)
    return "ok"


@route
def py_abstract(t):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(ABSTRACT)
    s.sendall(MSG)
    return "ok"


@route
def libc_abstract(t):
    fd = lc("socket", socket.AF_UNIX, socket.SOCK_STREAM, 0)
    addr = sockaddr_un(ABSTRACT)
    lc("connect", fd, addr, len(addr.raw))
    lc("write", fd, MSG, len(MSG))
    return "ok"


@route
def py_unix_path(t):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(UNIX_PATH)
    s.sendall(MSG)
    return "ok"


@route
def libc_unix_path(t):
    fd = lc("socket", socket.AF_UNIX, socket.SOCK_STREAM, 0)
    addr = sockaddr_un(UNIX_PATH.encode() + b"\0")
    lc("connect", fd, addr, len(addr.raw))
    lc("write", fd, MSG, len(MSG))
    return "ok"


@route
def py_dns(t):
    for host in ("localhost", "example.com"):
        try:
            infos = socket.getaddrinfo(host, PORT, type=socket.SOCK_STREAM)
        except OSError:
            continue
        for family, kind, proto, _, addr in infos:
            try:
                s = socket.socket(family, kind, proto)
                s.settimeout(1)
                s.connect(addr)
                s.sendall(MSG)
            except OSError:
                pass
    return "tried"


@route
def socketpair(t):  # sanity: what asyncio needs works
    a, b = socket.socketpair()
    a.sendall(b"x")
    return "ok" if b.recv(1) == b"x" else "no"
'''


def _nothing_arrived(tcp, udp, abstract, unix) -> list[str]:
    got = []
    time.sleep(0.2)
    for name, lst in (("tcp", tcp), ("abstract unix", abstract), ("unix path", unix)):
        try:
            conn, _ = lst.accept()
            conn.close()
            got.append(name)
        except BlockingIOError:
            pass
    try:
        udp.recvfrom(100)
        got.append("udp")
    except BlockingIOError:
        pass
    return got


@pytest.fixture
def listeners(outside):
    """A TCP and a UDP socket on 127.0.0.1, an abstract unix socket and a unix socket in a directory outside; each
    shown to receive what is sent to it before the attack."""
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(16)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    abstract_name = b"\0grpo-attack-" + os.urandom(6).hex().encode()
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(abstract_name)
    abstract.listen(16)
    unix_path = str(outside / "s.sock")
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(unix_path)
    os.chmod(unix_path, 0o777)
    unix.listen(16)
    for s in (tcp, udp, abstract, unix):
        s.setblocking(False)
    # the oracle works: each receives from this process
    probes = [socket.create_connection(tcp.getsockname(), timeout=1)]
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", udp.getsockname())
    for name in (abstract_name, unix_path):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect(name)
        probes.append(c)
    assert sorted(_nothing_arrived(tcp, udp, abstract, unix)) == ["abstract unix", "tcp", "udp", "unix path"]
    for c in probes:
        c.close()
    yield {"tcp": tcp, "udp": udp, "abstract": abstract, "unix": unix, "abstract_name": abstract_name,
           "unix_path": unix_path}
    for s in (tcp, udp, abstract, unix):
        s.close()


def test_no_network_reaches_the_trainers_listeners(sb, listeners):
    """TCP connect, UDP sendto, an abstract unix socket and a unix socket in a directory outside, DNS (getaddrinfo
    of localhost / example.com, then connect): Python, libc and raw syscalls. Oracle: the listeners received
    nothing. Sanity: socketpair() works in the program (asyncio needs it)."""
    L = listeners
    code = program(NET_BODY, PORT=L["tcp"].getsockname()[1], UDP_PORT=L["udp"].getsockname()[1],
                   ABSTRACT=L["abstract_name"], UNIX_PATH=L["unix_path"])
    routes = ["py_tcp", "libc_tcp", "sys_tcp", "py_udp", "libc_udp", "sys_udp", "py_abstract", "libc_abstract",
              "py_unix_path", "libc_unix_path", "py_dns"]
    cases = [NATIVE_CASE] + [(f"{r}\n", "ok") for r in routes] + [("socketpair\n", "ok")]
    (res,) = run_with_honest(sb, [StdioSuite(code, cases)])
    got = _nothing_arrived(L["tcp"], L["udp"], L["abstract"], L["unix"])
    assert not got, f"the program reached the trainer's listeners: {got}; routes that said ok: " \
                    f"{routes_that_said_ok(res, cases)}"
    assert_native_tried(res, "network")
    assert res.passed[-1], f"socketpair() failed in the program (asyncio needs it): {res.detail[-1]}"


# ==== a process left behind ==========================================================================================
LEFT_BODY = r'''
import socket
PORT, MARK = @PORT@, @MARK@


def linger():
    """What a left-behind process does: takes a session of its own, names itself, for 3 s keeps trying to reach
    the trainer's listener, then stays until 20 s have passed."""
    try:
        os.setsid()
    except BaseException:
        pass
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(MARK)
    except BaseException:
        pass
    try:
        lc("prctl", 15, MARK.encode(), 0, 0, 0)  # PR_SET_NAME
    except BaseException:
        pass
    start = time.monotonic()
    while time.monotonic() < start + 3:
        try:
            s = socket.create_connection(("127.0.0.1", PORT), timeout=0.2)
            s.sendall(b"left " + MARK.encode())
            s.close()
        except BaseException:
            pass
        time.sleep(0.05)
    time.sleep(max(0.0, start + 20 - time.monotonic()))  # then stays, to be seen (the test ends it)
    os._exit(0)


def forked(pid):
    if pid == 0:
        linger()
    return "ok"


@route
def py_fork(t):
    return forked(os.fork())


@route
def libc_fork(t):
    return forked(lc("fork"))


@route
def sys_clone(t):
    return forked(sc("clone", 17, 0, 0, 0, 0))  # SIGCHLD only: a fork by raw syscall


@route
def py_double_fork(t):
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            linger()
        os._exit(0)
    os.waitpid(pid, 0)
    return "ok"


@route
def libc_double_fork(t):
    pid = lc("fork")
    if pid == 0:
        lc("setsid")
        if lc("fork") == 0:
            linger()
        os._exit(0)
    os.waitpid(pid, 0)
    return "ok"


SH = "i=0; while [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done; : " + MARK  # 20 s


@route
def py_spawn(t):
    os.posix_spawn("/bin/sh", ["sh", "-c", SH], {}, setsid=True)
    return "ok"


@route
def libc_system(t):
    lc("system", ("(" + SH + ") >/dev/null 2>&1 &").encode())
    return "ok"
'''


def _leftovers(sb: Sandbox, before: set[int], mark: str) -> list[psutil.Process]:
    """Processes of the program that remain: marked ones (comm or cmdline), and descendants of the fork server
    that were not there before the batch (its long-lived processes were). A judge the batch started (a slot's first,
    or one replacing a judge an earlier batch over-ran) is the server's, not the program's: it runs as the judges'
    uid, which a program's process cannot take (it has no capabilities)."""
    judges_uid = confine.JUDGE_UID if "identity" not in sb.missing else None
    out = {}
    with contextlib.suppress(psutil.Error):
        for p in psutil.Process(sb.fork_server_pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if p.pid not in before and p.uids().real != judges_uid:
                    out[p.pid] = p
    for p in psutil.process_iter(["name", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if p.info["name"] == mark or any(mark in a for a in p.info["cmdline"] or ()):
                out[p.pid] = p
    alive = []
    for p in out.values():
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
    return alive


def test_no_process_is_left_behind(sb, listeners):
    """The program forks (os.fork, libc fork, raw clone), setsids, double-forks, posix_spawns a shell with
    setsid, libc system('... &'); what it leaves keeps trying to connect to the trainer's TCP listener for 3 s.
    Oracles: within 10 s after the batch no such process remains (marked by name, or a new descendant of the fork
    server), and the listener received nothing."""
    L = listeners
    mark = "grpoleft" + os.urandom(3).hex()  # 14 chars: fits comm
    code = program(LEFT_BODY, PORT=L["tcp"].getsockname()[1], MARK=mark)
    routes = ["py_fork", "libc_fork", "sys_clone", "py_double_fork", "libc_double_fork", "py_spawn", "libc_system"]
    cases = [NATIVE_CASE] + [(f"{r}\n", "ok") for r in routes]
    before: set[int] = set()
    with contextlib.suppress(psutil.Error):
        before = {p.pid for p in psutil.Process(sb.fork_server_pid).children(recursive=True)}
    (res,) = run_with_honest(sb, [StdioSuite(code, cases)])
    deadline = time.monotonic() + 10
    left = _leftovers(sb, before, mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _leftovers(sb, before, mark)
    described = []
    for p in left:
        with contextlib.suppress(psutil.Error):
            described.append((p.pid, p.name(), p.cmdline()[:4]))
    for p in left:  # processes the test's program started: ended by pid
        with contextlib.suppress(psutil.Error):
            p.kill()
    assert not described, f"processes of the program outlived the batch by 10 s: {described}; routes that said " \
                          f"ok: {routes_that_said_ok(res, cases)}"
    got = _nothing_arrived(L["tcp"], L["udp"], L["abstract"], L["unix"])
    assert not got, f"a process left behind reached the trainer's listener: {got}"
    assert_native_tried(res, "process left behind")


# ==== state left for the next program ================================================================================
STATE_BODY = r'''
TOKEN, KEY, MQ = @TOKEN@, @KEY@, @MQ@


def places():
    found = [".", "..", "/tmp", "/dev/shm", "/var/tmp", os.environ.get("TMPDIR") or "/tmp"]
    try:
        found.append(os.environ.get("HOME") or os.path.expanduser("~"))
    except BaseException:
        pass
    try:
        import tempfile
        found.append(tempfile.gettempdir())
    except BaseException:
        pass
    return found


@route
def write_files(t):
    """'ok' if it could write in its own cwd (the sanity of the route); what it wrote anywhere goes to stderr."""
    done = []
    for d in places():
        p = os.path.join(d, "left-" + TOKEN)
        try:
            with open(p, "w") as f:
                f.write("x")
            done.append(p)
        except BaseException:
            pass
        try:
            os.mkfifo(p + "-fifo")
            done.append(p + "-fifo")
        except BaseException:
            pass
    print("wrote", done, file=sys.stderr)
    return "ok" if os.path.join(".", "left-" + TOKEN) in done else "could not write in its own cwd"


@route
def write_native(t):
    done = []
    for d in places():
        p = os.path.join(d, "left-" + TOKEN + "-n")
        try:
            lc("open", p.encode(), os.O_WRONLY | os.O_CREAT, 0o644)
            done.append(p)
        except BaseException:
            pass
    return " ".join(done) or "nothing"


@route
def write_ipc(t):
    done = []
    for name, call in (("shm", lambda: lc("shmget", KEY, 4096, 0o1000 | 0o666)),
                       ("msg", lambda: lc("msgget", KEY, 0o1000 | 0o666)),
                       ("sem", lambda: lc("semget", KEY, 1, 0o1000 | 0o666)),
                       ("mq", lambda: lc("mq_open", MQ, os.O_CREAT | os.O_RDWR, 0o666, None))):
        try:
            call()
            done.append(name)
        except BaseException:
            pass
    return " ".join(done) or "nothing"


@route
def look(t):
    time.sleep(float(t or 0))
    found = []
    dirs = places()
    try:
        dirs += [os.path.join("..", d) for d in os.listdir("..")]  # other programs' scratch directories
    except BaseException:
        pass
    for d in dirs:
        try:
            found += [os.path.join(d, n) for n in os.listdir(d) if TOKEN in n]
        except BaseException:
            pass
    if NATIVE:
        for name, call in (("shm", lambda: lc("shmget", KEY, 0, 0)), ("msg", lambda: lc("msgget", KEY, 0)),
                           ("sem", lambda: lc("semget", KEY, 0, 0)), ("mq", lambda: lc("mq_open", MQ, os.O_RDONLY))):
            try:
                call()
                found.append(name)
            except BaseException:
                pass
    return " ".join(sorted(set(found))) or "none"
'''


def _host_state(token: str, key: int, mq: bytes) -> list[str]:
    """What the programs left on THIS side (the trainer's /tmp, /dev/shm, home, IPC namespace), removed now."""
    found = []
    home = os.path.expanduser("~")
    for d in {"/tmp", "/dev/shm", "/var/tmp", home, tempfile.gettempdir()}:
        with contextlib.suppress(OSError):
            for n in os.listdir(d):
                if token in n:
                    found.append(os.path.join(d, n))
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(d, n))
    libc = ctypes.CDLL(None, use_errno=True)
    ipc_rmid = 0
    for name, get, rm in (("shm", lambda: libc.shmget(key, 0, 0), lambda i: libc.shmctl(i, ipc_rmid, None)),
                          ("msg", lambda: libc.msgget(key, 0), lambda i: libc.msgctl(i, ipc_rmid, None)),
                          ("sem", lambda: libc.semget(key, 0, 0), lambda i: libc.semctl(i, 0, ipc_rmid))):
        ident = get()
        if ident >= 0:
            found.append(name)
            rm(ident)
    with contextlib.suppress(AttributeError):
        fd = libc.mq_open(mq, os.O_RDONLY)
        if fd >= 0:
            found.append("mq")
            libc.mq_close(fd)
            libc.mq_unlink(mq)
    return found


def test_nothing_is_left_for_the_next_program(sb):
    """A program leaves files and fifos in its cwd, its parent (other programs' scratch), /tmp, /dev/shm, /var/tmp,
    $HOME, $TMPDIR (Python and libc), SysV shm / msg / sem and a POSIX message queue (libc). Programs in the same
    batch (after a pause) and in the next batch list those places and look the IPC objects up: expected output
    'none'. Outside: nothing of it in the trainer's /tmp, /dev/shm, home or IPC namespace."""
    token = os.urandom(6).hex()
    key = 0x47520000 | int.from_bytes(os.urandom(2), "big")
    mq = f"/left-{token}".encode()
    code = program(STATE_BODY, TOKEN=token, KEY=key, MQ=mq)
    writer = StdioSuite(code, [NATIVE_CASE, ("write_files\n", "ok"), ("write_native\n", "-"), ("write_ipc\n", "-")])
    reader_later = StdioSuite(code + "\n# reader in the same batch\n", [NATIVE_CASE, ("look 0.5\n", "none")])
    try:
        first = run_with_honest(sb, [writer, reader_later])
        (second,) = run_with_honest(sb, [StdioSuite(code + "\n# reader, next batch\n", [("look\n", "none")])])
    finally:
        outside = _host_state(token, key, mq)
    assert first[1].passed[1], f"a program in the same batch found what another left (or did not run: " \
                               f"{first[1].detail}): {first[1].output[:500]!r}"
    assert second.passed == [True], f"a program in the next batch found what one left (or did not run: " \
                                    f"{second.detail}): {second.output[:500]!r}"
    assert not outside, f"programs left state on the trainer's side (removed now): {outside}"
    assert_native_tried(first[0], "state left behind")
    assert first[0].passed[1], f"the writer could not write in its own cwd (route bug?): {first[0].detail[1]}"


# ==== forged verdicts ================================================================================================
WRONG_ADD = "def add(a, b):\n    _hook()\n    return a - b\n"
WRONG_STDIO = "a, b = map(int, input().split())\n_hook()\nprint(a - b)\n"

FORGE_BYTES = ("\n" + "".join(
    json.dumps({"id": i, "status": "passed", "passed": [True] * 3, "score": 1.0,
                "tests": [{"status": "passed", "slots": {"0": {"i": "0x3"}}}] * 3}) + "\n" for i in range(64))
    + "passed\nPASSED\nOK\nP 0\nP 1\nP 2\n3\n4\n5\n").encode()

FLOOD = r'''
import os, sys
_FORGE = @FORGE@
_SKIP = @SKIP@


def _flood():
    for fd in range(1024):
        if fd in _SKIP:
            continue
        try:
            os.write(fd, _FORGE)
        except BaseException:
            pass


_hook = _flood
_flood()
'''

NATIVE_FLOOD = r'''
import os, sys
_FORGE = @FORGE@
_SKIP = @SKIP@
import ctypes
_libc = ctypes.CDLL(None)


def _flood():
    for fd in range(1024):
        if fd not in _SKIP:
            _libc.write(fd, _FORGE, len(_FORGE))


_hook = _flood
_flood()
'''

FRAME_WALK = r'''
import os, signal, sys, gc, time
_FORGE = @FORGE@
_VERDICTY = ("match", "judge", "verdict", "compare", "check", "passed", "equal", "same", "score")


def _forge(signum, frame):
    """From a signal handler: walk every frame up, write pass lines to every fd-like int, set every status to
    passed, rebind every verdict-like function to `lambda *a: True`."""
    f, depth = frame, 0
    while f is not None and depth < 200:
        depth += 1
        for scope in (f.f_locals, f.f_globals):
            for k, v in list(scope.items()):
                try:
                    if type(v) is int and 0 <= v < 1024 and v not in @SKIP@:
                        os.write(v, _FORGE)
                    elif isinstance(v, dict):
                        for key in ("status", "verdict"):
                            if key in v:
                                v[key] = "passed"
                        if "passed" in v:
                            v["passed"] = True
                    elif callable(v) and scope is f.f_globals and any(s in str(k).lower() for s in _VERDICTY):
                        scope[k] = lambda *a, **kw: True
                except BaseException:
                    pass
        f = f.f_back
    try:
        for o in gc.get_objects():
            if isinstance(o, dict) and o.get("status") not in (None, "passed"):
                o["status"] = "passed"
    except BaseException:
        pass


signal.signal(signal.SIGALRM, _forge)
signal.setitimer(signal.ITIMER_REAL, 0.001, 0.003)


def _hook():
    os.kill(os.getpid(), signal.SIGALRM)
    end = time.monotonic() + 0.02
    while time.monotonic() < end:
        pass


os.kill(os.getpid(), signal.SIGALRM)
'''

MEMORY = r'''
import os, sys, ctypes


def _poke(s, new):
    """Overwrite an interned str's characters in place (compact ASCII: the characters end the object)."""
    ctypes.memmove(id(s) + sys.getsizeof(s) - len(s) - 1, new.encode(), len(new))


def _hook():
    for old, new in (("raised", "passed"), ("failed", "passed"), ("killed", "passed"), ("wrong", "right"),
                     ("timeout", "success"), ("returned", "passedok"), ("AssertionError", "PassedOkayDone")):
        try:
            _poke(sys.intern(old), new)
        except BaseException:
            pass


_hook()
'''

SCRIBBLE = r'''
import os, sys, ctypes


def _hook():
    """Corrupt its own heap around a fresh object, then carry on (or crash)."""
    junk = bytearray(b"passed\n" * 4096)
    ctypes.memmove(id(object()), bytes(junk), len(junk))
'''

EXITS = {
    "os._exit(0) at import": "import os\ndef _hook():\n    pass\nos._exit(0)\n",
    "sys.exit(0) at import": "import sys\ndef _hook():\n    pass\nsys.exit(0)\n",
    "os._exit(0) in the call": "import os\ndef _hook():\n    os._exit(0)\n",
    "SystemExit in the call": "def _hook():\n    raise SystemExit(0)\n",
    "atexit os._exit(0)": "import atexit, os\ndef _hook():\n    pass\natexit.register(os._exit, 0)\n",
    "atexit flood": "import atexit, os\ndef _hook():\n    pass\n"
                    "atexit.register(lambda: [os.write(fd, @FORGE@) for fd in range(1024) if fd not in @SKIP@])\n",
}

FORGERS = {"fd flood (os.write)": (FLOOD, False), "fd flood (libc.write)": (NATIVE_FLOOD, True),
           "frame walk from a signal handler": (FRAME_WALK, False), "ctypes memory writes": (MEMORY, True),
           "ctypes heap scribble": (SCRIBBLE, True), **{k: (v, False) for k, v in EXITS.items()}}


def _fill(trick: str, skip: set[int]) -> str:
    return trick.replace("@FORGE@", repr(FORGE_BYTES)).replace("@SKIP@", repr(skip))


@pytest.mark.parametrize("name", list(FORGERS))
def test_a_wrong_program_cannot_forge_its_verdicts(sb, name):
    """A wrong `add` (a - b) with a trick that forges a pass in any harness that trusts the program's process:
    pass-like lines on every fd 0..1023, exits at import / in the call / atexit, a signal handler walking the
    frames, ctypes writes over its own memory. In all three formats it scores < 1 (every test fails) while the
    correct program passes the same tests."""
    trick, native = FORGERS[name]
    suites = [AssertSuite(_fill(trick, set()) + WRONG_ADD, TESTS),
              CallSuite(_fill(trick, set()) + WRONG_ADD, "add", CALLS),
              StdioSuite(_fill(trick, {1}) + WRONG_STDIO, STDIO)]  # its stdout is its answer: not flooded
    if native:
        suites.append(native_probe())
    res = run_with_honest(sb, suites)
    forged = [(kind, r.passed, r.detail) for kind, r in zip(("asserts", "call", "stdio"), res) if any(r.passed)]
    assert not forged, f"{name}: a wrong program got passes: {forged}"
    if native:
        assert_native_tried(res[3], name)


WRONG_FLOAT_ADD = "def add(a, b):\n    return float(a + b)\n"
ITEMS = "def items(n):\n    return list(range(n))[::-1]\n"
WRONG_ITEMS = "def items(n):\n    return [7]\n"
AREA = "import math\ndef area(r):\n    return math.pi * r * r\n"
WRONG_AREA = "def area(r):\n    return 3 * r * r\n"
MATH_TESTS = ["assert math.isclose(area(1), math.pi)", "import math\nassert math.isclose(area(2), 4 * math.pi)"]
LETTERS = "from collections import Counter\ndef letters(s):\n    return sorted(s)\n"
COUNTER_TESTS = ["assert Counter(letters('abca')) == Counter('aabc')", "assert Counter(letters('xy'))['x'] == 1"]


def _rebind(name: str, value: str) -> dict[str, str]:
    """The same rebinding as a top-level name and through the builtins module."""
    return {"top-level": f"{name} = {value}\n", "builtins": f"import builtins\nbuiltins.{name} = {value}\n"}


REBINDS = {  # name: (wrong program's function, its rebinding value, the tests, the correct program)
    "abs": (WRONG_ADD.replace("    _hook()\n", ""), "lambda x: 0",
            ["assert abs(add(1, 2) - 3) < 1e-9", "def check(candidate):\n    assert abs(candidate(2, 2) - 4) < 1e-9\n"
             "check(add)"], ADD),
    "all": (WRONG_ADD.replace("    _hook()\n", ""), "lambda it: True",
            ["assert all(add(a, b) == a + b for a, b in [(1, 2), (2, 2)])", "assert all([add(1, 2) == 3])"], ADD),
    "sorted": (WRONG_ITEMS, "lambda *a, **k: 0",
               ["assert sorted(items(3)) == sorted([2, 0, 1])",
                "assert sorted(items(4), reverse=True) == sorted(range(4), reverse=True)"], ITEMS),
    "set": (WRONG_ITEMS, "lambda *a: 0", ["assert set(items(3)) == set([0, 1, 2])",
                                          "assert set(items(2)) == set(range(2))"], ITEMS),
    "range": (WRONG_ADD.replace("    _hook()\n", ""), "lambda *a: []",
              ["for i in range(3):\n    assert add(i, 1) == i + 1",
               "assert [add(i, i) for i in range(3)] == [2 * i for i in range(3)]"], ADD),
    "type": (WRONG_FLOAT_ADD, "lambda *a: int", ["assert type(add(1, 2)) is int and add(1, 2) == 3",
                                                 "assert type(add(2, 2)) == type(4) and add(2, 2) == 4"], ADD),
    "isinstance": (WRONG_FLOAT_ADD, "lambda *a: True",
                   ["assert isinstance(add(1, 2), int) and add(1, 2) == 3",
                    "def check(candidate):\n    assert isinstance(candidate(2, 2), int)\ncheck(add)"], ADD),
}
REBIND_CASES = {f"{name} ({how})": (fn + binding, tests, good)
                for name, (fn, value, tests, good) in REBINDS.items()
                for how, binding in _rebind(name, value).items()}
REBIND_CASES.update({
    "import math as math + patched isclose": (
        "import math as math\nmath.isclose = lambda *a, **k: True\n" + WRONG_AREA, MATH_TESTS, AREA),
    "class math": ("class math:\n    pi = 3\n    @staticmethod\n    def isclose(*a, **k):\n        return True\n"
                   + WRONG_AREA, MATH_TESTS, AREA),
    "Counter rebound (class)": ("def letters(s):\n    return []\nclass Counter(dict):\n"
                                "    def __init__(self, *a):\n        super().__init__(x=1)\n"
                                "    def __eq__(self, o):\n        return True\n    __hash__ = None\n",
                                COUNTER_TESTS, LETTERS),
    "Counter rebound (function)": ("def letters(s):\n    return []\nCounter = lambda *a: {'x': 1}\n",
                                   COUNTER_TESTS, LETTERS),
    "lying __eq__ (int)": ("class Yes(int):\n    def __eq__(self, o):\n        return True\n"
                           "    __hash__ = int.__hash__\ndef add(a, b):\n    return Yes(a - b)\n",
                           TESTS + ["assert 3 == add(1, 2)"], ADD),
    "lying list (__eq__ __ne__ __contains__ __len__)": (
        "class Liar(list):\n    def __eq__(self, o):\n        return True\n    def __ne__(self, o):\n"
        "        return False\n    def __contains__(self, x):\n        return True\n    def __len__(self):\n"
        "        return 3\n    __hash__ = None\ndef evens(n):\n    return Liar()\n",
        ["assert evens(5) == [0, 2, 4]", "assert [0, 2, 4] == evens(5)", "assert 2 in evens(5) and 4 in evens(5)",
         "assert len(evens(5)) == 3", "assert not evens(5) != [0, 2, 4]"],
        "def evens(n):\n    return [k for k in range(n) if k % 2 == 0]\n"),
    # (a __bool__ that alternates is asked as CPython asks it: it can do no more than a function that alternates
    # the bools it returns, which any judge scores as it answers)
})


@pytest.mark.parametrize("name", list(REBIND_CASES))
def test_rebinding_names_or_lying_objects_forges_nothing(sb, name):
    """Names a test uses, rebound by the program (top level and builtins), `import math as math` with a patched
    isclose, `class math`, `Counter` used by the test without an import, objects whose __eq__ / __ne__ /
    __contains__ / __len__ / __bool__ lie: every test fails for the wrong program and passes for the correct one,
    in the same batch (asserts; the call-based format for the returned liars)."""
    wrong, tests, good = REBIND_CASES[name]
    suites = [AssertSuite(wrong, tests), AssertSuite(good, tests)]
    call = name.startswith("lying __eq__")
    if call:
        suites += [CallSuite(wrong, "add", CALLS), CallSuite(good, "add", CALLS)]
    res = run_with_honest(sb, suites)
    assert res[0].passed == [False] * len(tests), f"{name}: the wrong program got passes: {res[0]}"
    assert res[1].passed == [True] * len(tests), f"{name}: the correct program does not pass these tests: {res[1]}"
    if call:
        assert not any(res[2].passed) and res[3].score == 1.0, (res[2], res[3])


# ==== oversized and costly values ====================================================================================
BATCH_BOUND_S = 20.0  # a batch of an attacker and three honest programs (wall_s 2 s per test) finishes within this
RSS_BOUND_MB = 200  # the trainer process grows by less than this while judging it
RSS_KILL_MB = 3072  # safety: a run whose trainer passes this is stopped at once

RUNNER = r'''
import json, sys, time
from grpo_plugin.sandbox import AssertSuite, CallSuite, Limits, Sandbox, StdioSuite


def build(s):
    if s[0] == "assert":
        return AssertSuite(s[1], s[2])
    if s[0] == "call":
        return CallSuite(s[1], s[2], [tuple(c) for c in s[3]])
    return StdioSuite(s[1], [tuple(c) for c in s[2]])


specs = json.loads(sys.argv[1])
sb = Sandbox(Limits(wall_s=2))
sb.run_suites([AssertSuite("x = 1\n", ["assert x == 1"])])
print(json.dumps({"zygote": sb.fork_server_pid}), flush=True)
sys.stdin.readline()
t0 = time.monotonic()
res = sb.run_suites([build(s) for s in specs])
print(json.dumps({"elapsed": time.monotonic() - t0, "passed": [r.passed for r in res],
                  "detail": [[d[:200] for d in r.detail] for r in res]}), flush=True)
sys.stdin.readline()
sb.close()
'''


def rss_mb(pid: int) -> float:
    st = proc_status(pid) or {}
    return int(st.get("VmRSS", "0 kB").split()[0]) / 1024


def run_in_a_trainer(specs: list) -> dict:
    """The batch judged by a Sandbox in a trainer process of its own (a judge stuck in C holds the GIL: this
    process must stay free to time it out), watched from here: its RSS every 10 ms, its time, and the fork server's
    RSS before and after."""
    honest_specs = [["assert", ADD, TESTS], ["call", ADD, "add", CALLS], ["stdio", ADD_STDIO, STDIO]]
    err = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, json.dumps(specs + honest_specs)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    try:
        try:
            started = json.loads(lines.get(timeout=60))
        except (queue.Empty, ValueError):
            proc.kill()
            proc.wait()
            err.seek(0)
            pytest.fail(f"the trainer process did not start its sandbox: {err.read()[-2000:]!r}")
        zygote = started["zygote"]
        base, zbase = rss_mb(proc.pid), rss_mb(zygote)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        t0 = time.monotonic()
        peak, out, why = base, None, ""
        while out is None:
            try:
                out = json.loads(lines.get(timeout=0.01))
            except queue.Empty:
                pass
            peak = max(peak, rss_mb(proc.pid))
            if peak > RSS_KILL_MB:
                why = f"the trainer passed {RSS_KILL_MB} MB"
            elif time.monotonic() - t0 > BATCH_BOUND_S:
                why = f"the batch did not finish within {BATCH_BOUND_S:.0f} s"
            if why:
                break
        elapsed = time.monotonic() - t0
        zafter = rss_mb(zygote)
        if why:  # stuck (a judge in C never reads its stdin again) or too big: ended now
            proc.kill()
        return {"out": out, "why": why, "elapsed": elapsed, "growth_mb": peak - base,
                "zygote_growth_mb": zafter - zbase}
    finally:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.stdin.write("done\n")
                proc.stdin.flush()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()  # the fork server is tethered to it: it goes too
                proc.wait()
        err.close()


COSTLY = {
    "20 asserts returning 16 MB each": [
        ["assert", "def f(k):\n    return 'x' * (16 << 20)\n", [f"assert f({k}) == 'ok'" for k in range(20)]]],
    "40k hash-colliding ints": [
        ["assert", "M = 2 ** 61 - 1\ndef f():\n    return [k * M for k in range(40000)]\n"
                   "def g():\n    return {k * M for k in range(40000)}\n",
         ["assert set(f()) == {1}", "assert len(set(f())) == 1", "assert dict.fromkeys(f()) == {}",
          "assert frozenset(f()) == frozenset()", "assert g() == {1}"]]],
    "range(10**18)": [
        ["assert", "def f():\n    return range(10 ** 18)\n",
         ["assert 'x' in f()", "assert 0.5 in f()", "assert f().count('x') == 1", "assert list(f()) == []",
          "assert sum(f()) == 0"]]],
    "a 16M-bit int squared": [
        ["assert", "def f():\n    return 1 << (1 << 24)\n",
         ["assert f() ** 2 == 1", "assert f() * f() == 1", "assert f() ** 3 == 1", "assert f() ** f() == 0"]],
        ["call", "def f():\n    return 1 << (1 << 24)\n", "f", [[[], 1]]]],
    "a returned value repeated by the test": [
        ["assert", "def f():\n    return 'x' * 1000\ndef g():\n    return b'y' * 1000\ndef h():\n"
                   "    return [0] * 1000\n",
         ["assert f() * 10 ** 6 == 'ab'", "assert g() * 10 ** 6 == b''", "assert h() * 10 ** 5 == []",
          "assert f() * 10 ** 9 == ''"]]],
}


@pytest.mark.parametrize("name", list(COSTLY))
def test_oversized_and_costly_values_are_contained(name):
    """A returned value whose size or cost is the attack: its tests fail, the batch (the attacker and three honest
    programs) finishes within BATCH_BOUND_S (20 s), the trainer grows by < RSS_BOUND_MB (200 MB) while judging it
    and the fork server keeps < 200 MB of it afterwards, and the honest programs keep score 1.0."""
    specs = COSTLY[name]
    r = run_in_a_trainer(specs)
    assert not r["why"], f"{name}: {r['why']} (after {r['elapsed']:.1f} s, trainer +{r['growth_mb']:.0f} MB)"
    out = r["out"]
    attack, good = out["passed"][:len(specs)], out["passed"][len(specs):]
    assert all(not any(p) for p in attack), f"{name}: a costly test passed: {attack} {out['detail'][:len(specs)]}"
    assert all(p and all(p) for p in good), f"{name}: an honest program lost its verdict: {good} " \
                                            f"{out['detail'][len(specs):]}"
    assert out["elapsed"] < BATCH_BOUND_S, f"{name}: the batch took {out['elapsed']:.1f} s"
    assert r["growth_mb"] < RSS_BOUND_MB, f"{name}: the trainer grew by {r['growth_mb']:.0f} MB judging it"
    assert r["zygote_growth_mb"] < RSS_BOUND_MB, f"{name}: the fork server kept {r['zygote_growth_mb']:.0f} MB"


def test_the_syscall_table_covers_this_machine():
    """The raw syscall numbers the attacks use exist for this architecture (else every sys_* route would only
    raise KeyError and test nothing)."""
    assert os.uname().machine in NR, f"no syscall table for {os.uname().machine}: add it to NR"
