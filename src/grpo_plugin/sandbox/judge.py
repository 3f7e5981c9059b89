"""The judge: a process of its own (confined like a program's, under another identity) that runs a job's tests
and says which pass. Standard library only (it runs inside the jail).

Every test runs here, whole, with real builtins and the test's own imports: an assert, a loop, a comprehension,
HumanEval's `def check(candidate)`. A name the test reads and does not bind resolves, in order, to: a builtin
(the program never rebinds what `abs`, `sorted` or `set` mean to a test); a standard module when the test uses it
as one (`math.isclose`: the real module, whatever the program bound to `math`); the standard value types tests
compare with (`Counter`, `defaultdict`, `OrderedDict`, `deque`, `namedtuple`, `Fraction`, `Decimal`); what the
program imported by name at top level (`gcd` from `math`: the real one); else the program's own name, reached
through its process. Calling the program's code is a request to that process (child.Service) that returns plain
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
import collections
import json
import os
import sys

try:
    from . import child, codec, template
except ImportError:  # in the fork server: top-level modules beside zygote.py
    import child
    import codec
    import template

_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))
# the only classes the judge takes by the name a program's description gives: the built-in exceptions, whose
# constructors store their arguments and nothing more (every other class of the program's is a stand-in)
BUILTIN_EXCEPTIONS = {name: obj for name, obj in vars(builtins).items()
                      if isinstance(obj, type) and issubclass(obj, BaseException)}
_BUILTIN_BASES = {**BUILTIN_EXCEPTIONS, **{t.__name__: t for t in codec.PLAIN_BASES}}
AHEAD_MOST, AHEAD_BYTES = 256, 1 << 20  # calls sent ahead at once, and the size of their arguments
# value types tests compare with and often use without importing them (they came with the reference solution's
# imports): always the standard library's, whatever the program binds to these names
_STDLIB_VALUES = {"Counter": "collections", "defaultdict": "collections", "OrderedDict": "collections",
                  "deque": "collections", "namedtuple": "collections", "Fraction": "fractions",
                  "Decimal": "decimal"}


class ProgramFailed(Exception):
    """The program's process could not serve a request (it ended, or sent what cannot be read)."""


# ---- the connection to the program's process -------------------------------------------------------------
class Program:
    def __init__(self, fd: int, value_bytes: int, job_bytes: int):
        self.fd, self.value_bytes = fd, value_bytes
        self.channel = child.Channel(fd)
        self.decoder = codec.Decoder(self.remote, self.klass, job_bytes, self.kept_here)
        self.encoder = codec.Encoder(self.handle_of, self.describe_for_program, self.keep_here)
        self.callbacks: list = []  # what a test passed into the program that runs here (a lambda, an iterator)
        self.classes: dict[int, type] = {}  # class handle -> stand-in
        self.stand_ins: dict[int, object] = {}  # object handle -> its stand-in (the program keeps its objects)
        self.descs: dict[int, dict] = {}
        self.directory: dict[str, object] = {}  # the program's functions and classes as it ran (sent with ready)
        self.asked = False  # a request other than `get` went out: the program may have rebound its names
        # calls sent ahead (send_ahead), in order: [handle, number of arguments, keyword names, reply or None]
        self.ahead: collections.deque = collections.deque()

    # -- requests
    def request(self, *req):
        if self.ahead:  # replies to calls sent ahead come first on the connection: read them before asking more
            self.drain_ahead()
        if req[0] != "get":
            self.asked = True
        self.send(req)
        return self.reply()

    def send(self, req, text: str | None = None) -> None:
        """Request `req` (or one already encoded as JSON `text`)."""
        try:
            child.send(self.fd, (text if text is not None else child.dumps(req)).encode())
        except OSError as exc:
            raise ProgramFailed(f"the program's process is gone ({exc.strerror})") from None

    def send_ahead(self, calls: list, most_bytes: int) -> int:
        """Send `calls` ([handle, args, kwargs] each, in the order the tests make them; as many as fit in
        `most_bytes`) in one request: the program's process runs them one after the other, replying to each as it
        ends, without waiting for the next request; `call` then takes each reply in turn instead of a round trip.
        It stops early (and says so) after a call whose reply refers to an object it keeps (the test might ask
        that object more, and must find it as the call left it) or that raised an exception of its own kind; the
        calls it skipped are asked again one at a time when the tests make them. Returns how many were sent (none
        when fewer than two fit)."""
        parts, size = [], 0
        for h, a, k in calls:
            part = child.dumps([h, self.encoder.tree(list(a)), self.encoder.tree(dict(k))])
            size += len(part) + 1
            if size > most_bytes:
                break
            parts.append(part)
        if len(parts) < 2:  # not worth it
            return 0
        self.asked = True
        self.send(None, '["calls",[' + ",".join(parts) + "]]")
        self.ahead.extend([h, len(a), tuple(k), None] for h, a, k in calls[:len(parts)])
        return len(parts)

    def drain_ahead(self) -> None:
        """Read the replies still due to calls sent ahead (the program has run, or is running, those calls), kept
        for `call`; calls after one where the program stopped running ahead are forgotten."""
        read = collections.deque()
        while self.ahead:
            entry = self.ahead.popleft()
            read.append(entry)
            if entry[3] is None:
                kind, payload, more = self.read()
                entry[3] = (kind, payload)
                if not more:
                    break
        self.ahead = read

    def reply(self):
        kind, payload, _ = self.read()
        if kind == "ok":
            return payload
        if kind == "err":
            raise self.exception(payload)
        raise ProgramFailed(f"an unexpected reply {kind!r}")

    def read(self) -> tuple:
        """The next reply: (kind, payload, whether the program goes on running calls sent ahead). Callbacks the
        program makes meanwhile (it calls a function or iterator the test passed it) are run here first."""
        kind, payload, more = self.read_one()
        while kind == "cb":
            self.callback(payload)
            kind, payload, more = self.read_one()
        return kind, payload, more

    def callback(self, payload) -> None:
        """Run what the test passed into the program, as the program asks (`f(x)`, `next(it)`), and answer."""
        try:
            k, op, args, kwargs = payload
            target = self.kept_here(k, "f")
            args, kwargs = self.value(args), self.value(kwargs)
            if not isinstance(args, list) or not isinstance(kwargs, dict) or op not in ("call", "next"):
                raise ValueError("a malformed callback")
            answer = ["cbret", "ok", self.encoder.tree(target(*args, **kwargs) if op == "call" else next(target))]
        except StopIteration:
            answer = ["cbret", "stop", None]
        except (ProgramFailed, RecursionError):
            raise
        except Exception as exc:  # noqa: BLE001 - the test's function raised: raised in the program, as there
            answer = ["cbret", "err", [type(exc).__name__, _describe(exc)]]
        self.send(answer)

    def keep_here(self, obj):
        """The encoder's hook: a callable or iterator of the test's (not the program's) stays here; the program
        gets a reference it calls back through."""
        if isinstance(obj, (Remote, RemoteMeta)) or isinstance(obj, type) and obj in codec.BUILTIN_TYPES.values():
            return None
        iterator = hasattr(type(obj), "__next__")
        if not (iterator or callable(obj)):
            return None
        self.callbacks.append(obj)
        return ["J", len(self.callbacks) - 1, "i" if iterator else "f"]

    def kept_here(self, k, kind):
        if type(k) is not int or not 0 <= k < len(self.callbacks):
            raise ValueError("a callback that was never passed")
        return self.callbacks[k]

    def read_one(self) -> tuple:
        try:
            data = self.channel.recv(self.value_bytes)
        except ValueError as exc:
            raise ProgramFailed(f"a value larger than the sandbox's limit ({exc})") from None
        except OSError as exc:
            raise ProgramFailed(f"the program's process is gone ({exc.strerror})") from None
        if data is None:
            raise ProgramFailed("the program's process ended")
        self.decoder.charge(len(data))
        try:
            kind, payload, *more = json.loads(data.decode())
        except (ValueError, TypeError) as exc:
            raise ProgramFailed(f"an unreadable reply ({type(exc).__name__})") from None
        return kind, payload, more == [True]

    def first(self):
        """The program's process's first word: None (ready), or why the program did not run to its end."""
        data = self.channel.recv(self.value_bytes)
        if data is None:
            return "the program ended its process"
        self.decoder.charge(len(data))
        kind, payload = json.loads(data)
        if kind == "ready":
            if not isinstance(payload, dict):
                return "an unexpected first reply"
            try:
                self.directory = {k: self.value(v) for k, v in payload.items()}
            except ValueError as exc:
                return f"an unreadable first reply ({exc})"
            return None
        if kind == "exit":
            return f"the program exited with status {str(payload)[:80]}"
        if kind == "err":
            exc = self.exception(payload)
            return f"the program raised {type(exc).__name__}"
        return "an unexpected first reply"

    def value(self, tree):
        return self.decoder.value(tree)

    def get(self, name: str):
        if not self.asked and name in self.directory:
            return self.directory[name]
        return self.value(self.request("get", name))

    def call(self, handle: int, args: tuple, kwargs: dict):
        if self.ahead:
            h, n, keys, got = self.ahead.popleft()
            if h != handle or n != len(args) or keys != tuple(kwargs):
                self.ahead.clear()
                raise ProgramFailed("a call other than the one sent ahead")
            if got is None:
                kind, tree, more = self.read()
                if not more:
                    self.ahead.clear()
            else:
                kind, tree = got
            if kind == "err":
                raise self.exception(tree)
            if kind != "ok":
                raise ProgramFailed(f"an unexpected reply {kind!r}")
        else:
            tree = self.request("call", handle, self.encoder.tree(list(args)), self.encoder.tree(dict(kwargs)))
        ret, after = self.value(tree)
        if not isinstance(after, list) or len(after) != len(args):
            raise ProgramFailed("an unreadable reply (arguments)")
        for orig, new in zip(args, after):  # in-place changes to the arguments, as the program made them
            _sync(orig, new)
            if ret is new and _mutable(orig):
                ret = orig
        return ret

    # -- the codec's hooks
    def handle_of(self, obj) -> int:
        h = getattr(type(obj), "_grpo_handle_of", None)
        if h is None:
            raise TypeError(f"a {type(obj).__name__} of the test cannot be passed to the program's code")
        return h(obj)

    def describe_for_program(self, cls) -> dict:
        fields = getattr(cls, "_fields", None)
        return {"h": getattr(cls, "_grpo_class_handle", None), "n": cls.__name__,
                "nt": list(fields) if isinstance(fields, tuple) else None}

    def remote(self, handle, desc, value=None):
        """The stand-in of the program's object `handle`: one per object, so `is` holds as in the program (an enum
        member, None-like sentinels, the same node reached twice). With `value` (an instance of the program's
        subclass of a plain type): that value, built here, answering as the plain type does."""
        if type(handle) is not int or not isinstance(desc, dict):
            raise ValueError("a malformed object reference")
        cls = self.klass(desc)
        obj = self.stand_ins.get(handle)
        if obj is not None and type(obj) is cls and value is None:
            return obj
        if value is not None:
            base = next((b for b in codec.PLAIN_BASES if issubclass(cls, b)), None)
            if base is None or not isinstance(value, base):
                raise ValueError("a subclass value that is not of its class's plain type")
            if obj is not None and type(obj) is cls:  # the same object again: the same stand-in, as it is now
                if base in (list, dict, set):
                    base.clear(obj)
                    (base.extend if base is list else base.update)(obj, value)
                    return obj
                if base.__eq__(obj, value) is True:
                    return obj
            if base in (list, dict, set):
                obj = base.__new__(cls)
                base.__init__(obj, value)
            else:
                obj = base.__new__(cls, value)
        elif issubclass(cls, BaseException):
            obj = BaseException.__new__(cls)
        else:
            obj = object.__new__(cls)
        object.__setattr__(obj, "_grpo_h", handle)
        self.stand_ins[handle] = obj
        return obj

    def klass(self, desc: dict) -> type:
        if not isinstance(desc, dict) or type(desc.get("h")) is not int:
            raise ValueError("a malformed class description")
        h = desc["h"]
        if h in self.classes:
            return self.classes[h]
        if "n" not in desc:
            raise ValueError("a class referred to before it was described")
        self.descs[h] = desc
        name = str(desc.get("n"))[:200]
        if not name.isidentifier():
            name = "ProgramClass"
        nt = desc.get("nt")
        real = _BUILTIN_BASES.get(desc.get("q")) if desc.get("m") == "builtins" and not nt else None
        if real is not None:  # a built-in exception or plain type (a base of the program's own class): the real
            self.classes[h] = real  # one, from a closed table; no other class is looked up by a name it chose
            return real
        if nt is not None:
            if not isinstance(nt, list) or not all(isinstance(f, str) and f.isidentifier() for f in nt):
                raise ValueError("a malformed namedtuple")
        if nt is not None and desc.get("m") not in codec.PROGRAM_MODULES:  # a library's (the program's own: a
            cls = collections.namedtuple(name, nt, rename=True)  # tuple whose fields and methods are asked there)
            cls._grpo_class_handle = h
            self.classes[h] = cls
            return cls
        bases = [self.klass(b) for b in desc.get("b") or []][:16]
        bases = [b for b in bases if issubclass(b, (Remote, BaseException, *codec.PLAIN_BASES))]
        if desc.get("e") and not any(issubclass(b, BaseException) for b in bases):
            bases.append(Exception)
        if any(issubclass(b, codec.PLAIN_BASES) for b in bases):  # the plain type answers first (==, len, [])
            bases = [b for b in bases if issubclass(b, codec.PLAIN_BASES)][:1] + [Remote]
        elif not any(issubclass(b, Remote) for b in bases):
            bases.insert(0, Remote)
        fields = desc.get("dc")
        if isinstance(fields, list) and all(isinstance(f, str) and f.isidentifier() for f in fields):
            # a dataclass of the program's: a dataclass here too (no methods, no class attributes: every field is
            # read from the program's object), so that asdict(), astuple() and fields() in a test work
            import dataclasses

            bases.append(dataclasses.make_dataclass(name, list(dict.fromkeys(fields)), init=False, repr=False,
                                                    eq=False))
        try:
            cls = RemoteMeta(name, tuple(bases), self.namespace(h, desc))
        except TypeError:  # an inconsistent order of bases: the stand-in keeps the first
            cls = RemoteMeta(name, (bases[0],), self.namespace(h, desc))
        self.classes[h] = cls
        return cls

    def namespace(self, h: int, desc: dict) -> dict:
        ns = {"_grpo_class_handle": h, "_grpo_program": self, "__module__": str(desc.get("m")),
              "__doc__": _Asked("__doc__")}
        for name in desc.get("o") or ():  # special methods the program's subclass of a plain type defines
            if name in codec.OVERRIDABLE:
                ns[name] = _OVERRIDES.get(name) or _binary(name)
        return ns

    def exception(self, payload) -> BaseException:
        try:
            desc, msg, args, *kept = payload
            cls = self.klass(desc)
            args = self.value(args)
        except (ValueError, TypeError):
            return ProgramFailed("an unreadable exception")
        if issubclass(cls, Remote) and issubclass(cls, BaseException):
            exc = BaseException.__new__(cls)
            # (object.__setattr__: a stand-in's own __setattr__ would ask the program's process)
            object.__setattr__(exc, "args", tuple(args) if isinstance(args, list) else (str(msg),))
            # the program keeps its exception: `e.code`, `str(e)` are asked of it, as of any of its objects
            object.__setattr__(exc, "_grpo_h", kept[0] if kept and type(kept[0]) is int else None)
            object.__setattr__(exc, "_grpo_msg", str(msg))
            return exc
        if isinstance(cls, type) and issubclass(cls, BaseException):
            try:
                return cls(*args) if isinstance(args, list) else cls(str(msg))
            except Exception:  # noqa: BLE001 - an exception type whose constructor wants other arguments
                exc = BaseException.__new__(cls)
                exc.args = (str(msg),)
                return exc
        return RuntimeError(f"{getattr(cls, '__name__', '?')}: {str(msg)[:200]}")


def _mutable(x) -> bool:
    return isinstance(x, (list, dict, set, bytearray, collections.deque))


def _sync(orig, new, depth: int = 0) -> None:
    """Make `orig` (the test's argument) hold what the program left in its copy, in place all the way down: a
    list or dict inside it that the program changed in place is changed in place here too (the test may hold it
    under another name), one it replaced is replaced."""
    if orig is new or not _mutable(orig) or type(new) is not type(orig) and not (
            isinstance(orig, dict) and isinstance(new, dict)):
        return
    if isinstance(orig, list) and len(orig) == len(new) and depth < codec.MAX_DEPTH:
        for k, (o, n) in enumerate(zip(orig, new)):
            if _mutable(o) and type(o) is type(n):
                _sync(o, n, depth + 1)
            else:
                orig[k] = n
    elif isinstance(orig, (list, bytearray)):
        orig[:] = new
    elif isinstance(orig, collections.deque):
        orig.clear()
        orig.extend(new)
    elif isinstance(orig, dict) and depth < codec.MAX_DEPTH:
        for key in [key for key in orig if key not in new]:
            del orig[key]
        for key, n in new.items():
            o = orig.get(key)
            if _mutable(o) and type(o) is type(n) and key in orig:
                _sync(o, n, depth + 1)
            else:
                orig[key] = n
    else:  # set
        orig.clear()
        orig.update(new)


# ---- stand-ins for what the program keeps -----------------------------------------------------------------
class RemoteMeta(type):
    """The stand-in of one of the program's classes: calling it constructs in the program's process; reading an
    attribute reads the program's class (an enum member, a static method)."""

    def __call__(cls, *args, **kwargs):
        return cls._grpo_program.call(cls._grpo_class_handle, args, kwargs)

    def __getattr__(cls, name):
        if name.startswith("_grpo") or name.startswith("__") and name not in _ASKED_DUNDERS:
            raise AttributeError(name)
        return cls._grpo_program.value(cls._grpo_program.request("attr", cls._grpo_class_handle, name))

    def _grpo_class_op(cls, name, *args):
        program = cls._grpo_program
        return program.value(program.request("op", cls._grpo_class_handle, name, program.encoder.tree(list(args))))

    def __getitem__(cls, key):  # an enum's members by name: Color["RED"]
        return cls._grpo_class_op("getitem", key)

    def __iter__(cls):  # list(Color)
        return iter(cls._grpo_class_op("list"))

    def __len__(cls):
        n = cls._grpo_class_op("len")
        if type(n) is not int or n < 0:
            raise TypeError("len() of the program's class is not an int")
        return n


# special attributes a test reads of a program's function or object, asked of the program's process
_ASKED_DUNDERS = frozenset({"__name__", "__qualname__", "__doc__", "__wrapped__", "__annotations__",
                            "__defaults__", "__kwdefaults__"})


class _Asked:
    """A class attribute the stand-in's own class would answer (`__doc__`): for an instance, asked of the program."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, obj, cls=None):
        if obj is None:
            return cls._grpo_program.value(cls._grpo_program.request("attr", cls._grpo_class_handle, self.name))
        return Remote.__getattr__(obj, self.name)


def _binary(name: str):
    def op(self, other):
        return self._grpo_binary(name, other)

    op.__name__ = name
    return op


def _format(self, spec):
    s = self._grpo_op("format", spec)
    if not isinstance(s, str):
        raise TypeError("format() of the program's object is not a str")
    return s


_OVERRIDES = {"__neg__": lambda self: self._grpo_op("__neg__"), "__pos__": lambda self: self._grpo_op("__pos__"),
              "__abs__": lambda self: self._grpo_op("__abs__"), "__format__": _format,
              "__missing__": lambda self, key: self._grpo_op("missing", key),
              "__str__": lambda self: Remote.__str__(self), "__repr__": lambda self: Remote.__repr__(self)}


class Remote:
    """An object the program's process keeps."""

    _grpo_class_handle: int
    _grpo_program: Program

    @staticmethod
    def _grpo_handle_of(obj) -> int:
        return object.__getattribute__(obj, "_grpo_h")

    def _grpo(self):
        return type(self)._grpo_program, object.__getattribute__(self, "_grpo_h")

    def __getattr__(self, name):
        if name.startswith("__") and name not in _ASKED_DUNDERS or name.startswith("_grpo"):
            raise AttributeError(name)
        program, h = self._grpo()
        if h is None:
            raise AttributeError(name)
        return program.value(program.request("attr", h, name))

    def __setattr__(self, name, value):
        program, h = self._grpo()
        program.request("setattr", h, name, program.encoder.tree(value))

    def __call__(self, *args, **kwargs):
        program, h = self._grpo()
        return program.call(h, args, kwargs)

    def _grpo_state(self) -> dict:
        program, h = self._grpo()
        return program.value(program.request("state", h))

    def __eq__(self, other):
        if not isinstance(other, Remote) or type(other)._grpo_class_handle != type(self)._grpo_class_handle:
            return NotImplemented
        if self._grpo()[1] == other._grpo()[1]:
            return True
        return self._grpo_state() == other._grpo_state()

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        return hash(type(self).__name__)

    def _grpo_op(self, name, *args):
        program, h = self._grpo()
        return program.value(program.request("op", h, name, program.encoder.tree(list(args))))

    def _grpo_binary(self, name, other, both_program=False):
        if both_program and not isinstance(other, Remote):
            return NotImplemented  # a program's object never decides how it orders against a test's value
        try:
            return self._grpo_op(name, other)
        except TypeError:
            return NotImplemented

    def __add__(self, other):
        return self._grpo_binary("__add__", other)

    def __radd__(self, other):
        return self._grpo_binary("__radd__", other)

    def __sub__(self, other):
        return self._grpo_binary("__sub__", other)

    def __rsub__(self, other):
        return self._grpo_binary("__rsub__", other)

    def __mul__(self, other):
        return self._grpo_binary("__mul__", other)

    def __rmul__(self, other):
        return self._grpo_binary("__rmul__", other)

    def __truediv__(self, other):
        return self._grpo_binary("__truediv__", other)

    def __rtruediv__(self, other):
        return self._grpo_binary("__rtruediv__", other)

    def __floordiv__(self, other):
        return self._grpo_binary("__floordiv__", other)

    def __rfloordiv__(self, other):
        return self._grpo_binary("__rfloordiv__", other)

    def __mod__(self, other):
        return self._grpo_binary("__mod__", other)

    def __rmod__(self, other):
        return self._grpo_binary("__rmod__", other)

    def __pow__(self, other):
        return self._grpo_binary("__pow__", other)

    def __rpow__(self, other):
        return self._grpo_binary("__rpow__", other)

    def __matmul__(self, other):
        return self._grpo_binary("__matmul__", other)

    def __rmatmul__(self, other):
        return self._grpo_binary("__rmatmul__", other)

    def __and__(self, other):
        return self._grpo_binary("__and__", other)

    def __rand__(self, other):
        return self._grpo_binary("__rand__", other)

    def __or__(self, other):
        return self._grpo_binary("__or__", other)

    def __ror__(self, other):
        return self._grpo_binary("__ror__", other)

    def __xor__(self, other):
        return self._grpo_binary("__xor__", other)

    def __rxor__(self, other):
        return self._grpo_binary("__rxor__", other)

    def __lshift__(self, other):
        return self._grpo_binary("__lshift__", other)

    def __rlshift__(self, other):
        return self._grpo_binary("__rlshift__", other)

    def __rshift__(self, other):
        return self._grpo_binary("__rshift__", other)

    def __rrshift__(self, other):
        return self._grpo_binary("__rrshift__", other)
    def __lt__(self, other):
        return self._grpo_binary("__lt__", other, both_program=True)

    def __le__(self, other):
        return self._grpo_binary("__le__", other, both_program=True)

    def __gt__(self, other):
        return self._grpo_binary("__gt__", other, both_program=True)

    def __ge__(self, other):
        return self._grpo_binary("__ge__", other, both_program=True)

    def __neg__(self):
        return self._grpo_op("__neg__")

    def __pos__(self):
        return self._grpo_op("__pos__")

    def __abs__(self):
        return self._grpo_op("__abs__")

    def __len__(self):
        n = self._grpo_op("len")
        if type(n) is not int or n < 0:
            raise TypeError("len() of the program's object is not an int")
        return n

    def __bool__(self):
        """As in the program (`not stack` on an empty one): a truth the program states is no more than a value it
        returns (`False`, `[]`) would be."""
        if self._grpo()[1] is None:
            return True
        b = self._grpo_op("bool")
        if type(b) is not bool:
            raise TypeError("bool() of the program's object is not a bool")
        return b

    def __copy__(self):
        return self._grpo_op("copy")

    def __deepcopy__(self, memo):
        return self._grpo_op("deepcopy")

    def __iter__(self):
        it = self._grpo_op("iter")
        while True:
            items, done = it._grpo_op("next", 256) if isinstance(it, Remote) else ([], True)
            yield from items
            if done:
                return

    def __next__(self):
        items, done = self._grpo_op("next", 1)
        if not items:
            raise StopIteration
        return items[0]

    def __getitem__(self, key):
        return self._grpo_op("getitem", key)

    def __setitem__(self, key, value):
        self._grpo_op("setitem", key, value)

    def __delitem__(self, key):
        self._grpo_op("delitem", key)

    def __contains__(self, item):
        return self._grpo_op("contains", item) is True

    def __str__(self):
        if self._grpo()[1] is None:  # an exception the program's process no longer keeps: its message
            return str(getattr(self, "_grpo_msg", "?"))
        s = self._grpo_op("str")
        return s if isinstance(s, str) else "?"

    def __repr__(self):
        try:
            s = self._grpo_op("repr")
        except Exception:  # noqa: BLE001
            s = None
        return s if isinstance(s, str) else f"<{type(self).__name__} of the program>"


# ---- names a test reads -------------------------------------------------------------------------------------
# program_imports, compile_test, call_of: run in the fork server once per distinct program or test, after the
# templates are forked (`ast` is imported then: ~0.5 MB no forked process carries)
def program_imports(source: str) -> dict[str, tuple[str, str | None]]:
    """Names the program binds by an import at module level (its top-level statements, and those nested in a
    top-level `if`, `try` or `with`), read from its syntax tree: name -> (module, attribute or None). An import
    written in a string or a comment is no import."""
    import ast

    out: dict[str, tuple[str, str | None]] = {}
    try:
        body = list(ast.parse(source).body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return out
    while body:
        node = body.pop(0)
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = (a.name, None)
                else:
                    top = a.name.partition(".")[0]
                    out[top] = (top, None)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if a.name != "*":
                    out[a.asname or a.name] = (node.module, a.name)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            nested = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            for handler in getattr(node, "handlers", []):
                nested += handler.body
            body[:0] = nested
    return out


def compile_test(src: str) -> tuple:
    """(code, the names the test reads only as `name.attribute`, its call (`call_of`)): done once per distinct
    test, in the server."""
    import ast

    tree = ast.parse(src)
    modules, _ = _module_uses(tree)
    return compile(tree, "<test>", "exec", dont_inherit=True), sorted(modules), call_of(tree)


def call_of(tree):
    """The one call a test makes when it is nothing but `assert NAME(literals) == literal` (or `!=`, `is`,
    `is not`; or `assert NAME(literals)`, `assert not NAME(literals)`; a message only when it is a literal):
    (NAME, args, kwargs) with the literals' values, else None. Such a test does nothing else to the program
    before or after that call, so the call can be sent ahead of the test (Program.send_ahead)."""
    import ast

    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return None
    node = tree.body[0]
    if node.msg is not None and not isinstance(node.msg, ast.Constant):
        return None
    test = node.test
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    elif isinstance(test, ast.Compare):
        if len(test.ops) != 1 or not isinstance(test.ops[0], (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)):
            return None
        try:
            ast.literal_eval(test.comparators[0])
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        test = test.left
    if not isinstance(test, ast.Call) or not isinstance(test.func, ast.Name):
        return None
    try:
        args = [ast.literal_eval(a) for a in test.args]  # a starred argument is no literal: refused here
        kwargs = {}
        for k in test.keywords:
            if k.arg is None:
                return None
            kwargs[k.arg] = ast.literal_eval(k.value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return test.func.id, args, kwargs


def _module_uses(tree) -> tuple[set[str], set[str]]:
    """(names the test reads only as `name.attribute`, names it reads otherwise)."""
    import ast

    as_module, other = set(), set()
    attr_bases = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            (as_module if id(n) in attr_bases else other).add(n.id)
    return as_module - other, other


class Names(dict):
    """A test's builtins: the real ones, and, for a name neither the test nor builtins bind, what it resolves to
    (module docstring)."""

    def __init__(self, judge: Judge, modules: set[str]):
        super().__init__(vars(builtins))
        self.judge, self.modules = judge, modules

    def __missing__(self, name):
        value = self.judge.resolve(name, name in self.modules)
        self[name] = value
        return value


class Judge:
    def __init__(self, job: dict, program: Program, verdicts: int):
        self.job, self.program, self.out = job, program, verdicts
        self.kept: dict[str, object] = {}  # the program's functions and classes, fetched once per job

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
                    return getattr(mod, attr)
                except AttributeError:
                    return __import__(f"{module}.{attr}", fromlist=["_"])
            except Exception:  # noqa: BLE001 - not importable here: the program's own
                pass
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


    def run(self, start: int, end: int) -> str:
        """Run the tests; the job's last line: `Z` (over) or `R` (the program's process was lost during a test:
        the fork server runs the tests after it in a fresh one)."""
        mode = self.job["mode"]
        why = self.program.first()
        if why is not None:
            self.say(f"E {why}")
            return "Z"
        self.say("D")
        target = None
        ahead_until = start  # the tests before it had their call sent ahead (or were found to have none to send)
        for i in range(start, end):
            self.say(f"S {i}")
            try:
                if mode == "calls":
                    if target is None:
                        target = self.call_target()
                    if i >= ahead_until:
                        ahead_until = i + self.send_ahead(self.planned_cases(target, i, end))
                    ok, detail = self.call_test(target, self.job["cases"][i])
                else:
                    if i >= ahead_until:
                        ahead_until = i + self.send_ahead(self.planned(start, i, end))
                    ok, detail = self.assert_test(self.job["compiled"][i - start])
            except ProgramFailed as exc:  # its process is gone or broken: the job's other tests get a fresh one
                self.say(f"F {i} {exc}")
                return "R"
            except SyntaxError:
                ok, detail = False, "SyntaxError in the test"
            except AssertionError:
                ok, detail = False, "AssertionError"
            except BaseException as exc:  # noqa: BLE001 - the test's own error, or one the program's code raised
                ok, detail = False, _describe(exc)
            self.say(f"P {i}" if ok else f"F {i} {detail}")
        return "Z"

    def planned(self, start: int, i: int, end: int) -> list:
        """The calls of tests i, i+1, ... up to the first test that is not one call of the program's function
        with literals (call_of), or whose name means something else to a test: (stand-in, args, kwargs) each."""
        out, real = [], vars(builtins)
        for compiled in self.job["compiled"][i - start:min(end, i + AHEAD_MOST) - start]:
            call = compiled[2] if compiled is not None else None
            if call is None or call[0] in real or call[0] in _STDLIB_VALUES or call[0] in self.imports():
                break
            try:
                fn = self.resolve(call[0], False)
            except NameError:
                break
            if not isinstance(fn, Remote):
                break
            out.append((fn, call[1], call[2]))
        return out

    def planned_cases(self, target, i: int, end: int) -> list:
        """Call-based cases i, i+1, ... as calls of `target` (up to the first malformed case)."""
        out = []
        for case in self.job["cases"][i:end]:
            if not isinstance(case, (list, tuple)) or len(case) != 2:
                break
            out.append((target, _call_args(case[0]), {}))
        return out

    def send_ahead(self, calls: list) -> int:
        """Send `calls` ((stand-in, args, kwargs) each) ahead of their tests when there are two or more; how many
        tests from here on this settles (at least 1: each test's call is sent ahead at most once)."""
        batch = []
        for fn, args, kwargs in calls[:AHEAD_MOST]:
            h = Remote._grpo_handle_of(fn) if isinstance(fn, Remote) else None
            if h is None:
                break
            batch.append((h, args, kwargs))
        if len(batch) < 2:
            return 1
        return max(1, self.program.send_ahead(batch, AHEAD_BYTES))

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


def _describe(exc: BaseException) -> str:
    try:
        msg = str(exc)
    except Exception:  # noqa: BLE001
        msg = ""
    return f"{type(exc).__name__}: {msg}"[:200] if msg else type(exc).__name__


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


def run_judge(job: dict, start: int, end: int, rpc_fd: int, verdict_fd: int, limits: dict) -> None:
    """One job's tests [start, end); its last line is `Z` (the job is over, whatever happened)."""
    program = Program(rpc_fd, limits["value_bytes"], limits["job_bytes"])
    judge = Judge(job, program, verdict_fd)
    last = "Z"
    try:
        last = judge.run(start, end)
    except BaseException as exc:  # noqa: BLE001 - the judge's own failure ends its job (reported, never a pass)
        try:
            judge.say(f"X judge {type(exc).__name__}: {exc}")
        except OSError:
            pass
    judge.say(last)


def serve(ctrl, verdict_fd: int, limits: dict) -> None:
    """A judge's life: jobs one after the other from the fork server (`ctrl`, a socket: each job a length-prefixed
    marshal with the job's end of its program's socket attached), until the server closes it or replaces this
    judge (after a job over-ran its time, this process is killed with it, and the job's process too). Each job runs
    in a process forked for it from this one, which never runs a test: nothing a job does to the judge's code or
    state (a test that patches it, a value that fooled it) reaches the next job. Verdicts go out on `verdict_fd`
    only; what a test prints goes to /dev/null (fds 1 and 2)."""
    import _socket
    import gc
    import marshal

    gc.freeze()  # a job's collections never write the headers of what it shares with this process
    # one thread and nothing that registers at-fork work: libc's fork, without os.fork's bookkeeping
    fork = template.confine.fork_bare if template.confine.can_fork_bare() else os.fork
    while True:
        head, fds = template.recv_fds(ctrl, 4, 4)
        if len(head) < 4:
            os._exit(0)
        n = int.from_bytes(head, "little")
        payload = ctrl.recv(n, _socket.MSG_WAITALL) if n else b""
        if len(payload) < n or len(fds) != 1:
            os._exit(0)
        pid = fork()
        if pid == 0:  # the job's own judge: a copy of this process that dies with its job
            code = 1
            try:
                ctrl.close()
                job_text, start, end, tests, imports = marshal.loads(payload)
                job = json.loads(job_text)
                job["compiled"], job["imports"] = tests, imports
                run_judge(job, start, end, fds[0], verdict_fd, limits)
                code = 0
            finally:
                os._exit(code)
        os.close(fds[0])
        status = os.waitpid(pid, 0)[1]
        if status != 0:  # it died before its last line: the job ends here, said so (never a pass)
            _say(verdict_fd, f"X judge ended with wait status {status}")
            _say(verdict_fd, "Z")
