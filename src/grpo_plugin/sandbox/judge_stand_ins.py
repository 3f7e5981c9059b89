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
    from .judge_remote import _ASKED_DUNDERS, MISSING, Kept, Remote, RemoteAwaitable, _Asked
except ImportError:  # in the jail: top-level modules beside forkserver.py
    import codec
    from judge_remote import _ASKED_DUNDERS, MISSING, Kept, Remote, RemoteAwaitable, _Asked

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
        bases = [b for b in bases if issubclass(b, (Kept, BaseException, *codec.PLAIN_BASES))]
        if desc.get("e") and not any(issubclass(b, BaseException) for b in bases):
            bases.append(Exception)
        plain = [b for b in bases if issubclass(b, codec.PLAIN_BASES)][:1]
        if plain:  # the plain type answers everything it defines (==, in, +, str, iteration); the program only
            bases = plain + [Kept]  # what it lacks (judge_remote.py)
        elif desc.get("aw") and not any(issubclass(b, RemoteAwaitable) for b in bases):
            bases.insert(0, RemoteAwaitable)
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
              "__doc__": _Asked("__doc__"), "_grpo_eq": desc.get("eq") is True,
              "_grpo_prefetch": desc.get("m") == "builtins" and str(desc.get("n")).endswith("iterator")}
        if "__missing__" in (desc.get("o") or ()):  # a dict subclass's default for a missing key
            ns.update(MISSING)
        return ns

    def exception(self, payload, depth: int = 0) -> BaseException:
        try:
            desc, msg, args, *rest = payload
            cls = self.klass(desc)
            args = self.program.value(args)
            kept = rest[0] if rest and type(rest[0]) is int else None
            more = rest[1] if len(rest) > 1 and isinstance(rest[1], dict) else {}
        except (ValueError, TypeError):
            return ProgramFailed("an unreadable exception")
        if issubclass(cls, Kept) and issubclass(cls, BaseException):
            exc = BaseException.__new__(cls)
            # (object.__setattr__: a stand-in's own __setattr__ would ask the program's process)
            object.__setattr__(exc, "args", tuple(args) if isinstance(args, list) else (str(msg),))
            # the program keeps its exception: `e.code`, `str(e)` are asked of it, as of any of its objects
            object.__setattr__(exc, "_grpo_h", kept)
            object.__setattr__(exc, "_grpo_msg", str(msg))
        elif isinstance(cls, type) and issubclass(cls, BaseException):
            try:
                exc = cls(*args) if isinstance(args, list) else cls(str(msg))
            except Exception:  # noqa: BLE001 - an exception type whose constructor wants other arguments
                exc = BaseException.__new__(cls)
                exc.args = (str(msg),)
            attrs = self.program.value(more["a"]) if "a" in more else {}
            for k, v in attrs.items() if isinstance(attrs, dict) else ():  # `err.code = 3` on a built-in one
                if isinstance(k, str) and k.isidentifier() and not k.startswith("_") and k != "args":
                    setattr(exc, k, v)
        else:
            return RuntimeError(f"{getattr(cls, '__name__', '?')}: {str(msg)[:200]}")
        if "c" in more and depth < 4:  # raise ... from e
            cause = self.exception(more["c"], depth + 1)
            BaseException.__cause__.__set__(exc, cause)
        return exc


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


def describe_exception(exc: BaseException) -> str:
    try:
        msg = str(exc)
    except Exception:  # noqa: BLE001
        msg = ""
    return f"{type(exc).__name__}: {msg}"[:200] if msg else type(exc).__name__
