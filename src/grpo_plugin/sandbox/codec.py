"""Values between a program's process and its judge (standard library only: both run inside the jail).

A value is plain JSON with tagged lists for everything JSON lacks: `["L", ...]` a list, `["T", ...]` a tuple,
`["D", k, v, ...]` a dict, the stdlib value types code returns (`Fraction`, `Decimal` with the program's context,
`datetime` with its zone's name, `date`, `time`, `timedelta`, `deque`, `Counter`, `OrderedDict`, `defaultdict` with
its factory, namedtuples, `frozenset`, `complex`, `bytes`, `bytearray`, `range`, `array.array`, big ints, dict views,
numpy numbers), the builtin types by name (`["bt", "int"]`), `["@", k]` the k-th container already sent (aliasing
and cycles survive the trip), `["O", handle, class]` an object the program's process keeps (an instance of the
program's own class, a function, a generator: the judge gets a stand-in that forwards what it is asked to the
program's process), `["SV", handle, class, value]` the program's subclass of a plain type (its value, and the
object for its methods), and `["J", k, kind]` a function or iterator of the test's that the program calls back.

`Encoder` runs in the program's process (it may be fooled there: the program owns that process; whatever it sends
is simply what the program returned). `Decoder` runs in the judge and treats every byte as untrusted: a malformed,
too deep or too large value is a `ValueError` naming what was wrong, never a crash or a pass.
"""

from __future__ import annotations

import collections
import datetime
import json
import math
import sys

MAX_DEPTH = 200
_INT_JSON = 1 << 62  # larger ints travel as hex (json's decimal conversion is capped at 4300 digits)


def _is_namedtuple(t: type) -> bool:
    return issubclass(t, tuple) and hasattr(t, "_fields") and isinstance(getattr(t, "_fields", None), tuple)


class Encoder:
    """Values -> JSON-able trees. `handle(obj)` gives a number for an object that stays in this process and
    `describe(cls)` a class's description (the program's process provides both: it keeps the objects)."""

    def __init__(self, handle, describe, foreign=None):
        """`foreign(obj)`: the tree of an object of the OTHER side's kept here (a callable or iterator a test
        passes into the program: `["J", k, kind]`), or None when `obj` is not one."""
        self.handle, self.describe, self.foreign = handle, describe, foreign

    def encode(self, value) -> str:
        return json.dumps(self.tree(value), separators=(",", ":"))

    def tree(self, value):
        memo: dict[int, int] = {}
        keep: list = []  # the objects numbered, alive until the end (ids stay unique)
        return self._t(value, memo, keep, 0)

    def _t(self, x, memo, keep, depth):
        """JSON's own values as themselves; a container already sent as its number; a list or a tuple here (the
        most frequent: a call per container would cost ~3% of the encoding); any other value by its type's entry
        in _BY_TYPE, else by _other."""
        t = type(x)
        if x is None or t is bool or t is str:
            return x
        if t is int:
            return x if -_INT_JSON < x < _INT_JSON else ["I", format(x, "x")]
        if t is float:
            return x if x == x and x not in (float("inf"), float("-inf")) else ["f", repr(x)]
        if depth > MAX_DEPTH:
            raise ValueError("nested too deep")
        d = depth + 1
        k = memo.get(id(x))
        if k is not None:
            return ["@", k]
        if t is tuple:
            return ["T", *x] if _scalars(x) else ["T", *[self._t(e, memo, keep, d) for e in x]]
        if t is list:
            memo[id(x)] = len(memo)
            keep.append(x)
            return ["L", *x] if _scalars(x) else ["L", *[self._t(e, memo, keep, d) for e in x]]
        put = _BY_TYPE.get(t)
        if put is not None:
            return put(self, x, memo, keep, d)
        return self._other(x, t, memo, keep, depth)

    def _other(self, x, t, memo, keep, depth):
        """A value of a type loaded only where a program imports it (_BY_NAME), numpy's, the program's subclass of
        a plain type, a namedtuple, a type, the test's callback, a library's subclass of a plain type, else an
        object kept here (checked in that order)."""
        d = depth + 1
        named = _BY_NAME.get(t.__name__)
        if named is not None and t is getattr(sys.modules.get(named[0]), t.__name__, None):
            return named[1](self, x, memo, keep, d)
        np = sys.modules.get("numpy")  # loaded only where a program or a test imported it
        if np is not None and isinstance(x, (np.ndarray, np.generic)) and x.dtype.kind in _NUMPY_KINDS:
            return self._numpy(x, np, memo, keep, d)
        base = _plain_base(x)
        if base is not None and getattr(t, "__module__", None) in PROGRAM_MODULES:
            # the program's own subclass of a plain type (`class Vec(list)`, a NamedTuple, an IntEnum): its value,
            # and the object itself kept there for what only it knows (its methods, its fields' names)
            memo[id(x)] = len(memo)
            keep.append(x)
            return ["SV", self.handle(x), self.describe(t), self._t(_raw(base, x), memo, keep, d)]
        if _is_namedtuple(t):
            return ["NT", self.describe(t), *[self._t(e, memo, keep, d) for e in x]]
        if isinstance(x, type) and x in _BUILTIN_TYPE_NAMES:
            return ["bt", _BUILTIN_TYPE_NAMES[x]]
        own = self.foreign(x) if self.foreign is not None else None
        if own is not None:
            return own
        if isinstance(x, type):
            return ["K", self.describe(x)]
        if base is not None:  # a library's subclass of a plain type (an int with a name, a dict with helpers)
            return self._t(_raw(base, x), memo, keep, depth)
        memo[id(x)] = len(memo)
        keep.append(x)
        return ["O", self.handle(x), self.describe(t)]

    # -- one per type (x, the numbering memo, what it keeps alive, the depth of x's elements); a mutable value is
    # numbered before its elements, in the order the Decoder numbers what it builds

    def _items(self, x, memo, keep, d) -> list:
        """A mapping's keys and values in turn, the mapping numbered first."""
        memo[id(x)] = len(memo)
        keep.append(x)
        items = []
        for key, val in x.items():
            items.append(self._t(key, memo, keep, d))
            items.append(self._t(val, memo, keep, d))
        return items

    def _dict(self, x, memo, keep, d):
        return ["D", *self._items(x, memo, keep, d)]

    def _ordered_dict(self, x, memo, keep, d):
        return ["OD", *self._items(x, memo, keep, d)]

    def _counter(self, x, memo, keep, d):
        return ["Ct", *self._items(x, memo, keep, d)]

    def _defaultdict(self, x, memo, keep, d):
        f = x.default_factory  # a builtin type travels by name; the program's own factory as an object it keeps
        # the factory first, then the dict and its items: the order the Decoder builds (and numbers) them in
        factory = None if f is None else self._t(f, memo, keep, d)
        return ["DD", factory, *self._items(x, memo, keep, d)]

    def _set(self, x, memo, keep, d):
        memo[id(x)] = len(memo)
        keep.append(x)
        return ["S", *x] if _scalars(x) else ["S", *[self._t(e, memo, keep, d) for e in x]]

    def _frozenset(self, x, memo, keep, d):
        return ["F", *x] if _scalars(x) else ["F", *[self._t(e, memo, keep, d) for e in x]]

    def _bytes(self, x, memo, keep, d):
        return ["B", x.hex()]

    def _bytearray(self, x, memo, keep, d):
        memo[id(x)] = len(memo)
        keep.append(x)
        return ["Y", x.hex()]

    def _complex(self, x, memo, keep, d):
        return ["C", repr(x.real), repr(x.imag)]

    def _range(self, x, memo, keep, d):
        return ["R", self._t(x.start, memo, keep, d), self._t(x.stop, memo, keep, d), self._t(x.step, memo, keep, d)]

    def _datetime(self, x, memo, keep, d):
        return _clock("dt", x)

    def _time(self, x, memo, keep, d):
        return _clock("ti", x)

    def _date(self, x, memo, keep, d):
        return ["da", x.isoformat(), None]

    def _timedelta(self, x, memo, keep, d):
        return ["td", x.days, x.seconds, x.microseconds]

    def _deque(self, x, memo, keep, d):
        memo[id(x)] = len(memo)
        keep.append(x)
        return ["dq", x.maxlen, *[self._t(e, memo, keep, d) for e in x]]

    def _view(self, x, memo, keep, d):
        """d.keys(), d.values(), d.items(): their elements (rebuilt as a view of a fresh dict)."""
        tag = _VIEW_TAGS[type(x)]
        items = [e for kv in x for e in kv] if tag == "di" else list(x)
        return [tag, *[self._t(e, memo, keep, d) for e in items]]

    def _fraction(self, x, memo, keep, d):
        return ["Fr", self._t(x.numerator, memo, keep, d), self._t(x.denominator, memo, keep, d)]

    def _decimal(self, x, memo, keep, d):
        ctx = sys.modules["decimal"].getcontext()  # the program's precision and rounding, where not the default
        own = ctx.prec != 28 or ctx.rounding != "ROUND_HALF_EVEN"
        return ["De", str(x), *((ctx.prec, ctx.rounding) if own else ())]

    def _array(self, x, memo, keep, d):
        memo[id(x)] = len(memo)
        keep.append(x)
        return ["ar", x.typecode, *x.tolist()] if x.typecode != "u" else ["ar", "u", x.tounicode()]

    def _numpy(self, x, np, memo, keep, d):
        if isinstance(x, np.generic):
            return ["ns", x.dtype.str, self._t(x.item(), memo, keep, d)]
        flat = x.ravel().tolist()
        if x.dtype.kind == "c" or x.dtype.kind in "iu" and x.dtype.itemsize == 8 and flat and (
                min(flat) <= -_INT_JSON or max(flat) >= _INT_JSON):
            flat = [self._t(e, memo, keep, d) for e in flat]
        return ["nd", x.dtype.str, list(x.shape), *flat]


def _clock(tag: str, x) -> list:
    """A datetime's or a time's tree: its naive ISO text, its UTC offset in seconds, its zone's name if it has one."""
    tz = x.utcoffset()
    zone = x.tzinfo
    key = getattr(zone, "key", None) if type(zone).__name__ == "ZoneInfo" else None
    return [tag, x.replace(tzinfo=None).isoformat(), None if tz is None else tz.total_seconds(),
            *((key,) if isinstance(key, str) else ())]


PLAIN_BASES = (int, float, str, bytes, tuple, list, dict, set, frozenset)
_NUMPY_KINDS = frozenset("biufc")  # numpy values that travel: booleans and numbers, scalars and arrays
PROGRAM_MODULES = frozenset({"solution", "__main__"})  # where a program's own classes are defined
_VIEW_TAGS = {type({}.keys()): "dk", type({}.values()): "dv", type({}.items()): "di"}
# the builtin types a value may name (`key=int`, `isinstance(x, str)` arguments, a function returning `float`): a
# closed table, looked up by name on either side; any other class is the program's and stays a stand-in
BUILTIN_TYPES = {t.__name__: t for t in (int, float, complex, str, bytes, bytearray, bool, list, tuple, dict, set,
                                          frozenset, range, slice, object, type, memoryview)}
_BUILTIN_TYPE_NAMES = {t: name for name, t in BUILTIN_TYPES.items()}
_TEXTUAL, _NUMBERS = frozenset({str, bool, type(None)}), frozenset({int, float, bool})
# the Encoder's handler of each type it sends by its exact type, but list and tuple (Encoder._t's own)
_BY_TYPE = {dict: Encoder._dict,
            collections.OrderedDict: Encoder._ordered_dict, collections.Counter: Encoder._counter,
            collections.defaultdict: Encoder._defaultdict, set: Encoder._set, frozenset: Encoder._frozenset,
            bytes: Encoder._bytes, bytearray: Encoder._bytearray, complex: Encoder._complex, range: Encoder._range,
            datetime.datetime: Encoder._datetime, datetime.time: Encoder._time, datetime.date: Encoder._date,
            datetime.timedelta: Encoder._timedelta, collections.deque: Encoder._deque,
            **dict.fromkeys(_VIEW_TAGS, Encoder._view)}
# and of the types not loaded until a program imports them (forkserver.PRELOAD), by name: (module, handler)
_BY_NAME = {"Fraction": ("fractions", Encoder._fraction), "Decimal": ("decimal", Encoder._decimal),
            "array": ("array", Encoder._array)}


# a plain type's own value of an instance of its subclass, read with the plain type's own slots (never the
# subclass's __str__, __iter__, __int__...: a value whose text or items differ from itself would pass a test)
_RAW = {int: int.__int__, float: float.__float__, str: str.__str__, bytes: bytes.__bytes__,
        tuple: lambda x: tuple(tuple.__iter__(x)), list: lambda x: list(list.__iter__(x)),
        dict: lambda x: dict(dict.items(x)), set: lambda x: set(set.__iter__(x)),
        frozenset: lambda x: frozenset(frozenset.__iter__(x))}


def _raw(base: type, x):
    return _RAW[base](x)


def _plain_base(x):
    """The plain type `x` is an instance of (the first of PLAIN_BASES), None when it is none of them."""
    return next((b for b in PLAIN_BASES if isinstance(x, b)), None)


def _scalars(x) -> bool:
    """Whether every element of `x` is a value JSON holds as itself (a str, a bool, None, a finite float, an int
    within _INT_JSON): then the elements go out as they are, without a call per element."""
    kinds = set(map(type, x))
    if kinds <= _TEXTUAL:
        return True
    if not kinds <= _NUMBERS:
        return False
    try:
        if float in kinds and not all(map(math.isfinite, x)):
            return False
    except OverflowError:  # an int too large for a float
        return False
    return int not in kinds or min(x) > -_INT_JSON and max(x) < _INT_JSON


_ROUNDINGS = frozenset({"ROUND_DOWN", "ROUND_HALF_UP", "ROUND_HALF_EVEN", "ROUND_CEILING", "ROUND_FLOOR", "ROUND_UP",
                        "ROUND_HALF_DOWN", "ROUND_05UP"})


def _flat(items: list) -> bool:
    """Whether decoded JSON items are all scalars (a compound value is a tagged list; an object is never sent):
    then they are the values themselves, without a call per item."""
    return not set(map(type, items)) & _COMPOUND


_COMPOUND = frozenset({list, dict})
# what a judge decodes in its own process (judge.py, "in place"): the builtin containers and scalars, built by the
# code below from validated fields; every other tag ends the in-place part of a job
PLAIN_TAGS = frozenset({"@", "L", "T", "D", "S", "F", "I", "f", "B", "C"})


class NotPlain(Exception):  # noqa: N818 - a signal, not an error
    """A value a judge does not build in its own process (Decoder.plain_only): it goes on in a forked one."""


class Decoder:
    """JSON text from the program's process -> values, with budgets. `remote(handle, desc)` makes the judge's
    stand-in for an object the program's process keeps; `klass(desc)` the stand-in of a class (namedtuples)."""

    def __init__(self, remote, klass, budget_bytes: int, foreign=None):
        """`foreign(k, kind)`: what `["J", k, kind]` stands for (Encoder's `foreign`), None: refused."""
        self.remote, self.klass, self.foreign = remote, klass, foreign
        self.budget = budget_bytes  # bytes this job may still receive
        # PLAIN_TAGS only (else NotPlain, before anything is built), and ["O", ...] where `function(desc)` says
        # the object is a plain function of the program's (a stand-in that can only be called)
        self.plain_only, self.function = False, None

    def charge(self, n: int) -> None:
        self.budget -= n
        if self.budget < 0:
            raise ValueError("the program's values exceed this job's byte budget")

    def decode(self, text: str | bytes):
        try:
            tree = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"an invalid value from the program's process ({type(exc).__name__})") from None
        return self.value(tree)

    def value(self, tree):
        try:
            return self._v(tree, [], 0)
        except (TypeError, KeyError, IndexError, AttributeError, RecursionError,
                ArithmeticError) as exc:  # decimal.InvalidOperation, ZeroDivisionError, OverflowError
            raise ValueError(f"an invalid value from the program's process ({type(exc).__name__})") from None

    def _v(self, x, made: list, depth: int):
        """JSON's own values as themselves; a tagged list `[tag, *rest]` by its tag's entry in _BY_TAG."""
        if x is None or isinstance(x, (bool, str, int, float)):
            return x
        if depth > MAX_DEPTH:
            raise ValueError("a value nested too deep")
        if not isinstance(x, list) or not x or not isinstance(x[0], str):
            raise ValueError("not a tagged value")
        tag, rest = x[0], x[1:]
        build = _BY_TAG.get(tag)
        if build is None:
            raise ValueError(f"unknown tag {tag!r}")
        if self.plain_only and tag not in PLAIN_TAGS and not (
                tag == "O" and len(rest) == 2 and self.function is not None and self.function(rest[1])):
            raise NotPlain(tag)
        return build(self, rest, made, depth + 1)

    # -- one per tag (the tagged list's fields, what is built so far in the order it was numbered, the depth of the
    # fields); a mutable value is numbered (appended to `made`) before its elements are built, as the Encoder numbers

    def _alias(self, rest, made, d):
        return made[rest[0]]

    def _list(self, rest, made, d):
        if _flat(rest):
            made.append(rest)
            return rest
        out = []
        made.append(out)
        out.extend(self._v(e, made, d) for e in rest)
        return out

    def _set(self, rest, made, d):
        out = set()
        made.append(out)
        out.update(rest if _flat(rest) else (self._v(e, made, d) for e in rest))
        return out

    def _bytearray(self, rest, made, d):
        out = bytearray.fromhex(rest[0])
        made.append(out)
        return out

    def _deque(self, rest, made, d):
        out = collections.deque(maxlen=rest[0])
        made.append(out)
        out.extend(self._v(e, made, d) for e in rest[1:])
        return out

    def _array(self, rest, made, d):
        import array  # (here, not at the top: nothing a template carries, docs/benchmarks.md)

        if rest[0] not in array.typecodes:
            raise ValueError("an array with an unknown type code")
        out = array.array(rest[0], rest[1] if rest[0] == "u" else [self._number(v) for v in rest[1:]])
        made.append(out)
        return out

    def _items(self, out, rest, made, d):
        """`out` (a dict of some kind), numbered, then filled with the keys and values `rest` holds in turn."""
        made.append(out)
        if len(rest) % 2:
            raise ValueError("a dict with a key and no value")
        for i in range(0, len(rest), 2):
            out[self._v(rest[i], made, d)] = self._v(rest[i + 1], made, d)
        return out

    def _dict(self, rest, made, d):
        return self._items({}, rest, made, d)

    def _ordered_dict(self, rest, made, d):
        return self._items(collections.OrderedDict(), rest, made, d)

    def _counter(self, rest, made, d):
        return self._items(collections.Counter(), rest, made, d)

    def _defaultdict(self, rest, made, d):
        # its factory: a builtin type or a stand-in of the program's (both only callables)
        factory = None if rest[0] is None else self._v(rest[0], made, d)
        if factory is not None and not callable(factory):
            raise ValueError("a defaultdict factory that cannot be called")
        return self._items(collections.defaultdict(factory), rest[1:], made, d)

    def _tuple(self, rest, made, d):
        return tuple(rest if _flat(rest) else (self._v(e, made, d) for e in rest))

    def _frozenset(self, rest, made, d):
        return frozenset(rest if _flat(rest) else (self._v(e, made, d) for e in rest))

    def _big_int(self, rest, made, d):
        if len(rest[0]) > 1 << 22:
            raise ValueError("an int of more than 16M bits")
        return int(rest[0], 16)

    def _float(self, rest, made, d):
        return float(rest[0])

    def _bytes(self, rest, made, d):
        return bytes.fromhex(rest[0])

    def _complex(self, rest, made, d):
        return complex(float(rest[0]), float(rest[1]))

    def _range(self, rest, made, d):
        return range(*(self._int(self._v(e, made, d)) for e in rest))

    def _fraction(self, rest, made, d):
        from fractions import Fraction  # (only where a program returned one: not in the template)

        return Fraction(self._int(self._v(rest[0], made, d)), self._int(self._v(rest[1], made, d)))

    def _decimal(self, rest, made, d):
        import decimal  # (only where a program returned one: not in the template)

        if len(rest) == 3:  # the program's own context: the test's arithmetic on it runs under it, as there
            ctx = decimal.getcontext()
            if type(rest[1]) is not int or not 1 <= rest[1] <= 100000 or rest[2] not in _ROUNDINGS:
                raise ValueError("a malformed decimal context")
            ctx.prec, ctx.rounding = rest[1], rest[2]
        return decimal.Decimal(str(rest[0]))

    def _datetime(self, rest, made, d):
        return _clock_value(datetime.datetime, rest)

    def _time(self, rest, made, d):
        return _clock_value(datetime.time, rest)

    def _date(self, rest, made, d):
        return datetime.date.fromisoformat(rest[0])

    def _timedelta(self, rest, made, d):
        return datetime.timedelta(days=rest[0], seconds=rest[1], microseconds=rest[2])

    def _namedtuple(self, rest, made, d):
        cls = self.klass(rest[0])
        if not (isinstance(cls, type) and _is_namedtuple(cls)):  # nothing but a namedtuple is built here
            raise ValueError("a namedtuple whose class is not one")
        values = tuple(self._v(e, made, d) for e in rest[1:])
        if len(values) != len(cls._fields):
            raise ValueError("a namedtuple with another number of fields")
        return tuple.__new__(cls, values)

    def _class(self, rest, made, d):
        return self.klass(rest[0])

    def _builtin_type(self, rest, made, d):
        return BUILTIN_TYPES[rest[0]]

    def _numpy_scalar(self, rest, made, d):
        return _numpy_dtype(rest)[1].type(self._v(rest[1], made, d))

    def _numpy_array(self, rest, made, d):
        np, dt = _numpy_dtype(rest)
        shape = rest[1]
        if not isinstance(shape, list) or len(shape) > 32 or not all(type(n) is int and n >= 0 for n in shape):
            raise ValueError("a malformed array shape")
        values = [self._v(e, made, d) for e in rest[2:]]
        if math.prod(shape) != len(values):
            raise ValueError("an array whose shape does not hold its values")
        return np.array(values, dtype=dt).reshape(shape)

    def _callback(self, rest, made, d):
        if self.foreign is None or type(rest[0]) is not int or rest[1] not in ("f", "i"):
            raise ValueError("a malformed callback")
        return self.foreign(rest[0], rest[1])

    def _keys(self, rest, made, d):
        return dict.fromkeys(self._v(e, made, d) for e in rest).keys()

    def _values(self, rest, made, d):
        return dict(enumerate(self._v(e, made, d) for e in rest)).values()

    def _dict_items(self, rest, made, d):
        if len(rest) % 2:
            raise ValueError("dict items with a key and no value")
        vals = [self._v(e, made, d) for e in rest]
        return dict(zip(vals[::2], vals[1::2])).items()

    def _object(self, rest, made, d):
        out = self.remote(rest[0], rest[1])
        made.append(out)
        return out

    def _subclass_value(self, rest, made, d):
        k = len(made)
        made.append(None)  # its number, taken before its value's
        value = self._v(rest[2], made, d)
        if type(value) not in PLAIN_BASES:
            raise ValueError("a subclass value of no plain type")
        out = made[k] = self.remote(rest[0], rest[1], value)
        return out

    @staticmethod
    def _number(v):
        if type(v) not in (int, float):
            raise ValueError("not a number")
        return v

    @staticmethod
    def _int(v) -> int:
        if type(v) is not int:
            raise ValueError("not an int")
        return v


def _clock_value(cls, rest: list):
    """A datetime or a time (`cls`) from its naive ISO text, its UTC offset in seconds and its zone's name."""
    v = cls.fromisoformat(rest[0])
    if len(rest) > 2 and isinstance(rest[2], str):  # a named zone (zoneinfo's own lookup checks the key)
        import zoneinfo  # (only where a program returned a zoned datetime or time: not in the template)

        try:
            return v.replace(tzinfo=zoneinfo.ZoneInfo(rest[2]))
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
            pass  # unknown here: the fixed offset it had
    return v if rest[1] is None else v.replace(tzinfo=datetime.timezone(datetime.timedelta(seconds=float(rest[1]))))


def _numpy_dtype(rest: list):
    """numpy (where it is installed) and the dtype `rest[0]` names, if it is one that travels."""
    try:
        import numpy as np  # optional: where it is installed
    except ImportError:
        raise ValueError("a numpy value where numpy is not installed") from None
    dt = np.dtype(str(rest[0]))
    if dt.kind not in _NUMPY_KINDS or dt.itemsize > 32:
        raise ValueError("a numpy value of a type that does not travel")
    return np, dt


# the Decoder's handler of each tag (any other tag: Decoder._v's ValueError)
_BY_TAG = {"@": Decoder._alias, "L": Decoder._list, "T": Decoder._tuple, "D": Decoder._dict, "S": Decoder._set,
           "F": Decoder._frozenset, "I": Decoder._big_int, "f": Decoder._float, "B": Decoder._bytes,
           "C": Decoder._complex, "Y": Decoder._bytearray, "dq": Decoder._deque, "Ct": Decoder._counter,
           "OD": Decoder._ordered_dict, "DD": Decoder._defaultdict, "ar": Decoder._array, "R": Decoder._range,
           "Fr": Decoder._fraction, "De": Decoder._decimal, "dt": Decoder._datetime, "ti": Decoder._time,
           "da": Decoder._date, "td": Decoder._timedelta, "NT": Decoder._namedtuple, "K": Decoder._class,
           "bt": Decoder._builtin_type, "ns": Decoder._numpy_scalar, "nd": Decoder._numpy_array,
           "J": Decoder._callback, "dk": Decoder._keys, "dv": Decoder._values, "di": Decoder._dict_items,
           "O": Decoder._object, "SV": Decoder._subclass_value}
