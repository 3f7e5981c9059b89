"""The judge's stand-ins for objects the program's process keeps, and what each operation on them asks of that
process (judge process; standard library only: it runs inside the jail). `StandIns` (judge_stand_ins.py) makes
them.

Two kinds, by what Python gives the value its meaning:
- `Remote`: an object of the program's own class (or a function, a generator, a library object). Its operations are
  the program's (arithmetic, `len`, iteration, `float()`, `with`, `await`), asked of its process and answered with
  plain data; `==` is Python's: identity where its class defines no `__eq__`, else its type and fields (the
  program's `__eq__` itself is never asked); it never orders against, or equals, a test's value.
- `Kept`: the program's subclass of a plain type (`class Vec(list)`): the stand-in is the plain value itself, and
  every operator, conversion and iteration is the plain type's (the class's overrides decide nothing); only a
  method the plain type lacks (`v.norm()`), or a dict's `__missing__`, is asked of the program's object.
"""

from __future__ import annotations

# special attributes a test reads of a program's function or object, asked of the program's process
_ASKED_DUNDERS = frozenset({"__name__", "__qualname__", "__doc__", "__wrapped__", "__annotations__",
                            "__defaults__", "__kwdefaults__"})
_PREFETCH = 256  # items of a builtin iterator (a program's list, dict) asked for at once


class _Asked:
    """A class attribute the stand-in's own class would answer (`__doc__`): for an instance, asked of the program."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, obj, cls=None):
        if obj is None:
            return cls._grpo_program.value(cls._grpo_program.request("attr", cls._grpo_class_handle, self.name))
        return Kept.__getattr__(obj, self.name)


class Kept:
    """An object the program's process keeps, as every stand-in has it: its handle, its attributes (asked of the
    program), copies (made there)."""

    _grpo_class_handle: int
    _grpo_program: object  # the judge_link.Program that asks the program's process
    _grpo_prefetch = False  # a builtin iterator: items asked for in batches (no code of the program's runs)

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

    def _grpo_op(self, name, *args):
        program, h = self._grpo()
        return program.value(program.request("op", h, name, program.encoder.tree(list(args))))

    def __copy__(self):
        return self._grpo_op("copy")

    def __deepcopy__(self, memo):
        return self._grpo_op("deepcopy")


def _typed(kind: type, what: str):
    """A conversion the program's object makes (`float(x)`), checked to give exactly the type Python requires."""

    def convert(self, *args):
        v = self._grpo_op(what, *args)
        if type(v) is not kind:
            raise TypeError(f"{what}() of the program's object did not give a {kind.__name__}")
        return v

    convert.__name__ = f"__{what}__"
    return convert


def _binary(name: str, both_program: bool = False):
    def op(self, other):
        if both_program and not isinstance(other, Remote):
            return NotImplemented  # a program's object never decides how it orders against a test's value
        try:
            return self._grpo_op(name, other)
        except TypeError:
            return NotImplemented

    op.__name__ = name
    return op


class Remote(Kept):
    """An object of the program's own (module docstring): every operation a request to its process."""

    _grpo_eq = False  # its class defines __eq__ (program.Service.describe): equal by type and fields, else identity

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
        if not type(self)._grpo_eq:  # as Python compares objects whose class has no __eq__: by identity
            return False
        return self._grpo_state() == other._grpo_state()

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        return hash(type(self).__name__)

    for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor", "lshift",
                  "rshift"):
        locals()[f"__{_name}__"] = _binary(f"__{_name}__")
        locals()[f"__r{_name}__"] = _binary(f"__r{_name}__")
    for _name in ("lt", "le", "gt", "ge"):
        locals()[f"__{_name}__"] = _binary(f"__{_name}__", both_program=True)
    del _name

    def __neg__(self):
        return self._grpo_op("__neg__")

    def __pos__(self):
        return self._grpo_op("__pos__")

    def __abs__(self):
        return self._grpo_op("__abs__")

    __float__ = _typed(float, "float")
    __int__ = _typed(int, "int")
    __index__ = _typed(int, "index")
    __complex__ = _typed(complex, "complex")

    def __round__(self, ndigits=None):
        return self._grpo_op("round", ndigits)

    def __format__(self, spec):
        s = self._grpo_op("format", spec)
        if not isinstance(s, str):
            raise TypeError("format() of the program's object is not a str")
        return s

    @property
    def __dict__(self):  # vars(obj): the program's object's attributes
        d = self._grpo_op("vars")
        if not isinstance(d, dict):
            raise TypeError("vars() of the program's object is not a dict")
        return d

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

    def __iter__(self):
        it = self._grpo_op("iter")
        if it is self:  # an iterator of its own (a generator): one item at a time, as the test takes them
            return self
        if isinstance(it, Remote) and type(it)._grpo_prefetch:
            return _prefetched(it)
        return it if isinstance(it, Remote) else iter(())

    def __next__(self):
        items, done, *value = self._grpo_op("next", 1)
        if not items:
            raise StopIteration(*value[:1])
        return items[0]

    def __enter__(self):
        return self._grpo_op("enter")

    def __exit__(self, kind, exc, tb):
        """The program's `__exit__` runs, told of the test's exception by its built-in class name and message; what
        it returns is not taken: a test's exception (a failed assert among them) always goes on."""
        told = None if kind is None else [kind.__name__, str(exc)[:1000]]
        self._grpo_op("exit", told)
        return False

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


def _prefetched(it: Remote):
    """A builtin iterator's items (a program's list or dict iterated by a test), fetched in batches."""
    while True:
        items, done, *_ = it._grpo_op("next", _PREFETCH)
        yield from items
        if done:
            return


class RemoteAwaitable(Remote):
    """The program's coroutine (or other awaitable): awaited in a test (`asyncio.run(fetch(1))`, `await f()` in a
    test's coroutine), it runs to its end in the program's process (an event loop of its own there) and gives its
    value; a coroutine to asyncio's checks."""

    def send(self, value):
        raise StopIteration(self._grpo_op("await"))

    def throw(self, *args):
        raise args[1] if len(args) > 1 and isinstance(args[1], BaseException) else args[0]

    def close(self):
        return None

    def __await__(self):
        return self

    def __next__(self):
        return self.send(None)


MISSING = {"__missing__": lambda self, key: self._grpo_op("missing", key)}  # the one hook a plain type lacks
