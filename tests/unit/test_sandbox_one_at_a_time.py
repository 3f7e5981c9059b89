"""One test at a time, in both forms, against a program that owns its process (it reads its own frames, peeks at its
connection, scans its descriptors, leaves threads and processes behind):

- assert and call-based tests: the judge sends a call only when the one before it has returned, so a program never
  sees a later test's arguments before it has answered the earlier ones (a program that answered `rot13('hello')`
  with the argument of the next test, `rot13('uryyb')`, passed round-trip tests with no cipher at all when calls
  were sent ahead);
- stdin/stdout tests: each test runs in a process of its own, with only its own input: no later input to read
  early, no thread or process of an earlier test running on, no time of an earlier test lent to a later one.

Each attack scores below 1, while the honest programs of the same batch keep their verdicts."""

from __future__ import annotations

import pytest

from grpo_plugin.sandbox import AssertSuite, CallSuite, Limits, Sandbox, StdioSuite, forkserver_plan
from tests.unit.judge_harness import COUNTER, job_lines, verdicts

# ---- the assert and call-based forms ---------------------------------------------------------------------------
ROT13 = """
import codecs

def rot13(s):
    return codecs.encode(s, "rot13")
"""

# a program with no cipher: it answers each call with the argument of the call after it, wherever it can find one
# (the frames of its own process, which hold the request being served; its connection to the judge, peeked at),
# and answers that later call with the argument it was paired with
PEEKER = r'''
import os, re, socket, sys

_PROTOCOL = {"call", "calls", "get", "attr", "setattr", "state", "op", "ok", "rot"}
_seen = {}


def _words(x, out, depth=0):
    if depth > 6:
        return
    if isinstance(x, (bytes, bytearray)):
        x = bytes(x).decode("latin-1")
    if isinstance(x, str):
        for w in re.findall(r"[a-z]{3,}", x):
            if w not in _PROTOCOL and w not in out:
                out.append(w)
    elif isinstance(x, (list, tuple)):
        for e in x:
            _words(e, out, depth + 1)
    elif isinstance(x, dict):
        for e in x.values():
            _words(e, out, depth + 1)


def _visible():
    out = []
    frame = sys._getframe(2)
    while frame is not None:  # the service's frames: the request it is serving (and any it read with it)
        for v in list(frame.f_locals.values()):
            _words(v, out)
        frame = frame.f_back
    for fd in range(3, 64):  # the connection to the judge: whatever is already waiting there
        try:
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            _words(s.recv(1 << 20, socket.MSG_PEEK | socket.MSG_DONTWAIT), out)
        except OSError:
            pass
        finally:
            s.close()
    return out


def rot13(s):
    if s in _seen:
        return _seen[s]
    words = _visible()
    if s in words and words.index(s) + 1 < len(words):
        nxt = words[words.index(s) + 1]
        _seen[nxt] = s
        return nxt
    return s
'''

PAIRS = [("hello", "uryyb"), ("world", "jbeyq"), ("python", "clguba"), ("sandbox", "fnaqobk")]
ROUND_TRIPS = [x for a, b in PAIRS for x in ((a, b), (b, a))]


def test_a_program_that_reads_later_calls_early_finds_none():
    """The judge's lines for the round-trip tests: the honest cipher passes them all, the peeker none (it sees only
    the call it is answering)."""
    tests = [f"assert rot13({a!r}) == {b!r}" for a, b in ROUND_TRIPS]
    assert verdicts(job_lines(ROT13, tests)) == [True] * 8
    assert verdicts(job_lines(PEEKER, tests)) == [False] * 8
    calls = ("rot13", [([a], b) for a, b in ROUND_TRIPS])
    assert verdicts(job_lines(ROT13, calls=calls)) == [True] * 8
    assert verdicts(job_lines(PEEKER, calls=calls)) == [False] * 8


def test_which_tests_are_one_call_with_literals():
    def call(src):
        return forkserver_plan.call_of(__import__("ast").parse(src))

    assert call("assert f([1, 2.5], 'a', k={1: (2, None)}) == [3]") == (
        "f", [[1, 2.5], "a"], {"k": {1: (2, None)}}, ("==", [3], None))
    assert call("assert f(-1) != -2, 'message'") == ("f", [-1], {}, ("!=", -2, None))
    assert call("assert f(1) is True") == ("f", [1], {}, ("is", True, None))
    assert call("assert f(1) is not None") == ("f", [1], {}, ("is not", None, None))
    assert call("assert f(1) is 5") == ("f", [1], {}, None)  # judged as code (CPython's int cache)
    assert call("assert not f({1, 2})") == ("f", [{1, 2}], {}, ("not", None, None))
    assert call("assert f()") == ("f", [], {}, ("truth", None, None))
    assert call("assert f([3, 5]) == (3 + 5, 3 * 5, -(2 / 3), 1 + 2j)") == (
        "f", [[3, 5]], {}, ("==", (8, 15, -(2 / 3), 1 + 2j), None))
    assert call("assert abs(f(1.33) - 0.33) < 1e-06") == ("f", [1.33], {}, ("abs<", 0.33, 1e-06))
    for src in ("assert f(x) == 1", "assert f(1) == g(2)", "assert f(1) < 2", "assert f(*[1]) == 1",
                "assert m.f(1) == 1", "assert f(1)[0] == 1", "assert f(1) == 1\nassert f(2) == 2", "x = f(1)",
                "assert abs(f(1)) < 1", "assert f(1) == 2 ** 300 * 2 ** 300"):
        assert call(src) is None, src


def test_calls_run_in_order_and_state_carries_across_tests():
    tests = ["assert f() == 1", "assert f() == 2", "assert n == 2", "assert f() == 3", "assert f(10) == 14",
             "assert [f() for _ in range(2)] == [5, 6]", "assert f() == 8"]
    assert verdicts(job_lines(COUNTER, tests)) == [True] * 6 + [False]


def test_exceptions_are_raised_in_their_own_test():
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
        return n
    """
    tests = ["assert f(0) == 1", "assert f(1) == 2", "assert f(0) == 3", "assert f(2) == 4", "assert f(0) == 5",
             "assert f(3) == 6", "assert f(0) == 7"]
    lines = job_lines(code, tests)
    assert verdicts(lines) == [True, False, True, False, True, False, True]
    fails = [line for line in lines if line.startswith("F ")]
    assert "ValueError: bad 1" in fails[0] and "Oops" in fails[1] and "SystemExit" in fails[2], fails


# ---- in the sandbox ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(Limits(wall_s=1.0, memory_mb=512)) as sb:
        yield sb


def test_round_trips_in_the_sandbox(sandbox):
    asserts = [f"assert rot13({a!r}) == {b!r}" for a, b in ROUND_TRIPS]
    cases = [([a], b) for a, b in ROUND_TRIPS]
    res = sandbox.run_suites([AssertSuite(ROT13, asserts), AssertSuite(PEEKER, asserts),
                              CallSuite(ROT13, "rot13", cases), CallSuite(PEEKER, "rot13", cases)])
    assert [r.passed for r in res] == [[True] * 8, [False] * 8, [True] * 8, [False] * 8], res


def test_a_call_that_hangs_fails_alone_and_in_time(sandbox):
    code = "def f(x):\n    while x == 2:\n        pass\n    return x\n"
    res = sandbox.run_suites([AssertSuite(code, [f"assert f({k}) == {k}" for k in range(1, 6)]),
                              CallSuite(code, "f", [([k], k) for k in range(1, 6)])])
    for r in res:
        assert r.passed == [True, False, True, True, True], r
        assert "timed out" in r.detail[1]


# ---- stdin/stdout ----------------------------------------------------------------------------------------------
# each test: print n * n; it takes n / 4 seconds (a solution too slow for the last test's 1 s limit)
SLOW = """
import time
n = int(input())
time.sleep(n / 4)
print(n * n)
"""
FAST = "n = int(input())\nprint(n * n)\n"
# the slow solution, pooling: in its first test it looks for the other tests' inputs among its descriptors, starts a
# thread that computes the slow one, and holds every test to just under its limit; the thread's answer waits in
# `builtins` for the test that needs it
POOLER = r"""
import builtins, os, stat, threading, time

start = time.monotonic()
n = int(input())
cache = getattr(builtins, "pooled", None)
if cache is None:
    cache = builtins.pooled = {}
    for fd in range(3, 256):
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):
                text = os.pread(fd, 1 << 16, 0).decode()
                m = int(text.split()[0])
                if m != n:
                    threading.Thread(target=lambda m=m: (time.sleep(m / 4), cache.__setitem__(m, m * m)),
                                     daemon=True).start()
        except (OSError, ValueError, IndexError):
            pass
if n in cache:
    print(cache[n])
else:
    time.sleep(n / 4)
    print(n * n)
time.sleep(max(0.0, 0.8 - (time.monotonic() - start)))
"""
# what an earlier test left running, seen from a later one: a value in builtins, a daemon thread, a child process
LEFTOVERS = r"""
import builtins, os, threading, time

child = getattr(builtins, "child", None)
alive = 0
if child:
    try:
        alive = int(os.waitpid(child, os.WNOHANG) == (0, 0))
    except ChildProcessError:
        alive = 0
print(getattr(builtins, "mark", 0), threading.active_count(), alive)
builtins.mark = 1
threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
pid = os.fork()
if pid == 0:
    time.sleep(30)
    os._exit(0)
builtins.child = pid
"""
INPUTS = ["1\n", "1\n", "1\n", "1\n", "6\n"]  # the last needs 1.5 s


def test_a_stdio_test_cannot_use_an_earlier_tests_time(sandbox):
    cases = [(i, f"{int(i) ** 2}\n") for i in INPUTS]
    res = sandbox.run_suites([StdioSuite(FAST, cases), StdioSuite(SLOW, cases), StdioSuite(POOLER, cases),
                              StdioSuite(FAST, cases[:3])])
    assert res[0].passed == [True] * 5, res[0]
    assert res[1].passed == [True] * 4 + [False], res[1]
    assert res[2].passed == [True] * 4 + [False], res[2]  # as slow as it is: no later input, no thread lives on
    assert "timed out" in res[2].detail[4]
    assert res[3].passed == [True] * 3


def test_nothing_of_an_earlier_stdio_test_is_alive_in_a_later_one(sandbox):
    res = sandbox.run_suites([StdioSuite(LEFTOVERS, [("", "0 1 0\n")] * 4)])[0]
    assert res.passed == [True] * 4, res
