"""A corpus of ordinary correct programs, each with a wrong twin (a realistic bug), in the three test formats the
sandbox runs: assert tests (HumanEval / MBPP), call-based (APPS / TACO `fn_name`, LeetCode `Solution`) and
stdin/stdout. Every correct program scores 1.0 and every twin < 1 under plain CPython, run as users run them
without a sandbox (`test_corpus_is_right_under_plain_python`); the sandbox must give the same verdicts
(`test_corpus_in_the_sandbox`): a correct program scoring < 1 is a false negative (the sandbox breaks ordinary
code: a stdlib module that does not import, a value that does not compare), a twin scoring 1.0 a reward hack.

The programs use the stdlib as solutions do (namedtuple, logging, asyncio, tempfile, zoneinfo, zlib, ...), return
stdlib value types the test compares with values it builds itself (Fraction, Decimal, datetime, deque, ...),
mutate their arguments in place, end with exit() / quit() / sys.exit(0), recurse deeply, read stdin fast."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from grpo_plugin.sandbox.verdicts import outputs_match

HAS_NUMPY = importlib.util.find_spec("numpy") is not None


@dataclass(frozen=True)
class Entry:
    name: str
    fmt: str  # "assert" | "call" | "stdio"
    code: str
    wrong: str  # the twin: the same program with a realistic bug
    tests: tuple  # assert: test sources; call: (args, expected); stdio: (stdin, expected stdout)
    fn: str = ""  # call-based: the function (or Solution method) called


CORPUS: list[Entry] = []


def _src(s: str) -> str:
    return textwrap.dedent(s).strip("\n") + "\n"


def _twin(code: str, bug) -> str:
    """The wrong twin: `bug` is the whole wrong program (a str), or one (old, new) replacement or a list of them,
    each `old` found exactly once in the correct program."""
    if isinstance(bug, str):
        return _src(bug)
    out = code
    for old, new in [bug] if isinstance(bug[0], str) else bug:
        assert out.count(old) == 1, f"twin replacement {old!r} found {out.count(old)} times"
        out = out.replace(old, new)
    assert out != code
    return out


def adders(into: list[Entry]):
    """The helpers that add an entry and its wrong twin to `into`: A (assert tests), C (call-based cases), S
    (stdin/stdout cases)."""
    def A(name: str, code: str, bug, *tests: str) -> None:
        code = _src(code)
        into.append(Entry(name, "assert", code, _twin(code, bug), tuple(textwrap.dedent(t).strip() for t in tests)))

    def C(name: str, code: str, bug, fn: str, *cases) -> None:
        code = _src(code)
        into.append(Entry(name, "call", code, _twin(code, bug), tuple(cases), fn))

    def S(name: str, code: str, bug, *cases) -> None:
        code = _src(code)
        into.append(Entry(name, "stdio", code, _twin(code, bug), tuple(cases)))

    return A, C, S


A, C, S = adders(CORPUS)


# ================================================================================================================
# assert tests (HumanEval / MBPP style): each test a statement or a few, run after the program
# ================================================================================================================

A("namedtuple", r"""
    from collections import namedtuple

    Point = namedtuple("Point", "x y")

    def midpoint(a, b):
        return Point((a.x + b.x) / 2, (a.y + b.y) / 2)
    """, ("(a.x + b.x)", "(a.x + b.y)"),
  "assert midpoint(Point(0, 0), Point(2, 4)) == Point(1.0, 2.0)",
  "assert midpoint(Point(1, 5), Point(3, 5)).x == 2")

A("typing_namedtuple_functional", r"""
    from typing import NamedTuple

    Interval = NamedTuple("Interval", [("start", int), ("end", int)])

    def merge(intervals):
        out = []
        for s, e in sorted(intervals):
            if out and s <= out[-1].end:
                out[-1] = Interval(out[-1].start, max(out[-1].end, e))
            else:
                out.append(Interval(s, e))
        return out
    """, ("s <= out[-1].end", "s < out[-1].end"),
  "assert merge([(1, 3), (2, 6), (8, 10)]) == [(1, 6), (8, 10)]",
  "assert merge([(1, 4), (4, 5)])[0].end == 5",
  "assert merge([]) == []")

A("enum_functional", r"""
    from enum import Enum

    Color = Enum("Color", "RED GREEN BLUE")

    def next_color(c):
        members = list(Color)
        return members[(members.index(c) + 1) % len(members)]
    """, ("members[(members.index(c) + 1) % len(members)]", "members[members.index(c) + 1]"),
  "assert next_color(Color.RED) == Color.GREEN",
  "assert next_color(Color.BLUE) == Color.RED",
  'assert next_color(Color.GREEN).name == "BLUE"')

A("logging", r"""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(levelname)s:%(message)s")
    log = logging.getLogger(__name__)

    def safe_div(a, b):
        if b == 0:
            log.warning("division by zero: %s / %s", a, b)
            return None
        log.info("dividing %s by %s", a, b)
        return a / b
    """, ("return None", "return 0"),
  "assert safe_div(6, 3) == 2",
  "assert safe_div(1, 0) is None")

A("traceback", r"""
    import traceback

    def parse_ints(items):
        good, errors = [], []
        for s in items:
            try:
                good.append(int(s))
            except ValueError:
                errors.append(traceback.format_exc().strip().splitlines()[-1])
        return good, errors
    """, ("splitlines()[-1]", "splitlines()[0]"),
  'assert parse_ints(["1", "x", "3"])[0] == [1, 3]',
  """assert parse_ints(["a"])[1] == ["ValueError: invalid literal for int() with base 10: 'a'"]""")

A("unittest", r"""
    import unittest

    def is_palindrome(s):
        t = [c.lower() for c in s if c.isalnum()]
        return t == t[::-1]

    class TestPalindrome(unittest.TestCase):
        def test_examples(self):
            self.assertTrue(is_palindrome("A man, a plan, a canal: Panama"))
            self.assertFalse(is_palindrome("race a car"))

    _tc = unittest.TestCase()
    _tc.assertEqual(is_palindrome("aba"), True)
    """, ("c.lower() for c", "c for c"),
  'assert is_palindrome("Racecar")',
  'assert not is_palindrome("hello")',
  """
  import unittest
  unittest.TestCase().assertEqual(is_palindrome("No 'x' in Nixon"), True)
  """)

A("asyncio", r"""
    import asyncio

    async def _square(x):
        await asyncio.sleep(0)
        return x * x

    async def _all(xs):
        return await asyncio.gather(*(_square(x) for x in xs))

    def squares(xs):
        return asyncio.run(_all(xs))
    """, ("return x * x", "return x * 2"),
  "assert squares([1, 2, 3]) == [1, 4, 9]",
  "assert squares([]) == []")

A("thread_pool", r"""
    from concurrent.futures import ThreadPoolExecutor

    def word_lengths(words):
        with ThreadPoolExecutor(max_workers=4) as ex:
            return list(ex.map(len, words))
    """, ("ex.map(len, words)", "ex.map(len, sorted(words))"),
  'assert word_lengths(["a", "abc", "ab"]) == [1, 3, 2]',
  "assert word_lengths([]) == []")

A("inspect_signature", r"""
    import functools
    import inspect

    def typed(func):
        sig = inspect.signature(func)

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            for name, value in bound.arguments.items():
                ann = sig.parameters[name].annotation
                if ann is not inspect.Parameter.empty and not isinstance(value, ann):
                    raise TypeError(f"{name} must be {ann.__name__}, got {type(value).__name__}")
            return func(*args, **kwargs)
        return wrapper

    @typed
    def scale(x: float, factor: int = 2) -> float:
        return x * factor
    """, ("for name, value in bound.arguments.items():", "for name, value in zip(sig.parameters, args):"),
  "assert scale(1.5) == 3.0",
  "assert scale(2.0, factor=3) == 6.0",
  """
  try:
      scale(1.0, factor=2.5)
  except TypeError:
      pass
  else:
      assert False, "expected TypeError"
  """)

A("dataclass_default_factory", r"""
    from dataclasses import dataclass, field

    @dataclass
    class Order:
        customer: str
        items: list = field(default_factory=list)

        def total(self, prices):
            return sum(prices[i] for i in self.items)

    def orders_from(rows):
        orders = {}
        for customer, item in rows:
            orders.setdefault(customer, Order(customer)).items.append(item)
        return list(orders.values())
    """, ("Order(customer)).items.append(item)", "Order(customer, [item])).items"),
  'assert [o.customer for o in orders_from([("ann", "tea"), ("bob", "jam"), ("ann", "bun")])] == ["ann", "bob"]',
  'assert orders_from([("ann", "tea"), ("ann", "bun")])[0] == Order("ann", ["tea", "bun"])',
  'assert orders_from([("a", "x"), ("a", "y")])[0].total({"x": 2, "y": 3}) == 5',
  'assert Order("z").items == []')

A("tempfile_directory", r"""
    import os
    import tempfile

    def roundtrip_lines(lines):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "data.txt")
            with open(path, "w") as f:
                f.write("\n".join(lines))
            with open(path) as f:
                return f.read().splitlines()
    """, (r'"\n".join(lines)', '"".join(lines)'),
  'assert roundtrip_lines(["a", "b c"]) == ["a", "b c"]',
  "assert roundtrip_lines([]) == []")

A("tempfile_named", r"""
    import tempfile

    def via_temp_file(data: bytes) -> bytes:
        with tempfile.NamedTemporaryFile(suffix=".bin") as f:
            f.write(data)
            f.flush()
            f.seek(0)
            return f.read()
    """, ("        f.seek(0)\n", ""),
  'assert via_temp_file(b"abc") == b"abc"',
  "assert via_temp_file(bytes(range(256)))[-1] == 255")

A("statistics", r"""
    import statistics

    def summary(xs):
        return statistics.mean(xs), statistics.median(xs), statistics.mode(xs)
    """, ("statistics.median(xs)", "sorted(xs)[len(xs) // 2]"),
  "assert summary([1, 2, 2, 3, 7]) == (3, 2, 2)",
  "assert summary([1, 2, 4, 4]) == (2.75, 3.0, 4)")

A("uuid", r"""
    import uuid

    def stable_id(name):
        return str(uuid.uuid5(uuid.NAMESPACE_DNS, name))

    def fresh_ids(n):
        return [uuid.uuid4().hex for _ in range(n)]
    """, ("uuid.uuid5(", "uuid.uuid3("),
  'assert stable_id("python.org") == "886313e1-3b8a-5372-9b90-0c9aee199e5d"',
  """
  ids = fresh_ids(5)
  assert len(set(ids)) == 5 and all(len(i) == 32 for i in ids)
  """)

A("pathlib", r"""
    from pathlib import Path

    def save_and_count_words(text, name="notes.txt"):
        path = Path(name)
        path.write_text(text, encoding="utf-8")
        return len(path.read_text(encoding="utf-8").split())

    def list_txt(names):
        folder = Path("docs")
        folder.mkdir(exist_ok=True)
        for n in names:
            (folder / n).write_text(n)
        return sorted(p.name for p in folder.glob("*.txt"))
    """, ('.split())', '.split(" "))'),
  'assert save_and_count_words("one two\\nthree") == 3',
  'assert list_txt(["b.txt", "a.txt", "c.md"]) == ["a.txt", "b.txt"]')

A("urllib_parse", r"""
    from urllib.parse import parse_qs, urlencode, urlparse

    def get_param(url, key):
        values = parse_qs(urlparse(url).query).get(key)
        return values[0] if values else None

    def with_params(base, params):
        return base + "?" + urlencode(sorted(params.items()))
    """, ("values = parse_qs(urlparse(url).query).get(key)\n    return values[0] if values else None",
          'values = dict(p.split("=") for p in urlparse(url).query.split("&"))\n    return values.get(key)'),
  'assert get_param("https://x.org/p?a=1&b=hello%20world", "b") == "hello world"',
  'assert get_param("https://x.org/?a=1", "z") is None',
  'assert with_params("https://x.org/s", {"q": "a b", "n": 2}) == "https://x.org/s?n=2&q=a+b"')

A("difflib", r"""
    import difflib

    def closest(word, options):
        matches = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
        return matches[0] if matches else None

    def similarity(a, b):
        return difflib.SequenceMatcher(None, a, b).ratio()
    """, ("cutoff=0.6", "cutoff=0.0"),
  'assert closest("appel", ["ape", "apple", "peach"]) == "apple"',
  'assert closest("zzz", ["apple", "peach"]) is None',
  'assert round(similarity("abcd", "bcde"), 2) == 0.75')

A("fraction", r"""
    from fractions import Fraction

    def harmonic(n):
        return sum(Fraction(1, k) for k in range(1, n + 1))
    """, ("range(1, n + 1)", "range(1, n)"),
  """
  from fractions import Fraction
  assert harmonic(3) == Fraction(11, 6)
  """,
  "assert harmonic(1) == 1")

A("decimal", r"""
    from decimal import ROUND_HALF_UP, Decimal

    def round_money(s):
        return Decimal(s).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    """, ("Decimal(s)", "Decimal(float(s))"),
  """
  from decimal import Decimal
  assert round_money("2.675") == Decimal("2.68")
  """,
  'assert str(round_money("1.005")) == "1.01"')

A("datetime", r"""
    from datetime import datetime, timedelta

    def add_business_days(start, n):
        d = start
        while n > 0:
            d += timedelta(days=1)
            if d.weekday() < 5:
                n -= 1
        return d

    def parse_ts(s):
        return datetime.strptime(s, "%Y-%m-%d %H:%M")

    def gap(a, b):
        return parse_ts(b) - parse_ts(a)
    """, ("d.weekday() < 5", "d.weekday() < 6"),
  """
  from datetime import date
  assert add_business_days(date(2024, 3, 8), 1) == date(2024, 3, 11)
  """,
  """
  from datetime import datetime
  assert parse_ts("2024-01-02 03:04") == datetime(2024, 1, 2, 3, 4)
  """,
  """
  from datetime import timedelta
  assert gap("2024-01-01 00:00", "2024-01-02 01:30") == timedelta(days=1, minutes=90)
  """)

A("deque", r"""
    from collections import deque

    def last_k(items, k):
        return deque(items, maxlen=k)

    def rotate_left(items, n):
        d = deque(items)
        d.rotate(-n)
        return d
    """, ("d.rotate(-n)", "d.rotate(n)"),
  """
  from collections import deque
  assert last_k([1, 2, 3, 4], 2) == deque([3, 4])
  """,
  """
  from collections import deque
  assert rotate_left("abcde", 2) == deque("cdeab")
  """)

A("counter", r"""
    from collections import Counter

    def letter_counts(text):
        return Counter(c for c in text.lower() if c.isalpha())
    """, ("text.lower()", "text"),
  """
  from collections import Counter
  assert letter_counts("Hello!") == Counter({"l": 2, "h": 1, "e": 1, "o": 1})
  """,
  'assert letter_counts("aAb").most_common(1) == [("a", 2)]')

A("ordereddict", r"""
    from collections import OrderedDict

    def counts_in_order(words):
        counts = OrderedDict()
        for w in words:
            counts[w] = counts.get(w, 0) + 1
        return counts
    """, ("for w in words:", "for w in sorted(words):"),
  """
  from collections import OrderedDict
  assert counts_in_order(["b", "a", "b"]) == OrderedDict([("b", 2), ("a", 1)])
  """,
  'assert list(counts_in_order("xyx")) == ["x", "y"]')

A("lru_cache_class", r"""
    from collections import OrderedDict

    class LRUCache:
        def __init__(self, capacity):
            self.capacity = capacity
            self.data = OrderedDict()

        def get(self, key):
            if key not in self.data:
                return -1
            self.data.move_to_end(key)
            return self.data[key]

        def put(self, key, value):
            self.data[key] = value
            self.data.move_to_end(key)
            if len(self.data) > self.capacity:
                self.data.popitem(last=False)
    """, ("        self.data.move_to_end(key)\n        return", "        return"),
  """
  c = LRUCache(2)
  c.put(1, 1)
  c.put(2, 2)
  assert c.get(1) == 1
  c.put(3, 3)
  assert c.get(2) == -1
  assert c.get(3) == 3
  """,
  """
  c = LRUCache(1)
  c.put("a", 1)
  assert c.get("b") == -1
  """)

A("defaultdict", r"""
    from collections import defaultdict

    def group_anagrams(words):
        groups = defaultdict(list)
        for w in words:
            groups["".join(sorted(w))].append(w)
        return groups
    """, ('groups["".join(sorted(w))]', "groups[len(w)]"),
  """
  from collections import defaultdict
  assert group_anagrams(["eat", "tea", "tan"]) == defaultdict(list, {"aet": ["eat", "tea"], "ant": ["tan"]})
  """,
  'assert sorted(map(len, group_anagrams(["ab", "ba", "c"]).values())) == [1, 2]')

A("namedtuple_return", r"""
    from collections import namedtuple

    Range = namedtuple("Range", ["lo", "hi"])

    def bounds(xs):
        return Range(min(xs), max(xs))
    """, ("Range(min(xs), max(xs))", "Range(xs[0], xs[-1])"),
  "assert bounds([3, 1, 2]) == (1, 3)",
  "assert bounds([5]).hi == 5",
  """
  from collections import namedtuple
  Stats = namedtuple("Stats", "lo hi")
  assert bounds([4, -2, 9]) == Stats(-2, 9)
  """)

A("frozenset", r"""
    def pair_sums(nums, target):
        seen, pairs = set(), set()
        for x in nums:
            if target - x in seen:
                pairs.add(frozenset((x, target - x)))
            seen.add(x)
        return pairs
    """, ("        if target - x in seen:\n            pairs.add(frozenset((x, target - x)))\n        seen.add(x)",
          "        seen.add(x)\n        if target - x in seen:\n            pairs.add(frozenset((x, target - x)))"),
  "assert pair_sums([1, 2, 3, 4], 5) == {frozenset({1, 4}), frozenset({2, 3})}",
  "assert pair_sums([1, 2, 3], 4) == {frozenset({1, 3})}",
  "assert frozenset({1, 3}) in pair_sums([1, 2, 3, 4], 4)")

A("complex", r"""
    import cmath

    def quadratic_roots(a, b, c):
        d = cmath.sqrt(b * b - 4 * a * c)
        return (-b + d) / (2 * a), (-b - d) / (2 * a)
    """, ("(-b + d) / (2 * a), (-b - d) / (2 * a)", "(-b + d) / 2 * a, (-b - d) / 2 * a"),
  "assert quadratic_roots(1, -3, 2) == (2, 1)",
  "assert quadratic_roots(2, 0, 2) == (1j, -1j)",
  "assert abs(quadratic_roots(1, 2, 5)[0] - complex(-1, 2)) < 1e-12")

A("bytes_xor", r"""
    def xor_bytes(data: bytes, key: int) -> bytes:
        return bytes(b ^ key for b in data)
    """, ("b ^ key", "b | key"),
  'assert xor_bytes(xor_bytes(b"hello", 42), 42) == b"hello"',
  r'assert xor_bytes(b"\x00\xff", 255) == bytes([255, 0])',
  'assert xor_bytes(b"", 7) == b""')

A("isinstance_own_class", r"""
    class Token:
        def __init__(self, text):
            self.text = text

        def __repr__(self):
            return f"{type(self).__name__}({self.text!r})"

    class Number(Token):
        @property
        def value(self):
            return int(self.text)

    class Word(Token):
        pass

    def lex(s):
        return [Number(t) if t.isdigit() else Word(t) for t in s.split()]
    """, ("t.isdigit()", "t.isalpha()"),
  """
  toks = lex("add 2 3")
  assert isinstance(toks[0], Word) and isinstance(toks[1], Number)
  """,
  'assert all(isinstance(t, Token) for t in lex("a 1 b"))',
  'assert [t.text for t in lex("x 10")] == ["x", "10"]')

A("class_with_eq", r"""
    class Money:
        def __init__(self, amount, currency):
            self.amount = amount
            self.currency = currency

        def __eq__(self, other):
            return isinstance(other, Money) and (self.amount, self.currency) == (other.amount, other.currency)

        def __hash__(self):
            return hash((self.amount, self.currency))

        def __add__(self, other):
            if other.currency != self.currency:
                raise ValueError("currency mismatch")
            return Money(self.amount + other.amount, self.currency)
    """, ("Money(self.amount + other.amount, self.currency)", "Money(self.amount - other.amount, self.currency)"),
  'assert Money(5, "EUR") + Money(7, "EUR") == Money(12, "EUR")',
  'assert Money(1, "USD") != Money(1, "EUR")',
  """
  try:
      Money(1, "USD") + Money(1, "EUR")
  except ValueError:
      pass
  else:
      assert False, "expected ValueError"
  """)

A("raises_value_error", r"""
    def isqrt(n):
        if n < 0:
            raise ValueError("negative input")
        lo, hi = 0, n + 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if mid * mid <= n:
                lo = mid
            else:
                hi = mid
        return lo
    """, ('    if n < 0:\n        raise ValueError("negative input")\n', ""),
  """
  try:
      isqrt(-1)
  except ValueError:
      pass
  else:
      assert False
  """,
  """
  for n in range(200):
      r = isqrt(n)
      assert r * r <= n < (r + 1) ** 2
  """,
  "assert isqrt(10**18) == 10**9")

A("mutates_argument", r"""
    def bump(a):
        for i in range(len(a)):
            a[i] += 1
    """, r"""
    def bump(a):
        a = [x + 1 for x in a]
    """,
  """
  a = [1, 2, 3]
  bump(a)
  assert a == [2, 3, 4]
  """,
  """
  a = []
  bump(a)
  assert a == []
  """)

A("leetcode_rotate_in_place", r"""
    from typing import List

    class Solution:
        def rotate(self, nums: List[int], k: int) -> None:
            k %= len(nums)
            nums[:] = nums[-k:] + nums[:-k]
    """, ("nums[:] = nums[-k:]", "nums = nums[-k:]"),
  """
  nums = [1, 2, 3, 4, 5, 6, 7]
  Solution().rotate(nums, 3)
  assert nums == [5, 6, 7, 1, 2, 3, 4]
  """,
  """
  nums = [-1, -100, 3, 99]
  Solution().rotate(nums, 2)
  assert nums == [3, 99, -1, -100]
  """)

A("pickle_own_class", r"""
    import pickle

    class Node:
        def __init__(self, value, children=()):
            self.value = value
            self.children = list(children)

        def total(self):
            return self.value + sum(c.total() for c in self.children)

    def clone(node):
        return pickle.loads(pickle.dumps(node))

    def clone_total(values):
        root = Node(values[0], [Node(v) for v in values[1:]])
        copy = clone(root)
        copy.children.append(Node(100))
        return root.total(), copy.total()
    """, ("    copy = clone(root)", "    copy = root"),
  "assert clone_total([1, 2, 3]) == (6, 106)",
  "assert clone_total([5]) == (5, 105)",
  "assert clone(Node(7, [Node(1)])).total() == 8")

A("base64", r"""
    import base64

    def to_b64url(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode("ascii")

    def from_b64url(text: str) -> bytes:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    """, ("base64.urlsafe_b64encode(data)", "base64.b64encode(data)"),
  r'assert to_b64url(b"\xfb\xff") == "-_8="',
  'assert from_b64url("aGk") == b"hi"',
  "assert from_b64url(to_b64url(bytes(range(256)))) == bytes(range(256))")

A("binascii", r"""
    import binascii

    def crc_hex(data: bytes) -> str:
        return format(binascii.crc32(data) & 0xFFFFFFFF, "08x")

    def hex_dump(data: bytes) -> str:
        return binascii.hexlify(data, " ").decode()
    """, ('"08x"', '"x"'),
  'assert crc_hex(b"hello") == "3610a686"',
  r'assert hex_dump(b"\x01\xab\xff") == "01 ab ff"',
  'assert crc_hex(b"") == "00000000"')

A("zlib", r"""
    import zlib

    def pack(text: str) -> bytes:
        return zlib.compress(text.encode("utf-8"), 9)

    def unpack(blob: bytes) -> str:
        return zlib.decompress(blob).decode("utf-8")

    def checksum(text: str) -> int:
        return zlib.adler32(text.encode("utf-8"))
    """, ('zlib.decompress(blob).decode("utf-8")', 'zlib.decompress(blob).decode("latin-1")'),
  'assert unpack(pack("héllo " * 200)) == "héllo " * 200',
  'assert len(pack("a" * 10000)) < 100',
  'assert checksum("Wikipedia") == 300286872')

A("gzip", r"""
    import gzip
    import io

    def gzip_lines(lines):
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb") as f:
            f.write("\n".join(lines).encode())
        return buf.getvalue()

    def read_gzip_lines(blob):
        return gzip.decompress(blob).decode().split("\n")
    """, ("    return buf.getvalue()", "        return buf.getvalue()"),
  'assert read_gzip_lines(gzip_lines(["a", "b"])) == ["a", "b"]',
  r'assert gzip_lines(["x"])[:2] == b"\x1f\x8b"',
  r"""
  import gzip
  assert gzip.decompress(gzip_lines(["p", "q"])) == b"p\nq"
  """)

A("zipfile_in_memory", r"""
    import io
    import zipfile

    def make_zip(files):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for name, text in files.items():
                zf.writestr(name, text)
        return buf.getvalue()

    def read_zip(blob):
        with zipfile.ZipFile(io.BytesIO(blob)) as zf:
            return {name: zf.read(name).decode() for name in sorted(zf.namelist())}
    """, ("    return buf.getvalue()", "        return buf.getvalue()"),
  'assert read_zip(make_zip({"b.txt": "2", "a/c.txt": "x" * 1000})) == {"a/c.txt": "x" * 1000, "b.txt": "2"}',
  'assert make_zip({"x": "y"})[:2] == b"PK"')

A("bz2", r"""
    import bz2

    def compress_chunks(chunks):
        comp = bz2.BZ2Compressor()
        out = b"".join(comp.compress(c) for c in chunks)
        return out + comp.flush()
    """, ("return out + comp.flush()", "return out"),
  """
  import bz2
  assert bz2.decompress(compress_chunks([b"ab", b"cd"])) == b"abcd"
  """,
  'assert compress_chunks([])[:3] == b"BZh"')

A("lzma", r"""
    import lzma

    def pack_records(records):
        return lzma.compress("\n".join(records).encode())

    def unpack_records(blob):
        return lzma.decompress(blob).decode().split("\n")
    """, (r'.split("\n")', ".split()"),
  'assert unpack_records(pack_records(["a b", "c"])) == ["a b", "c"]',
  r'assert pack_records(["x"])[:6] == b"\xfd7zXZ\x00"')

A("secrets", r"""
    import secrets

    def make_token(nbytes=16):
        return secrets.token_hex(nbytes)
    """, ("secrets.token_hex(nbytes)", "secrets.token_hex(nbytes // 2)"),
  "assert len(make_token()) == 32",
  "assert len(make_token(8)) == 16",
  """
  t = make_token(4)
  assert all(c in "0123456789abcdef" for c in t)
  """)

A("hashlib", r"""
    import hashlib

    def sha256_hex(text):
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def md5_of_chunks(chunks):
        h = hashlib.md5()
        for c in chunks:
            h.update(c)
        return h.hexdigest()
    """, ("h.update(c)", "h = hashlib.md5(c)"),
  'assert sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"',
  """
  import hashlib
  assert md5_of_chunks([b"ab", b"c"]) == hashlib.md5(b"abc").hexdigest()
  """)

A("zoneinfo", r"""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    def utc_offset_hours(tz, y, m, d):
        local = datetime(y, m, d, 12, tzinfo=ZoneInfo(tz))
        return local.utcoffset().total_seconds() / 3600

    def paris_to_tokyo(s):
        t = datetime.fromisoformat(s).replace(tzinfo=ZoneInfo("Europe/Paris"))
        return t.astimezone(ZoneInfo("Asia/Tokyo")).strftime("%Y-%m-%d %H:%M")
    """, (".utcoffset()", ".dst()"),
  'assert utc_offset_hours("Europe/Paris", 2024, 1, 15) == 1',
  'assert utc_offset_hours("Europe/Paris", 2024, 7, 15) == 2',
  'assert paris_to_tokyo("2024-07-01 20:00") == "2024-07-02 03:00"')

A("json", r"""
    import json

    def merge_json(a, b):
        merged = {**json.loads(a), **json.loads(b)}
        return json.dumps(merged, sort_keys=True)
    """, ("{**json.loads(a), **json.loads(b)}", "{**json.loads(b), **json.loads(a)}"),
  """assert merge_json('{"b": 1}', '{"a": [1, 2]}') == '{"a": [1, 2], "b": 1}'""",
  """
  import json
  assert json.loads(merge_json('{"x": 1}', '{"x": 2}')) == {"x": 2}
  """)

A("re", r"""
    import re

    EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")

    def extract_emails(text):
        return EMAIL.findall(text)

    def normalize_spaces(s):
        return re.sub(r"\s+", " ", s).strip()
    """, (r"[\w.+-]+@", r"\w+@"),
  'assert extract_emails("mail john.doe@example.com or ann+x@mail.co.uk now") == '
  '["john.doe@example.com", "ann+x@mail.co.uk"]',
  r'assert normalize_spaces("  a \t b\n\nc ") == "a b c"')

A("bisect", r"""
    import bisect

    def grade(score, breakpoints=(60, 70, 80, 90), grades="FDCBA"):
        return grades[bisect.bisect(breakpoints, score)]
    """, ("bisect.bisect(", "bisect.bisect_left("),
  'assert [grade(s) for s in [33, 99, 77, 70, 89, 90, 100]] == list("FACCBAA")',
  'assert grade(59) == "F"')

A("itertools_groupby", r"""
    from itertools import groupby

    def run_length(s):
        return [(ch, len(list(g))) for ch, g in groupby(s)]
    """, ("groupby(s)", "groupby(sorted(s))"),
  'assert run_length("aaabccaa") == [("a", 3), ("b", 1), ("c", 2), ("a", 2)]',
  'assert run_length("") == []')

A("functools_lru_cache", r"""
    from functools import lru_cache

    @lru_cache(maxsize=None)
    def ways(n):
        if n <= 1:
            return 1
        return ways(n - 1) + ways(n - 2)
    """, ("return 1", "return n"),
  "assert ways(50) == 20365011074",
  "assert [ways(i) for i in range(6)] == [1, 1, 2, 3, 5, 8]")

A("deep_recursion", r"""
    import sys

    sys.setrecursionlimit(10000)

    def sum_to(n):
        return 0 if n == 0 else n + sum_to(n - 1)
    """, ("sys.setrecursionlimit(10000)\n", ""),
  "assert sum_to(5000) == 12502500",
  "assert sum_to(0) == 0")

A("generator", r"""
    def fib_gen(n):
        a, b = 0, 1
        for _ in range(n):
            yield a
            a, b = b, a + b
    """, ("yield a", "yield b"),
  "assert list(fib_gen(6)) == [0, 1, 1, 2, 3, 5]",
  "assert sum(fib_gen(10)) == 88",
  "assert list(fib_gen(0)) == []")

A("humaneval_check_candidate", r"""
    from typing import List

    def has_close_elements(numbers: List[float], threshold: float) -> bool:
        for i, a in enumerate(numbers):
            for j, b in enumerate(numbers):
                if i != j and abs(a - b) < threshold:
                    return True
        return False
    """, ("i != j and abs(a - b) < threshold", "abs(a - b) < threshold"),
  """
  METADATA = {"author": "jt", "dataset": "test"}


  def check(candidate):
      assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True
      assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False
      assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True
      assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.8) == False
      assert candidate([1.0, 2.0, 3.0, 4.0, 5.0, 2.0], 0.1) == True
      assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 1.0) == True
      assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 0.5) == False


  check(has_close_elements)
  """)

A("humaneval_check_longest", r"""
    from typing import List, Optional

    def longest(strings: List[str]) -> Optional[str]:
        if not strings:
            return None
        maxlen = max(len(x) for x in strings)
        for s in strings:
            if len(s) == maxlen:
                return s
    """, ("    maxlen = max(len(x) for x in strings)\n    for s in strings:\n        if len(s) == maxlen:\n"
          "            return s", "    return sorted(strings, key=len)[-1]"),
  """
  def check(candidate):
      assert candidate([]) == None
      assert candidate(['x', 'y', 'z']) == 'x'
      assert candidate(['x', 'yyy', 'zzzz', 'www', 'kkkk', 'abc']) == 'zzzz'

  check(longest)
  """)

A("loop_in_test", r"""
    def square(n):
        return sum(2 * k + 1 for k in range(n))
    """, ("range(n)", "range(1, n)"),
  """
  for i in range(10):
      assert square(i) == i * i
  """)

A("comprehension_tests", r"""
    def is_prime(n):
        if n < 2:
            return False
        for d in range(2, int(n ** 0.5) + 1):
            if n % d == 0:
                return False
        return True
    """, ("int(n ** 0.5) + 1", "int(n ** 0.5)"),
  "assert all(is_prime(p) for p in [2, 3, 5, 7, 11, 97, 7919])",
  "assert not any(is_prime(x) for x in [0, 1, 4, 9, 25, 91])",
  "assert [n for n in range(20) if is_prime(n)] == [2, 3, 5, 7, 11, 13, 17, 19]")

A("sqlite3", r"""
    import sqlite3

    def top_customers(rows, k):
        con = sqlite3.connect(":memory:")
        con.execute("CREATE TABLE sales (customer TEXT, amount INTEGER)")
        con.executemany("INSERT INTO sales VALUES (?, ?)", rows)
        query = ("SELECT customer, SUM(amount) AS total FROM sales GROUP BY customer "
                 "ORDER BY total DESC, customer LIMIT ?")
        result = con.execute(query, (k,)).fetchall()
        con.close()
        return result
    """, ("total DESC", "total"),
  'assert top_customers([("ann", 5), ("bob", 7), ("ann", 4), ("cy", 9)], 2) == [("ann", 9), ("cy", 9)]',
  "assert top_customers([], 3) == []")

A("csv", r"""
    import csv
    import io

    def parse_csv(text):
        return [dict(row) for row in csv.DictReader(io.StringIO(text))]

    def to_csv(rows, fields):
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue()
    """, ("    return [dict(row) for row in csv.DictReader(io.StringIO(text))]",
          '    lines = text.splitlines()\n    header = lines[0].split(",")\n'
          '    return [dict(zip(header, line.split(","))) for line in lines[1:]]'),
  r"""assert parse_csv('name,city\nAnn,"Paris, FR"\n') == [{"name": "Ann", "city": "Paris, FR"}]""",
  r"""assert to_csv([{"a": 1, "b": "x,y"}], ["a", "b"]) == 'a,b\n1,"x,y"\n'""")

A("struct", r"""
    import struct

    def pack_point(x, y, label):
        data = label.encode()
        return struct.pack("<ddH", x, y, len(data)) + data

    def unpack_point(blob):
        x, y, n = struct.unpack_from("<ddH", blob)
        start = struct.calcsize("<ddH")
        return x, y, blob[start:start + n].decode()
    """, ('start = struct.calcsize("<ddH")', "start = 16"),
  'assert unpack_point(pack_point(1.5, -2.0, "A1")) == (1.5, -2.0, "A1")',
  'assert len(pack_point(0, 0, "")) == 18')

A("xml_etree", r"""
    import xml.etree.ElementTree as ET

    def titles_by(xml_text, author):
        root = ET.fromstring(xml_text)
        return [b.findtext("title") for b in root.iter("book") if b.get("author") == author]
    """, ('root.iter("book")', 'root.findall("book")'),
  """
  DOC = ('<lib><book author="ann"><title>A</title></book>'
         '<shelf><book author="ann"><title>B</title></book></shelf>'
         '<book author="bob"><title>C</title></book></lib>')
  assert titles_by(DOC, "ann") == ["A", "B"]
  """,
  'assert titles_by("<lib/>", "ann") == []')

A("random_seeded", r"""
    import random

    def shuffled(items, seed):
        rng = random.Random(seed)
        out = list(items)
        rng.shuffle(out)
        return out
    """, ("    out = list(items)\n    rng.shuffle(out)\n", "    out = sorted(items, key=lambda _: rng.random())\n"),
  "assert sorted(shuffled(range(10), 1)) == list(range(10))",
  'assert shuffled("abcdef", 7) == shuffled("abcdef", 7)',
  """
  import random
  expected = list("abcdefgh")
  random.Random(3).shuffle(expected)
  assert shuffled("abcdefgh", 3) == expected
  """)

A("deepcopy_input_unchanged", r"""
    import copy

    def with_cell(grid, r, c, value):
        new = copy.deepcopy(grid)
        new[r][c] = value
        return new
    """, ("copy.deepcopy(grid)", "copy.copy(grid)"),
  """
  g = [[0, 0], [0, 0]]
  h = with_cell(g, 0, 1, 5)
  assert h == [[0, 5], [0, 0]]
  assert g == [[0, 0], [0, 0]]
  """)

A("contextmanager", r"""
    from contextlib import contextmanager

    events = []

    @contextmanager
    def tag(name):
        events.append(f"<{name}>")
        try:
            yield
        finally:
            events.append(f"</{name}>")

    def render(fail=False):
        events.clear()
        try:
            with tag("a"):
                with tag("b"):
                    if fail:
                        raise RuntimeError("boom")
        except RuntimeError:
            pass
        return "".join(events)
    """, ("    try:\n        yield\n    finally:\n        events.append", "    yield\n    events.append"),
  'assert render() == "<a><b></b></a>"',
  'assert render(fail=True) == "<a><b></b></a>"')

A("abc_abstract", r"""
    from abc import ABC, abstractmethod

    class Shape(ABC):
        @abstractmethod
        def area(self): ...

    class Rect(Shape):
        def __init__(self, w, h):
            self.w, self.h = w, h

        def area(self):
            return self.w * self.h

    def total_area(specs):
        return sum(Rect(w, h).area() for w, h in specs)
    """, ("class Shape(ABC):", "class Shape:"),
  "assert total_area([(2, 3), (1, 1)]) == 7",
  """
  try:
      Shape()
  except TypeError:
      pass
  else:
      assert False, "an abstract class was instantiated"
  """)

A("threads_lock", r"""
    import threading

    def parallel_count(n_threads, per_thread):
        count = 0
        lock = threading.Lock()

        def work():
            nonlocal count
            for _ in range(per_thread):
                with lock:
                    count += 1

        threads = [threading.Thread(target=work) for _ in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return count
    """, ("[threading.Thread(target=work) for _ in range(n_threads)]", "[threading.Thread(target=work)] * n_threads"),
  "assert parallel_count(4, 1000) == 4000",
  "assert parallel_count(1, 5) == 5")

A("dataclass_frozen_order", r"""
    from dataclasses import dataclass

    @dataclass(frozen=True, order=True)
    class Version:
        major: int
        minor: int = 0
        patch: int = 0

        @classmethod
        def parse(cls, s):
            return cls(*map(int, s.split(".")))

    def newest(versions):
        return max(Version.parse(v) for v in versions)
    """, ("max(Version.parse(v) for v in versions)", "Version.parse(max(versions))"),
  'assert newest(["1.2.10", "1.10.0", "1.9.9"]) == Version(1, 10, 0)',
  'assert str(newest(["2", "1.5"])) == "Version(major=2, minor=0, patch=0)"',
  """
  try:
      Version(1).major = 2
  except AttributeError:
      pass
  else:
      assert False, "a frozen dataclass was changed"
  """)

if HAS_NUMPY:
    A("numpy_linalg", r"""
        import numpy as np

        def solve_linear(a, b):
            return np.linalg.solve(np.array(a, dtype=float), np.array(b, dtype=float)).round(6).tolist()

        def moving_average(xs, w):
            return np.convolve(xs, np.ones(w) / w, mode="valid").tolist()
        """, ("np.array(a, dtype=float), np.array(b", "np.array(a, dtype=float).T, np.array(b"),
      "assert solve_linear([[1, 2], [3, 4]], [5, 6]) == [-4.0, 4.5]",
      "assert moving_average([1, 2, 3, 4], 2) == [1.5, 2.5, 3.5]",
      """
      import numpy as np
      assert np.allclose(solve_linear([[2, 0], [0, 4]], [1, 1]), [0.5, 0.25])
      """)

# ================================================================================================================
# call-based (APPS / TACO `fn_name`; LeetCode's `class Solution`): arguments and expected return as JSON holds them
# ================================================================================================================

C("two_sum_solution", r"""
    from typing import List

    class Solution:
        def twoSum(self, nums: List[int], target: int) -> List[int]:
            seen = {}
            for i, x in enumerate(nums):
                if target - x in seen:
                    return [seen[target - x], i]
                seen[x] = i
            return []
    """, ("            if target - x in seen:\n                return [seen[target - x], i]\n"
          "            seen[x] = i",
          "            seen[x] = i\n            if target - x in seen:\n"
          "                return [seen[target - x], i]"),
  "twoSum",
  ([[2, 7, 11, 15], 9], [0, 1]), ([[3, 2, 4], 6], [1, 2]), ([[3, 3], 6], [0, 1]))

C("longest_common_prefix", r"""
    def longest_common_prefix(strs):
        if not strs:
            return ""
        prefix = strs[0]
        for s in strs[1:]:
            while not s.startswith(prefix):
                prefix = prefix[:-1]
        return prefix
    """, ("for s in strs[1:]:", "for s in strs[1:2]:"),
  "longest_common_prefix",
  ([["flower", "flow", "flight"]], "fl"), ([["dog", "racecar", "car"]], ""), ([["a"]], "a"), ([[]], ""))

C("max_profit_solution", r"""
    class Solution:
        def maxProfit(self, prices):
            lo, best = float("inf"), 0
            for p in prices:
                lo = min(lo, p)
                best = max(best, p - lo)
            return best
    """, r"""
    class Solution:
        def maxProfit(self, prices):
            return max(prices) - min(prices)
    """,
  "maxProfit",
  ([[7, 1, 5, 3, 6, 4]], 5), ([[7, 6, 4, 3, 1]], 0), ([[2, 4, 1]], 2))

C("kth_largest_heapq", r"""
    import heapq

    def kth_largest(nums, k):
        heap = []
        for x in nums:
            heapq.heappush(heap, x)
            if len(heap) > k:
                heapq.heappop(heap)
        return heap[0]
    """, ("len(heap) > k", "len(heap) >= k"),
  "kth_largest",
  ([[3, 2, 1, 5, 6, 4], 2], 5), ([[3, 2, 3, 1, 2, 4, 5, 5, 6], 4], 4), ([[1], 1], 1))

C("first_unique_counter", r"""
    from collections import Counter

    def first_unique_char(s):
        counts = Counter(s)
        for i, ch in enumerate(s):
            if counts[ch] == 1:
                return i
        return -1
    """, ("counts[ch] == 1", "counts[ch] <= 2"),
  "first_unique_char",
  (["leetcode"], 0), (["loveleetcode"], 2), (["aabb"], -1))

C("unique_paths_lru_cache", r"""
    from functools import lru_cache

    def unique_paths(m, n):
        @lru_cache(maxsize=None)
        def go(r, c):
            if r == m - 1 or c == n - 1:
                return 1
            return go(r + 1, c) + go(r, c + 1)
        return go(0, 0)
    """, ("if r == m - 1 or c == n - 1:", "if r == m or c == n:"),
  "unique_paths",
  ([3, 7], 28), ([3, 2], 3), ([1, 1], 1), ([10, 10], 48620))

C("count_in_range_bisect", r"""
    from bisect import bisect_left, bisect_right

    def count_in_range(nums, lo, hi):
        nums = sorted(nums)
        return bisect_right(nums, hi) - bisect_left(nums, lo)
    """, ("bisect_right(nums, hi)", "bisect_left(nums, hi)"),
  "count_in_range",
  ([[1, 3, 3, 5, 7], 3, 5], 3), ([[5, 1, 9], 0, 10], 3), ([[2, 2, 2], 3, 4], 0))

C("count_triplets_itertools", r"""
    from itertools import combinations

    def count_triplets(nums, target):
        return sum(1 for c in combinations(nums, 3) if sum(c) == target)
    """, ("combinations(nums, 3)", "combinations(set(nums), 3)"),
  "count_triplets",
  ([[1, 2, 3, 4, 5], 9], 2), ([[1, 1, 1, 1], 3], 4), ([[1, 2], 3], 0))

C("min_max_tuple", r"""
    def min_max(xs):
        lo = hi = xs[0]
        for x in xs[1:]:
            if x < lo:
                lo = x
            elif x > hi:
                hi = x
        return lo, hi
    """, ("lo = hi = xs[0]", "lo = hi = 0"),
  "min_max",
  ([[3, 1, 9, 4]], [1, 9]), ([[5]], [5, 5]), ([[-2, -7, -1]], [-7, -1]))

C("word_count_dict", r"""
    import re
    from collections import Counter

    def word_count(text):
        return dict(Counter(re.findall(r"[a-z']+", text.lower())))
    """, ("text.lower()", "text"),
  "word_count",
  (["The cat and the hat"], {"the": 2, "cat": 1, "and": 1, "hat": 1}),
  (["Don't stop, don't!"], {"don't": 2, "stop": 1}))

C("run_length_compress", r"""
    def compress(s):
        out = []
        i = 0
        while i < len(s):
            j = i
            while j < len(s) and s[j] == s[i]:
                j += 1
            out.append(f"{s[i]}{j - i}")
            i = j
        return "".join(out)
    """, ('out.append(f"{s[i]}{j - i}")', 'out.append(f"{s[i]}{j - i}" if j - i > 1 else s[i])'),
  "compress",
  (["aabccc"], "a2b1c3"), ([""], ""), (["zzzzzzzzzzzz"], "z12"))

C("valid_parentheses", r"""
    def is_valid(s):
        pairs = {")": "(", "]": "[", "}": "{"}
        stack = []
        for ch in s:
            if ch in pairs:
                if not stack or stack.pop() != pairs[ch]:
                    return False
            else:
                stack.append(ch)
        return not stack
    """, ("return not stack", "return True"),
  "is_valid",
  (["()[]{}"], True), (["(]"], False), (["(("], False), (["{[()]}"], True))

C("rotate_matrix", r"""
    def rotate_matrix(m):
        return [list(row) for row in zip(*m[::-1])]
    """, ("zip(*m[::-1])", "zip(*m)"),
  "rotate_matrix",
  ([[[1, 2], [3, 4]]], [[3, 1], [4, 2]]), ([[[1, 2, 3], [4, 5, 6], [7, 8, 9]]], [[7, 4, 1], [8, 5, 2], [9, 6, 3]]),
  ([[[5]]], [[5]]))

C("sliding_window_max_deque", r"""
    from collections import deque

    def max_sliding_window(nums, k):
        dq, out = deque(), []
        for i, x in enumerate(nums):
            while dq and nums[dq[-1]] <= x:
                dq.pop()
            dq.append(i)
            if dq[0] <= i - k:
                dq.popleft()
            if i >= k - 1:
                out.append(nums[dq[0]])
        return out
    """, ("if dq[0] <= i - k:", "if dq[0] < i - k:"),
  "max_sliding_window",
  ([[1, 3, -1, -3, 5, 3, 6, 7], 3], [3, 3, 5, 5, 6, 7]), ([[1], 1], [1]), ([[9, 8, 7, 6], 2], [9, 8, 7]))

C("valid_ipv4_re", r"""
    import re

    def is_valid_ipv4(s):
        parts = s.split(".")
        if len(parts) != 4:
            return False
        for p in parts:
            if not re.fullmatch(r"0|[1-9]\d{0,2}", p) or int(p) > 255:
                return False
        return True
    """, (r'r"0|[1-9]\d{0,2}"', r'r"\d{1,3}"'),
  "is_valid_ipv4",
  (["192.168.1.1"], True), (["256.1.1.1"], False), (["01.2.3.4"], False), (["1.2.3"], False))

C("climb_stairs_solution_cache", r"""
    from functools import lru_cache

    class Solution:
        def climbStairs(self, n: int) -> int:
            @lru_cache(None)
            def f(i):
                return 1 if i <= 1 else f(i - 1) + f(i - 2)
            return f(n)
    """, ("return 1 if i <= 1", "return i if i <= 1"),
  "climbStairs",
  ([2], 2), ([3], 3), ([45], 1836311903))

C("spiral_order", r"""
    def spiral_order(matrix):
        out = []
        while matrix:
            out += matrix.pop(0)
            matrix = [list(r) for r in zip(*matrix)][::-1]
        return out
    """, ("[list(r) for r in zip(*matrix)][::-1]", "[list(r) for r in zip(*matrix)]"),
  "spiral_order",
  ([[[1, 2, 3], [4, 5, 6], [7, 8, 9]]], [1, 2, 3, 6, 9, 8, 7, 4, 5]),
  ([[[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]], [1, 2, 3, 4, 8, 12, 11, 10, 9, 5, 6, 7]),
  ([[]], []))

C("binary_search_none", r"""
    def binary_search(nums, x):
        lo, hi = 0, len(nums) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            if nums[mid] == x:
                return mid
            if nums[mid] < x:
                lo = mid + 1
            else:
                hi = mid - 1
        return None
    """, ("while lo <= hi:", "while lo < hi:"),
  "binary_search",
  ([[1, 3, 5, 7], 7], 3), ([[1, 3, 5, 7], 4], None), ([[2], 2], 0))

C("caesar", r"""
    def caesar(s, k):
        out = []
        for ch in s:
            if ch.isalpha():
                base = ord("a") if ch.islower() else ord("A")
                out.append(chr((ord(ch) - base + k) % 26 + base))
            else:
                out.append(ch)
        return "".join(out)
    """, ("(ord(ch) - base + k) % 26 + base", "ord(ch) + k"),
  "caesar",
  (["abc xyz", 3], "def abc"), (["Hello, World!", 13], "Uryyb, Jbeyq!"), (["abc", -1], "zab"))

C("median_float", r"""
    def median(xs):
        s = sorted(xs)
        n = len(s)
        mid = n // 2
        return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2
    """, ("s = sorted(xs)", "s = xs"),
  "median",
  ([[3, 1, 2]], 2), ([[4, 1, 3, 2]], 2.5), ([[7]], 7))

C("gcd_of_strings_solution", r"""
    from math import gcd

    class Solution:
        def gcdOfStrings(self, str1: str, str2: str) -> str:
            if str1 + str2 != str2 + str1:
                return ""
            return str1[:gcd(len(str1), len(str2))]
    """, ('        if str1 + str2 != str2 + str1:\n            return ""\n', ""),
  "gcdOfStrings",
  (["ABCABC", "ABC"], "ABC"), (["ABABAB", "ABAB"], "AB"), (["LEET", "CODE"], ""))

C("fizzbuzz_list", r"""
    def fizzbuzz(n):
        out = []
        for i in range(1, n + 1):
            if i % 15 == 0:
                out.append("FizzBuzz")
            elif i % 3 == 0:
                out.append("Fizz")
            elif i % 5 == 0:
                out.append("Buzz")
            else:
                out.append(str(i))
        return out
    """, ("range(1, n + 1)", "range(n)"),
  "fizzbuzz",
  ([5], ["1", "2", "Fizz", "4", "Buzz"]),
  ([15], ["1", "2", "Fizz", "4", "Buzz", "Fizz", "7", "8", "Fizz", "Buzz", "11", "Fizz", "13", "14", "FizzBuzz"]),
  ([0], []))

# ================================================================================================================
# stdin/stdout (APPS, Codeforces, CodeContests): the program run as a script, its output compared token by token
# ================================================================================================================

S("kadane_exit", r"""
    n = int(input())
    a = list(map(int, input().split()))
    best = cur = a[0]
    for x in a[1:]:
        cur = max(x, cur + x)
        best = max(best, cur)
    print(best)
    exit()
    """, ("best = cur = a[0]\nfor x in a[1:]:", "best = cur = 0\nfor x in a:"),
  ("5\n-2 1 -3 4 -1\n", "4"), ("3\n-3 -1 -2\n", "-1"), ("1\n7\n", "7"))

S("palindrome_quit", r"""
    s = input().strip()
    if s == s[::-1]:
        print("YES")
        quit()
    print("NO")
    quit()
    """, ("if s == s[::-1]:", "if s[0] == s[-1]:"),
  ("racecar\n", "YES"), ("abca\n", "NO"), ("ab\n", "NO"))

S("first_duplicate_sys_exit", r"""
    import sys

    def main():
        data = sys.stdin.read().split()
        n = int(data[0])
        seen = set()
        for x in data[1:n + 1]:
            if x in seen:
                print(x)
                sys.exit(0)
            seen.add(x)
        print(-1)

    main()
    """, ("        seen.add(x)\n", ""),
  ("5\n2 1 3 1 2\n", "1"), ("3\n1 2 3\n", "-1"), ("4\n9 9 9 9\n", "9"))

_PATH_5000 = "5000\n" + "".join(f"{i} {i + 1}\n" for i in range(1, 5000))
S("thread_big_stack_tree_depth", r"""
    import sys
    import threading

    def main():
        data = sys.stdin.buffer.read().split()
        n = int(data[0])
        adj = [[] for _ in range(n + 1)]
        for i in range(n - 1):
            u, v = int(data[1 + 2 * i]), int(data[2 + 2 * i])
            adj[u].append(v)
            adj[v].append(u)

        def depth(u, parent):
            best = 0
            for v in adj[u]:
                if v != parent:
                    best = max(best, depth(v, u))
            return best + 1

        print(depth(1, 0))

    sys.setrecursionlimit(1 << 20)
    threading.stack_size(1 << 26)
    threading.Thread(target=main).start()
    """, ("return best + 1", "return best"),
  ("1\n", "1"), ("5\n1 2\n1 3\n3 4\n4 5\n", "4"), (_PATH_5000, "5000"))

S("sort_print_star", r"""
    import sys

    data = sys.stdin.read().split()
    n = int(data[0])
    a = sorted(map(int, data[1:n + 1]))
    print(*a)
    """, ("sorted(map(int, data[1:n + 1]))", "sorted(data[1:n + 1])"),
  ("5\n3 1 2 5 4\n", "1 2 3 4 5"), ("3\n10 9 1\n", "1 9 10"))

_N = 200000
S("prefix_sums_stdin_buffer", r"""
    import sys

    def main():
        data = sys.stdin.buffer.read().split()
        n, q = int(data[0]), int(data[1])
        prefix = [0] * (n + 1)
        for i in range(n):
            prefix[i + 1] = prefix[i] + int(data[2 + i])
        out = []
        pos = 2 + n
        for _ in range(q):
            left, right = int(data[pos]), int(data[pos + 1])
            pos += 2
            out.append(prefix[right] - prefix[left - 1])
        sys.stdout.write("\n".join(map(str, out)) + "\n")

    main()
    """, ("prefix[right] - prefix[left - 1]", "prefix[right] - prefix[left]"),
  ("5 3\n1 2 3 4 5\n1 5\n2 3\n4 4\n", "15\n5\n4"),
  (f"{_N} 3\n" + " ".join(map(str, range(1, _N + 1))) + f"\n1 {_N}\n7 7\n100 {_N}\n",
   f"{_N * (_N + 1) // 2}\n7\n{_N * (_N + 1) // 2 - 99 * 100 // 2}"))

S("gcd_lcm_testcases", r"""
    from math import gcd

    t = int(input())
    for _ in range(t):
        a, b = map(int, input().split())
        print(gcd(a, b), a * b // gcd(a, b))
    """, ("a * b // gcd(a, b)", "a * b"),
  ("3\n12 18\n7 5\n10 10\n", "6 36\n1 35\n10 10"), ("1\n1 1\n", "1 1"))

S("bfs_grid_deque", r"""
    import sys
    from collections import deque

    def main():
        lines = sys.stdin.read().split("\n")
        h, w = map(int, lines[0].split())
        grid = lines[1:1 + h]
        dist = [[-1] * w for _ in range(h)]
        dist[0][0] = 0
        q = deque([(0, 0)])
        while q:
            r, c = q.popleft()
            for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                nr, nc = r + dr, c + dc
                if 0 <= nr < h and 0 <= nc < w and grid[nr][nc] == "." and dist[nr][nc] == -1:
                    dist[nr][nc] = dist[r][c] + 1
                    q.append((nr, nc))
        print(dist[h - 1][w - 1])

    main()
    """, ("q.popleft()", "q.pop()"),
  ("3 3\n...\n.#.\n...\n", "4"), ("5 5\n.....\n.....\n.....\n.....\n.....\n", "8"), ("2 2\n.#\n#.\n", "-1"),
  ("3 5\n.....\n.###.\n.....\n", "6"))

S("dijkstra_heapq", r"""
    import heapq
    import sys

    def main():
        data = sys.stdin.read().split()
        n, m = int(data[0]), int(data[1])
        adj = [[] for _ in range(n + 1)]
        for i in range(m):
            u, v, w = (int(x) for x in data[2 + 3 * i: 5 + 3 * i])
            adj[u].append((v, w))
            adj[v].append((u, w))
        dist = [float("inf")] * (n + 1)
        dist[1] = 0
        pq = [(0, 1)]
        while pq:
            d, u = heapq.heappop(pq)
            if d > dist[u]:
                continue
            for v, w in adj[u]:
                if d + w < dist[v]:
                    dist[v] = d + w
                    heapq.heappush(pq, (dist[v], v))
        print(*(x if x != float("inf") else -1 for x in dist[1:]))

    main()
    """, ("        adj[v].append((u, w))\n", ""),
  ("4 4\n1 2 4\n1 3 1\n3 2 2\n4 3 5\n", "0 3 1 6"), ("3 1\n2 3 7\n", "0 -1 -1"))

S("top_k_words_counter", r"""
    import sys
    from collections import Counter

    data = sys.stdin.read().split()
    k = int(data[0])
    counts = Counter(w.lower() for w in data[1:])
    for word, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]:
        print(word, c)
    """, ("sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]", "counts.most_common(k)"),
  ("2\nb a B a c\n", "a 2\nb 2"), ("1\nx y x\n", "x 2"))

S("namedtuple_students", r"""
    from collections import namedtuple

    Student = namedtuple("Student", "name score")
    n = int(input())
    students = []
    for _ in range(n):
        name, score = input().split()
        students.append(Student(name, int(score)))
    students.sort(key=lambda s: (-s.score, s.name))
    for s in students:
        print(s.name, s.score)
    """, ("key=lambda s: (-s.score, s.name)", "key=lambda s: -s.score"),
  ("3\nbob 90\nalice 90\ncarl 95\n", "carl 95\nalice 90\nbob 90"), ("1\nzed 1\n", "zed 1"))

S("decimal_money", r"""
    from decimal import ROUND_HALF_UP, Decimal

    total = Decimal("0")
    n = int(input())
    for _ in range(n):
        total += Decimal(input().strip())
    print(total.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))
    """, r"""
    total = 0.0
    n = int(input())
    for _ in range(n):
        total += float(input())
    print(f"{total:.2f}")
    """,
  ("1\n2.675\n", "2.68"), ("3\n0.1\n0.2\n0.3\n", "0.60"), ("2\n1.005\n0\n", "1.01"))

S("edit_distance_lru_cache", r"""
    import sys
    from functools import lru_cache

    sys.setrecursionlimit(10000)

    def main():
        a = input().strip()
        b = input().strip()

        @lru_cache(maxsize=None)
        def dist(i, j):
            if i == len(a):
                return len(b) - j
            if j == len(b):
                return len(a) - i
            if a[i] == b[j]:
                return dist(i + 1, j + 1)
            return 1 + min(dist(i + 1, j), dist(i, j + 1), dist(i + 1, j + 1))

        print(dist(0, 0))

    main()
    """, ("min(dist(i + 1, j), dist(i, j + 1), dist(i + 1, j + 1))", "min(dist(i + 1, j), dist(i, j + 1))"),
  ("kitten\nsitting\n", "3"), ("horse\nros\n", "3"), ("a" * 300 + "\n" + "a" * 299 + "b\n", "1"))

S("permutations_sorted", r"""
    from itertools import permutations

    s = input().strip()
    for p in sorted(set(permutations(s))):
        print("".join(p))
    """, ("sorted(set(permutations(s)))", "permutations(sorted(s))"),
  ("aab\n", "aab\naba\nbaa"), ("cba\n", "abc\nacb\nbac\nbca\ncab\ncba"))

S("lis_bisect", r"""
    import sys
    from bisect import bisect_left

    data = sys.stdin.read().split()
    n = int(data[0])
    tails = []
    for x in map(int, data[1:n + 1]):
        i = bisect_left(tails, x)
        if i == len(tails):
            tails.append(x)
        else:
            tails[i] = x
    print(len(tails))
    """, [("from bisect import bisect_left", "from bisect import bisect_right"),
          ("i = bisect_left(tails, x)", "i = bisect_right(tails, x)")],
  ("8\n10 9 2 5 3 7 101 18\n", "4"), ("5\n2 2 2 3 3\n", "2"), ("1\n5\n", "1"))

S("json_stdin", r"""
    import json
    import sys

    orders = json.load(sys.stdin)
    total = sum(item["price"] * item.get("qty", 1) for o in orders for item in o["items"])
    print(f"{total:.2f}")
    """, ('item.get("qty", 1)', 'item["qty"]'),
  ('[{"items": [{"price": 2.5, "qty": 2}, {"price": 1}]}, {"items": []}]\n', "6.00"),
  ('[{"items": [{"price": 3, "qty": 3}]}]\n', "9.00"))

S("regex_sum_numbers", r"""
    import re
    import sys

    for line in sys.stdin:
        nums = re.findall(r"-?\d+", line)
        print(sum(map(int, nums)))
    """, (r'r"-?\d+"', r'r"\d+"'),
  ("a1b-2c3\nno digits\n", "2\n0"), ("x10y20\n", "30"))

S("logging_to_stderr", r"""
    import logging
    import sys

    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    log = logging.getLogger("solve")

    def main():
        n = int(sys.stdin.readline())
        total = 0
        for i in range(1, n + 1):
            if i % 3 == 0 or i % 5 == 0:
                total += i
        log.debug("n=%d total=%d", n, total)
        print(total)

    main()
    """, ("range(1, n + 1)", "range(1, n)"),
  ("10\n", "33"), ("1\n", "0"), ("15\n", "60"))

S("fractions_sum", r"""
    from fractions import Fraction

    total = sum(Fraction(tok) for tok in input().split())
    print(total)
    """, ("total = sum(Fraction(tok) for tok in input().split())",
          "total = Fraction(sum(float(Fraction(t)) for t in input().split())).limit_denominator(100)"),
  ("1/2 1/3\n", "5/6"), ("1/3 1/7 1/11\n", "131/231"), ("1/2 1/2\n", "1"))

S("date_difference", r"""
    from datetime import date

    a = date.fromisoformat(input().strip())
    b = date.fromisoformat(input().strip())
    print(abs((b - a).days))
    """, ("abs((b - a).days)", "(b - a).days"),
  ("2024-01-01\n2024-03-01\n", "60"), ("2024-03-01\n2023-03-01\n", "366"))

S("main_guard", r"""
    import sys

    def solve(n, a):
        a.sort()
        return sum(abs(x - a[n // 2]) for x in a)

    def main():
        it = iter(sys.stdin.read().split())
        n = int(next(it))
        a = [int(next(it)) for _ in range(n)]
        print(solve(n, a))

    if __name__ == "__main__":
        main()
    """, ("abs(x - a[n // 2])", "abs(x - sum(a) // n)"),
  ("3\n1 2 3\n", "2"), ("4\n1 10 2 9\n", "16"), ("3\n1 1 100\n", "99"))

S("input_until_eof", r"""
    while True:
        try:
            line = input()
        except EOFError:
            break
        if not line.strip():
            continue
        a, b = map(int, line.split())
        if a == 0 and b == 0:
            break
        print(a + b)
    """, ("if a == 0 and b == 0:", "if a == 0 or b == 0:"),
  ("1 2\n3 4\n0 0\n5 5\n", "3\n7"), ("0 5\n\n2 2\n", "5\n4"))

_CHAIN_3000 = "3001 2999\n" + "".join(f"{i} {i + 1}\n" for i in range(1, 3000))
S("recursive_dfs_components", r"""
    import sys

    sys.setrecursionlimit(100000)

    def main():
        data = sys.stdin.read().split()
        n, m = int(data[0]), int(data[1])
        adj = [[] for _ in range(n + 1)]
        for i in range(m):
            u, v = int(data[2 + 2 * i]), int(data[3 + 2 * i])
            adj[u].append(v)
            adj[v].append(u)
        seen = [False] * (n + 1)

        def dfs(u):
            seen[u] = True
            for v in adj[u]:
                if not seen[v]:
                    dfs(v)

        comps = 0
        for u in range(1, n + 1):
            if not seen[u]:
                comps += 1
                dfs(u)
        print(comps)

    main()
    """, ("        adj[v].append(u)\n", ""),
  ("5 3\n1 2\n3 2\n4 5\n", "2"), (_CHAIN_3000, "2"))

if HAS_NUMPY:
    S("numpy_stdin_matrix", r"""
        import sys

        import numpy as np

        data = sys.stdin.read().split()
        n = int(data[0])
        m = np.array(data[1:1 + n * n], dtype=np.int64).reshape(n, n)
        print(int(np.trace(m)), int(round(np.linalg.det(m))))
        """, ("int(np.trace(m))", "int(m.sum())"),
      ("2\n1 2\n3 4\n", "5 -2"), ("3\n2 0 0\n0 3 0\n0 0 4\n", "9 24"))


# ================================================================================================================
# the plain-CPython reference: how users run these without a sandbox, one fresh interpreter per test
# ================================================================================================================

PLAIN_TIMEOUT_S = 30




def _callee(code: str, fn: str) -> str:
    """What a call-based test calls: the program's top-level function, else the method of `Solution()`."""
    tree = ast.parse(code)
    top = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    return fn if fn in top or "Solution" not in top else f"Solution().{fn}"


def _plain_stdio(code: str, case: tuple) -> bool:
    """A stdin/stdout program on one test's input in a fresh interpreter, in its own temporary directory."""
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "solution.py"), "w", encoding="utf-8") as f:
            f.write(code)
        try:
            out = subprocess.run([sys.executable, "solution.py"], input=case[0], capture_output=True, text=True,
                                 cwd=d, timeout=PLAIN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return False
    return out.returncode == 0 and outputs_match(out.stdout, case[1])


ALL_TESTS_HARNESS = """

import json as _json
import sys as _sys


def _plain(x):
    if isinstance(x, (list, tuple)):
        return [_plain(e) for e in x]
    if isinstance(x, dict):
        return {{k: _plain(v) for k, v in x.items()}}
    return x


_verdicts = []
for _test in _json.loads({tests!r}):
    try:
        if isinstance(_test, str):
            exec(compile(_test, "<test>", "exec"), globals())
            _verdicts.append(1)
        else:
            _verdicts.append(int(_plain({callee}(*_test[0])) == _plain(_test[1])))
    except BaseException:
        _verdicts.append(0)
_sys.__stdout__.write("\\nVERDICTS " + "".join(map(str, _verdicts)) + "\\n")
_sys.__stdout__.flush()
"""


def _plain_program(entry: Entry, code: str) -> list[bool]:
    """Each test of `entry` on `code` under plain CPython (check_plain_python)."""
    if entry.fmt == "stdio":
        return [_plain_stdio(code, case) for case in entry.tests]
    tests = list(entry.tests) if entry.fmt == "assert" else [[list(a), e] for a, e in entry.tests]
    callee = _callee(code, entry.fn) if entry.fmt == "call" else "None"
    script = code + ALL_TESTS_HARNESS.format(tests=json.dumps(tests), callee=callee)
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "solution.py"), "w", encoding="utf-8") as f:
            f.write(script)
        try:
            out = subprocess.run([sys.executable, "solution.py"], input="", capture_output=True, text=True, cwd=d,
                                 timeout=PLAIN_TIMEOUT_S * 2)
        except subprocess.TimeoutExpired:
            return [False] * len(tests)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("VERDICTS ")]
    marks = line[-1].split(" ", 1)[1] if line else ""
    return [k < len(marks) and marks[k] == "1" for k in range(len(tests))]


def _suite(entry: Entry, code: str):
    from grpo_plugin.sandbox import AssertSuite, CallSuite, StdioSuite

    if entry.fmt == "assert":
        return AssertSuite(code, list(entry.tests))
    if entry.fmt == "call":
        return CallSuite(code, entry.fn, [(list(a), e) for a, e in entry.tests])
    return StdioSuite(code, [(i, o) for i, o in entry.tests])


def _mismatches(scores: dict[tuple[str, str], float], details: dict | None = None, corpus=None) -> list[str]:
    """Each (name, variant) whose score is wrong: a correct program below 1.0, a twin at 1.0."""
    bad = []
    for e in CORPUS if corpus is None else corpus:
        for variant in ("correct", "twin"):
            s = scores[(e.name, variant)]
            if (variant == "correct") != (s == 1.0):
                line = f"{e.name} [{e.fmt}, {variant}]: score {s:.2f}"
                if details:
                    line += " " + details[(e.name, variant)]
                bad.append(line)
    return bad


# ================================================================================================================
# the tests
# ================================================================================================================

def test_corpus_shape():
    names = [e.name for e in CORPUS]
    assert len(names) == len(set(names)), "names are unique"
    by_fmt = {f: sum(1 for e in CORPUS if e.fmt == f) for f in ("assert", "call", "stdio")}
    assert len(CORPUS) >= 70 and by_fmt["call"] >= 15 and by_fmt["stdio"] >= 15, by_fmt
    for e in CORPUS:
        assert e.wrong != e.code and e.tests, e.name


@pytest.mark.any_stack
def test_corpus_is_right_under_plain_python():
    check_plain_python(CORPUS)


def check_plain_python(corpus: list[Entry]) -> None:
    """Every correct program of `corpus` scores 1.0 and every twin < 1 under plain CPython: a stdin/stdout program
    once per test, with the test's input (as a judge runs it); an assert or call-based program once with all its
    tests after it, each in its own try (as the HumanEval harness runs a completion)."""
    jobs = [(e, variant, code) for e in corpus for variant, code in (("correct", e.code), ("twin", e.wrong))]
    with ThreadPoolExecutor(max_workers=2) as pool:
        passed = list(pool.map(lambda j: _plain_program(j[0], j[2]), jobs))
    per: dict[tuple[str, str], list[bool]] = {}
    for (e, variant, _), oks in zip(jobs, passed):
        per[(e.name, variant)] = oks
    scores = {key: sum(v) / len(v) for key, v in per.items()}
    details = {key: "passed: " + "".join("1" if ok else "0" for ok in v) for key, v in per.items()}
    bad = _mismatches(scores, details, corpus)
    assert not bad, "wrong under plain CPython (fix the corpus):\n" + "\n".join(bad)


@pytest.fixture(scope="module")
def sandbox():
    from grpo_plugin.sandbox import Sandbox

    sb = Sandbox()
    yield sb
    sb.close()


def test_corpus_in_the_sandbox(sandbox):
    """The whole corpus, correct programs and twins, in one batch: the verdicts plain CPython gives."""
    check_in_sandbox(sandbox, CORPUS)


def check_in_sandbox(sandbox, corpus: list[Entry]) -> None:
    keys = [(e, variant, code) for e in corpus for variant, code in (("correct", e.code), ("twin", e.wrong))]
    results = sandbox.run_suites([_suite(e, code) for e, _, code in keys])
    scores = {(e.name, v): r.score for (e, v, _), r in zip(keys, results)}
    details = {(e.name, v): f"detail={r.detail} stderr={r.output[:300]!r}" for (e, v, _), r in zip(keys, results)}
    bad = _mismatches(scores, details, corpus)
    for line in bad:
        print(line)
    assert not bad, f"{len(bad)} of {len(keys)} verdicts differ from plain CPython:\n" + "\n".join(bad)
