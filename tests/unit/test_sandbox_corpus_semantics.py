"""A second corpus for the sandbox, in the format of `test_sandbox_corpus.py` (whose `Entry`, `check_plain_python`
and `check_in_sandbox` it reuses, with its own list `SEM`): ordinary correct programs, each with a wrong twin (a
realistic bug that gives a wrong value), in the three test formats (assert, call-based, stdin/stdout).

Where the other corpus covers the stdlib modules programs import, this one covers the Python semantics that tests
rely on when they talk to the program's own objects, which a sandbox that runs the program apart from its tests (or
passes values between them) has to keep:

 1. the program's own exception classes caught by the test (`except ValueError` catching a subclass, `e.code`,
    `str(e)`, `isinstance(e, KeyError)`, try/except/else);
 2. values the test passes into the program: lambdas, builtins (`key=len`, `str.lower`), types (`int`, `Fraction`),
    generator expressions, iterators (the test checking what the program left of them), `map` / `filter` objects;
 3. identity: `is` on the program's enum members, singletons and sentinels, `is None`;
 4. dict views returned (`keys()`, `items()`, `values()`) compared with sets, listed, used in set operations;
 5. truthiness of the program's containers (`__len__`, `__bool__`) and of empty lists;
 6. subclasses of builtins (`list`, `float`, `dict`, `str`) whose methods the test calls;
 7. `typing.NamedTuple` with methods, properties and defaults;
 8. dataclasses: equality with the program's class, `field(compare=False)`, `order=True`, `__post_init__`, `asdict`;
 9. the program's decimal context (`getcontext().prec`, `.rounding`) that the test's own Decimal arithmetic shares;
10. time zones (`zoneinfo`): aware datetimes returned, `str(dt.tzinfo)`, comparisons across zones, DST;
11. `collections.defaultdict` (lambda, `list`, a class as factory, nested) read at a missing key by the test;
12. `copy.deepcopy` of the program's objects in the test (and in the program), the copy mutated;
13. `__name__`, `__doc__`, `__qualname__`, `__wrapped__` of the program's functions and classes;
14. the program mutating inner lists the test still holds through an alias;
15. `array.array` returned and compared;
16. numpy scalars and arrays returned (only where numpy imports);
17. `multiprocessing.Pool` / `ProcessPoolExecutor` (fork context) inside the program;
18. stdin idioms: `input = open(0).readline`, `sys.stdin = open(0)`, `open(0).read().split()`,
    `sys.stdin.buffer.read()`, `sys.stdin.readline`, iterating `sys.stdin`, and CRLF input where the twin keeps '\\r'.

Like the other corpus, every correct program scores 1.0 and every twin < 1 under plain CPython
(`test_semantics_corpus_is_right_under_plain_python`); the sandbox must give the same verdicts
(`test_semantics_corpus_in_the_sandbox`)."""

from __future__ import annotations

import pytest

from tests.unit import test_sandbox_corpus as base

SEM: list[base.Entry] = []


A, C, S = base.adders(SEM)


# ================================================================================================================
# 1. the program's own exception classes, caught by the test
# ================================================================================================================

A("sem_exc_valueerror_subclass", r"""
    class ParseError(ValueError):
        pass

    def parse_age(s):
        s = s.strip()
        if not s.isdigit():
            raise ParseError(f"not a number: {s!r}")
        n = int(s)
        if n > 150:
            raise ParseError(f"out of range: {n}")
        return n
    """, ("n > 150", "n > 1500"),
  """
  try:
      parse_age("x1")
  except ValueError as e:
      assert "not a number" in str(e)
  else:
      assert False, "no error"
  """,
  """
  try:
      parse_age("200")
  except ValueError:
      pass
  else:
      raise AssertionError("200 accepted")
  """,
  "assert parse_age(' 42 ') == 42")

A("sem_exc_code_attribute", r"""
    class HttpError(Exception):
        def __init__(self, code, message):
            super().__init__(f"{code} {message}")
            self.code = code
            self.message = message

    def check_status(code):
        if 400 <= code < 500:
            raise HttpError(code, "client error")
        if code >= 500:
            raise HttpError(code, "server error")
        return "ok"
    """, ("400 <= code < 500", "400 < code < 500"),
  """
  try:
      check_status(404)
  except HttpError as e:
      assert e.code == 404 and e.message == "client error"
  else:
      assert False
  """,
  """
  try:
      check_status(400)
  except HttpError as e:
      assert str(e) == "400 client error"
      assert e.code == 400
  else:
      assert False, "400 must raise"
  """,
  "assert check_status(200) == 'ok'",
  """
  try:
      check_status(503)
  except Exception as e:
      assert type(e) is HttpError and e.args == ("503 server error",)
  """)

A("sem_exc_keyerror_subclass", r"""
    class MissingConfig(KeyError):
        def __init__(self, key):
            super().__init__(key)
            self.key = key

    def get_setting(cfg, key):
        for part in key.split("."):
            if not isinstance(cfg, dict) or part not in cfg:
                raise MissingConfig(key)
            cfg = cfg[part]
        return cfg
    """, ("raise MissingConfig(key)", "raise MissingConfig(part)"),
  """
  try:
      get_setting({"a": {"b": 1}}, "a.c")
  except KeyError as e:
      assert isinstance(e, MissingConfig) and e.key == "a.c"
  else:
      assert False
  """,
  "assert get_setting({'a': {'b': 1}}, 'a.b') == 1",
  """
  try:
      get_setting({}, "x")
  except LookupError as e:
      assert isinstance(e, KeyError)
      assert e.args[0] == "x"
  """)

A("sem_exc_hierarchy_else", r"""
    class BankError(Exception):
        pass

    class InsufficientFunds(BankError):
        def __init__(self, needed):
            super().__init__(f"need {needed} more")
            self.needed = needed

    class Account:
        def __init__(self, balance=0):
            self.balance = balance

        def withdraw(self, amount):
            if amount > self.balance:
                raise InsufficientFunds(amount - self.balance)
            self.balance -= amount
            return self.balance
    """, ("InsufficientFunds(amount - self.balance)", "InsufficientFunds(amount)"),
  """
  acc = Account(50)
  try:
      acc.withdraw(80)
  except BankError as e:
      assert isinstance(e, InsufficientFunds)
      assert e.needed == 30
      assert str(e) == "need 30 more"
  else:
      assert False
  assert acc.balance == 50
  """,
  """
  acc = Account(100)
  try:
      left = acc.withdraw(30)
  except InsufficientFunds:
      assert False
  else:
      assert left == 70 and acc.balance == 70
  """)

C("sem_exc_rpn_call", r"""
    class StackUnderflow(IndexError):
        pass

    def evaluate_rpn(tokens):
        stack = []

        def pop():
            if not stack:
                raise StackUnderflow("empty")
            return stack.pop()

        try:
            for t in tokens:
                if t in ("+", "-", "*"):
                    b, a = pop(), pop()
                    stack.append(a + b if t == "+" else a - b if t == "-" else a * b)
                else:
                    stack.append(int(t))
        except IndexError:
            return "error"
        return stack[-1]
    """, ("b, a = pop(), pop()", "a, b = pop(), pop()"),
  "evaluate_rpn",
  ([["2", "3", "+"]], 5), ([["5", "1", "-"]], 4), ([["1", "+"]], "error"), ([["2", "3", "4", "*", "-"]], -10))

S("sem_exc_stdio", r"""
    import sys

    class BadCommand(ValueError):
        pass

    def run(cmd, stack):
        op, *rest = cmd.split()
        if op == "push":
            stack.append(int(rest[0]))
        elif op == "pop":
            if not stack:
                raise BadCommand("pop from empty")
            stack.pop()
        else:
            raise BadCommand(op)

    stack = []
    for line in sys.stdin.read().splitlines()[1:]:
        try:
            run(line, stack)
        except ValueError as e:
            print("ERR", e)
    print(sum(stack))
    """, ("stack.pop()", "stack.pop(0)"),
  ("4\npush 1\npush 5\npop\nfoo\n", "ERR foo\n1"),
  ("2\npop\npush 3\n", "ERR pop from empty\n3"))

# ================================================================================================================
# 2. values the test passes into the program: lambdas, builtins, types, generators, iterators, map objects
# ================================================================================================================

A("sem_arg_lambda", r"""
    def apply_all(fn, xs):
        return [fn(x) for x in xs]

    def compose(*fns):
        def composed(x):
            for f in reversed(fns):
                x = f(x)
            return x
        return composed
    """, ("reversed(fns)", "fns"),
  "assert apply_all(lambda x: x * 2, [1, 2]) == [2, 4]",
  "assert compose(lambda x: x + 1, lambda x: x * 10)(2) == 21",
  "assert apply_all(compose(str, abs), [-3, 4]) == ['3', '4']")

A("sem_arg_builtin_key", r"""
    def sort_by(items, key=None, reverse=False):
        return sorted(items, key=key, reverse=reverse)

    def group_by(items, key):
        groups = {}
        for it in items:
            groups.setdefault(key(it), []).append(it)
        return groups
    """, ("key=key, reverse=reverse)", "key=key)"),
  "assert sort_by(['ccc', 'a', 'bb'], key=len) == ['a', 'bb', 'ccc']",
  "assert sort_by([-3, 1, -2], key=abs, reverse=True) == [-3, -2, 1]",
  "assert sort_by(['b', 'A', 'c'], key=str.lower) == ['A', 'b', 'c']",
  "assert group_by(['a', 'bb', 'cc'], len) == {1: ['a'], 2: ['bb', 'cc']}",
  "assert group_by([1.5, 2.5, 1.2], int) == {1: [1.5, 1.2], 2: [2.5]}")

A("sem_arg_type_convert", r"""
    def convert(values, typ=str, default=None):
        out = []
        for v in values:
            try:
                out.append(typ(v))
            except (TypeError, ValueError):
                out.append(default)
        return out
    """, ("out.append(default)", "continue"),
  "assert convert(['1', '2'], int) == [1, 2]",
  "assert convert(['1.5', 'x'], float) == [1.5, None]",
  "assert convert([1, 0, ''], bool) == [True, False, False]",
  "assert convert(['ab', 'c'], list) == [['a', 'b'], ['c']]",
  """
  from fractions import Fraction
  assert convert(['1/2', 'q'], Fraction, 0) == [Fraction(1, 2), 0]
  """)

A("sem_arg_generator_expression", r"""
    def total(xs):
        s = 0
        for x in xs:
            s += x
        return s

    def running_max(xs):
        out, best = [], None
        for x in xs:
            best = x if best is None or x > best else best
            out.append(best)
        return out
    """, ("x > best", "x < best"),
  "assert total(x * x for x in range(4)) == 14",
  "assert running_max(n % 5 for n in [3, 7, 9, 1]) == [3, 3, 4, 4]",
  "assert total(iter([])) == 0",
  "assert running_max(c for c in 'abca') == ['a', 'b', 'c', 'c']")

A("sem_arg_iterator", r"""
    def first(it, default=None):
        for x in it:
            return x
        return default

    def take(it, n):
        out = []
        for _ in range(n):
            try:
                out.append(next(it))
            except StopIteration:
                break
        return out

    def pairwise_diffs(it):
        it = iter(it)
        prev = next(it, None)
        out = []
        for x in it:
            out.append(x - prev)
            prev = x
        return out
    """, ("out.append(x - prev)", "out.append(prev - x)"),
  "assert first(iter([3, 4])) == 3",
  "assert first(iter([]), 'none') == 'none'",
  """
  it = iter(range(10))
  assert take(it, 3) == [0, 1, 2]
  assert next(it) == 3
  """,
  "assert pairwise_diffs(iter([1, 4, 9])) == [3, 5]",
  "assert pairwise_diffs(map(int, '136')) == [2, 3]")

A("sem_arg_map_object", r"""
    def dot(u, v):
        return sum(a * b for a, b in zip(u, v))

    def count_positive(xs):
        return sum(1 for x in xs if x > 0)
    """, ("x > 0", "x >= 0"),
  "assert dot(map(int, ['1', '2']), map(float, ['3', '4'])) == 11.0",
  "assert count_positive(map(int, '-1 0 2 3'.split())) == 2",
  "assert count_positive(filter(None, [0, -1, 5])) == 1",
  "assert count_positive(map(lambda x: x - 2, range(5))) == 2")

# ================================================================================================================
# 3. identity: the program's enum members, singletons, sentinels; `is None`
# ================================================================================================================

A("sem_enum_identity", r"""
    from enum import Enum

    class Color(Enum):
        RED = "r"
        GREEN = "g"
        BLUE = "b"

    def color(code):
        return Color(code.lower())

    def complement(c):
        return {Color.RED: Color.GREEN, Color.GREEN: Color.RED, Color.BLUE: Color.BLUE}[c]
    """, ("Color(code.lower())", "Color(code)"),
  "assert color('r') is Color.RED",
  "assert color('G') is Color.GREEN",
  "assert complement(color('B')) is Color.BLUE",
  "assert complement(Color.RED) is not Color.RED")

A("sem_enum_state_identity", r"""
    from enum import Enum, auto

    class State(Enum):
        IDLE = auto()
        RUNNING = auto()
        DONE = auto()

    TRANSITIONS = {
        (State.IDLE, "start"): State.RUNNING,
        (State.RUNNING, "finish"): State.DONE,
        (State.RUNNING, "abort"): State.IDLE,
    }

    def step(state, event):
        return TRANSITIONS.get((state, event), state)

    def run(events):
        s = State.IDLE
        for e in events:
            s = step(s, e)
        return s
    """, ('(State.RUNNING, "abort"): State.IDLE', '(State.RUNNING, "abort"): State.DONE'),
  "assert run(['start', 'finish']) is State.DONE",
  "assert run(['start', 'abort']) is State.IDLE",
  "assert step(State.DONE, 'start') is State.DONE",
  "assert State['RUNNING'] is run(['start'])")

A("sem_is_none_binary_search", r"""
    def find_index(xs, target):
        lo, hi = 0, len(xs) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            if xs[mid] == target:
                return mid
            if xs[mid] < target:
                lo = mid + 1
            else:
                hi = mid - 1
        return None
    """, ("while lo <= hi:", "while lo < hi:"),
  "assert find_index([1, 3, 5], 4) is None",
  "assert find_index([1, 3, 5], 5) == 2",
  "assert find_index([7], 7) == 0",
  "assert find_index([], 1) is None")

A("sem_singleton_identity", r"""
    _MISSING = object()

    class Registry:
        _instance = None

        def __new__(cls):
            if cls._instance is None:
                cls._instance = super().__new__(cls)
                cls._instance.items = {}
            return cls._instance

        def register(self, key, value):
            self.items[key] = value
            return self

    def lookup(key, default=_MISSING):
        items = Registry().items
        if key in items:
            return items[key]
        if default is _MISSING:
            raise KeyError(key)
        return default
    """, ("    def register(self", "    def __init__(self):\n        self.items = {}\n\n    def register(self"),
  "assert Registry() is Registry()",
  """
  Registry().register('a', 1)
  assert Registry().items['a'] == 1
  """,
  """
  r = Registry().register('b', 2)
  assert r is Registry() and lookup('b') == 2
  """,
  "assert lookup('zzz', None) is None")

# ================================================================================================================
# 4. dict views returned
# ================================================================================================================

A("sem_dict_keys_view", r"""
    def in_stock(inventory):
        return {k: v for k, v in inventory.items() if v > 0}

    def in_stock_names(inventory):
        return in_stock(inventory).keys()
    """, ("if v > 0", "if v >= 0"),
  "assert in_stock({1: 3, 2: 1, 3: 0}).keys() == {1, 2}",
  "assert in_stock_names({'a': 1, 'b': 0, 'c': 2}) == {'a', 'c'}",
  "assert list(in_stock_names({'x': 1, 'y': 0, 'z': 5})) == ['x', 'z']",
  "assert 'b' not in in_stock_names({'a': 1, 'b': 0})",
  "assert in_stock_names({'a': 1}) | {'q'} == {'a', 'q'}")

A("sem_dict_items_view", r"""
    def word_counts(text):
        counts = {}
        for w in text.lower().split():
            counts[w] = counts.get(w, 0) + 1
        return counts

    def count_items(text):
        return word_counts(text).items()
    """, ("text.lower().split()", "text.split()"),
  "assert count_items('a B b') == {('a', 1), ('b', 2)}",
  "assert list(count_items('x y X')) == [('x', 2), ('y', 1)]",
  "assert ('the', 2) in count_items('The cat the')",
  "assert word_counts('A a').keys() == {'a'}")

A("sem_dict_values_view", r"""
    def scores_by_player(rounds):
        totals = {}
        for name, pts in rounds:
            totals[name] = totals.get(name, 0) + pts
        return totals.values()
    """, ("totals[name] = totals.get(name, 0) + pts", "totals[name] = pts"),
  "assert sorted(scores_by_player([('a', 3), ('b', 4), ('a', 2)])) == [4, 5]",
  "assert list(scores_by_player([('x', 1), ('y', 2), ('x', 1)])) == [2, 2]",
  "assert sum(scores_by_player([('a', 1), ('a', 1)])) == 2",
  "assert max(scores_by_player([('p', 5)])) == 5 and len(scores_by_player([])) == 0")

A("sem_dict_keys_set_ops", r"""
    def common_keys(a, b):
        return a.keys() & b.keys()

    def changed(old, new):
        return {k for k in old.keys() & new.keys() if old[k] != new[k]}

    def added(old, new):
        return new.keys() - old.keys()
    """, ("new.keys() - old.keys()", "old.keys() - new.keys()"),
  "assert common_keys({'a': 1, 'b': 2}, {'b': 3, 'c': 4}) == {'b'}",
  "assert added({'a': 1}, {'a': 1, 'z': 0}) == {'z'}",
  "assert changed({'a': 1, 'b': 2}, {'a': 1, 'b': 3}) == {'b'}",
  "assert sorted(added({}, {'y': 1, 'x': 2})) == ['x', 'y']")

C("sem_dict_items_call", r"""
    def char_runs(s):
        runs = {}
        for ch in s:
            runs[ch] = runs.get(ch, 0) + 1
        return list(runs.items())
    """, ("runs.get(ch, 0) + 1", "runs.get(ch, 1) + 1"),
  "char_runs",
  (["aab"], [["a", 2], ["b", 1]]), (["ba"], [["b", 1], ["a", 1]]), ([""], []))

# ================================================================================================================
# 5. truthiness of the program's containers and of empty lists
# ================================================================================================================

A("sem_truthiness_own_len", r"""
    class Bag:
        def __init__(self, items=()):
            self._items = list(items)

        def __len__(self):
            return len(self._items)

        def __iter__(self):
            return iter(self._items)

    def evens(xs):
        return Bag(x for x in xs if x % 2 == 0)
    """, ("x % 2 == 0", "x % 2"),
  "assert not evens([1, 3, 5])",
  "assert evens([1, 2])",
  "assert len(evens([2, 4, 5])) == 2",
  "assert list(evens(range(5))) == [0, 2, 4]")

A("sem_truthiness_own_bool", r"""
    class Result:
        def __init__(self, value=None, error=None):
            self.value = value
            self.error = error

        def __bool__(self):
            return self.error is None

    def safe_sqrt(x):
        if x < 0:
            return Result(error="negative")
        return Result(x ** 0.5)
    """, ("if x < 0:", "if x <= 0:"),
  "assert not safe_sqrt(-4)",
  "assert safe_sqrt(0) and safe_sqrt(0).value == 0",
  """
  r = safe_sqrt(9)
  assert r
  assert r.value == 3.0
  """,
  "assert safe_sqrt(-1).error == 'negative'")

A("sem_truthiness_empty_list", r"""
    def duplicates(xs):
        seen, dups = set(), []
        for x in xs:
            if x in seen and x not in dups:
                dups.append(x)
            seen.add(x)
        return dups
    """, (" and x not in dups", ""),
  "assert not duplicates([1, 2, 3])",
  "assert duplicates([1, 2, 1])",
  "assert duplicates([1, 1, 1, 2, 2]) == [1, 2]",
  "assert not duplicates([])")

A("sem_truthiness_queue", r"""
    class Queue:
        def __init__(self):
            self._in, self._out = [], []

        def push(self, x):
            self._in.append(x)

        def pop(self):
            if not self._out:
                while self._in:
                    self._out.append(self._in.pop())
            return self._out.pop()

        def __len__(self):
            return len(self._in) + len(self._out)

    def drain(q, k):
        return [q.pop() for _ in range(min(k, len(q)))]
    """, ("self._out.append(self._in.pop())", "self._out.append(self._in.pop(0))"),
  """
  q = Queue()
  assert not q
  q.push(1)
  assert q
  """,
  """
  q = Queue()
  for i in range(3):
      q.push(i)
  assert drain(q, 2) == [0, 1]
  assert q and len(q) == 1
  """,
  """
  q = Queue()
  q.push(5)
  assert drain(q, 3) == [5]
  assert not q
  """)

C("sem_truthiness_call", r"""
    def first_nonempty(groups):
        for g in groups:
            if g:
                return g
        return []
    """, ("if g:", "if g is not None:"),
  "first_nonempty",
  ([[[], [1, 2], [3]]], [1, 2]), ([[[], []]], []), ([[[0]]], [0]), ([[{}, {"a": 1}]], {"a": 1}),
  ([["", "x"]], "x"))

# ================================================================================================================
# 6. subclasses of builtins
# ================================================================================================================

A("sem_list_subclass_vec", r"""
    import math

    class Vec(list):
        def norm(self):
            return math.sqrt(sum(x * x for x in self))

        def plus(self, other):
            return Vec(a + b for a, b in zip(self, other))

    def make_vec(*xs):
        return Vec(xs)
    """, ("math.sqrt(sum(x * x for x in self))", "sum(x * x for x in self)"),
  "assert make_vec(3, 4).norm() == 5",
  "assert make_vec(1, 2) == [1, 2]",
  """
  v = make_vec(1, 2).plus(make_vec(2, 2))
  assert isinstance(v, Vec) and v == [3, 4] and v.norm() == 5.0
  assert make_vec(1) + make_vec(2) == [1, 2]
  """,
  "assert isinstance(make_vec(), list) and make_vec().norm() == 0")

A("sem_float_subclass_money", r"""
    class Money(float):
        def label(self):
            return f"${self:,.2f}"

        def plus(self, other):
            return Money(float(self) + float(other))

    def total(prices, tax_rate=0.0):
        return Money(sum(prices) * (1 + tax_rate))
    """, ("sum(prices) * (1 + tax_rate)", "sum(prices) + tax_rate"),
  "assert total([1000, 234.5]).label() == '$1,234.50'",
  "assert total([10], 0.5) == 15.0",
  "assert isinstance(total([1, 2]), float) and total([1, 2]) == 3",
  "assert total([2], 0.25).plus(Money(0.5)).label() == '$3.00'",
  "assert f'{total([5]):.1f}' == '5.0'")

A("sem_dict_subclass_tally", r"""
    class Tally(dict):
        def __missing__(self, key):
            return 0

        def add(self, key, n=1):
            self[key] += n
            return self

        def top(self):
            return max(self, key=self.get) if self else None

    def tally(words):
        t = Tally()
        for w in words:
            t.add(w)
        return t
    """, ("max(self, key=self.get)", "max(self)"),
  "assert tally(['z', 'a', 'a']).top() == 'a'",
  "assert tally(['x'])['missing'] == 0",
  "assert tally(['a', 'a']) == {'a': 2}",
  "assert tally([]).top() is None and isinstance(tally(['q']), dict)")

A("sem_str_subclass_slug", r"""
    class Slug(str):
        def words(self):
            return self.split("-")

    def slugify(title):
        return Slug("-".join(title.lower().split()))
    """, ("title.lower().split()", "title.split()"),
  "assert slugify('Hello  World') == 'hello-world'",
  "assert slugify('A b C').words() == ['a', 'b', 'c']",
  """
  s = slugify('X Y')
  assert isinstance(s, str) and s.upper() == 'X-Y' and len(s) == 3
  """,
  "assert slugify('Hi There').startswith('hi')")

C("sem_list_subclass_call", r"""
    class Path(list):
        def length(self):
            return sum(abs(b[0] - a[0]) + abs(b[1] - a[1]) for a, b in zip(self, self[1:]))

    def simplify(points):
        p = Path()
        for pt in points:
            if not p or p[-1] != pt:
                p.append(pt)
        return p
    """, ("p[-1] != pt", "p[0] != pt"),
  "simplify",
  ([[[0, 0], [0, 0], [1, 1]]], [[0, 0], [1, 1]]),
  ([[[1, 2], [3, 4], [3, 4], [1, 2]]], [[1, 2], [3, 4], [1, 2]]),
  ([[]], []))

# ================================================================================================================
# 7. typing.NamedTuple with methods and defaults
# ================================================================================================================

A("sem_namedtuple_methods_defaults", r"""
    import math
    from typing import NamedTuple

    class Point(NamedTuple):
        x: float
        y: float = 0

        def dist(self, other=None):
            other = other or Point(0, 0)
            return math.hypot(self.x - other.x, self.y - other.y)

    def make(x=3, y=4):
        return Point(x, y)
    """, ("self.y - other.y", "self.y - other.x"),
  """
  p = make()
  assert p.dist() == 5
  """,
  "assert Point(1).y == 0",
  "assert make(1, 1).dist(Point(4, 5)) == 5",
  "assert make(6, 8) == (6, 8) and make()._replace(y=0).dist() == 3")

A("sem_namedtuple_employee", r"""
    from typing import NamedTuple

    class Employee(NamedTuple):
        name: str
        dept: str = "eng"
        salary: int = 0

        def raise_by(self, pct):
            return self._replace(salary=self.salary + self.salary * pct // 100)

    def top_paid(staff, n=1):
        return sorted(staff, key=lambda e: (-e.salary, e.name))[:n]
    """, ("(-e.salary, e.name)", "(e.salary, e.name)"),
  "assert Employee('a').dept == 'eng' and Employee('a').salary == 0",
  """
  e = Employee('bo', salary=100).raise_by(10)
  assert e == Employee('bo', 'eng', 110)
  """,
  "assert top_paid([Employee('a', salary=5), Employee('b', salary=9)]) == [Employee('b', 'eng', 9)]",
  "assert [e.name for e in top_paid([Employee('x', salary=1), Employee('w', salary=1), Employee('v')], 2)] "
  "== ['w', 'x']")

A("sem_namedtuple_property", r"""
    from typing import NamedTuple

    class Rect(NamedTuple):
        w: int
        h: int = 1

        @property
        def area(self):
            return self.w * self.h

        def scale(self, k):
            return Rect(self.w * k, self.h * k)

    def largest(rects):
        return max(rects, key=lambda r: r.area)
    """, ("max(rects, key=lambda r: r.area)", "max(rects)"),
  "assert Rect(3).area == 3",
  "assert largest([Rect(5, 1), Rect(2, 3)]) == Rect(2, 3)",
  "assert Rect(2, 3).scale(2)._asdict() == {'w': 4, 'h': 6}",
  "assert Rect._fields == ('w', 'h') and Rect._field_defaults == {'h': 1}")

C("sem_namedtuple_call", r"""
    from typing import NamedTuple

    class Stats(NamedTuple):
        lo: int
        hi: int
        mean: float = 0.0

    def stats(xs):
        if not xs:
            return Stats(0, 0)
        return Stats(min(xs), max(xs), sum(xs) / len(xs))
    """, ("sum(xs) / len(xs)", "sum(xs) // len(xs)"),
  "stats",
  ([[1, 2]], [1, 2, 1.5]), ([[]], [0, 0, 0.0]), ([[5, 1, 3]], [1, 5, 3.0]))

# ================================================================================================================
# 8. dataclasses
# ================================================================================================================

A("sem_dataclass_equality", r"""
    from dataclasses import dataclass

    @dataclass
    class Point:
        x: int
        y: int

    def reflect(p):
        return Point(p.y, p.x)

    def centroid(points):
        n = len(points)
        return Point(sum(p.x for p in points) // n, sum(p.y for p in points) // n)
    """, ("sum(p.y for p in points) // n", "sum(p.x for p in points) // n"),
  "assert reflect(Point(1, 2)) == Point(2, 1)",
  "assert centroid([Point(0, 0), Point(2, 4)]) == Point(1, 2)",
  "assert centroid([Point(3, 3)]) != Point(0, 0)",
  "assert repr(reflect(Point(5, 6))) == 'Point(x=6, y=5)'")

A("sem_dataclass_compare_false", r"""
    import itertools
    from dataclasses import dataclass, field

    _ids = itertools.count(1)

    @dataclass
    class Task:
        title: str
        priority: int = 0
        id: int = field(default_factory=lambda: next(_ids), compare=False)
        tags: list = field(default_factory=list, compare=False, repr=False)

    def make_task(title, priority=0, *tags):
        return Task(title.strip(), priority, tags=list(tags))
    """, ("Task(title.strip(), priority", "Task(title, priority"),
  "assert make_task(' write ', 2) == Task('write', 2)",
  """
  a = make_task('x')
  b = make_task('x')
  assert a == b and a.id != b.id
  """,
  "assert make_task('t', 1, 'home').tags == ['home'] and make_task('t', 1, 'home') == Task('t', 1)",
  "assert 'tags' not in repr(make_task('q'))")

A("sem_dataclass_order", r"""
    from dataclasses import dataclass, field

    @dataclass(order=True)
    class Job:
        priority: int
        name: str = field(compare=False)

    def schedule(jobs):
        return [j.name for j in sorted(jobs)]
    """, ("sorted(jobs)", "sorted(jobs, reverse=True)"),
  "assert schedule([Job(2, 'b'), Job(1, 'a')]) == ['a', 'b']",
  "assert Job(1, 'x') == Job(1, 'y')",
  "assert schedule([Job(3, 'c'), Job(1, 'a'), Job(2, 'b')]) == ['a', 'b', 'c']",
  "assert min([Job(5, 'p'), Job(4, 'q')]).name == 'q'")

A("sem_dataclass_post_init", r"""
    from dataclasses import asdict, dataclass, field

    @dataclass
    class Order:
        items: list
        discount: float = 0.0
        total: float = field(init=False)

        def __post_init__(self):
            self.total = round(sum(p * q for p, q in self.items) * (1 - self.discount), 2)

    def order(*items, discount=0.0):
        return Order(list(items), discount)
    """, ("sum(p * q for p, q in self.items)", "sum(p for p, q in self.items)"),
  "assert order((2.5, 2), (1.0, 3)).total == 8.0",
  "assert order((10, 1), discount=0.25) == Order([(10, 1)], 0.25)",
  "assert asdict(order((1, 2))) == {'items': [(1, 2)], 'discount': 0.0, 'total': 2}")

C("sem_dataclass_call", r"""
    from dataclasses import astuple, dataclass

    @dataclass
    class Span:
        start: int
        end: int

        def __len__(self):
            return self.end - self.start

    def longest_span(pairs):
        spans = [Span(a, b) for a, b in pairs]
        return list(astuple(max(spans, key=len))) if spans else []
    """, ("max(spans, key=len)", "min(spans, key=len)"),
  "longest_span",
  ([[[1, 3], [2, 9], [0, 1]]], [2, 9]), ([[]], []), ([[[5, 5], [5, 6]]], [5, 6]))

# ================================================================================================================
# 9. the program's own decimal context
# ================================================================================================================

A("sem_decimal_prec_50", r"""
    from decimal import Decimal, getcontext

    getcontext().prec = 50

    def sqrt2():
        return Decimal(2).sqrt()

    def one_third():
        return Decimal(1) / Decimal(3)
    """, ("getcontext().prec = 50", "getcontext().prec = 30"),
  "assert len(str(one_third())) == 52",
  """
  from decimal import Decimal
  assert sqrt2() == Decimal(2).sqrt()
  """,
  "assert str(sqrt2()) == '1.4142135623730950488016887242096980785696718753769'",
  """
  from decimal import Decimal
  assert one_third() * 3 == Decimal('0.' + '9' * 50)
  """)

A("sem_decimal_rounding", r"""
    from decimal import ROUND_HALF_UP, Decimal, getcontext

    getcontext().rounding = ROUND_HALF_UP

    def split_bill(total, people):
        share = (Decimal(total) / people).quantize(Decimal("0.01"))
        return share, Decimal(total) - share * (people - 1)
    """, ("getcontext().rounding = ROUND_HALF_UP\n", ""),
  """
  from decimal import Decimal
  assert split_bill('10.05', 2) == (Decimal('5.03'), Decimal('5.02'))
  """,
  "assert str(split_bill('9', 3)[0]) == '3.00'",
  """
  from decimal import Decimal
  assert Decimal('2.5').quantize(Decimal('1')) == split_bill('5', 2)[0].quantize(Decimal('1'))
  """)

A("sem_decimal_euler", r"""
    from decimal import Decimal, getcontext

    getcontext().prec = 50

    def euler(terms=60):
        total, term = Decimal(0), Decimal(1)
        for k in range(1, terms):
            total += term
            term /= k
        return total
    """, ("total, term = Decimal(0), Decimal(1)", "total, term = Decimal(1), Decimal(1)"),
  """
  from decimal import Decimal
  assert abs(euler() - Decimal(1).exp()) < Decimal('1e-45')
  """,
  "assert str(euler()).startswith('2.71828182845904523536028747135266249775724709369')",
  """
  from decimal import getcontext
  assert getcontext().prec == 50 and euler(3) == 2
  """)

S("sem_decimal_stdio", r"""
    from decimal import Decimal, getcontext

    n, d, k = map(int, input().split())
    getcontext().prec = k + 10
    q = Decimal(n) / Decimal(d)
    frac = f"{q:.{k + 5}f}".split(".")[1]
    print(frac[k - 1])
    """, ("getcontext().prec = k + 10", "getcontext().prec = k"),
  ("1 7 5\n", "5"), ("1 7 40\n", "8"), ("2 3 50\n", "6"), ("22 7 30\n", "7"))

C("sem_decimal_call", r"""
    from decimal import Decimal, getcontext

    getcontext().prec = 40

    def divide(a, b, places):
        q = Decimal(a) / Decimal(b)
        return str(q.quantize(Decimal(1).scaleb(-places)))
    """, ("getcontext().prec = 40", "getcontext().prec = 20"),
  "divide",
  ([1, 3, 30], "0." + "3" * 30), ([2, 7, 5], "0.28571"), ([10, 4, 2], "2.50"))

# ================================================================================================================
# 10. time zones
# ================================================================================================================

A("sem_zoneinfo_paris", r"""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    def meeting(year, month, day, hour, tz="Europe/Paris"):
        return datetime(year, month, day, hour, tzinfo=ZoneInfo(tz))

    def to_utc(dt):
        return dt.astimezone(ZoneInfo("UTC"))
    """, ('dt.astimezone(ZoneInfo("UTC"))', 'dt.replace(tzinfo=ZoneInfo("UTC"))'),
  "assert str(meeting(2024, 7, 1, 9).tzinfo) == 'Europe/Paris'",
  """
  from datetime import datetime, timezone
  assert to_utc(meeting(2024, 7, 1, 9)) == datetime(2024, 7, 1, 7, tzinfo=timezone.utc)
  """,
  "assert to_utc(meeting(2024, 1, 15, 12)).hour == 11",
  """
  from datetime import datetime
  from zoneinfo import ZoneInfo
  assert meeting(2024, 3, 31, 10) == datetime(2024, 3, 31, 8, tzinfo=ZoneInfo('UTC'))
  """)

A("sem_zoneinfo_elapsed", r"""
    from datetime import datetime, timedelta, timezone
    from zoneinfo import ZoneInfo

    PARIS = ZoneInfo("Europe/Paris")

    def at(y, m, d, h):
        return datetime(y, m, d, h, tzinfo=PARIS)

    def elapsed_hours(start, end):
        return (end.astimezone(timezone.utc) - start.astimezone(timezone.utc)) / timedelta(hours=1)
    """, ("(end.astimezone(timezone.utc) - start.astimezone(timezone.utc))", "(end - start)"),
  "assert elapsed_hours(at(2024, 3, 30, 12), at(2024, 3, 31, 12)) == 23",
  "assert elapsed_hours(at(2024, 1, 1, 0), at(2024, 1, 1, 6)) == 6",
  "assert at(2024, 10, 27, 12).utcoffset().total_seconds() == 3600",
  "assert str(at(2024, 6, 1, 0).tzinfo) == 'Europe/Paris' and at(2024, 6, 1, 0).tzname() == 'CEST'")

C("sem_zoneinfo_call", r"""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    def convert(ts, src, dst):
        dt = datetime.fromisoformat(ts).replace(tzinfo=ZoneInfo(src))
        return dt.astimezone(ZoneInfo(dst)).isoformat()
    """, (".astimezone(ZoneInfo(dst))", ".replace(tzinfo=ZoneInfo(dst))"),
  "convert",
  (["2024-07-01T09:00:00", "Europe/Paris", "America/New_York"], "2024-07-01T03:00:00-04:00"),
  (["2024-01-01T00:00:00", "UTC", "Asia/Tokyo"], "2024-01-01T09:00:00+09:00"),
  (["2024-03-10T12:00:00", "America/New_York", "America/New_York"], "2024-03-10T12:00:00-04:00"))

S("sem_zoneinfo_stdio", r"""
    import sys
    from datetime import datetime, timezone
    from zoneinfo import ZoneInfo

    for line in sys.stdin.read().splitlines()[1:]:
        day, clock, tz = line.split()
        local = datetime.fromisoformat(f"{day} {clock}").replace(tzinfo=ZoneInfo(tz))
        print(local.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M"))
    """, ("local.astimezone(timezone.utc).strftime", "local.strftime"),
  ("2\n2024-07-01 09:00 Europe/Paris\n2024-01-01 00:00 Asia/Tokyo\n", "2024-07-01 07:00\n2023-12-31 15:00"),
  ("1\n2024-05-05 05:05 UTC\n", "2024-05-05 05:05"))

# ================================================================================================================
# 11. collections.defaultdict read at a missing key
# ================================================================================================================

A("sem_defaultdict_lambda", r"""
    from collections import defaultdict

    def letter_counts(text):
        counts = defaultdict(lambda: 0)
        for ch in text:
            if ch.isalpha():
                counts[ch.lower()] += 1
        return counts
    """, ("counts[ch.lower()]", "counts[ch]"),
  "assert letter_counts('abA')['a'] == 2",
  "assert letter_counts('xyz')['missing'] == 0",
  "assert letter_counts('')['q'] == 0",
  "assert dict(letter_counts('Hi!')) == {'h': 1, 'i': 1}")

A("sem_defaultdict_list_graph", r"""
    from collections import defaultdict

    def build_graph(edges, directed=False):
        g = defaultdict(list)
        for u, v in edges:
            g[u].append(v)
            if not directed:
                g[v].append(u)
        return g
    """, ("if not directed:", "if directed:"),
  """
  g = build_graph([(1, 2), (2, 3)])
  assert g[2] == [1, 3]
  """,
  "assert build_graph([(1, 2)])[99] == []",
  """
  g = build_graph([('a', 'b')], directed=True)
  assert g['b'] == [] and g['a'] == ['b']
  """,
  "assert sorted(build_graph([(1, 2)]).keys()) == [1, 2]")

A("sem_defaultdict_class_factory", r"""
    from collections import defaultdict

    class Stats:
        def __init__(self):
            self.count = 0
            self.total = 0

        def add(self, x):
            self.count += 1
            self.total += x

        @property
        def mean(self):
            return self.total / self.count if self.count else 0

    def by_key(pairs):
        out = defaultdict(Stats)
        for k, v in pairs:
            out[k].add(v)
        return out
    """, ("self.total += x", "self.total = x"),
  "assert by_key([('a', 1), ('a', 3)])['a'].mean == 2",
  """
  s = by_key([])['missing']
  assert isinstance(s, Stats) and s.count == 0 and s.mean == 0
  """,
  """
  r = by_key([('x', 5), ('y', 1), ('x', 1)])
  assert r['x'].count == 2 and r['x'].total == 6
  """)

A("sem_defaultdict_nested", r"""
    from collections import defaultdict

    def matrix_from(triples):
        m = defaultdict(lambda: defaultdict(int))
        for r, c, v in triples:
            m[r][c] += v
        return m
    """, ("m[r][c] += v", "m[r][c] = v"),
  """
  m = matrix_from([(0, 1, 5), (0, 1, 2)])
  assert m[0][1] == 7
  """,
  "assert matrix_from([])[3][4] == 0",
  """
  m = matrix_from([(1, 1, 1)])
  assert m[1][2] == 0 and m[1][1] == 1 and m[2]['x'] == 0
  """)

C("sem_defaultdict_call", r"""
    from collections import defaultdict

    def group_anagrams(words):
        groups = defaultdict(list)
        for w in words:
            groups["".join(sorted(w))].append(w)
        return sorted(sorted(g) for g in groups.values())
    """, ('"".join(sorted(w))', '"".join(sorted(set(w)))'),
  "group_anagrams",
  ([["eat", "tea", "tan", "ate", "nat", "bat"]], [["ate", "eat", "tea"], ["bat"], ["nat", "tan"]]),
  ([["aab", "ab", "ba"]], [["aab"], ["ab", "ba"]]),
  ([[]], []))

# ================================================================================================================
# 12. copy.deepcopy of the program's objects
# ================================================================================================================

A("sem_deepcopy_board", r"""
    class Board:
        def __init__(self, n):
            self.cells = [[0] * n for _ in range(n)]

        def place(self, r, c, v):
            self.cells[r][c] = v
            return self

    def new_board(n):
        return Board(n)
    """, ("[[0] * n for _ in range(n)]", "[[0] * n] * n"),
  """
  import copy
  b = new_board(2)
  c = copy.deepcopy(b)
  c.place(0, 0, 9)
  assert b.cells == [[0, 0], [0, 0]] and c.cells[0][0] == 9
  """,
  """
  b = new_board(3).place(1, 2, 5)
  assert b.cells[1] == [0, 0, 5] and b.cells[0] == [0, 0, 0]
  """,
  """
  import copy
  b = new_board(2).place(1, 1, 4)
  c = copy.deepcopy(b)
  c.cells[1].append(7)
  assert b.cells[1] == [0, 4]
  """)

A("sem_deepcopy_config", r"""
    import copy

    DEFAULTS = {"db": {"host": "localhost", "port": 5432}, "debug": False}

    def make_config(**overrides):
        cfg = copy.deepcopy(DEFAULTS)
        for key, value in overrides.items():
            section, _, name = key.partition("__")
            if name:
                cfg[section][name] = value
            else:
                cfg[section] = value
        return cfg
    """, ("copy.deepcopy(DEFAULTS)", "dict(DEFAULTS)"),
  """
  import copy
  cfg = make_config(debug=True)
  c2 = copy.deepcopy(cfg)
  c2['db']['port'] = 1
  assert cfg['db']['port'] == 5432 and cfg['debug'] is True
  """,
  """
  make_config(db__port=6000)
  assert make_config()['db']['port'] == 5432
  """,
  "assert make_config(db__host='h')['db'] == {'host': 'h', 'port': 5432}")

A("sem_deepcopy_dataclass_tree", r"""
    from dataclasses import dataclass, field

    @dataclass
    class Node:
        value: int
        children: list = field(default_factory=list)

        def add(self, value):
            child = Node(value)
            self.children.append(child)
            return child

        def total(self):
            return self.value + sum(c.total() for c in self.children)
    """, ("sum(c.total() for c", "sum(c.value for c"),
  """
  import copy
  root = Node(1)
  root.add(2).add(3)
  clone = copy.deepcopy(root)
  clone.children[0].value = 100
  assert root.total() == 6 and clone.total() == 104
  """,
  """
  root = Node(5)
  assert root.total() == 5 and Node(1).add(2).children == []
  """,
  """
  import copy
  r = Node(0)
  r.add(1)
  c = copy.deepcopy(r)
  c.add(9)
  assert len(r.children) == 1 and c == Node(0, [Node(1), Node(9)])
  """)

A("sem_deepcopy_snapshot", r"""
    import copy

    class Inventory:
        def __init__(self):
            self.items = {}
            self.history = []

        def add(self, name, qty):
            self.items[name] = self.items.get(name, 0) + qty
            self.history.append(("add", name, qty))

        def snapshot(self):
            return copy.deepcopy(self)
    """, ("return copy.deepcopy(self)", "return copy.copy(self)"),
  """
  inv = Inventory()
  inv.add('a', 1)
  snap = inv.snapshot()
  inv.add('a', 2)
  assert snap.items == {'a': 1} and inv.items == {'a': 3}
  """,
  """
  import copy
  inv = Inventory()
  inv.add('x', 1)
  c = copy.deepcopy(inv)
  c.add('y', 1)
  assert 'y' not in inv.items and len(inv.history) == 1
  """,
  """
  inv = Inventory()
  inv.add('k', 4)
  assert inv.snapshot().history == [('add', 'k', 4)]
  """)

# ================================================================================================================
# 13. __name__ / __doc__ of the program's functions and classes
# ================================================================================================================

A("sem_func_name_doc", r'''
    def celsius_to_fahrenheit(c):
        """Convert Celsius to Fahrenheit."""
        return c * 9 / 5 + 32
    ''', ("c * 9 / 5 + 32", "(c + 32) * 9 / 5"),
  "assert celsius_to_fahrenheit.__name__ == 'celsius_to_fahrenheit'",
  "assert celsius_to_fahrenheit.__doc__ == 'Convert Celsius to Fahrenheit.'",
  "assert celsius_to_fahrenheit(100) == 212",
  "assert celsius_to_fahrenheit(-40) == -40")

A("sem_decorator_wraps_name", r'''
    import functools

    def memoize(fn):
        cache = {}

        @functools.wraps(fn)
        def wrapper(*args):
            if args not in cache:
                cache[args] = fn(*args)
            return cache[args]
        return wrapper

    @memoize
    def fib(n):
        """Return the n-th Fibonacci number."""
        return n if n < 2 else fib(n - 1) + fib(n - 2)
    ''', ("return n if n < 2", "return 1 if n < 2"),
  "assert fib.__name__ == 'fib'",
  "assert fib.__doc__ == 'Return the n-th Fibonacci number.'",
  "assert fib(30) == 832040",
  "assert fib.__wrapped__(10) == 55")

A("sem_registry_by_name", r'''
    HANDLERS = {}

    def handler(fn):
        HANDLERS[fn.__name__] = fn
        return fn

    @handler
    def add(a, b):
        """a + b"""
        return a + b

    @handler
    def sub(a, b):
        """a - b"""
        return a - b

    def dispatch(name, *args):
        return HANDLERS[name](*args)
    ''', ("return a - b", "return b - a"),
  "assert dispatch('sub', 5, 3) == 2",
  "assert sorted(HANDLERS) == ['add', 'sub'] and HANDLERS['add'].__name__ == 'add'",
  "assert [HANDLERS[k].__doc__ for k in ('add', 'sub')] == ['a + b', 'a - b']",
  "assert dispatch.__name__ == 'dispatch' and dispatch.__doc__ is None")

A("sem_class_name_doc", r'''
    class Stack:
        """A LIFO stack."""

        def __init__(self):
            self._data = []

        def push(self, x):
            """Push x on top."""
            self._data.append(x)

        def pop(self):
            """Remove and return the top item."""
            return self._data.pop()
    ''', ("return self._data.pop()", "return self._data.pop(0)"),
  "assert Stack.__name__ == 'Stack' and Stack.__doc__ == 'A LIFO stack.'",
  "assert Stack.push.__doc__ == 'Push x on top.' and Stack.pop.__name__ == 'pop'",
  """
  s = Stack()
  s.push(1)
  s.push(2)
  assert s.pop() == 2
  """,
  "assert type(Stack()).__name__ == 'Stack' and Stack().push.__qualname__ == 'Stack.push'")

# ================================================================================================================
# 14. inner lists mutated in place, seen through the test's alias
# ================================================================================================================

A("sem_alias_fill_row", r"""
    def fill(grid, value=1):
        for row in grid:
            for j in range(len(row)):
                if row[j] == 0:
                    row[j] = value
        return grid
    """, ("range(len(row))", "range(len(row) - 1)"),
  """
  grid = [[0, 2], [0, 0]]
  row = grid[0]
  fill(grid)
  assert row == [1, 2]
  """,
  """
  grid = [[5, 0]]
  r = grid[0]
  out = fill(grid)
  assert out is grid and r == [5, 1]
  """,
  """
  grid = [[0], [0, 0]]
  rows = list(grid)
  fill(grid, 2)
  assert rows == [[2], [2, 2]]
  """)

A("sem_alias_rotate", r"""
    def rotate(matrix):
        n = len(matrix)
        for i in range(n):
            for j in range(i + 1, n):
                matrix[i][j], matrix[j][i] = matrix[j][i], matrix[i][j]
        for row in matrix:
            row.reverse()
    """, ("range(i + 1, n)", "range(n)"),
  """
  m = [[1, 2], [3, 4]]
  top = m[0]
  rotate(m)
  assert top == [3, 1] and m == [[3, 1], [4, 2]]
  """,
  """
  m = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
  rows = m[:]
  rotate(m)
  assert rows[2] == [9, 6, 3]
  """,
  """
  m = [[1]]
  r = m[0]
  assert rotate(m) is None and r == [1]
  """)

A("sem_alias_normalize_rows", r"""
    def normalize_rows(rows):
        for row in rows:
            total = sum(row)
            if total:
                row[:] = [x / total for x in row]
    """, ("row[:] = [x / total", "row = [x / total"),
  """
  data = [[1, 3], [2, 2]]
  first = data[0]
  normalize_rows(data)
  assert first == [0.25, 0.75]
  """,
  """
  data = [[0, 0], [5]]
  z, f = data
  normalize_rows(data)
  assert z == [0, 0] and f == [1.0]
  """)

A("sem_alias_distribute", r"""
    def distribute(buckets, items):
        for i, x in enumerate(items):
            buckets[i % len(buckets)].append(x)
        return buckets
    """, ("buckets[i % len(buckets)]", "buckets[x % len(buckets)]"),
  """
  b = [[], []]
  first = b[0]
  distribute(b, [10, 11, 13])
  assert first == [10, 13]
  """,
  """
  b = [[9], []]
  second = b[1]
  distribute(b, [5, 6])
  assert second == [6] and b[0] == [9, 5]
  """)

# ================================================================================================================
# 15. array.array returned
# ================================================================================================================

A("sem_array_squares", r"""
    from array import array

    def squares(n):
        return array("i", (i * i for i in range(n)))
    """, ("range(n)", "range(1, n)"),
  """
  from array import array
  assert squares(3) == array('i', [0, 1, 4])
  """,
  "assert list(squares(4)) == [0, 1, 4, 9]",
  """
  from array import array
  assert squares(0) == array('i')
  """,
  "assert squares(2).typecode == 'i' and squares(5)[-1] == 16")

A("sem_array_prefix_sums", r"""
    from array import array

    def prefix_sums(xs):
        out = array("q", xs)
        for i in range(1, len(out)):
            out[i] += out[i - 1]
        return out
    """, ("range(1, len(out))", "range(2, len(out))"),
  """
  from array import array
  assert prefix_sums([1, 2, 3]) == array('q', [1, 3, 6])
  """,
  "assert prefix_sums([]).tolist() == []",
  "assert list(prefix_sums([5, -5, 5])) == [5, 0, 5]",
  """
  from array import array
  assert prefix_sums([1, 1]) == array('q', [1, 2]) and prefix_sums([1, 1]) != array('q', [1, 1])
  """)

A("sem_array_scale_bytes", r"""
    from array import array

    def scale(values, k):
        a = array("d", values)
        for i, v in enumerate(a):
            a[i] = v * k
        return a

    def bytes_roundtrip(values):
        a = array("h", values)
        b = array("h")
        b.frombytes(a.tobytes())
        return b
    """, ("a[i] = v * k", "a[i] = v + k"),
  """
  from array import array
  assert scale([1.5, 2], 2) == array('d', [3.0, 4.0])
  """,
  """
  from array import array
  assert bytes_roundtrip([1, -2, 300]) == array('h', [1, -2, 300])
  """,
  "assert list(scale([1], 0)) == [0.0]",
  "assert scale([], 3).typecode == 'd' and len(scale([], 3)) == 0")

S("sem_array_stdio", r"""
    import sys
    from array import array

    data = sys.stdin.buffer.read().split()
    n = int(data[0])
    a = array("l", map(int, data[1:1 + n]))
    best = cur = a[0]
    for x in a[1:]:
        cur = max(x, cur + x)
        best = max(best, cur)
    print(best)
    """, ("cur = max(x, cur + x)", "cur = cur + x"),
  ("5\n-2 1 -3 4 -1\n", "4"), ("3\n-5 -1 -2\n", "-1"), ("4\n1 2 3 4\n", "10"))

# ================================================================================================================
# 16. numpy scalars and arrays returned (only where numpy imports)
# ================================================================================================================

if base.HAS_NUMPY:
    A("sem_numpy_int_scalar", r"""
        import numpy as np

        def count_above(a, t):
            return np.sum(np.asarray(a) > t)

        def argmax_row(m):
            return np.argmax(np.asarray(m).sum(axis=1))
        """, ("sum(axis=1)", "sum(axis=0)"),
      """
      import numpy as np
      r = count_above([1, 5, 7], 4)
      assert r == 2 and isinstance(r, np.integer)
      """,
      "assert argmax_row([[1, 5], [3, 0], [0, 0]]) == 0",
      "assert argmax_row([[5, 0], [0, 3], [0, 4]]) == 0",
      "assert count_above([], 0) == 0")

    A("sem_numpy_array_eq", r"""
        import numpy as np

        def normalize(a):
            a = np.asarray(a, dtype=float)
            rng = a.max() - a.min()
            return (a - a.min()) / rng if rng else np.zeros_like(a)
        """, ("(a - a.min()) / rng", "a / rng"),
      """
      import numpy as np
      assert (normalize([0, 5, 10]) == np.array([0, 0.5, 1])).all()
      """,
      """
      import numpy as np
      assert np.array_equal(normalize([2, 4]), [0.0, 1.0])
      """,
      "assert normalize([3, 3]).tolist() == [0.0, 0.0]",
      """
      import numpy as np
      assert np.allclose(normalize(np.array([1, 2, 3])), [0, 0.5, 1])
      """)

    A("sem_numpy_int64", r"""
        import numpy as np

        def running_total(xs):
            return np.cumsum(np.array(xs, dtype=np.int64))

        def total(xs):
            return running_total(xs)[-1] if len(xs) else np.int64(0)
        """, ("dtype=np.int64", "dtype=np.int8"),
      """
      import numpy as np
      t = total([100, 100, 100])
      assert t == 300 and isinstance(t, np.int64)
      """,
      """
      import numpy as np
      assert np.array_equal(running_total([1, 2, 3]), np.array([1, 3, 6]))
      """,
      "assert total([]) == 0 and running_total([5]).dtype.name == 'int64'",
      "assert int(total([2**40, 1])) == 2**40 + 1")

    C("sem_numpy_median_call", r"""
        import numpy as np

        def median_of(xs):
            return np.median(np.array(xs))
        """, ("np.median(", "np.mean("),
      "median_of",
      ([[1, 2, 10]], 2.0), ([[4, 1, 3, 2]], 2.5), ([[7]], 7.0))

    C("sem_numpy_inversions_call", r"""
        import numpy as np

        def count_inversions(xs):
            a = np.array(xs, dtype=np.int64)
            if a.size == 0:
                return np.int64(0)
            greater = a[:, None] > a[None, :]
            return np.triu(greater, k=1).sum()
        """, ("a[:, None] > a[None, :]", "a[:, None] >= a[None, :]"),
      "count_inversions",
      ([[3, 1, 2]], 2), ([[1, 1, 1]], 0), ([[]], 0), ([[5, 4, 3, 2, 1]], 10))

# ================================================================================================================
# 17. multiprocessing.Pool / ProcessPoolExecutor (fork context) inside the program
# ================================================================================================================

A("sem_mp_pool_map", r"""
    import multiprocessing as mp

    def square(x):
        return x * x

    def parallel_squares(xs):
        with mp.get_context("fork").Pool(2) as pool:
            return pool.map(square, xs)
    """, ("return x * x", "return x * 2"),
  "assert parallel_squares([1, 2, 3]) == [1, 4, 9]",
  "assert parallel_squares([]) == []")

A("sem_process_pool_executor", r"""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    def is_prime(n):
        if n < 2:
            return False
        i = 2
        while i * i <= n:
            if n % i == 0:
                return False
            i += 1
        return True

    def primes_in(nums):
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=2, mp_context=ctx) as ex:
            flags = list(ex.map(is_prime, nums))
        return [n for n, f in zip(nums, flags) if f]
    """, ("while i * i <= n:", "while i * i < n:"),
  "assert primes_in(list(range(10))) == [2, 3, 5, 7]",
  "assert primes_in([25, 29]) == [29]",
  "assert primes_in([]) == []")

A("sem_mp_pool_starmap", r"""
    from multiprocessing import get_context

    def power(base, exp):
        return base ** exp

    def powers(pairs):
        with get_context("fork").Pool(processes=2) as pool:
            return pool.starmap(power, pairs)
    """, ("return base ** exp", "return exp ** base"),
  "assert powers([(2, 3), (3, 2)]) == [8, 9]",
  "assert powers([(5, 0)]) == [1]")

S("sem_mp_stdio", r"""
    import sys
    from multiprocessing import get_context

    def digit_sum(n):
        return sum(map(int, str(n)))

    def main():
        data = sys.stdin.read().split()
        nums = list(map(int, data[1:]))
        with get_context("fork").Pool(2) as pool:
            sums = pool.map(digit_sum, nums)
        print(*sums)

    if __name__ == "__main__":
        main()
    """, ("map(int, data[1:])", "map(int, data)"),
  ("3\n12 305 9\n", "3 8 9"), ("1\n99999\n", "45"))

C("sem_process_pool_call", r"""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    def collatz_len(n):
        steps = 1
        while n != 1:
            n = n // 2 if n % 2 == 0 else 3 * n + 1
            steps += 1
        return steps

    def longest_collatz(limit):
        with ProcessPoolExecutor(2, mp_context=get_context("fork")) as ex:
            lengths = list(ex.map(collatz_len, range(1, limit + 1)))
        return lengths.index(max(lengths)) + 1
    """, ("range(1, limit + 1)", "range(1, limit)"),
  "longest_collatz",
  ([9], 9), ([7], 7), ([27], 27))

# ================================================================================================================
# 18. stdin idioms, CRLF input
# ================================================================================================================

S("sem_stdin_open0_readline", r"""
    input = open(0).readline

    n = int(input())
    total = 0
    for _ in range(n):
        a, b = map(int, input().split())
        total += a * b
    print(total)
    """, ("total += a * b", "total += a + b"),
  ("2\n1 2\n3 4\n", "14"), ("1\n5 5\n", "25"), ("0\n", "0"), ("2\r\n1 2\r\n3 4\r\n", "14"))

S("sem_stdin_sys_stdin_open0", r"""
    import sys
    sys.stdin = open(0)

    t = int(input())
    for _ in range(t):
        s = input().strip().lower()
        print("YES" if s == s[::-1] else "NO")
    """, ("input().strip().lower()", "input().strip()"),
  ("3\nabba\nAbba\nabc\n", "YES\nYES\nNO"), ("1\nX\n", "YES"), ("2\r\nNoon\r\nab\r\n", "YES\nNO"))

S("sem_stdin_read_split", r"""
    data = open(0).read().split()
    n, k = int(data[0]), int(data[1])
    xs = sorted(map(int, data[2:2 + n]))
    print(sum(xs[-k:]) if k else 0)
    """, ("sum(xs[-k:])", "sum(xs[:k])"),
  ("5 2\n1 9 3 7 5\n", "16"), ("3 0\n1 2 3\n", "0"), ("4 4\n-1 -2\n-3 -4\n", "-10"))

S("sem_stdin_buffer_read", r"""
    import sys

    def main():
        data = sys.stdin.buffer.read().split()
        n = int(data[0])
        words = [w.decode() for w in data[1:1 + n]]
        longest = max(words, key=len)
        print(longest, len(longest))

    main()
    """, ("max(words, key=len)", "max(words)"),
  ("3\napple fig banana\n", "banana 6"), ("2\r\nzz\r\nabc\r\n", "abc 3"), ("1\nx\n", "x 1"))

S("sem_stdin_crlf_len", r"""
    import sys

    n = int(sys.stdin.readline())
    for _ in range(n):
        line = sys.stdin.readline().rstrip("\r\n")
        print(len(line))
    """, (r'sys.stdin.readline().rstrip("\r\n")', "sys.stdin.readline()[:-1]"),
  ("2\r\nabc\r\nhello world\r\n", "3\n11"), ("1\r\n\r\n", "0"), ("2\nab\nc\n", "2\n1"))

S("sem_stdin_crlf_commands", r"""
    import sys

    stack = []
    for raw in sys.stdin:
        cmd = raw.strip().split(" ")
        if cmd[0] == "push":
            stack.append(int(cmd[1]))
        elif cmd[0] == "pop" and stack:
            stack.pop()
        elif cmd[0] == "top":
            print(stack[-1] if stack else "EMPTY")
    """, ("raw.strip().split", r'raw.rstrip("\n").split'),
  ("push 1\r\npush 2\r\npop\r\ntop\r\n", "1"), ("top\r\n", "EMPTY"), ("push 5\ntop\n", "5"))

S("sem_stdin_crlf_grid", r"""
    import sys

    lines = sys.stdin.read().split("\n")
    h, w = map(int, lines[0].split())
    grid = [lines[1 + i].rstrip("\r") for i in range(h)]
    ok = all(len(row) == w for row in grid)
    print(sum(row.count("#") for row in grid), "OK" if ok else "BAD")
    """, (r'lines[1 + i].rstrip("\r")', "lines[1 + i]"),
  ("2 3\r\n#.#\r\n..#\r\n", "3 OK"), ("1 2\n##\n", "2 OK"), ("3 1\r\n.\r\n#\r\n.\r\n", "1 OK"))

S("sem_stdin_crlf_readline_names", r"""
    import sys
    input = sys.stdin.readline

    n = int(input())
    names = [input().strip() for _ in range(n)]
    print(names.count("admin"), len(set(names)), sum(map(len, names)))
    """, ("input().strip() for", "input()[:-1] for"),
  ("3\r\nadmin\r\nbob\r\nadmin\r\n", "2 2 13"), ("2\nx\nadmin\n", "1 2 6"), ("1\r\nadmin", "1 1 5"))


# ================================================================================================================
# the tests
# ================================================================================================================

def test_semantics_corpus_shape():
    names = [e.name for e in SEM]
    assert len(names) == len(set(names)), "names are unique"
    assert not set(names) & {e.name for e in base.CORPUS}, "names differ from the other corpus"
    by_fmt = {f: sum(1 for e in SEM if e.fmt == f) for f in ("assert", "call", "stdio")}
    assert len(SEM) >= 60 and by_fmt["call"] >= 8 and by_fmt["stdio"] >= 8, by_fmt
    for e in SEM:
        assert e.wrong != e.code and e.tests, e.name
        assert e.fmt != "call" or e.fn, e.name


@pytest.mark.any_stack
def test_semantics_corpus_is_right_under_plain_python():
    base.check_plain_python(SEM)


@pytest.fixture(scope="module")
def sandbox():
    from grpo_plugin.sandbox import Sandbox

    sb = Sandbox()
    yield sb
    sb.close()


def test_semantics_corpus_in_the_sandbox(sandbox):
    """The whole corpus, correct programs and twins, in one batch: the verdicts plain CPython gives."""
    base.check_in_sandbox(sandbox, SEM)
