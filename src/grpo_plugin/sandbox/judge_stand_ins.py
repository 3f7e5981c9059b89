"""The judge's stand-ins for what the program's process keeps (judge process; standard library only: it runs
inside the jail). `StandIns` builds them from the program's descriptions — a class per described class, one object
per handle — and rebuilds values, never behaviour: the only classes taken by the name a description gives are the
built-in exceptions and plain types, from closed tables; every other class is a `RemoteMeta` whose every operation
is a request to the program's process (`Remote`), and an exception the program raised is rebuilt as its built-in
class or as such a stand-in."""

from __future__ import annotations

import builtins
import collections

try:
    from . import codec
except ImportError:  # in the jail: top-level modules beside forkserver.py
    import codec

# the only classes the judge takes by the name a program's description gives: the built-in exceptions, whose
# constructors store their arguments and nothing more, and the plain types (bases of the program's own subclasses)
BUILTIN_EXCEPTIONS = {name: obj for name, obj in vars(builtins).items()
                      if isinstance(obj, type) and issubclass(obj, BaseException)}
_BUILTIN_BASES = {**BUILTIN_EXCEPTIONS, **{t.__name__: t for t in codec.PLAIN_BASES}}
# how program.Service describes the class of a `def` or `lambda` (no bases of its own, nothing special)
_FUNCTION = {"n": "function", "q": "function", "m": "builtins", "e": False, "nt": None, "b": []}


class ProgramFailed(Exception):
    """The program's process could not serve a request (it ended, or sent what cannot be read)."""


class StandIns:
    """What the judge builds for the program's classes and objects (`program`: the judge_link.Program that asks
    the program's process)."""

    def __init__(self, program):
        self.program = program
        self.classes: dict[int, type] = {}  # class handle -> stand-in
        self.objects: dict[int, object] = {}  # object handle -> its stand-in (the program keeps its objects)
        self.functions: set[int] = set()  # handles of the classes described exactly as a plain function's

    def function(self, desc) -> bool:
        """Whether `desc` describes the class of the program's plain functions (`def`, `lambda`), or is a reference
        to a class described so: the one kind of object a judge takes in place (codec.Decoder.plain_only)."""
        if not isinstance(desc, dict) or type(desc.get("h")) is not int:
            return False
        h = desc["h"]
        if h in self.classes or len(desc) == 1:
            return h in self.functions
        if desc == {"h": h, **_FUNCTION}:
            self.functions.add(h)
            self.klass(desc)  # described once: a later reference finds it, whatever else this value holds
            return True
        return False

    def remote(self, handle, desc, value=None):
        """The stand-in of the program's object `handle`: one per object, so `is` holds as in the program (an enum
        member, None-like sentinels, the same node reached twice). With `value` (an instance of the program's
        subclass of a plain type): that value, built here, answering as the plain type does."""
        if type(handle) is not int or not isinstance(desc, dict):
            raise ValueError("a malformed object reference")
        cls = self.klass(desc)
        obj = self.objects.get(handle)
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
        self.objects[handle] = obj
        return obj

    def klass(self, desc: dict) -> type:
        if not isinstance(desc, dict) or type(desc.get("h")) is not int:
            raise ValueError("a malformed class description")
        h = desc["h"]
        if h in self.classes:
            return self.classes[h]
        if "n" not in desc:
            raise ValueError("a class referred to before it was described")
        name = str(desc.get("n"))[:200]
        if not name.isidentifier():
            name = "ProgramClass"
        nt = desc.get("nt")
        real = _BUILTIN_BASES.get(desc.get("q")) if desc.get("m") == "builtins" and not nt else None
        if real is not None:  # a built-in exception or plain type (a base of the program's own class): the real
            self.classes[h] = real  # one, from a closed table; no other class is looked up by a name it chose
            return real
        if nt is not None and not (isinstance(nt, list) and all(isinstance(f, str) and f.isidentifier() for f in nt)):
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
        ns = {"_grpo_class_handle": h, "_grpo_program": self.program, "__module__": str(desc.get("m")),
              "__doc__": _Asked("__doc__")}
        for name in desc.get("o") or ():  # special methods the program's subclass of a plain type defines
            if name in codec.OVERRIDABLE:
                ns[name] = _OVERRIDES.get(name) or _binary(name)
        return ns

    def exception(self, payload) -> BaseException:
        try:
            desc, msg, args, *kept = payload
            cls = self.klass(desc)
            args = self.program.value(args)
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
    _grpo_program: object  # the judge_link.Program that asks the program's process

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


def describe_exception(exc: BaseException) -> str:
    try:
        msg = str(exc)
    except Exception:  # noqa: BLE001
        msg = ""
    return f"{type(exc).__name__}: {msg}"[:200] if msg else type(exc).__name__
