"""What runs in a child of the sandbox's fork server (zygote.py), before and while it runs a program: the Landlock
rules, the audit hook, the value encoder, the program and its tests, the stdin/stdout runner. Standard library
only; loaded in the fork server before its template is forked, so every child finds it in memory. Everything the
program could change is bound here before its code runs; nothing of it judges (the trainer does)."""

from __future__ import annotations

import atexit
import builtins
import io
import json
import marshal
import os
import resource
import signal
import stat
import struct
import sys

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
    copy: nothing to build, less memory written per child): the audit hook and its scratch slot, the value
    encoder (`_make_plain`), a fresh `__main__` (the server's globals out of reach), and the `_posixsubprocess`
    stub: `import subprocess` works and refuses to start anything (the real module's import is refused by the audit
    hook, and was never loaded). The stub's function is defined in the stub itself: a function of this module would
    lead to its globals."""
    import types

    hook, where = _audit_hook(readable, max_files)
    main = types.ModuleType("__main__")
    stub = types.ModuleType("_posixsubprocess")
    exec("def fork_exec(*args, **kwargs):\n"  # noqa: S102 - constant code
         "    raise PermissionError('sandbox: starting a process is not permitted')\n", stub.__dict__)
    return hook, where, _make_plain(), main, stub


def _child(payload: bytes, fd_list: list[int], ruleset: int, limits: dict, landlock: Landlock | None,
           statics: tuple) -> None:
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

        if stdio:  # the template runs without collector passes, and so does a short-lived child; a stdio child runs
            gc.enable()  # every test of its program, one after the other: their cycles must be freed
        sys.argv[:] = ["solution.py"]
        namespace = {"__name__": "solution", "__builtins__": builtins}  # stdio: each test's own (_stdio_runner)
        tests = []
        for code in test_code:  # compiled in the fork server, once per distinct test
            if code is None:
                tests.append(None)
                continue
            scope = {}
            exec(code, namespace, scope)
            tests.append(scope["__grpo_test__"])
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

        hook, where, (plain, encode), sys.modules["__main__"], sys.modules["_posixsubprocess"] = statics
        for name in ("zygote", "template", __name__):  # the fork server's modules, out of the program's reach
            sys.modules.pop(name, None)
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
