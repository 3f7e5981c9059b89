"""What a program's process runs once it is confined (confine.py): the program, as plain CPython, then either

- the service a judge calls (assert and call-based tests): each request is one call into the program's code — a
  function, a method, an attribute, a global — answered with plain data (codec.py): the return value and the
  arguments as they are after the call. No test code runs here, and nothing sent from here is a verdict;
- or the stdin/stdout runs: the program as `__main__` once per test, its input on stdin, its output on stdout.

Standard library only (it runs inside the jail). Everything here can be read, changed or bypassed by the program
(it owns this process, native code included); what it sends is treated as untrusted by its readers.
"""

from __future__ import annotations

import atexit
import builtins
import collections
import copy
import gc
import json
import os
import sys
import types

try:
    from . import codec, wire
except ImportError:  # in the jail: top-level modules beside forkserver.py
    import codec
    import wire

DIRECTORY_MOST = 64


def _install_exit() -> None:
    """`exit()` / `quit()` as the interpreter's `site` defines them (the fork server runs without `site`)."""
    try:
        import _sitebuiltins  # (the C-free half of site: what the interpreter's site module would load)

        builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
        builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    except ImportError:
        pass


def prepare_common(site_dirs: list[str]) -> None:
    """What every program's interpreter shares, set once in the fork server before the template is forked (each
    program's process then only moves into its scratch directory): site-packages importable (numpy where
    installed), `exit()` / `quit()`, `sys.argv` as `python solution.py` gives it, a plain environment."""
    os.environ.clear()
    os.environ.update({"LANG": "C.UTF-8", "PATH": "/usr/bin:/bin"})
    for d in site_dirs:
        if d not in sys.path:
            sys.path.append(d)
    _install_exit()
    sys.argv[:] = ["solution.py"]


def prepare_interpreter(scratch: str) -> None:
    """The program's own view: its scratch directory as cwd, HOME and TMPDIR."""
    os.chdir(scratch)
    os.environ["HOME"] = os.environ["TMPDIR"] = scratch


# ---- the service a judge calls ------------------------------------------------------------------------------
class Service:
    """Answers the judge's requests about the program's namespace `ns` (see judge_link.py for the requests)."""

    def __init__(self, ns: dict, fd: int, most: int):
        self.ns, self.fd, self.most = ns, fd, most
        self.channel = wire.Channel(fd)
        self.objects: list = []  # handle -> object kept here
        self.handles: dict[int, int] = {}  # id(object) -> handle
        self.classes: dict[int, dict] = {}  # id(class) -> its description
        self.encoder = codec.Encoder(self.handle, self.describe, _JudgeObject.tree)
        self.decoder = codec.Decoder(self.lookup, self.klass, 1 << 62, self.judge_object)
        self.nt_classes: dict = {}

    def handle(self, obj) -> int:
        h = self.handles.get(id(obj))
        if h is None:
            h = self.handles[id(obj)] = len(self.objects)
            self.objects.append(obj)
        return h

    def describe(self, cls) -> dict:
        d = self.classes.get(id(cls))
        if d is not None:
            return {"h": d["h"]}  # described once per job: the judge keeps it
        h = self.handle(cls)
        module = getattr(cls, "__module__", None)
        d = {"h": h, "n": str(getattr(cls, "__name__", "?")), "q": str(getattr(cls, "__qualname__", "?")),
             "m": module if isinstance(module, str) else None,
             "e": isinstance(cls, type) and issubclass(cls, BaseException),
             "nt": list(cls._fields) if codec._is_namedtuple(cls) else None}
        dataclasses = sys.modules.get("dataclasses")
        if dataclasses is not None and isinstance(cls, type) and dataclasses.is_dataclass(cls):
            d["dc"] = [f.name for f in dataclasses.fields(cls)]  # asdict(), fields() in a test
        if isinstance(cls, type):
            if issubclass(cls, dict) and cls.__module__ in codec.PROGRAM_MODULES and any(
                    "__missing__" in vars(c) for c in cls.__mro__ if c.__module__ in codec.PROGRAM_MODULES):
                d["o"] = ["__missing__"]  # the program's dict subclass's default for a missing key
            if getattr(cls, "__eq__", None) is not object.__eq__:
                d["eq"] = True  # its objects compare by type and fields in a test; else by identity, as in Python
            if hasattr(cls, "__await__"):
                d["aw"] = True
        self.classes[id(cls)] = d
        bases = []
        for b in getattr(cls, "__bases__", ()):
            if b is not object:
                bases.append(self.describe(b))
        d["b"] = bases
        return d

    def judge_object(self, k: int, kind: str):
        """What a test passed in (a function, an iterator): calls back to the judge, which runs it."""
        return (_JudgeIterator if kind == "i" else _JudgeCallable)(self, k)

    def callback(self, k: int, op: str, args: list, kwargs: dict):
        """Ask the judge to run its object k (`call` it, or `next` of it) and wait for its answer, answering the
        requests the judge makes meanwhile (the function may call into the program)."""
        self.reply("cb", [k, op, self.encoder.tree(args), self.encoder.tree(kwargs)])
        while True:
            msg = self.channel.recv(self.most)
            if msg is None:
                os._exit(0)  # the judge is gone: so is this job
            req = json.loads(msg.decode())
            if req[0] != "cbret":
                self.answer(msg)
                continue
            if req[1] == "ok":
                return self.decoder.value(req[2])
            if req[1] == "stop":
                raise StopIteration
            name, message = req[2]
            kind = getattr(builtins, str(name), None)
            if not (isinstance(kind, type) and issubclass(kind, Exception)):
                kind = Exception
            raise kind(message)

    def lookup(self, h, desc, value=None):  # an object the judge sends back: one of ours
        return self.objects[h]

    def klass(self, desc):  # a namedtuple the judge built: the program's class when it is one
        h = desc.get("h")
        if isinstance(h, int) and 0 <= h < len(self.objects):
            return self.objects[h]
        key = (desc.get("n"), tuple(desc.get("nt") or ()))
        cls = self.nt_classes.get(key)
        if cls is None:
            cls = self.nt_classes[key] = collections.namedtuple(key[0], key[1])
        return cls

    def directory(self) -> dict:
        """The program's functions and classes by name, as `get` would answer each, sent with `ready`: the judge
        looks most names up without a round trip (at most DIRECTORY_MOST; the rest are asked for)."""
        out = {}
        for name, value in list(self.ns.items()):
            if len(out) >= DIRECTORY_MOST:
                break
            if type(name) is str and not name.startswith("__") and (
                    type(value) is types.FunctionType or isinstance(value, type)):
                out[name] = self.encoder.tree(value)
        return out

    def reply(self, kind: str, payload, *more) -> None:
        wire.send(self.fd, wire.dumps([kind, payload, *more]).encode())

    def error(self, exc: BaseException) -> None:
        """Reply with `exc`: its class, message and arguments (an exception of a kind not built in stays here too:
        the judge asks it for its fields, its str, ...)."""
        try:
            msg = str(exc)[:1000]
        except BaseException:  # noqa: BLE001 - the program's __str__
            msg = ""
        try:
            args = self.encoder.tree(list(exc.args))
        except BaseException:  # noqa: BLE001
            args = ["L"]
        self.reply("err", self.exception(exc, msg, args))

    def exception(self, exc: BaseException, msg: str, args, depth: int = 0) -> list:
        """An exception as the judge rebuilds it: its class, message, arguments, the handle of the object when its
        class is not built in (the judge asks it for its fields), and for a built-in one the attributes the program
        gave it (`err.code = 3`); its `__cause__` (`raise ... from e`) likewise, a few deep."""
        kept = self.handle(exc) if type(exc).__module__ != "builtins" else None
        more: dict = {}
        try:
            own = vars(exc) if kept is None else {}
            if own:
                more["a"] = self.encoder.tree({k: v for k, v in own.items() if isinstance(k, str)
                                               and not k.startswith("_")})
            cause = exc.__cause__
            if isinstance(cause, BaseException) and depth < 4:
                try:
                    cause_msg = str(cause)[:1000]
                except BaseException:  # noqa: BLE001
                    cause_msg = ""
                more["c"] = self.exception(cause, cause_msg, self.encoder.tree(list(cause.args)), depth + 1)
        except BaseException:  # noqa: BLE001 - the program's own objects: what could be sent is sent
            pass
        return [self.describe(type(exc)), msg, args, kept, more]

    def call(self, fn, a, k):
        args, kwargs = self.decoder.value(a), self.decoder.value(k)
        ret = fn(*args, **kwargs)
        mutable = (list, dict, set, bytearray, collections.deque)
        after = [a if isinstance(a, mutable) else 0 for a in args]
        return self.encoder.tree([ret, after])

    def serve(self) -> None:
        """Answer requests until the judge closes its end."""
        while True:
            msg = self.channel.recv(self.most)
            if msg is None:
                return
            self.answer(msg)

    def answer(self, msg: bytes) -> None:
        """One request, one reply."""
        try:
            req = json.loads(msg.decode())
            op = req[0]
            if op == "get":
                if req[1] not in self.ns:
                    raise NameError(f"name {req[1]!r} is not defined")
                self.reply("ok", self.encoder.tree(self.ns[req[1]]))
            elif op == "call":
                self.reply("ok", self.call(self.objects[req[1]], req[2], req[3]))
            elif op == "attr":
                self.reply("ok", self.encoder.tree(getattr(self.objects[req[1]], req[2])))
            elif op == "setattr":
                setattr(self.objects[req[1]], req[2], self.decoder.value(req[3]))
                self.reply("ok", None)
            elif op == "state":
                self.reply("ok", self.encoder.tree(_state(self.objects[req[1]])))
            elif op == "op":
                self.reply("ok", self.encoder.tree(self.operate(self.objects[req[1]], req[2],
                                                                   self.decoder.value(req[3]))))
            else:
                raise ValueError(f"unknown request {op!r}")
        except SystemExit as exc:  # the program called exit() inside a call: that call ends with it
            self.error(exc)
        except BaseException as exc:  # noqa: BLE001 - reported to the judge, which raises it in the test
            self.error(exc)

    @staticmethod
    def operate(obj, name: str, args: list):
        """One operation a judge asks of an object kept here (judge_stand_ins.Remote)."""
        one = _OPERATIONS.get(name)
        if one is not None:
            return one(obj, *args)
        if name == "next":  # up to args[0] items: [items, finished], and the value it finished with
            out = []
            for _ in range(int(args[0])):
                try:
                    out.append(next(obj))
                except StopIteration as stop:
                    return [out, True, stop.value]
            return [out, False]
        if name.startswith("__") and name in _OPERATORS:  # arithmetic, and ordering between its own objects
            result = getattr(obj, name)(*args)
            if result is NotImplemented:
                raise TypeError(f"{name} of {type(obj).__name__} not supported")
            return result
        raise ValueError(f"unknown operation {name!r}")


def _setitem(obj, key, value) -> None:
    obj[key] = value


def _delitem(obj, key) -> None:
    del obj[key]


def _exit(obj, told):
    """`with obj:` in a test ends: its __exit__ told of the test's exception by built-in class and message."""
    if told is None:
        return bool(type(obj).__exit__(obj, None, None, None))
    kind = getattr(builtins, str(told[0]), None)
    if not (isinstance(kind, type) and issubclass(kind, BaseException)):
        kind = Exception
    exc = kind(str(told[1]))
    return bool(type(obj).__exit__(obj, kind, exc, None))


def _await(obj):
    """A test awaits the program's coroutine: it runs to its end here, in an event loop of its own."""
    import asyncio  # only in a process whose test awaits: in the template it would weigh on every fork and register
    # work for every forked child (confine.AT_FORK_MODULES)

    async def run():
        return await obj

    return asyncio.run(run())


_OPERATIONS = {"len": len, "iter": iter, "list": list, "str": str, "repr": repr, "bool": bool,
               "float": float, "int": int, "index": lambda obj: obj.__index__(), "complex": complex,
               "round": lambda obj, n=None: round(obj, n), "vars": lambda obj: dict(vars(obj)),
               "enter": lambda obj: type(obj).__enter__(obj), "exit": _exit, "await": _await,
               "getitem": lambda obj, key: obj[key], "setitem": _setitem, "delitem": _delitem,
               "contains": lambda obj, item: bool(item in obj), "format": lambda obj, spec: format(obj, str(spec)),
               "missing": lambda obj, key: type(obj).__missing__(obj, key),
               "copy": copy.copy, "deepcopy": copy.deepcopy}


class _JudgeObject:
    """A function or iterator of the test's, run in the judge when the program uses it."""

    __slots__ = ("_service", "_k")

    def __init__(self, service: Service, k: int):
        self._service, self._k = service, k

    @staticmethod
    def tree(obj):
        if isinstance(obj, _JudgeObject):
            return ["J", obj._k, "i" if isinstance(obj, _JudgeIterator) else "f"]
        return None


class _JudgeCallable(_JudgeObject):
    __slots__ = ()

    def __call__(self, *args, **kwargs):
        return self._service.callback(self._k, "call", list(args), kwargs)


class _JudgeIterator(_JudgeObject):
    __slots__ = ()

    def __iter__(self):
        return self

    def __next__(self):
        return self._service.callback(self._k, "next", [], {})


_OPERATORS = frozenset(f"__{p}{o}__" for o in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul",
                                                 "and", "or", "xor", "lshift", "rshift") for p in ("", "r")) | {
    "__lt__", "__le__", "__gt__", "__ge__", "__neg__", "__pos__", "__abs__"}


def _state(obj) -> dict:
    """An object's fields (instance attributes and slots) for the judge's equality; a dataclass's compared fields
    only (`field(compare=False)` left out, as its generated __eq__ does)."""
    dataclasses = sys.modules.get("dataclasses")
    if dataclasses is not None and dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name, None) for f in dataclasses.fields(obj) if f.compare}
    out = {}
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        out.update((k, v) for k, v in d.items() if not (isinstance(k, str) and k.startswith("__")))
    for cls in type(obj).__mro__:
        for s in getattr(cls, "__slots__", ()) if isinstance(getattr(cls, "__slots__", ()), (tuple, list)) else ():
            if isinstance(s, str) and not s.startswith("__") and hasattr(obj, s):
                out[s] = getattr(obj, s)
    return out


def run_program(code, rpc_fd: int, most: int) -> None:
    """Run the program (a compiled code object) as module `solution` (registered, so its classes pickle), then
    serve the judge. Never returns. The judge hears first: ready, or why the program could not run."""
    service = Service(_module(), rpc_fd, most)
    try:
        exec(code, service.ns)  # noqa: S102 - the program, in its own confined process
    except SystemExit as exc:
        if exc.code not in (None, 0):
            service.reply("exit", repr(exc.code)[:200])
            os._exit(0)
    except BaseException as exc:  # noqa: BLE001
        service.error(exc)
        os._exit(0)
    _flush()
    try:
        names = service.directory()
    except BaseException:  # noqa: BLE001 - a class whose description fails: the judge asks name by name
        names = {}
    service.reply("ready", names)
    service.serve()
    os._exit(0)


def _module() -> dict:
    module = types.ModuleType("solution")
    module.__file__ = "solution.py"
    sys.modules["solution"] = module
    return module.__dict__


_WARM_PROGRAM = """
from typing import List, Optional


class Box:
    def __init__(self, items):
        self.items = list(items)

    def total(self):
        return sum(self.items)


def f(xs: List[int], k: int = 1, name: Optional[str] = "a") -> dict:
    out = [x * k for x in xs]
    xs.append(len(out))
    return {"out": out, "name": name * 2, "pair": (k, 2.5), "set": {1, 2}, "none": None, "ok": True}
"""


def warm_typing() -> int:
    """Build, once here, the typing aliases programs most often write in annotations (`List[int]`,
    `Dict[str, int]`, `Optional[str]`, `Tuple[int, int]`, ...): typing keeps the last 128 it built per kind in a
    cache, so a program's `def f(xs: List[int])` finds its alias there instead of running typing's Python code to
    build it (~0.1 ms and the pages that code writes, in every program's process that annotates). Returns how many
    it built."""
    import typing  # (in the fork server before the templates fork, never in a template's own imports)

    # typing's own objects by name: they are what programs subscript (the lint would have them rewritten)
    t = {name: getattr(typing, name) for name in ("List", "Dict", "Tuple", "Set", "Optional", "Union", "Sequence",
                                                  "Iterable", "Iterator", "Callable", "Any")}
    scalars = (int, float, str, bool, t["Any"])
    lists = [t["List"][a] for a in (int, str, float)]
    wanted = [(t["List"], a) for a in lists] + [
        (t["List"], t["Tuple"][int, int]), (t["Tuple"], (int, ...)), (t["Tuple"], (int, int, int)),
        (t["Dict"], (str, lists[1])), (t["Dict"], (int, lists[0])), (t["Optional"], lists[0]),
        (t["Callable"], (..., t["Any"])), (t["Union"], (int, float)), (t["Union"], (int, str))]
    for a in scalars:
        wanted += [(t[head], a) for head in ("List", "Optional", "Set", "Sequence", "Iterable", "Iterator")]
        wanted += [(t["Dict"], (a, b)) for b in scalars]
    wanted += [(t["Tuple"], p) for p in ((int, int), (float, float), (str, int), (int, str), (str, str))]
    made = [head[params] for head, params in wanted]
    return len(made)


def warm_up(scratch: str) -> list[str]:
    """Take a small program through what every program's process runs after it is confined (the interpreter's
    preparation, the program's run, the service's answers, the codec, json), here in the fork server before the
    template is forked: the interpreter specialises that code once, here, instead of in every program's process,
    where each first run writes into code and caches on pages shared with the template (a copy-on-write fault per
    page, ~1 us each, and the specialising itself). Everything it changed in this process is put back. Returns the
    kinds of the replies ("ok", or "err" for the one request that asks for a missing name)."""
    import _socket  # (the warm-up's, in the fork server: the C half only, as everywhere in the sandbox)

    saved = (os.getcwd(), dict(os.environ))
    ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    kinds: list[str] = []
    warm_typing()
    try:
        prepare_interpreter(scratch)
        service = Service(_module(), theirs.fileno(), 1 << 20)
        exec(compile(_WARM_PROGRAM, "solution.py", "exec"), service.ns)  # noqa: S102 - our own program
        _flush()
        service.reply("ready", service.directory())
        answers = wire.Channel(ours.fileno())
        answers.recv(1 << 20)
        enc = codec.Encoder(None, None).tree

        def ask(*req):
            service.answer(wire.dumps(req).encode())
            kind, payload = json.loads(answers.recv(1 << 20).decode())
            kinds.append(kind)
            return payload

        f, box = ask("get", "f")[1], ask("get", "Box")[1]["h"]  # ["O", handle, class], ["K", class]
        for k in range(12):  # runs enough for the interpreter to specialise what they execute
            ask("call", f, enc([[1, 2, k], k]), enc({"name": "b"}))
        for k in range(16):  # floats too
            ask("call", f, enc([[1.5, 2.5], k]), enc({}))
        obj = ask("call", box, enc([[1, 2]]), enc({}))[1][1]  # ["L", ["O", handle, class], arguments after]
        ask("call", ask("attr", obj, "total")[1], enc([]), enc({}))
        ask("state", obj)
        ask("op", obj, "repr", enc([]))
        ask("get", "missing")
    finally:
        ours.close()
        theirs.close()
        sys.modules.pop("solution", None)
        cwd, env = saved
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
    return kinds


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:  # noqa: BLE001
            pass


# ---- stdin/stdout runs ----------------------------------------------------------------------------------------
def run_stdio(code, i: int, nonce: str, input_fd: int) -> None:
    """Test i, the only one this process runs: the program as `__main__` with the test's input on fd 0 (a memory file
    the fork server wrote; no other test's input exists here), ending as the interpreter would (non-daemon threads
    joined, atexit, streams flushed, then its objects finalised: a file it opened on fd 1 flushes as at exit); then
    `NUL nonce T|F i ...` on the stdout pipe so the fork server knows the test's output is whole. The process ends
    here, and with it (its PID namespace) every thread and process the program started. What this reports is the
    program's own behaviour (the output is compared in the trainer): a program could forge a normal end only for
    itself, as it could by catching its own exceptions."""
    mark = f"\0{nonce} "
    status_fd = os.dup(1)  # the status line's way out, also where the program closed fd 1 (`with open(1, 'w')`)

    def word(text) -> str:
        return "".join(str(text).split())[:80] or "?"

    status = f"T {i}"
    try:
        os.dup2(input_fd, 0)
        os.close(input_fd)
        # as CPython opens stdin on Linux: no newline translation (a "\r\n" input keeps its "\r")
        sys.stdin = sys.__stdin__ = open(0, encoding=sys.stdin.encoding if sys.stdin else "utf-8",  # noqa: SIM115
                                         errors="strict", closefd=False, newline="\n")
    except BaseException as exc:  # noqa: BLE001
        status = f"F {i} no input ({word(type(exc).__name__)})"
    else:
        main = types.ModuleType("__main__")
        main.__file__ = "solution.py"
        sys.modules["__main__"] = main
        try:
            exec(code, main.__dict__)  # noqa: S102
        except SystemExit as exc:
            if exc.code is not None and exc.code != 0:
                status = f"F {i} exit status {word(exc.code)}"
        except BaseException as exc:  # noqa: BLE001
            status = f"F {i} the program raised {word(type(exc).__name__)}"
        try:
            _like_exit(main)
        except BaseException:  # noqa: BLE001 - as at exit: reported on stderr by Python, not a failure
            pass
    try:
        os.write(status_fd, f"{mark}{status}\n".encode())
    except BaseException:  # noqa: BLE001 - the program closed or replaced the pipe: its run ends without a status
        os._exit(70)
    os._exit(0)


def _like_exit(main) -> None:
    """What the interpreter does at exit, in its order: non-daemon threads joined, atexit functions, the standard
    streams flushed, then the modules' objects finalised (a file the program opened on fd 1 and never closed
    writes what it holds)."""
    th = sys.modules.get("threading")
    if th is not None:
        current = th.main_thread()
        for t in th.enumerate():
            if t is not current and not t.daemon:
                t.join()
    atexit._run_exitfuncs()
    _flush()
    main.__dict__.clear()
    gc.collect()
    _flush()
