"""The judge: a process of its own (confined like a program's, under another identity) that runs a job's tests
and says which pass. Standard library only (it runs inside the jail).

Every test runs here, whole, with real builtins and the test's own imports: an assert, a loop, a comprehension,
HumanEval's `def check(candidate)`. A name the test reads and does not bind resolves, in order, to: a builtin
(the program never rebinds what `abs`, `sorted` or `set` mean to a test); a standard module when the test uses it
as one (`math.isclose`: the real module, whatever the program bound to `math`); the standard value types tests
compare with (`Counter`, `defaultdict`, `OrderedDict`, `deque`, `namedtuple`, `Fraction`, `Decimal`); what the
program imported by name at top level (`gcd` from `math`: the real one); else the program's own name, reached
through its process. Calling the program's code is a request to that process (program.Service) that returns plain
data: the return value and the arguments after the call (in-place mutation is seen here), or the exception it
raised, raised here as the same type. Objects the program keeps (its classes' instances, generators) come back
as stand-ins whose methods are requests again; their `==` compares their type and fields, and `isinstance` works
with the program's classes. Nothing the program does in its own process changes what a test's code means here.

Budgets: the bytes a job's values may take (`value_bytes` per value, `job_bytes` in all), their nesting depth,
and this process's own (its address space, and the per-test wall clock the fork server keeps: a test whose values
cost too much to judge fails, and the job's other tests run in a fresh pair of processes).
"""

from __future__ import annotations

import builtins
import gc
import json
import marshal
import os
import sys
import types

try:
    from . import codec, confine, wire
    from .judge_link import Program
    from .judge_stand_ins import ProgramFailed, Remote, RemoteMeta, describe_exception
except ImportError:  # in the jail: top-level modules beside forkserver.py
    import codec
    import confine
    import wire
    from judge_link import Program
    from judge_stand_ins import ProgramFailed, Remote, RemoteMeta, describe_exception

_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))
# value types tests compare with and often use without importing them (they came with the reference solution's
# imports): always the standard library's, whatever the program binds to these names
_STDLIB_VALUES = {"Counter": "collections", "defaultdict": "collections", "OrderedDict": "collections",
                  "deque": "collections", "namedtuple": "collections", "Fraction": "fractions",
                  "Decimal": "decimal"}


class Names(dict):
    """A test's builtins: the real ones, and, for a name neither the test nor builtins bind, what it resolves to
    (module docstring)."""

    def __init__(self, judge: Judge, modules: set[str]):
        super().__init__(vars(builtins))
        self.judge, self.modules = judge, modules

    def __missing__(self, name):
        """Resolved each time the test reads it, except what cannot change under it (a module, the program's
        function or class, an object it keeps): a global the program rebinds (`reset()`) or a list it appends to
        reads as it is now."""
        value = self.judge.resolve(name, name in self.modules)
        if isinstance(value, (types.ModuleType, Remote, RemoteMeta)):
            self[name] = value
        return value


class Judge:
    def __init__(self, job: dict, program: Program, verdicts: int, leave=None):
        """`leave`: the job starts in place (module docstring); `leave()` forks when it can no longer stay there
        and says which side this is (True: the forked process, which goes on with the job; False: the judge,
        which stops). None: the whole job out of place (the caller runs it in a process of its own)."""
        self.job, self.program, self.out, self.leave = job, program, verdicts, leave
        self.kept: dict[str, object] = {}  # the program's functions and classes, fetched once per job
        self.target = None  # the function a call-based job calls
        self.strained = False  # in place, something ran out of memory: this process is not reused
        program.decoder.plain_only = leave is not None

    def say(self, line: str) -> None:
        _say(self.out, line)

    def imports(self) -> dict:
        return self.job.get("imports") or {}

    def resolve(self, name: str, used_as_module: bool):
        if used_as_module and name in _STDLIB:
            return __import__(name)
        if name in _STDLIB_VALUES:
            return getattr(__import__(_STDLIB_VALUES[name]), name)
        imported = self.imports().get(name)
        if imported is not None:
            module, attr = imported
            try:
                mod = __import__(module, fromlist=["_"] if attr or "." in module else [])
                if attr is None:
                    return mod
                try:
                    value = getattr(mod, attr)
                except AttributeError:
                    value = __import__(f"{module}.{attr}", fromlist=["_"])
                if isinstance(value, types.ModuleType):  # a module it imported: the real one
                    return value
            except Exception:  # noqa: BLE001 - not importable here: the program's own
                pass
            # any other name it imported (`from math import gcd`, `from unittest.mock import ANY as result`) is
            # a value of the program's like any other: asked of its process, rebuilt as data or a stand-in
        hit = self.kept.get(name)
        if hit is not None:
            return hit
        try:
            value = self.program.get(name)
        except NameError:
            raise NameError(f"name {name!r} is not defined") from None
        if isinstance(value, (Remote, RemoteMeta)):  # a function or class: the same one for every test
            self.kept[name] = value
        return value


    @property
    def in_place(self) -> bool:
        return self.program.decoder.plain_only

    def run(self, start: int, end: int) -> str | None:
        """Run the tests; the job's last line: `Z` (over) or `R` (the program's process was lost during a test:
        the fork server runs the tests after it in a fresh one); None: the job went on in a forked process, which
        says the rest."""
        try:
            why = self.program.first()
        except codec.NotPlain:  # the program raised: its exception is built out of place
            if not self.out_of_place():
                return None
            why = self.program.first()
        if why is not None:
            self.say(f"E {why}")
            return "Z"
        self.say("D")
        for i in range(start, end):
            self.say(f"S {i}")
            try:
                try:
                    ok, detail = self.test(i, start, end)
                except codec.NotPlain:
                    if not self.out_of_place():
                        return None
                    ok, detail = self.test(i, start, end)
            except ProgramFailed as exc:  # its process is gone or broken: the job's other tests get a fresh one
                self.say(f"F {i} {exc}")
                return "R"
            except SyntaxError:
                ok, detail = False, "SyntaxError in the test"
            except AssertionError:
                ok, detail = False, "AssertionError"
            except BaseException as exc:  # noqa: BLE001 - the test's own error, or one the program's code raised
                self.strained |= isinstance(exc, MemoryError) and self.in_place
                ok, detail = False, describe_exception(exc)
            self.say(f"P {i}" if ok else f"F {i} {detail}")
        return "Z"

    def out_of_place(self) -> bool:
        """The rest of the job in a process forked for it: True there, False in the judge (which stops)."""
        if not self.leave():
            return False
        self.program.out_of_place()
        return True

    def test(self, i: int, start: int, end: int) -> tuple[bool, str]:
        """Test i: (passed, detail), or an exception. In place, NotPlain (nothing consumed that the forked
        process cannot take up again) for what cannot be judged there. A test's calls reach the program one at a
        time, each when the one before it has returned: the program never sees a later test's call (or its
        arguments) before it has answered the calls before it."""
        if self.job["mode"] == "calls":
            if self.target is None:
                self.target = self.call_target()
            return self.call_test(self.target, self.job["cases"][i])
        compiled = self.job["compiled"][i - start]
        return self.literal_test(compiled) if self.in_place else self.assert_test(compiled)

    def literal_test(self, compiled):
        """In place: a test that is one call of the program's function with literals and a check of its value
        against a literal (forkserver_plan.call_of), judged without running the test as code: the value is plain
        data (codec.PLAIN_TAGS), so `==`, `is None` and truth are the builtin types' own. Else NotPlain."""
        call = compiled[2] if compiled is not None else None
        if call is None or call[3] is None or self.shadowed(call[0]):
            raise codec.NotPlain("a test that is more than a call and a literal")
        fn = self.resolve(call[0], False)
        if not isinstance(fn, Remote):
            raise codec.NotPlain("not the program's function")
        args, kwargs = marshal.loads(marshal.dumps(call[1:3]))  # the job's own copy: a call may change them
        got = fn(*args, **kwargs)
        op, want, bound = call[3]
        if op in ("abs<", "abs<="):  # abs(got - want) < bound: the builtin abs, as a test's `abs` always is
            gap = abs(got - want)
            ok = gap < bound if op == "abs<" else gap <= bound
        else:
            ok = (got == want if op == "==" else got != want if op == "!=" else got is want if op == "is"
                  else got is not want if op == "is not" else not got if op == "not" else bool(got))
        if not ok:
            raise AssertionError
        return True, "passed"

    def shadowed(self, name: str) -> bool:
        """Whether `name` in a test means something other than the program's own (Names, resolve)."""
        return name in vars(builtins) or name in _STDLIB_VALUES or name in self.imports()

    def assert_test(self, compiled):
        if compiled is None:
            raise SyntaxError("the test does not parse")
        code, modules = compiled[:2]
        exec(code, {"__builtins__": Names(self, set(modules)), "__name__": "__test__"})  # noqa: S102
        return True, "passed"

    def call_target(self):
        fn = self.job["fn"]
        try:
            return self.program.get(fn)
        except NameError:
            pass
        solution = self.program.get("Solution")
        return getattr(solution(), fn)

    def call_test(self, target, case):
        args, expected = case
        got = target(*_call_args(args))
        ok = returns_match(got, expected)
        return ok, "passed" if ok else "wrong answer"


def _say(fd: int, line: str) -> None:
    """One verdict line (at most 301 bytes: one write, never interleaved with another's)."""
    data = (line.replace("\n", " ")[:300] + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _call_args(args) -> list:
    """A call-based case's arguments: a list or tuple of them, or the one argument."""
    return list(args) if isinstance(args, (list, tuple)) else [args]


def _jsonish(x):
    """A value as JSON would hold it (datasets store expected returns as JSON): tuples are lists."""
    if isinstance(x, (list, tuple)):
        return [_jsonish(e) for e in x]
    if isinstance(x, dict):
        return {k: _jsonish(v) for k, v in x.items()}
    return x


def returns_match(actual, expected) -> bool:
    """Call-based tests: the return equals the expected value (tuples equal lists, as JSON cannot tell them apart),
    or the one element of a one-element expected list (APPS and TACO wrap some expected returns so)."""
    got = _jsonish(actual)
    if got == _jsonish(expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and got == _jsonish(expected[0])


def run_judge(job: dict, start: int, end: int, rpc_fd: int, verdict_fd: int, limits: dict, leave=None) -> bool:
    """One job's tests [start, end); its last line is `Z` (the job is over, whatever happened). `leave`: start in
    place (Judge). Whether this process may serve another job in place (False: it ran out of memory in this one, or
    this is the job's forked process)."""
    program = Program(rpc_fd, limits["value_bytes"], limits["job_bytes"])
    judge = Judge(job, program, verdict_fd, leave)
    last: str | None = "Z"
    try:
        last = judge.run(start, end)
    except BaseException as exc:  # noqa: BLE001 - the judge's own failure ends its job (reported, never a pass)
        judge.strained = True
        try:
            judge.say(f"X judge {type(exc).__name__}: {exc}")
        except OSError:
            pass
    if last is not None:
        if judge.in_place and judge.strained:
            judge.say("Q")  # this process ends after this job (serve): the server hands it no other
        judge.say(last)
    return judge.in_place and not judge.strained


def serve(ctrl, verdict_fd: int, limits: dict) -> None:
    """A judge's life: jobs one after the other from the fork server (`ctrl`, a socket: each job a framed marshal
    with the job's end of its program's socket attached, wire.py), until the server closes it or replaces this
    judge (after a job over-ran its time, this process is killed with it, and the job's process too). Verdicts go
    out on `verdict_fd` only; what a test prints goes to /dev/null (fds 1 and 2).

    A job starts here, in place, and stays as long as nothing but plain data comes from the program and every test
    is one call checked against a literal (Judge.literal_test): no test runs as code here, no class is built, so
    nothing of the job is left when it ends. At the first value or test that is more, `leave` forks a process for
    the rest of the job (a copy of this one that dies with it) and this one waits for it: whatever that process
    runs or is fooled into doing (a test that patches the judge, a value that fooled it) never reaches another
    job. After a job that ran out of memory here, this process ends and the slot gets a new judge."""
    gc.freeze()  # a job's collections never write the headers of what it shares with this process
    # one thread and nothing that registers at-fork work: libc's fork, without os.fork's bookkeeping
    fork = confine.fork_bare if confine.can_fork_bare() else os.fork
    while True:
        message = wire.recv_message(ctrl, 4)
        if message is None or len(message[1]) != 1:
            os._exit(0)
        payload, fds = message
        leave = _Leave(fork, ctrl)
        again = done = False
        try:
            job_text, start, end, tests, imports = marshal.loads(payload)
            job = json.loads(job_text)
            job["compiled"], job["imports"] = tests, imports
            again = run_judge(job, start, end, fds[0], verdict_fd, limits, leave)
            done = True
        finally:
            if leave.forked:  # the job's process ends with its job
                os._exit(0 if done else 1)
        os.close(fds[0])
        if leave.pid is not None:
            status = os.waitpid(leave.pid, 0)[1]
            if status != 0:  # it died before its last line: the job ends here, said so (never a pass)
                _say(verdict_fd, f"X judge ended with wait status {status}")
                _say(verdict_fd, "Z")
        elif not again:
            os._exit(0)
        elif gc.get_count()[0] > 2000:  # what jobs left in place (stand-ins' classes hold cycles): this
            gc.collect()  # process runs no collector of its own
        _reap()  # what a test forked and left (this process is PID 1 of its namespace: orphans come here)


class _Leave:
    """A job's way out of the judge's process (Judge.leave): a fork, once. `pid`: the job's process (in the
    judge); `forked`: this is that process."""

    def __init__(self, fork, ctrl):
        self.fork, self.ctrl = fork, ctrl
        self.pid: int | None = None
        self.forked = False

    def __call__(self) -> bool:
        pid = self.fork()
        if pid == 0:
            self.ctrl.close()
            self.forked = True
            return True
        self.pid = pid
        return False


def _reap() -> None:
    """Collect every ended process this one inherited, so none holds a slot of the judges' process budget."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return
