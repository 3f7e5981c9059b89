"""The sandbox's fork server. Started by sandbox/host.py as `python -I -S -c "import zygote; zygote.main()" CONFIG`
(standard library only, no site-packages, an empty environment; imported, so its bytecode is cached) and fed by
it. It never runs model-written code itself and never judges: it runs one child per program (stdin/stdout tests
too: one run each), collects what the child computed, and sends that to the trainer side, which judges
(sandbox/judge.py). Nothing a job carries here holds an expected value: the tests' expected sides stay in the
trainer, so no child can read them, whatever it reaches in memory.

Two processes. The server (`Zygote`) reads jobs, compiles programs, keeps deadlines, reads the children's pipes
and replies; it never forks after its start, so the pages its bookkeeping writes stay its own. The template
(`Template`, `_template_loop`), forked once from the server when everything a child needs is loaded, only forks a
child per request and collects it when asked: each page a process writes while children share its memory must
be copied first, so the one that forks does as little as possible.

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

import atexit
import builtins
import collections
import io
import json
import marshal
import os
import resource
import selectors
import signal
import stat
import struct
import sys
import time
import warnings

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
# Operations refused (PermissionError inside the program, which may catch it). Imports of the modules that hold
# them work; refusing the import was stricter than a real locked-down machine and failed correct solutions that
# import `resource` or `socket` and never use them (or handle the failure).
BLOCKED_EVENTS = {
    "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "os.popen",
    "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill", "os.setns", "os.unshare",
    "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
    "socket.sethostname", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function",
    "ctypes.addressof", "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._getframe",
    "sys._current_frames", "sys._current_exceptions", "sys._getframemodulename", "sys.settrace",
    "sys.setprofile", "os.chroot", "os.chown", "os.setxattr", "os.removexattr", "os.link", "os.symlink",
    "shutil.chown", "resource.prlimit", "fcntl.ioctl", "sys.remote_exec", "os.putenv", "os.unsetenv",
    "mmap.__new__", "code.__new__", "os.mkfifo", "os.mknod",
}
# Refused at import, each for a reason no per-call check can cover:
BLOCKED_IMPORTS = {
    "ctypes": "raw memory and foreign calls: everything else here could be undone",
    "_ctypes": "raw memory and foreign calls", "cffi": "foreign calls", "_cffi_backend": "foreign calls",
    "mmap": "shared memory mappings", "_posixsubprocess": "fork+exec without an audit event",
    "pty": "forks a process", "faulthandler": "writes other threads' stacks to any descriptor",
    "tracemalloc": "walks every allocation's frames", "_tracemalloc": "walks every allocation's frames",
    "_xxsubinterpreters": "new interpreters without this audit hook",
    "_interpreters": "new interpreters without this audit hook",
    "_sqlite3": "SQLite makes files itself (ATTACH) with no audit event: the cap on files written would not hold",
    "_dbm": "makes files with no audit event", "_gdbm": "makes files with no audit event",
}
FRAME_ATTRS = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "f_globals", "f_locals", "__code__",
               "gi_code", "cr_code", "f_builtins"}
OUT_READ_CAP = 1024  # diagnostics kept per job (stderr, and stdout for calls)
# server -> template: (kind, size of what follows or pid, scratch slot); template -> server: (kind, pid or -errno,
# wait status)
_HEAD, _ANSWER = struct.Struct("=cQq"), struct.Struct("=cqq")


class SandboxViolation(PermissionError):
    pass


# ---- Landlock (Linux >= 5.13): syscalls through libc, bound at start; the child drops them after use ----------
_SYSCALL = None
_PRCTL = None
_LL_CREATE, _LL_ADD_RULE, _LL_RESTRICT = 444, 445, 446  # the same numbers on every Linux architecture
_FS = {name: 1 << bit for bit, name in enumerate((
    "execute", "write_file", "read_file", "read_dir", "remove_dir", "remove_file", "make_char", "make_dir",
    "make_reg", "make_sock", "make_fifo", "make_block", "make_sym", "refer", "truncate", "ioctl_dev"))}
_ABI_FS_BITS = {1: 13, 2: 14, 3: 15, 4: 15, 5: 16}  # rights each ABI version knows


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when it has none (or it is disabled)."""
    if _SYSCALL is None:
        return 0
    v = _SYSCALL(_LL_CREATE, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    return max(0, int(v))


class Landlock:
    """The rules every child gets, prepared once here (paths opened as O_PATH descriptors, the ruleset attribute
    packed); `ruleset(scratch)` builds, in the template, one ruleset per scratch directory from them plus that
    directory, and a child restricts itself with its directory's (`restrict`). Children of different directories
    never share one: each would see the others' scratch dirs."""

    def __init__(self, abi: int, readable: tuple[str, ...]):
        self.pack = struct.pack
        fs_all = sum(v for v in _FS.values() if v < (1 << _ABI_FS_BITS.get(abi, 16)))
        self.attr = _make_buffer(struct.pack("=QQQ", fs_all, 0b11 if abi >= 4 else 0, 0b11 if abi >= 6 else 0))
        self.size = 24 if abi >= 6 else 16 if abi >= 4 else 8
        file_rights = _FS["read_file"] | _FS["write_file"] | (_FS["truncate"] if abi >= 3 else 0)
        self.scratch_rights = file_rights | _FS["read_dir"] | _FS["remove_dir"] | _FS["remove_file"] \
            | _FS["make_dir"] | _FS["make_reg"]
        wanted = [(r, _FS["read_file"] | _FS["read_dir"]) for r in readable]
        wanted += [("/dev/null", _FS["read_file"] | _FS["write_file"]), ("/dev/zero", _FS["read_file"]),
                   ("/dev/urandom", _FS["read_file"]), ("/dev/random", _FS["read_file"])]
        self.static = []  # one packed rule per path, its O_PATH descriptor kept open here for every child
        for path, rights in wanted:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                rights &= _FS["read_file"] | _FS["write_file"] | _FS["truncate"] | _FS["execute"]
            self.static.append(_make_buffer(struct.pack("=Qi", rights, fd)))

    def ruleset(self, scratch: str) -> int:
        """A ruleset of these rules and `scratch` (read, write, make and remove files and directories), as a
        descriptor: built in the template once per scratch directory, never changed after; each child of that
        directory restricts itself with it."""
        syscall, pack, buf = _SYSCALL, self.pack, _make_buffer
        rs = syscall(_LL_CREATE, self.attr, self.size, 0)
        if rs < 0:
            raise OSError("landlock_create_ruleset failed")
        try:
            sfd = os.open(scratch, os.O_PATH | os.O_CLOEXEC)
            try:
                for rule in [*self.static, buf(pack("=Qi", self.scratch_rights, sfd))]:
                    if syscall(_LL_ADD_RULE, rs, 1, rule, 0) != 0:
                        raise OSError("landlock_add_rule failed")
            finally:
                os.close(sfd)
        except BaseException:
            os.close(rs)
            raise
        return rs

    @staticmethod
    def restrict(ruleset: int) -> None:
        """In the child: restrict it for good with `ruleset`. Raises OSError on failure."""
        if ruleset < 0:
            raise OSError("no Landlock ruleset for this scratch directory")
        if _PRCTL(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: required to restrict oneself without privileges
            raise OSError("prctl(PR_SET_NO_NEW_PRIVS) failed")
        if _SYSCALL(_LL_RESTRICT, ruleset, 0) != 0:
            raise OSError("landlock_restrict_self failed")

_make_buffer = None  # ctypes.create_string_buffer, bound at start
_REFCNT = [None]  # ctypes.c_ssize_t.from_address, bound at start, dropped once the template is forked


def _immortalize() -> int:
    """Make every object loaded so far immortal (PEP 683, Python >= 3.12: reference counts of such objects are never
    written), just before the template is forked: a child that uses a module, a function or a constant then writes
    nothing to the page it lies on, where each write to a page shared with the template cost a copy-on-write fault
    (measured: 18% fewer faults per child, 13% less of its time). These objects live as long as the template
    anyway. Returns how many were made so (0 on Python 3.11, which has no immortal objects)."""
    set_refcnt, _REFCNT[0] = _REFCNT[0], None
    if sys.version_info < (3, 12) or set_refcnt is None:
        return 0
    import gc

    immortal = 0xFFFFFFFF  # _Py_IMMORTAL_REFCNT on a 64-bit build (the low half all ones, the high half zero)
    if sys.maxsize < 2 ** 32:
        return 0
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


class Opaque:
    """A value of a type the program defined (in the trainer: sent as its type's name; values.py decodes it to this
    class too): equal to nothing, not a truth value."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = str(name)[:80]

    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return True

    __hash__ = object.__hash__

    def __bool__(self):
        raise TypeError(f"a {self.name} (a type the program defined) cannot be judged: return builtin values")

    def __repr__(self):
        return f"<{self.name}>"


# ---- what a child sends back: its values as plain, typed JSON (decoded, untrusted, by sandbox/values.py) ----
def _make_plain():
    """(plain, encode), built before the program runs. plain(x): a copy of `x` made of builtin values only, read
    through the builtin types' own slots (a subclass cannot lie about its value); an object of a type the
    program defines becomes an Opaque, equal to nothing. encode(x): plain(x) as typed JSON for the trainer.
    (The program could still send anything on its channel: it never sees what a value is compared with, so
    that buys it nothing.)"""
    type_, repr_, hex_, list_, str_ = type, repr, hex, list, str
    int_int, float_float = int.__int__, float.__float__
    str_str, bytes_bytes = str.__str__, bytes.__bytes__
    list_iter, tuple_iter, dict_items, set_iter, fs_iter = list.__iter__, tuple.__iter__, dict.items, \
        set.__iter__, frozenset.__iter__
    c_real, c_imag = complex.real.__get__, complex.imag.__get__
    builtin_types = {t: t.__name__ for t in (int, float, complex, str, bytes, bool, list, tuple, dict, set,
                                             frozenset, type(None), bytearray, range, object, type)}
    max_items = 1_000_000
    budget = [0]

    def plain(x, depth=0):
        if depth > 100:
            raise ValueError("nested deeper than 100")
        budget[0] += 1
        if budget[0] > max_items:
            raise ValueError(f"more than {max_items} values")
        if x is None or x is True or x is False:
            return x
        t = type_(x)
        if t is type:
            return x if x in builtin_types else Opaque("class")
        for base in t.__mro__:
            if base is int:
                return int_int(x)
            if base is float:
                return float_float(x)
            if base is complex:
                return complex(float_float(c_real(x)), float_float(c_imag(x)))
            if base is str:
                return str_str(x)
            if base is bytes:
                return bytes_bytes(x)
            if base is bytearray:
                return bytearray(bytes(x))
            if base is list:
                return [plain(e, depth + 1) for e in list_(list_iter(x))]
            if base is tuple:
                return tuple(plain(e, depth + 1) for e in list_(tuple_iter(x)))
            if base is dict:
                return {plain(k, depth + 1): plain(v, depth + 1) for k, v in list_(dict_items(x))}
            if base is set:
                return {plain(e, depth + 1) for e in list_(set_iter(x))}
            if base is frozenset:
                return frozenset(plain(e, depth + 1) for e in list_(fs_iter(x)))
            if base is range:
                return range(int_int(x.start), int_int(x.stop), int_int(x.step))
        return Opaque(str_(getattr(t, "__name__", "?"))[:80])

    def tag(p):
        t = type_(p)
        if p is None or t is bool or t is str:
            return p
        if t is int:
            return {"i": hex_(p)}
        if t is float:
            return {"f": repr_(p)}
        if t is complex:
            return {"c": [repr_(p.real), repr_(p.imag)]}
        if t is bytes:
            return {"b": p.hex()}
        if t is bytearray:
            return {"ba": bytes(p).hex()}
        if t is list:
            return [tag(e) for e in p]
        if t is tuple:
            return {"t": [tag(e) for e in p]}
        if t is dict:
            return {"d": [[tag(k), tag(v)] for k, v in p.items()]}
        if t is set:
            return {"s": [tag(e) for e in p]}
        if t is frozenset:
            return {"fs": [tag(e) for e in p]}
        if t is range:
            return {"r": [p.start, p.stop, p.step]}
        if t is type:
            return {"y": builtin_types[p]}
        return {"o": p.name}

    def plain_value(x):
        budget[0] = 0
        return plain(x)

    plain_value.builtins = dict(builtins.__dict__)  # as they are before the program runs (tests' slots use them)

    # json's C encoder made once here (JSONEncoder.encode makes one per call, and looks its methods up on a class
    # the program can reach: `import json`); what it encodes is tag()'s output, builtin types only, a tree
    from json.encoder import c_make_encoder, encode_basestring_ascii

    if c_make_encoder is not None:
        chunks, join = c_make_encoder(None, None, encode_basestring_ascii, None, ":", ",", False, False, True), \
            "".join

        def dumps(x) -> str:
            return join(chunks(x, 0))
    else:  # no _json extension: the pure-Python encoder
        dumps = json.JSONEncoder(separators=(",", ":")).encode

    def encode(x) -> str:
        return dumps(tag(plain_value(x)))

    return plain_value, encode


# ---- the child -----------------------------------------------------------------------------------------
def _audit_hook(readable: tuple[str, ...], max_files: int):
    """(hook, scratch): the children's audit hook, built once before the template forks any (each child gets it
    fresh, its count of files at 0), and the one-item list through which a child tells it its scratch directory
    before adding it. Bound to locals: nothing the program can reach changes what it refuses (a hook cannot be
    read back from Python). Opens for writing, directories made and renames are counted: past `max_files` they are
    refused (RLIMIT_FSIZE caps each file, so the scratch directory, on the trainer's disk, cannot be filled)."""
    where = [""]
    blocked, blocked_imports, frame_attrs = frozenset(BLOCKED_EVENTS), dict(BLOCKED_IMPORTS), \
        frozenset(FRAME_ATTRS)
    fspath, realpath, isinstance_, str_, int_ = os.fspath, os.path.realpath, isinstance, str, int
    getrlimit, infinity = resource.getrlimit, resource.RLIM_INFINITY
    dev_ok = ("/dev/null", "/dev/urandom", "/dev/random", "/dev/zero")
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    made = [0]  # opens for writing, mkdir, rename: every one counts (a dir_fd makes path strings ambiguous)

    def count() -> None:
        made[0] += 1
        if made[0] > max_files:
            raise SandboxViolation(f"sandbox: more than {max_files} files written (each at most RLIMIT_FSIZE)")

    def inside(path, roots) -> bool:
        p = realpath(fspath(path))
        return any(p == r or p.startswith(r + "/") for r in roots)

    def raising(new, old) -> bool:  # a limit above the current hard one (RLIM_INFINITY is the largest)
        return old != infinity and (new == infinity or new < 0 or new > old)

    def hook(event, args):
        if event in blocked:
            raise SandboxViolation(f"sandbox: {event} is not permitted")
        if event == "import":
            why = blocked_imports.get(args[0].partition(".")[0])
            if why is not None:
                raise SandboxViolation(f"sandbox: import {args[0]} is not permitted ({why})")
        elif event == "resource.setrlimit":
            res, limits = args[0], args[1]
            try:
                soft, hard = limits
                cur_hard = getrlimit(res)[1]
                bad = raising(hard, cur_hard) or raising(soft, cur_hard)
            except Exception:  # noqa: BLE001 - malformed arguments: setrlimit itself will say so
                bad = False
            if bad:
                raise SandboxViolation("sandbox: raising a resource limit is not permitted")
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
            if writing and path != "/dev/null":
                count()
            if inside(path, (where[0],)):
                return
            if not writing and (path in dev_ok or inside(path, readable)):
                return
            if path == "/dev/null":
                return
            raise SandboxViolation(f"sandbox: open({path!r}) is outside the sandbox")
        elif event in ("os.remove", "os.rmdir", "os.mkdir", "os.rename", "os.chmod", "os.utime", "os.chdir",
                       "shutil.rmtree", "shutil.move", "shutil.copyfile", "os.listdir", "os.scandir",
                       "os.truncate"):
            if event in ("os.mkdir", "os.rename", "shutil.copyfile", "shutil.move"):
                count()
            for a in args:
                if isinstance_(a, (str_, bytes)) or hasattr(a, "__fspath__"):
                    p = fspath(a)
                    if isinstance_(p, bytes):
                        p = p.decode(errors="replace")
                    if not inside(p, (where[0],)) and not (event in ("os.listdir", "os.scandir")
                                                           and inside(p, readable)):
                        raise SandboxViolation(f"sandbox: {event}({p!r}) is outside the sandbox")
    return hook, where


def _child_statics(readable: tuple[str, ...], max_files: int) -> tuple:
    """What every child installs before its program runs, built once in the template (each child gets a pristine
    copy: nothing to build, less memory written per child): the audit hook and its scratch slot, a fresh
    `__main__` (the server's globals out of reach), and the `_posixsubprocess` stub: `import subprocess` works and
    refuses to start anything (the real module's import is refused by the audit hook, and was never loaded). The
    stub's function is defined in the stub itself: a function of this module would lead to its globals."""
    import types

    hook, where = _audit_hook(readable, max_files)
    main = types.ModuleType("__main__")
    stub = types.ModuleType("_posixsubprocess")
    exec("def fork_exec(*args, **kwargs):\n"  # noqa: S102 - constant code
         "    raise PermissionError('sandbox: starting a process is not permitted')\n", stub.__dict__)
    return hook, where, main, stub


def _child(payload: bytes, fd_list: list[int], ruleset: int, limits: dict, landlock: Landlock | None,
           plain_encode: tuple, statics: tuple) -> None:
    """In a child the template forked: limits, then the program, then its tests [start, end). `payload` is what the
    server sent for this run (marshal: compiled in the server, which never forks); `fd_list` its pipes' write
    ends (verdicts, stdout[, stderr]). Never returns."""
    global _SYSCALL, _PRCTL, _make_buffer
    write, exit_, w = os.write, os._exit, fd_list[0]
    fds = {"w": w, "out": fd_list[1]}
    if len(fd_list) > 2:
        fds["err"] = fd_list[2]
    try:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: it dies with the template, whatever kills that
        mode, start, end, nonce, scratch, scratch_real, cpu, program, test_code, parent = marshal.loads(payload)
        inputs = fd_list[3:]  # stdio: each test's input, a memory file the server wrote (fd 0 when its test runs)
        del payload
    except BaseException:  # noqa: BLE001 - the server's own bytes: cannot happen; ends with no line (killed)
        exit_(0)
    stdio = mode == "stdio"
    try:
        if os.getppid() != parent:  # the template ended before PR_SET_PDEATHSIG took hold
            exit_(0)
        os.setpgid(0, 0)  # its own process group, killed as one (not setsid: a session costs a scheduler group)
        os.dup2(os.open("/dev/null", os.O_RDONLY), 0)  # stdio tests: each test's input replaces it
        os.dup2(fds["out"], 1)
        os.dup2(fds.get("err", fds["out"]), 2)
        if landlock is not None:
            landlock.restrict(ruleset)
        low = 3  # every inherited descriptor but the verdict pipe and the inputs (the Landlock rule paths too)
        for keep in sorted([w, *inputs]):
            os.closerange(low, keep)
            low = keep + 1
        os.closerange(low, limits["max_fd_scan"])
        os.chdir(scratch)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"], limits["memory_bytes"]))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits["output_bytes"], limits["output_bytes"]))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.environ.clear()
        _SYSCALL = _PRCTL = _make_buffer = None  # libc's entry points: gone before any program code runs
        import gc

        if not stdio:  # a short-lived child: no collector passes (stdio runs every test: cycles must be freed)
            gc.disable()
        sys.argv[:] = ["solution.py"]
        namespace = {"__name__": "__main__" if stdio else "solution", "__builtins__": builtins}
        tests = []
        for code in test_code:  # compiled in the fork server, once per distinct test
            if code is None:
                tests.append(None)
                continue
            scope = {}
            exec(code, namespace, scope)
            tests.append(scope["__grpo_test__"])
        plain, encode = plain_encode
        base_exc, system_exit = BaseException, SystemExit
        flush_out, flush_err = sys.stdout.flush, sys.stderr.flush

        def rec(i: int, lines: list):
            def record(k, thunk):  # one slot of test i: the value it computed, or the exception it raised
                try:
                    value = thunk()
                except base_exc as exc:  # noqa: BLE001
                    lines.append(f"{nonce} R {i} {k} {type(exc).__name__}\n")
                    return
                try:
                    lines.append(f"{nonce} V {i} {k} {encode(value)}\n")
                except base_exc as exc:  # noqa: BLE001
                    lines.append(f"{nonce} U {i} {k} {type(exc).__name__}\n")
            return record

        hook, where, sys.modules["__main__"], sys.modules["_posixsubprocess"] = statics
        sys.modules.pop(__name__, None)  # this module (imported by the launcher), out of the program's reach
        if stdio:
            run_stdio = _stdio_runner(start, end, nonce, inputs, program)
        where[0] = scratch_real
        sys.addaudithook(hook)
        del limits, fds, statics, hook, where
    except BaseException as exc:  # noqa: BLE001 - a setup failure is reported, not raised
        write(w, f"{nonce} X setup {type(exc).__name__}: {exc}\n".encode())
        exit_(0)
    try:
        if stdio:
            run_stdio(program)  # never returns
        exec(program, namespace)
    except system_exit as exc:
        if exc.code not in (None, 0):
            write(w, f"{nonce} E exit status {exc.code!r}"[:200].encode() + b"\n")
            exit_(0)
    except base_exc as exc:  # noqa: BLE001
        write(w, f"{nonce} E {type(exc).__name__}\n".encode())
        exit_(0)
    try:
        flush_out()
        flush_err()
    except base_exc:  # noqa: BLE001
        pass
    write(w, f"{nonce} D\n".encode())
    # test i runs from the end of test i-1 (or D) on: no start line; its slots and its end go in one write
    for i, test in enumerate(tests, start):
        lines: list = []
        if test is None:
            lines.append(f"{nonce} F {i} SyntaxError\n")
        else:
            try:
                verdict = test(rec(i, lines), plain)
            except base_exc as exc:  # noqa: BLE001
                lines.append(f"{nonce} F {i} {type(exc).__name__}\n")
            else:
                # a test judged here (one the trainer could not split): its own verdict, nonce-protected
                lines.append(f"{nonce} {'P' if verdict is True else 'T'} {i}\n")
        write(w, "".join(lines).encode())
    exit_(0)


def _stdio_runner(start: int, end: int, nonce: str, inputs: list[int], program):
    """In the child, before the audit hook: a function that runs stdin/stdout tests [start, end) one after the
    other, each as a fresh `__main__` with its own input on fd 0 (`inputs[i - start]`: a memory file the fork server
    wrote, seekable like a file on disk; the program could read, close or replace a later test's descriptor, which
    costs only its own later tests: their expected outputs stay in the trainer), and ends the
    child. After each run, what the interpreter does at exit: non-daemon threads joined, atexit handlers run,
    sys.stdout/sys.stderr flushed (fast-IO templates buffer output until then). Then `NUL nonce T|F i ...` on
    stdout itself, so the fork server splits the output stream per test in order. Everything it calls is bound
    here, before the program runs (nothing the program rebinds changes it); the program could still write a
    status of its own only by knowing the nonce, and it would only misplace its own output."""
    write, exit_, dup2, close = os.write, os._exit, os.dup2, os.close
    io_open, modules, sys_, builtins_, base_exc, system_exit = io.open, sys.modules, sys, builtins, BaseException, \
        SystemExit
    type_, str_, none = type, str, None
    run_exitfuncs, clear_exitfuncs = atexit._run_exitfuncs, atexit._clear
    std_out, std_err, enc, errs = sys.stdout, sys.stderr, sys.stdin.encoding, sys.stdin.errors
    mark = f"\0{nonce} "

    def word(text) -> str:
        return "".join(str_(text).split())[:80] or "?"

    def like_exit():  # what the interpreter would do at exit (the program's own code may run here)
        th = modules.get("threading")
        if th is not None:
            main = th.main_thread()
            for t in th.enumerate():
                if t is not main and not t.daemon:
                    t.join()
        run_exitfuncs()
        clear_exitfuncs()
        for stream in (sys_.stdout, sys_.stderr):
            if stream is not none:
                stream.flush()

    def run(code) -> None:
        for i in range(start, end):
            status = f"T {i}"
            try:
                dup2(inputs[i - start], 0)
                close(inputs[i - start])
                sys_.stdin = sys_.__stdin__ = io_open(0, "r", encoding=enc, errors=errs, closefd=False)
                sys_.stdout, sys_.__stdout__, sys_.stderr, sys_.__stderr__ = std_out, std_out, std_err, std_err
            except base_exc as exc:  # noqa: BLE001 - an earlier test closed its input
                status = f"F {i} no input ({word(type_(exc).__name__)})"
            else:
                try:
                    exec(code, {"__name__": "__main__", "__builtins__": builtins_})
                except system_exit as exc:
                    if exc.code is not none and exc.code != 0:
                        status = f"F {i} exit status {word(exc.code)}"
                except base_exc as exc:  # noqa: BLE001
                    status = f"F {i} the program raised {word(type_(exc).__name__)}"
                try:
                    like_exit()
                except base_exc:  # noqa: BLE001 - as at exit: reported on stderr by Python, not a failure
                    pass
            try:
                std_out.flush()
                std_err.flush()
            except base_exc:  # noqa: BLE001
                pass
            try:
                write(1, f"{mark}{status}\n".encode())
            except base_exc:  # noqa: BLE001 - the program closed or replaced fd 1: this test ends the child
                exit_(70)
        exit_(0)
    return run


# ---- the zygote ----------------------------------------------------------------------------------------
class ProtocolError(Exception):
    pass


class _Run:
    """One child running `job`'s tests [start, end)."""

    def __init__(self, job, start, end, pid, fds, slot, nonce, limits):
        self.job, self.start, self.end, self.pid, self.slot, self.nonce = job, start, end, pid, slot, nonce
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


class TemplateGone(Exception):
    pass


class Template:
    """The process that forks the children, as the server sees it. Forked once from the server when everything a
    child needs is loaded (modules, Landlock rules, the value encoder), it does nothing else from then on: fork a
    child per `spawn`, collect one per `reap`. The server itself never forks again, so the pages its bookkeeping
    writes stay its own: when it forked every child, each page it wrote after a fork was shared with the children
    still running and had to be copied first (~250 copy-on-write faults per program, 40% of its time)."""

    def __init__(self, child_main, landlock: Landlock | None):
        """child_main(payload, fds, ruleset): what a child runs (never returns). Requests are answered in order,
        without waiting on them here: the server goes on serving the other children meanwhile."""
        import socket

        self.socket = socket
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        server = os.getpid()
        pid = os.fork()
        if pid == 0:
            ours.close()
            try:
                _template_loop(theirs, server, child_main, landlock)
            finally:
                os._exit(0)
        theirs.close()
        self.sock, self.pid, self.buf = ours, pid, b""

    def spawn(self, payload: bytes, fds: list[int], slot: int) -> None:
        """Ask for a child running `payload` with `fds` (the template closes its copies once it forked) in scratch
        directory `slot`. Answered, in order, by ("P", pid, 0), or ("P", -errno, 0) when fork failed."""
        self._send(_HEAD.pack(b"S", len(payload), slot), fds, payload)

    def scratch(self, slot: int, path: str) -> None:
        """Tell the template scratch directory `slot` is `path` (its Landlock ruleset is built there, once)."""
        data = path.encode()
        self._send(_HEAD.pack(b"L", len(data), slot), (), data)

    def reap(self, pid: int) -> None:
        """Ask to kill child `pid` (its process group) if it still runs and to collect it. Answered by
        ("X", pid, wait status) (status -1: unknown)."""
        self._send(_HEAD.pack(b"R", pid, 0))

    def _send(self, head: bytes, fds=(), payload: bytes = b"") -> None:
        try:
            self.socket.send_fds(self.sock, [head], list(fds)) if fds else self.sock.sendall(head)
            if payload:
                self.sock.sendall(payload)
        except OSError as exc:
            raise TemplateGone(f"the template process is gone ({exc})") from None

    def answers(self) -> list[tuple[bytes, int, int]]:
        """The answers that arrived (call when its socket is readable)."""
        try:
            data = self.sock.recv(1 << 16, self.socket.MSG_DONTWAIT)
        except BlockingIOError:
            return []
        if not data:
            raise TemplateGone("the template process is gone")
        self.buf += data
        n = len(self.buf) - len(self.buf) % _ANSWER.size
        out = [_ANSWER.unpack_from(self.buf, k) for k in range(0, n, _ANSWER.size)]
        self.buf = self.buf[n:]
        return out


def _template_loop(sock, server: int, child_main, landlock: Landlock | None) -> None:
    """The template process: fork on request, reap on request, nothing else (each page it writes is one the children
    it forked share: the less it does, the fewer copies). It dies with the server."""
    _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != server:
        return
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)  # not the server's pipes to the trainer: the trainer must see them close when the server ends
    os.dup2(null, 1)
    os.close(null)
    import gc
    import socket

    gc.disable()
    recv_fds, recv, send, fork, close, waitall = socket.recv_fds, sock.recv, sock.send, os.fork, os.close, \
        socket.MSG_WAITALL
    head_size, unpack, pack = _HEAD.size, _HEAD.unpack, _ANSWER.pack
    rulesets: dict[int, int] = {}  # scratch slot -> its Landlock ruleset (-1: none could be built)
    while True:
        head, fds, _, _ = recv_fds(sock, head_size, 256)
        if len(head) < head_size:
            head += recv(head_size - len(head), waitall) if head else b""
            if len(head) < head_size:  # the server is gone
                return
        kind, n, slot = unpack(head)
        if kind == b"S":
            payload = recv(n, waitall) if n else b""
            try:
                answer = fork()
            except OSError as exc:
                answer = -(exc.errno or 1)
            if answer == 0:
                sock.close()
                child_main(payload, fds, rulesets.get(slot, -1))
                os._exit(0)
            for fd in fds:
                close(fd)
            del payload
            answer = pack(b"P", answer, 0)
        elif kind == b"R":
            try:
                os.killpg(n, signal.SIGKILL)
            except OSError:
                try:
                    os.kill(n, signal.SIGKILL)  # before its setsid
                except OSError:
                    pass
            try:
                status = os.waitpid(n, 0)[1]
            except ChildProcessError:
                status = -1
            answer = pack(b"X", n, status)
        elif kind == b"L":
            path = recv(n, waitall).decode()
            old = rulesets.pop(slot, -1)
            if old >= 0:
                close(old)
            try:
                rulesets[slot] = landlock.ruleset(path) if landlock is not None else -1
            except OSError:
                rulesets[slot] = -1  # its children fail their setup, saying so
            continue
        else:
            return
        send(answer)


class Zygote:
    def __init__(self, config: dict):
        self.limits = config["limits"]
        self.workers = max(1, int(config["workers"]))
        self.root = config["scratch_root"]
        self.root_real = os.path.realpath(self.root)
        # the standard library (the only code a program may import: no site-packages)
        self.readable = tuple(sorted({os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}))
        abi = int(config.get("landlock_abi", 0))
        self.landlock = Landlock(abi, self.readable) if abi else None
        self.plain_encode = _make_plain()  # built before any program runs; every child inherits it
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
        limits, landlock, plain_encode = self.limits, self.landlock, self.plain_encode
        statics = _child_statics(self.readable, limits["max_files"])
        _immortalize()
        self.template = Template(lambda payload, fds, ruleset: _child(payload, fds, ruleset, limits, landlock,
                                                                      plain_encode, statics), landlock)
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
        try:
            self.template.spawn(payload, [wr for _, wr in pipes.values()] + inputs, slot)
        finally:
            for fd in [wr for _, wr in pipes.values()] + inputs:
                os.close(fd)
        fds = {}
        for k, (r, _) in pipes.items():
            os.set_blocking(r, False)
            fds[k] = r
        run = _Run(job, start, end, None, fds, slot, nonce, self.limits)  # its pid: the template's answer
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
            if _SYSCALL(272 if os.uname().machine == "x86_64" else 97, flags) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
    try:
        unshare(flags_net)
        return "network namespace"
    except OSError:
        unshare(flags_user | flags_net)  # unprivileged: a user namespace makes the network one possible
        return "user + network namespace"


def main() -> None:
    global _SYSCALL, _PRCTL, _make_buffer
    config = json.loads(sys.argv[1])
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    _SYSCALL, _PRCTL = libc.syscall, libc.prctl
    _SYSCALL.restype = ctypes.c_long
    _make_buffer = ctypes.create_string_buffer
    _REFCNT[0] = ctypes.c_ssize_t.from_address
    abi = landlock_abi()
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
