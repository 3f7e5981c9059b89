"""The values between a program's process and its judge (sandbox/codec.py): what goes in comes out equal and of
the same type (lists of plain scalars take a shortcut that must not change that), aliasing survives, and what
the program's side sends is untrusted: a malformed value is a ValueError, never a crash."""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import json
import math

import pytest

from grpo_plugin.sandbox import codec


def trip(value):
    enc = codec.Encoder(lambda obj: 0, lambda cls: {"h": 1, "n": cls.__name__, "nt": list(cls._fields)})
    text = json.dumps(enc.tree(value))
    dec = codec.Decoder(lambda h, d: ("remote", h), lambda d: collections.namedtuple(d["n"], d["nt"]), 1 << 30)
    return dec.decode(text), text


class Name(str):
    pass


VALUES = [
    [], [1, 2, 3], [1.5, -2.0, 3], ["a", None, True, False, ""], [True, 2, 3.5], (1, "a"), (), {1, 2}, frozenset("ab"),
    [2 ** 62 - 1, -(2 ** 62) + 1], [2 ** 62], [-(2 ** 62)], [10 ** 400, 1.0], [1.0, float("inf")], [float("-inf")],
    [1, "a", 2.5], [[1], [2, [3]]], ({1: [2.5]}, (3,)), [Name("x"), "y"], [b"x", bytearray(b"y")], [1 + 2j],
    [fractions.Fraction(1, 3), decimal.Decimal("1.10"), datetime.date(2020, 1, 2), datetime.timedelta(seconds=3)],
    collections.deque([1, 2], maxlen=5), collections.Counter("aab"), collections.OrderedDict(a=1),
    collections.defaultdict(list, a=[1]), range(1, 10, 2), [None] * 3, {"k": {"n": [1, (2, 3)]}},
]


@pytest.mark.parametrize("value", VALUES, ids=[f"{k}-{type(v).__name__}" for k, v in enumerate(VALUES)])
def test_values_come_back_equal_and_of_their_type(value):
    got, _ = trip(value)
    assert got == value
    assert type(got) is (str if type(value) is Name else type(value))

    def types(x):
        if isinstance(x, (list, tuple, set, frozenset, collections.deque)):
            return [type(x).__name__, sorted(map(repr, map(types, x)))]
        if isinstance(x, dict):
            return ["dict", sorted(map(repr, map(types, x.items())))]
        return type(x).__name__ if type(x) is not Name else "str"

    assert types(got) == types(value)


def test_nan_big_ints_and_infinities_keep_their_tags():
    got, text = trip([float("nan"), 2 ** 70, float("inf")])
    assert math.isnan(got[0]) and got[1:] == [2 ** 70, float("inf")]
    assert '"I"' in text and '"f"' in text  # JSON has neither: tagged, not sent as themselves


def test_aliases_and_cycles_survive_a_trip():
    inner = [1, 2]
    cyclic: list = [inner, inner]
    cyclic.append(cyclic)
    got, _ = trip(cyclic)
    assert got[0] is got[1] and got[2] is got and got[0] == [1, 2]
    got, _ = trip([[1.0], [2.0], [3.0]])
    assert len({id(x) for x in got}) == 3


@pytest.mark.parametrize("text", [
    '["L", 1, {"a": 1}]', '["T", {"x": 1}]', '["S", [1]]', '["F", 1, {}]', '["L", ["Q"]]', '["@", 5]', '{"a": 1}',
    '["D", 1]', '["I", "zz"]', '["L"' + ', ["L"' * 300 + "]" * 301,
])
def test_what_the_program_sends_is_checked(text):
    dec = codec.Decoder(lambda h, d: None, lambda d: None, 1 << 30)
    with pytest.raises(ValueError):
        dec.decode(text)


class _Factory:  # a program's own callable: it travels as an object the program keeps (a handle)
    def __call__(self):
        return []


class _Kept:  # the judge's stand-in of an object the program keeps (a callable one here)
    def __init__(self, handle):
        self.handle = handle

    def __call__(self):
        return []


def test_a_defaultdict_with_the_programs_factory_keeps_the_aliases_around_it():
    """The factory is numbered where the Decoder builds it, before the dict: an alias after it is the same object."""
    shared = [1]
    dd = collections.defaultdict(_Factory(), a=shared)
    enc = codec.Encoder(lambda obj: 0, lambda cls: {"h": 1, "n": cls.__name__})
    dec = codec.Decoder(lambda h, d: _Kept(h), lambda d: None, 1 << 30)
    got = dec.decode(json.dumps(enc.tree([dd, shared, dd])))
    assert got[0]["a"] == [1] and got[1] is got[0]["a"] and got[2] is got[0]
    assert isinstance(got[0].default_factory, _Kept) and got[0].default_factory.handle == 0
