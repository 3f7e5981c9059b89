"""Values between a program's process and its judge (standard library only: both run inside the jail).

A value is plain JSON with tagged lists for everything JSON lacks: `["L", ...]` a list, `["T", ...]` a tuple,
`["D", k, v, ...]` a dict, the stdlib value types code returns (`Fraction`, `Decimal`, `datetime`, `date`, `time`,
`timedelta`, `deque`, `Counter`, `OrderedDict`, `defaultdict`, namedtuples, `frozenset`, `complex`, `bytes`,
`bytearray`, `range`, big ints, dict views, the builtin types by name), `["@", k]` the k-th container already sent (aliasing and cycles survive the trip),
and `["O", handle, class]` an object the program's process keeps (an instance of the program's own class, a
function, a generator): the judge gets a stand-in that forwards what it is asked to the program's process.

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
_MUTABLE_TAGS = frozenset({"L", "D", "S", "Y", "dq", "Ct", "OD", "DD"})  # numbered in the order they are met
_INT_JSON = 1 << 62  # larger ints travel as hex (json's decimal conversion is capped at 4300 digits)


def _is_namedtuple(t: type) -> bool:
    return issubclass(t, tuple) and hasattr(t, "_fields") and isinstance(getattr(t, "_fields", None), tuple)


class Encoder:
    """Values -> JSON-able trees. `handle(obj)` gives a number for an object that stays in this process and
    `describe(cls)` a class's description (the program's process provides both: it keeps the objects)."""

    def __init__(self, handle, describe):
        self.handle, self.describe = handle, describe

    def encode(self, value) -> str:
        return json.dumps(self.tree(value), separators=(",", ":"))

    def tree(self, value):
        memo: dict[int, int] = {}
        keep: list = []  # the objects numbered, alive until the end (ids stay unique)
        return self._t(value, memo, keep, 0)

    def _t(self, x, memo, keep, depth):  # noqa: C901 - one branch per type, in order of frequency
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
        if t is dict or t is collections.OrderedDict or t is collections.Counter or t is collections.defaultdict:
            memo[id(x)] = len(memo)
            keep.append(x)
            items = []
            for key, val in x.items():
                items.append(self._t(key, memo, keep, d))
                items.append(self._t(val, memo, keep, d))
            if t is dict:
                return ["D", *items]
            if t is collections.OrderedDict:
                return ["OD", *items]
            if t is collections.Counter:
                return ["Ct", *items]
            f = x.default_factory
            return ["DD", f.__name__ if f in _FACTORIES.values() else None, *items]
        if t is set or t is frozenset:
            if t is set:
                memo[id(x)] = len(memo)
                keep.append(x)
            if _scalars(x):
                return ["S" if t is set else "F", *x]
            return ["S" if t is set else "F", *[self._t(e, memo, keep, d) for e in x]]
        if t is bytes:
            return ["B", x.hex()]
        if t is bytearray:
            memo[id(x)] = len(memo)
            keep.append(x)
            return ["Y", x.hex()]
        if t is complex:
            return ["C", repr(x.real), repr(x.imag)]
        if t is range:
            return ["R", self._t(x.start, memo, keep, d), self._t(x.stop, memo, keep, d),
                    self._t(x.step, memo, keep, d)]
        # fractions and decimal are not loaded until a program imports them (zygote.PRELOAD): the names first
        if t.__name__ == "Fraction" and t is getattr(sys.modules.get("fractions"), "Fraction", None):
            return ["Fr", self._t(x.numerator, memo, keep, d), self._t(x.denominator, memo, keep, d)]
        if t.__name__ == "Decimal" and t is getattr(sys.modules.get("decimal"), "Decimal", None):
            return ["De", str(x)]
        if t is datetime.datetime or t is datetime.date or t is datetime.time:
            tz = x.utcoffset() if t is not datetime.date else None
            return [{datetime.datetime: "dt", datetime.date: "da", datetime.time: "ti"}[t],
                    x.replace(tzinfo=None).isoformat() if t is not datetime.date else x.isoformat(),
                    None if tz is None else tz.total_seconds()]
        if t is datetime.timedelta:
            return ["td", x.days, x.seconds, x.microseconds]
        if t is collections.deque:
            memo[id(x)] = len(memo)
            keep.append(x)
            return ["dq", x.maxlen, *[self._t(e, memo, keep, d) for e in x]]
        if t in _VIEW_TAGS:  # d.keys(), d.values(), d.items(): their elements (rebuilt as a view of a fresh dict)
            tag = _VIEW_TAGS[t]
            items = [e for kv in x for e in kv] if tag == "di" else list(x)
            return [tag, *[self._t(e, memo, keep, d) for e in items]]
        if _is_namedtuple(t):
            return ["NT", self.describe(t), *[self._t(e, memo, keep, d) for e in x]]
        if isinstance(x, type):
            name = _BUILTIN_TYPE_NAMES.get(x)
            return ["bt", name] if name is not None else ["K", self.describe(x)]
        for base in _PLAIN_BASES:  # a subclass of a plain type (an int with a name, a dict with helpers): its value
            if isinstance(x, base):
                return self._t(base(x), memo, keep, depth)
        memo[id(x)] = len(memo)
        keep.append(x)
        return ["O", self.handle(x), self.describe(t)]


_PLAIN_BASES = (int, float, str, bytes, tuple, list, dict, set, frozenset)
_VIEW_TAGS = {type({}.keys()): "dk", type({}.values()): "dv", type({}.items()): "di"}
# the builtin types a value may name (`key=int`, `isinstance(x, str)` arguments, a function returning `float`): a
# closed table, looked up by name on either side; any other class is the program's and stays a stand-in
BUILTIN_TYPES = {t.__name__: t for t in (int, float, complex, str, bytes, bytearray, bool, list, tuple, dict, set,
                                          frozenset, range, slice, object, type, memoryview)}
_BUILTIN_TYPE_NAMES = {t: name for name, t in BUILTIN_TYPES.items()}
_TEXTUAL, _NUMBERS = frozenset({str, bool, type(None)}), frozenset({int, float, bool})


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


_FACTORIES = {"int": int, "list": list, "set": set, "dict": dict, "str": str, "float": float, "tuple": tuple,
              "frozenset": frozenset, "bool": bool, "bytes": bytes, "deque": collections.deque,
              "Counter": collections.Counter, "OrderedDict": collections.OrderedDict}


def _flat(items: list) -> bool:
    """Whether decoded JSON items are all scalars (a compound value is a tagged list; an object is never sent):
    then they are the values themselves, without a call per item."""
    return not set(map(type, items)) & _COMPOUND


_COMPOUND = frozenset({list, dict})


class Decoder:
    """JSON text from the program's process -> values, with budgets. `remote(handle, desc)` makes the judge's
    stand-in for an object the program's process keeps; `klass(desc)` the stand-in of a class (namedtuples)."""

    def __init__(self, remote, klass, budget_bytes: int):
        self.remote, self.klass = remote, klass
        self.budget = budget_bytes  # bytes this job may still receive

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

    def _v(self, x, made: list, depth: int):  # noqa: C901
        if x is None or isinstance(x, (bool, str, int, float)):
            return x
        if depth > MAX_DEPTH:
            raise ValueError("a value nested too deep")
        if not isinstance(x, list) or not x or not isinstance(x[0], str):
            raise ValueError("not a tagged value")
        tag, rest, d = x[0], x[1:], depth + 1
        if tag == "@":
            return made[rest[0]]
        if tag in _MUTABLE_TAGS:
            if tag == "L":
                if _flat(rest):
                    made.append(rest)
                    return rest
                out = []
                made.append(out)
                out.extend(self._v(e, made, d) for e in rest)
                return out
            if tag == "S":
                out = set()
                made.append(out)
                out.update(rest if _flat(rest) else (self._v(e, made, d) for e in rest))
                return out
            if tag == "Y":
                out = bytearray.fromhex(rest[0])
                made.append(out)
                return out
            if tag == "dq":
                out = collections.deque(maxlen=rest[0])
                made.append(out)
                out.extend(self._v(e, made, d) for e in rest[1:])
                return out
            if tag == "DD":
                out = collections.defaultdict(_FACTORIES[rest[0]] if rest[0] is not None else None)
                rest = rest[1:]
            else:
                out = {"D": dict, "OD": collections.OrderedDict, "Ct": collections.Counter}[tag]()
            made.append(out)
            if len(rest) % 2:
                raise ValueError("a dict with a key and no value")
            for i in range(0, len(rest), 2):
                out[self._v(rest[i], made, d)] = self._v(rest[i + 1], made, d)
            return out
        if tag == "T":
            return tuple(rest if _flat(rest) else (self._v(e, made, d) for e in rest))
        if tag == "F":
            return frozenset(rest if _flat(rest) else (self._v(e, made, d) for e in rest))
        if tag == "I":
            if len(rest[0]) > 1 << 22:
                raise ValueError("an int of more than 16M bits")
            return int(rest[0], 16)
        if tag == "f":
            return float(rest[0])
        if tag == "B":
            return bytes.fromhex(rest[0])
        if tag == "C":
            return complex(float(rest[0]), float(rest[1]))
        if tag == "R":
            return range(*(self._int(self._v(e, made, d)) for e in rest))
        if tag == "Fr":
            from fractions import Fraction

            return Fraction(self._int(self._v(rest[0], made, d)), self._int(self._v(rest[1], made, d)))
        if tag == "De":
            from decimal import Decimal

            return Decimal(str(rest[0]))
        if tag in ("dt", "ti"):
            cls = datetime.datetime if tag == "dt" else datetime.time
            v = cls.fromisoformat(rest[0])
            return v if rest[1] is None else v.replace(
                tzinfo=datetime.timezone(datetime.timedelta(seconds=float(rest[1]))))
        if tag == "da":
            return datetime.date.fromisoformat(rest[0])
        if tag == "td":
            return datetime.timedelta(days=rest[0], seconds=rest[1], microseconds=rest[2])
        if tag == "NT":
            cls = self.klass(rest[0])
            if not (isinstance(cls, type) and _is_namedtuple(cls)):  # nothing but a namedtuple is built here
                raise ValueError("a namedtuple whose class is not one")
            return cls(*(self._v(e, made, d) for e in rest[1:]))
        if tag == "K":
            return self.klass(rest[0])
        if tag == "bt":
            return BUILTIN_TYPES[rest[0]]
        if tag == "dk":
            return dict.fromkeys(self._v(e, made, d) for e in rest).keys()
        if tag == "dv":
            return dict(enumerate(self._v(e, made, d) for e in rest)).values()
        if tag == "di":
            if len(rest) % 2:
                raise ValueError("dict items with a key and no value")
            vals = [self._v(e, made, d) for e in rest]
            return dict(zip(vals[::2], vals[1::2])).items()
        if tag == "O":
            out = self.remote(rest[0], rest[1])
            made.append(out)
            return out
        raise ValueError(f"unknown tag {tag!r}")

    @staticmethod
    def _int(v) -> int:
        if type(v) is not int:
            raise ValueError("not an int")
        return v
