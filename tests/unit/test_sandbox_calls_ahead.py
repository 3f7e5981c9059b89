"""Calls sent ahead (judge_link.Program.send_ahead): the tests that are nothing but one call of the program's function
with literals have their calls sent in one request, and the program's process answers each as it ends. What a test
sees must be exactly what it sees with one round trip per call: the same verdicts, the same details, in the same
order of the program's state. Checked twice: the judge and the program's service in plain processes, each job run
with and without calls sent ahead (the lines the judge says compared); and in the sandbox."""

from __future__ import annotations

import pytest

from grpo_plugin.sandbox import AssertSuite, CallSuite, Limits, Sandbox, forkserver_plan, judge, judge_link
from tests.unit.judge_harness import COUNTER, job_lines, verdicts


def judge_lines(code: str, tests: list[str] | None = None, calls=None, ahead: bool = True,
                monkeypatch=None) -> tuple[list[str], list[int]]:
    """The lines the judge says for one job (no jail: the program's service in a forked process), and how many
    calls each request sent ahead carried."""
    sent: list[int] = []
    real = judge_link.Program.send_ahead

    def spy(self, batch, most_bytes):
        n = real(self, batch, most_bytes)
        sent.append(n)
        return n

    monkeypatch.setattr(judge_link.Program, "send_ahead", spy)
    monkeypatch.setattr(judge, "AHEAD_MOST", 256 if ahead else 0)
    return job_lines(code, tests, calls), sent


def same_either_way(monkeypatch, code, tests=None, calls=None) -> tuple[list[str], list[int]]:
    lines, sent = judge_lines(code, tests, calls, ahead=True, monkeypatch=monkeypatch)
    one_by_one, none = judge_lines(code, tests, calls, ahead=False, monkeypatch=monkeypatch)
    assert lines == one_by_one
    assert none == []
    return lines, sent


# a call returns the one object the program keeps; the test asks it nothing the program decides
BOX = """
class Box:
    def __init__(self):
        self.v = 0
    def __bool__(self):
        return self.v == 1
b = Box()
def get():
    b.v += 1
    return b
"""


def test_which_tests_are_one_call_with_literals():
    def call(src):
        return forkserver_plan.call_of(__import__("ast").parse(src))

    assert call("assert f([1, 2.5], 'a', k={1: (2, None)}) == [3]") == (
        "f", [[1, 2.5], "a"], {"k": {1: (2, None)}}, ("==", [3], None))
    assert call("assert f(-1) != -2, 'message'") == ("f", [-1], {}, ("!=", -2, None))
    assert call("assert f(1) is True") == ("f", [1], {}, ("is", True, None))
    assert call("assert f(1) is not None") == ("f", [1], {}, ("is not", None, None))
    assert call("assert f(1) is 5") == ("f", [1], {}, None)  # sent ahead; judged as code (CPython's int cache)
    assert call("assert not f({1, 2})") == ("f", [{1, 2}], {}, ("not", None, None))
    assert call("assert f()") == ("f", [], {}, ("truth", None, None))
    # arithmetic on numbers is a literal, folded as CPython does; a tolerance around one call
    assert call("assert f([3, 5]) == (3 + 5, 3 * 5, -(2 / 3), 1 + 2j)") == (
        "f", [[3, 5]], {}, ("==", (8, 15, -(2 / 3), 1 + 2j), None))
    assert call("assert abs(f(1.33) - 0.33) < 1e-06") == ("f", [1.33], {}, ("abs<", 0.33, 1e-06))
    assert call("assert abs(f(x=[1.0]) - 2.0 / 3.0) <= 1e-6") == ("f", [], {"x": [1.0]}, ("abs<=", 2 / 3, 1e-6))
    for src in ("assert f(x) == 1",  # a name: the test's or the program's, not a literal
                "assert f(1) == g(2)", "assert f(1) == 2 == 2", "assert f(1) < 2", "assert f(*[1]) == 1",
                "assert f(**{'a': 1}) == 1", "assert m.f(1) == 1", "assert f(1)[0] == 1", "assert f(1) == 1, f(2)",
                "assert f(1) == 1\nassert f(2) == 2", "x = f(1)", "assert f(1) + 1 == 2", "assert f(1)(2) == 1",
                "assert f(1) == 'a' * 3", "assert f(1) == 2 ** 3", "assert f(1) == 1 / 0", "assert abs(f(1)) < 1",
                "assert abs(f(1) + 1) < 1", "assert abs(1 - f(1)) < 1", "assert f(1) - 2 < 1",
                "assert abs(f(1) - 2) < x", "assert f(1) == 2 ** 300 * 2 ** 300"):
        assert call(src) is None, src


def test_calls_sent_ahead_run_in_order_and_score_as_one_by_one(monkeypatch):
    tests = [f"assert f() == {k}" for k in (1, 2, 3, 5, 5, 6)]
    lines, sent = same_either_way(monkeypatch, COUNTER, tests)
    assert verdicts(lines) == [True, True, True, False, True, True]
    assert sent == [6]


def test_a_test_that_does_more_than_one_call_sees_the_state_the_calls_before_it_left(monkeypatch):
    """Sending every call of the job ahead would run f a 4th time before the test that reads n: the tests that are
    not one call split the calls sent ahead."""
    tests = ["assert f() == 1", "assert f() == 2", "assert n == 2", "assert f() == 3", "assert f(10) == 14",
             "assert [f() for _ in range(2)] == [5, 6]", "assert f() == 7"]
    lines, sent = same_either_way(monkeypatch, COUNTER, tests)
    assert verdicts(lines) == [True] * 7
    assert sent == [2, 2]  # the last test alone: sent the usual way


def test_a_call_that_returns_an_object_it_keeps_scores_as_one_by_one(monkeypatch):
    """A stand-in for the program's object (its truth asked of the program when the test asks it, as CPython
    would: the box it returns is true once, when its count is 1); the program's process stops running ahead after
    such a call, and the calls after it go one by one."""
    lines, sent = same_either_way(monkeypatch, BOX, ["assert get()", "assert get()", "assert not get()"])
    assert verdicts(lines) == [True, False, True]
    assert sent == [3]


def test_exceptions_in_calls_sent_ahead_are_raised_in_their_own_test(monkeypatch):
    code = """
    n = 0
    class Oops(Exception):
        def __str__(self):
            return f"oops at {n}"
    def f(x):
        global n
        n += 1
        if x == 1:
            raise ValueError(f"bad {x}")
        if x == 2:
            raise Oops()
        if x == 3:
            exit(3)
        if x == 4:
            raise LookupError(Tell())  # the test reads its message after the call: n as this call left it
        return n
    class Tell:
        def __str__(self):
            return f"n is {n}"
    """
    tests = ["assert f(0) == 1", "assert f(1) == 2", "assert f(0) == 3", "assert f(2) == 4", "assert f(0) == 5",
             "assert f(3) == 6", "assert f(0) == 7", "assert f(4) == 8", "assert f(0) == 9"]
    lines, _ = same_either_way(monkeypatch, code, tests)
    assert verdicts(lines) == [True, False, True, False, True, False, True, False, True]
    fails = [line for line in lines if line.startswith("F ")]
    assert "ValueError: bad 1" in fails[0] and "Oops" in fails[1] and "SystemExit" in fails[2], fails
    assert "n is 8" in fails[3], fails


def test_a_name_that_means_something_else_to_a_test_is_not_sent_to_the_program(monkeypatch):
    code = """
    from math import gcd
    def sorted(xs):
        return xs
    def gcd2(a, b):
        return 1
    """
    tests = ["assert sorted([2, 1]) == [1, 2]", "assert sorted([3, 1]) == [1, 3]", "assert gcd(4, 6) == 2",
             "assert gcd(9, 6) == 3", "assert Counter('aab') == {'a': 2, 'b': 1}", "assert gcd2(4, 6) == 1",
             "assert gcd2(9, 6) == 1"]
    lines, sent = same_either_way(monkeypatch, code, tests)
    assert verdicts(lines) == [True] * 7
    assert sent == [2]  # only gcd2 is the program's own


def test_mutated_and_large_arguments(monkeypatch):
    code = """
    def push(xs, x):
        xs.append(x)
        return len(xs)
    def size(s):
        return len(s)
    """
    big = "x" * 300_000
    tests = ["assert push([1], 2) == 2", "assert push([], 2) == 1"] + [f"assert size('{big}') == 300000"] * 5
    lines, sent = same_either_way(monkeypatch, code, tests)
    assert verdicts(lines) == [True] * 7
    assert sum(sent) == 7 and len(sent) >= 2  # the arguments sent ahead at once stay under AHEAD_BYTES


def test_call_based_cases_are_sent_ahead(monkeypatch):
    code = """
    class Solution:
        def __init__(self):
            self.calls = 0
        def twice(self, x):
            self.calls += 1
            return 2 * x + self.calls - 1
    """
    cases = [([k], 2 * k + k) for k in range(40)] + [(["a"], "aa"), ([[1]], [1, 1])]
    lines, sent = same_either_way(monkeypatch, code, calls=("twice", cases))
    assert verdicts(lines) == [True] * 40 + [False, False]
    assert sent == [42]


# ---- in the sandbox ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(Limits(wall_s=1.0, memory_mb=512)) as sb:
        yield sb


def test_a_call_that_hangs_among_calls_sent_ahead_fails_alone_and_in_time(sandbox):
    code = "def f(x):\n    while x == 2:\n        pass\n    return x\n"
    res = sandbox.run_suites([AssertSuite(code, [f"assert f({k}) == {k}" for k in range(1, 6)]),
                              CallSuite(code, "f", [([k], k) for k in range(1, 6)])])
    for r in res:
        assert r.passed == [True, False, True, True, True], r
        assert "timed out" in r.detail[1]


def test_state_and_objects_through_the_sandbox(sandbox):
    res = sandbox.run([(COUNTER, [f"assert f() == {k}" for k in (1, 2, 4, 4)] + ["assert n == 4"]),
                       (BOX, ["assert get()", "assert not get()", "assert get() == 1"])])
    assert res[0].passed == [True, True, False, True, True]
    assert res[1].passed == [True, True, False]  # as CPython: true at 1, false at 2, never == 1
