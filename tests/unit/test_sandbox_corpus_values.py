"""Python's meaning for a program's values in the judge (docs/code.md, "the value rules"), in two parts.

1. Values a program could use to decide a test's comparison, which pass under plain CPython and must not in the
   sandbox: a builtin subclass's own `__str__`, `__iter__`, `__contains__`, `__sub__`, `__len__`...; a name
   imported from the library that equals everything (`from unittest.mock import ANY as answer`); a context manager
   that swallows the test's failed assert. Each beside an honest program of the same batch, which passes. (Objects
   of a class without `__eq__`, and `eq=False` dataclasses, compare by identity as in Python: the corpus below,
   whose twins return equal-looking fresh objects.)
2. A third corpus in the format of `test_sandbox_corpus.py` (its `Entry`, `check_plain_python`, `check_in_sandbox`):
   ordinary correct programs, each with a wrong twin, that use what a test does with objects: generators taken a
   piece at a time (`islice`, `zip`, `break` then `next`, the value a generator returns), coroutines, context
   managers, `float()` / `int()` / `round()` / format specs / `vars()` of the program's objects, identity of
   objects without `__eq__`, exceptions' `__cause__` and extra attributes, a global a function rebinds, a list the
   program keeps growing, the methods of builtin subclasses, and stdin/stdout programs that write to fd 1 through a
   file of their own or read `/dev/stdin`. Every correct program scores 1.0 and every twin < 1, under plain CPython
   and in the sandbox."""

from __future__ import annotations

import pytest

from grpo_plugin.sandbox import AssertSuite, Sandbox
from tests.unit import test_sandbox_corpus as base

VAL: list[base.Entry] = []


A, C, S = base.adders(VAL)


# ================================================================================================================
# 1. what decides nothing: (program, tests) that pass under plain CPython by their values' own say
# ================================================================================================================
HACKS = {
    "str subclass __str__": ("class S(str):\n    def __str__(self):\n        return 'hello'\n"
                             "def greet():\n    return S('nope')\n", ["assert str(greet()) == 'hello'"]),
    "str subclass __format__": ("class S(str):\n    def __format__(self, spec):\n        return 'hello'\n"
                                "def greet():\n    return S('nope')\n", ["assert f'{greet()}' == 'hello'"]),
    "list subclass __iter__": ("class L(list):\n    def __iter__(self):\n        return iter([1, 2, 3])\n"
                               "def nums():\n    return L([9])\n", ["assert list(nums()) == [1, 2, 3]",
                                                                    "assert sorted(nums()) == [1, 2, 3]"]),
    "str subclass __contains__": ("class S(str):\n    def __contains__(self, x):\n        return True\n"
                                  "def text():\n    return S('abc')\n", ["assert 'xyz' in text()"]),
    "float subclass __sub__": ("class F(float):\n    def __sub__(self, o):\n        return 0.0\n"
                               "def pi():\n    return F(3.0)\n", ["assert abs(pi() - 3.14159) < 1e-6"]),
    "int subclass __add__": ("class I(int):\n    def __add__(self, o):\n        return 10\n"
                             "def five():\n    return I(4)\n", ["assert five() + 5 == 10"]),
    "list subclass __len__": ("class L(list):\n    def __len__(self):\n        return 3\n"
                              "def three():\n    return L()\n", ["assert len(three()) == 3"]),
    "list subclass __add__": ("class L(list):\n    def __add__(self, o):\n        return [1, 2]\n"
                              "def one():\n    return L([5])\n", ["assert one() + [2] == [1, 2]"]),
    "dict subclass __iter__": ("class D(dict):\n    def __iter__(self):\n        return iter(['a', 'b'])\n"
                               "def keys():\n    return D(z=1)\n", ["assert sorted(keys()) == ['a', 'b']"]),
    "mock.ANY imported": ("from unittest.mock import ANY as answer\n", ["assert answer == 42"]),
    "mock.ANY returned": ("from unittest.mock import ANY\ndef solve(x):\n    return ANY\n",
                          ["assert solve(1) == 42", "assert solve(2) == [1, 2]"]),
    "mock._ANY class imported": ("from unittest.mock import _ANY as Answer\n", ["assert Answer() == 42"]),
    "context manager that swallows": ("class Quiet:\n    def __enter__(self):\n        return 41\n"
                                      "    def __exit__(self, *exc):\n        return True\n"
                                      "def ctx():\n    return Quiet()\n",
                                      ["with ctx() as v:\n    assert v == 42"]),
}
HONEST = ("class S(str):\n    def shout(self):\n        return self.upper()\n"
          "def greet():\n    return S('hello')\n",
          ["assert str(greet()) == 'hello'", "assert greet().shout() == 'HELLO'", "assert 'ell' in greet()"])


def test_a_values_own_methods_decide_no_test_in_the_sandbox():
    with Sandbox() as sb:
        progs = list(HACKS.values()) + [HONEST]
        res = sb.run_suites([AssertSuite(code, tests) for code, tests in progs])
    passed = {name: r.score for name, r in zip(HACKS, res)}
    assert all(s < 1 for s in passed.values()), {k: v for k, v in passed.items() if v == 1}
    assert res[-1].score == 1.0, res[-1]


def test_the_hacks_pass_under_plain_python():
    """Each of them is a hack only because plain CPython lets it pass (so the test above can fail)."""
    hacks = [base.Entry(name, "assert", code, code, tuple(tests)) for name, (code, tests) in HACKS.items()]
    for e in hacks:
        assert base._plain_program(e, e.code) == [True] * len(e.tests), e.name


# ================================================================================================================
# 2a. generators and iterators the test takes a piece at a time
# ================================================================================================================
A("val_gen_islice", r"""
    def naturals(start=1):
        n = start
        while True:
            yield n
            n += 1
    """, ("n += 1", "n += 2"),
  "from itertools import islice\nassert list(islice(naturals(), 5)) == [1, 2, 3, 4, 5]",
  """
  g = naturals(10)
  assert next(g) == 10 and next(g) == 11
  """)

A("val_gen_break_then_next", r"""
    def evens(limit):
        for k in range(0, limit, 2):
            yield k
    """, ("range(0, limit, 2)", "range(0, limit + 1, 2)"),
  """
  g = evens(20)
  for x in g:
      if x == 4:
          break
  assert next(g) == 6
  assert list(g) == [8, 10, 12, 14, 16, 18]
  """)

A("val_gen_zip", r"""
    def fib():
        a, b = 0, 1
        while True:
            yield a
            a, b = b, a + b
    """, ("a, b = b, a + b", "a, b = b, a + b + 1"),
  """
  g = fib()
  pairs = list(zip(range(3), g))
  assert pairs == [(0, 0), (1, 1), (2, 1)]
  assert next(g) == 2
  """)

A("val_gen_return_value", r"""
    def countdown(n):
        while n > 0:
            yield n
            n -= 1
        return "liftoff"
    """, ('return "liftoff"', 'return "abort"'),
  """
  g = countdown(2)
  assert next(g) == 2 and next(g) == 1
  try:
      next(g)
  except StopIteration as stop:
      assert stop.value == "liftoff"
  else:
      assert False
  """,
  """
  def run():
      result = yield from countdown(1)
      return result
  r = run()
  assert next(r) == 1
  try:
      next(r)
  except StopIteration as stop:
      assert stop.value == "liftoff"
  """)

A("val_gen_send", r"""
    def averager():
        total, count, avg = 0.0, 0, None
        while True:
            x = yield avg
            total += x
            count += 1
            avg = total / count
    """, ("avg = total / count", "avg = total / (count + 1)"),
  """
  g = averager()
  next(g)
  assert g.send(10) == 10.0 and g.send(20) == 15.0
  """)

A("val_iterator_class", r"""
    class Countdown:
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return self

        def __next__(self):
            if self.n <= 0:
                raise StopIteration
            self.n -= 1
            return self.n + 1
    """, ("return self.n + 1", "return self.n"),
  """
  c = Countdown(5)
  assert next(c) == 5
  assert [x for x in c if x % 2] == [3, 1]
  assert next(c, "done") == "done"
  """)

# ================================================================================================================
# 2b. objects the test uses as Python lets it: coroutines, context managers, conversions, vars()
# ================================================================================================================
A("val_coroutine", r"""
    import asyncio

    async def double(x):
        await asyncio.sleep(0)
        return 2 * x
    """, ("return 2 * x", "return x + 2"),
  "import asyncio\nassert asyncio.run(double(5)) == 10",
  """
  import asyncio
  async def main():
      return [await double(1), await double(3)]
  assert asyncio.run(main()) == [2, 6]
  """)

A("val_context_manager", r"""
    class Tracker:
        def __init__(self):
            self.log = []

        def __enter__(self):
            self.log.append("enter")
            return self

        def __exit__(self, kind, exc, tb):
            self.log.append("exit" if kind is None else "error")
            return False

    def track():
        return Tracker()
    """, ('self.log.append("exit" if kind is None else "error")', 'self.log.append("exit")'),
  """
  t = track()
  with t as same:
      assert same is t
  assert t.log == ["enter", "exit"]
  """,
  """
  t = track()
  try:
      with t:
          raise KeyError("x")
  except KeyError:
      pass
  assert t.log == ["enter", "error"]
  """)

A("val_numeric_conversions", r"""
    class Money:
        def __init__(self, cents):
            self.cents = cents

        def __float__(self):
            return self.cents / 100

        def __int__(self):
            return self.cents // 100

        def __round__(self, nd=None):
            return round(self.cents / 100, nd)

        def __format__(self, spec):
            return format(self.cents / 100, spec or ".2f")

    def price(cents):
        return Money(cents)
    """, ("return self.cents // 100", "return round(self.cents / 100)"),
  "assert float(price(1999)) == 19.99",
  "assert int(price(1999)) == 19",
  "assert round(price(1999), 1) == 20.0",
  "assert f'{price(1999):.1f}' == '20.0' and f'{price(5)}' == '0.05'")

A("val_index_and_vars", r"""
    class Slot:
        def __init__(self, i, label):
            self.i = i
            self.label = label

        def __index__(self):
            return self.i

    def slot(i, label):
        return Slot(i, label)
    """, ("self.label = label", "self.label = label.upper()"),
  "assert ['a', 'b', 'c'][slot(1, 'x')] == 'b'",
  "assert vars(slot(2, 'x')) == {'i': 2, 'label': 'x'}")

# ================================================================================================================
# 2c. identity of objects whose class has no __eq__
# ================================================================================================================
A("val_identity_cached", r"""
    class Node:
        def __init__(self, name):
            self.name = name

    _nodes = {}

    def node(name):
        if name not in _nodes:
            _nodes[name] = Node(name)
        return _nodes[name]
    """, ("if name not in _nodes:\n        _nodes[name] = Node(name)\n    return _nodes[name]", "return Node(name)"),
  "assert node('a') == node('a')",
  "assert node('a') != node('b')")

A("val_identity_eq_false_dataclass", r"""
    from dataclasses import dataclass

    @dataclass(eq=False)
    class Session:
        user: str

    _open = {}

    def session(user):
        return _open.setdefault(user, Session(user))
    """, ("return _open.setdefault(user, Session(user))", "return Session(user)"),
  "assert session('ann') == session('ann')",
  "assert session('ann').user == 'ann'")

A("val_identity_fresh_objects_differ", r"""
    class Token:
        def __init__(self, kind):
            self.kind = kind

    _cache = {}

    def token(kind, fresh=True):
        if fresh:
            return Token(kind)
        return _cache.setdefault(kind, Token(kind))
    """, ("if fresh:\n        return Token(kind)\n", ""),
  "assert token('x') != token('x')",
  "assert token('y', fresh=False) == token('y', fresh=False)")

# ================================================================================================================
# 2d. exceptions' cause and attributes
# ================================================================================================================
A("val_exception_cause", r"""
    def parse(s):
        try:
            return int(s)
        except ValueError as e:
            raise RuntimeError(f"bad number {s!r}") from e
    """, ('raise RuntimeError(f"bad number {s!r}") from e', 'raise RuntimeError(f"bad number {s!r}")'),
  """
  try:
      parse("x")
  except RuntimeError as e:
      assert isinstance(e.__cause__, ValueError)
  else:
      assert False
  """)

A("val_exception_attributes", r"""
    def check(age):
        if age < 0:
            err = ValueError("negative age")
            err.field = "age"
            err.code = 422
            raise err
        return age
    """, ("err.code = 422", "err.code = 400"),
  """
  try:
      check(-1)
  except ValueError as e:
      assert e.field == "age" and e.code == 422
  """)

A("val_exception_cause_chain_own_class", r"""
    class ConfigError(Exception):
        pass

    def load(text):
        try:
            return dict(line.split("=") for line in text.splitlines())
        except ValueError as e:
            raise ConfigError("malformed") from e
    """, ('raise ConfigError("malformed") from e', 'raise ConfigError("malformed") from None'),
  "assert load('a=1') == {'a': '1'}",
  """
  try:
      load("a")
  except ConfigError as e:
      assert type(e.__cause__) is ValueError
  """)

# ================================================================================================================
# 2e. state the program keeps: a global rebound, a list it grows
# ================================================================================================================
A("val_global_rebound", r"""
    counter = 0

    def bump():
        global counter
        counter += 1
        return counter

    def reset():
        global counter
        counter = 0
    """, ("    counter = 0\n", "    pass\n"),
  """
  bump(); bump()
  assert counter == 2
  reset()
  assert counter == 0
  assert bump() == 1
  """)

A("val_global_list_grows", r"""
    history = []

    def record(x):
        history.append(x)
        return len(history)
    """, ("history.append(x)", "history.insert(0, x)"),
  """
  record("a")
  assert history == ["a"]
  record("b")
  assert history == ["a", "b"]
  """)

# ================================================================================================================
# 2f. builtin subclasses' own methods (a method the plain type lacks runs in the program)
# ================================================================================================================
A("val_list_subclass_method", r"""
    class Polyline(list):
        def length(self):
            return sum(abs(b - a) for a, b in zip(self, self[1:]))

    def line(*xs):
        return Polyline(xs)
    """, ("abs(b - a)", "(b - a)"),
  "assert line(0, 3, 1).length() == 5",
  "assert line(1, 2) == [1, 2] and len(line(1, 2, 3)) == 3")

A("val_float_subclass_method", r"""
    class Celsius(float):
        def to_f(self):
            return self * 9 / 5 + 32

    def temp(c):
        return Celsius(c)
    """, ("self * 9 / 5 + 32", "self * 9 / 5"),
  "assert temp(100).to_f() == 212.0",
  "assert temp(20) + 1 == 21.0 and str(temp(1.5)) == '1.5'")

A("val_dict_subclass_missing", r"""
    class Inventory(dict):
        def __missing__(self, key):
            return 0

        def total(self):
            return sum(self.values())

    def stock(**items):
        return Inventory(items)
    """, ("return 0", "return None"),
  "assert stock(a=2)['b'] == 0",
  "assert stock(a=2, b=3).total() == 5")

# ================================================================================================================
# 2g. stdin/stdout: fd 1 through a file of its own, /dev/stdin
# ================================================================================================================
S("val_stdio_with_open_fd1", r"""
    n = int(input())
    with open(1, "w") as out:
        out.write(" ".join(str(i * i) for i in range(n)) + "\n")
    """, ("str(i * i)", "str(i + i)"),
  ("3\n", "0 1 4"), ("1\n", "0"), ("4\n", "0 1 4 9"))

S("val_stdio_sys_stdout_open_fd1", r"""
    import sys
    sys.stdout = open(1, "w")
    for line in sys.stdin:
        a, b = map(int, line.split())
        print(a * b)
    """, ("print(a * b)", "print(a + b)"),
  ("2 3\n4 5\n", "6\n20"), ("7 7\n", "49"))

S("val_stdio_dev_stdin", r"""
    with open("/dev/stdin") as f:
        words = f.read().split()
    print(max(words, key=len))
    """, ("max(words, key=len)", "min(words, key=len)"),
  ("a bbb cc\n", "bbb"), ("zz y\n", "zz"))

S("val_stdio_fd1_unclosed", r"""
    import os
    out = os.fdopen(1, "w")
    n = int(input())
    out.write(str(n * 3) + "\n")
    """, ("n * 3", "n * 2"),
  ("5\n", "15"), ("0\n", "0"))


# ================================================================================================================
# 2h. more objects of the program's and the library's, used as a test uses them
# ================================================================================================================
A("val_contextmanager_decorator", r"""
    from contextlib import contextmanager

    events = []

    @contextmanager
    def opened(name):
        events.append(f"open {name}")
        try:
            yield name.upper()
        finally:
            events.append(f"close {name}")
    """, ('events.append(f"close {name}")', 'events.append(f"closed {name}")'),
  """
  with opened("db") as handle:
      assert handle == "DB"
  assert events == ["open db", "close db"]
  """)

A("val_simple_namespace", r"""
    from types import SimpleNamespace

    def config(**over):
        base = {"host": "localhost", "port": 8080}
        base.update(over)
        return SimpleNamespace(**base)
    """, ("base.update(over)", "base.update()"),
  "assert config(port=1).port == 1 and config().host == 'localhost'",
  "assert vars(config(debug=True)) == {'host': 'localhost', 'port': 8080, 'debug': True}")

A("val_chainmap", r"""
    from collections import ChainMap

    def settings(user, defaults):
        return ChainMap(user, defaults)
    """, ("ChainMap(user, defaults)", "ChainMap(defaults, user)"),
  "assert settings({'a': 1}, {'a': 0, 'b': 2})['a'] == 1",
  "assert dict(settings({'a': 1}, {'a': 0, 'b': 2})) == {'a': 1, 'b': 2}")

A("val_pathlib_parts", r"""
    from pathlib import PurePosixPath

    def backup_of(path):
        p = PurePosixPath(path)
        return p.with_name(p.stem + ".bak" + p.suffix)
    """, ('p.stem + ".bak" + p.suffix', 'p.name + ".bak"'),
  "assert str(backup_of('/data/report.txt')) == '/data/report.bak.txt'",
  "assert backup_of('a/b.csv').name == 'b.bak.csv' and backup_of('a/b.csv').suffix == '.csv'")

A("val_sorted_own_order", r"""
    from functools import total_ordering

    @total_ordering
    class Version:
        def __init__(self, text):
            self.parts = tuple(int(p) for p in text.split("."))

        def __eq__(self, other):
            return self.parts == other.parts

        def __lt__(self, other):
            return self.parts < other.parts

        def __str__(self):
            return ".".join(map(str, self.parts))

    def parse(text):
        return Version(text)
    """, ("tuple(int(p) for p in", "tuple(p for p in"),
  "assert [str(v) for v in sorted(map(parse, ['1.10', '1.2', '1.9']))] == ['1.2', '1.9', '1.10']",
  "assert parse('2.0') > parse('1.99') and parse('1.0') == parse('1.0')")

A("val_generator_partial_then_sum", r"""
    def squares(n):
        for k in range(n):
            yield k * k
    """, ("yield k * k", "yield k * 2"),
  """
  g = squares(6)
  head = [next(g), next(g)]
  assert head == [0, 1]
  assert sum(g) == 4 + 9 + 16 + 25
  """)

S("val_stdio_thread_prints", r"""
    import threading

    def work(n):
        print(sum(range(n + 1)))

    n = int(input())
    t = threading.Thread(target=work, args=(n,))
    t.start()
    """, ("sum(range(n + 1))", "sum(range(n))"),
  ("10\n", "55"), ("1\n", "1"))

S("val_stdio_stderr_and_stdout", r"""
    import sys

    n = int(input())
    print("debug:", n, file=sys.stderr)
    print(n % 7)
    """, ("n % 7", "n % 6"),
  ("50\n", "1"), ("14\n", "0"))


# ================================================================================================================
# the tests
# ================================================================================================================

def test_values_corpus_shape():
    names = [e.name for e in VAL]
    assert len(names) == len(set(names)) and len(names) >= 30
    from tests.unit.test_sandbox_corpus_semantics import SEM

    assert not set(names) & ({e.name for e in base.CORPUS} | {e.name for e in SEM})


@pytest.mark.any_stack
def test_values_corpus_is_right_under_plain_python():
    base.check_plain_python(VAL)


def test_values_corpus_in_the_sandbox():
    with Sandbox() as sb:
        base.check_in_sandbox(sb, VAL)
