"""Jobs judged in place (judge.serve): a judge takes a job in its own process as long as the program sends nothing
but plain data and every test is one call checked against a literal; at the first value, exception or test that is
more, the rest of the job goes on in a process forked for it. What a test sees must not depend on where it was
judged: the lines the judge says are compared, for every assert and call-based program of both corpora (correct
and wrong twin), with the job judged in place and wholly out of place. The judge and the program's service run in
plain processes here; `leave` stays in this process (the fork is the sandbox's: its tests run every job so)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_plugin.sandbox import codec, judge, judge_stand_ins
from tests.unit import test_sandbox_corpus, test_sandbox_corpus_semantics
from tests.unit.judge_harness import COUNTER, job_lines, verdicts

ROOT = Path(__file__).resolve().parents[2]


def judge_lines(code: str, tests=None, calls=None, in_place: bool = True) -> tuple[list[str], int]:
    """The lines the judge says for one job, and how many times it left its place (0 or 1)."""
    left: list[int] = []

    def leave() -> bool:  # the rest of the job in this same process
        left.append(1)
        return True

    return job_lines(code, tests, calls, leave if in_place else None), len(left)


def same_either_place(code: str, tests=None, calls=None) -> tuple[list[str], int]:
    lines, left = judge_lines(code, tests, calls, in_place=True)
    assert lines == judge_lines(code, tests, calls, in_place=False)[0]
    return lines, left


def test_plain_values_and_literal_checks_stay_in_place():
    tests = [f"assert f() == {k}" for k in (1, 2, 4)] + ["assert f() != 5", "assert f()", "assert not f(-6)",
                                                           "assert f(-7) is None", "assert f(0) is not None"]
    lines, left = same_either_place(COUNTER, tests)
    assert verdicts(lines) == [True, True, False, True, True, True, False, True]
    assert left == 0
    lines, left = same_either_place("def f(a, b=2):\n    return [a, {b: (a, 'x')}, {1.5}, b'z', 2**70, 1j]\n",
                                    ["assert f(1) == [1, {2: (1, 'x')}, {1.5}, b'z', 1180591620717411303424, 1j]",
                                     "assert f(1, b=3) == [1, {3: [1, 'x']}, {1.5}, b'z', 1180591620717411303424, 1j]"])
    assert verdicts(lines) == [True, False] and left == 0  # a tuple is no list, as in CPython
    # a tolerance, and arithmetic in the expected value; a wrong type fails with the error the test would raise
    lines, left = same_either_place("def f(x):\n    return x / 3 if x else None\n",
                                    ["assert abs(f(2.0) - 2.0 / 3.0) < 1e-06", "assert abs(f(1) - 0.3) <= 0.04",
                                     "assert abs(f(1) - 0.3) < 0.01", "assert abs(f(0) - 1.0) < 1e-06",
                                     "assert f(3) == (3 + 0) / 3"])
    assert verdicts(lines) == [True, True, False, False, True] and left == 0
    assert "TypeError: unsupported operand type(s) for -: 'NoneType' and 'float'" in lines[lines.index("S 3") + 1]


@pytest.mark.parametrize("code, tests", [
    # a value of the program's own class: its stand-in is built out of place
    ("class P:\n    def __init__(s, v):\n        s.v = v\n    def __eq__(s, o):\n        return True\n"
     "def f(v):\n    return P(v) if v else 0\n", ["assert f(0) == 0", "assert f(1) == 2", "assert f(0) == 0"]),
    # the program raises (the exception is built out of place, as the program's own class)
    ("class E(ValueError):\n    pass\ndef f(v):\n    if v:\n        raise E('no')\n    return v\n",
     ["assert f(0) == 0", "assert f(1) == 1", "assert f(0) == 0"]),
    # a test that is more than a call and a literal runs as code, out of place
    ("def f(v):\n    return v * 2\n", ["assert f(1) == 2", "assert round(f(1)) == 2", "assert f(2) == 4"]),
    # a function returned is an object of the program's (only a function named by the test is called in place)
    ("def f(v):\n    return f if v else 0\n", ["assert f(0) == 0", "assert f(1)", "assert f(0) == 0"]),
    # a decorated function is no plain function; an `is` with an int is judged as code
    ("import functools\n@functools.lru_cache(None)\ndef f(v):\n    return v\n", ["assert f(3) == 3"]),
    (COUNTER, ["assert f() == 1", "assert f(0) is 2"]),
    # a name the test means as the builtin, and a name the program imported
    ("from math import gcd\ndef f(v):\n    return v\n", ["assert f(1) == 1", "assert gcd(4, 6) == 2"]),
    ("def sorted(v):\n    return v\n", ["assert sorted([2, 1]) == [1, 2]"]),
    # the program raises at its top level
    ("raise KeyError('x')\n", ["assert f() == 1"]),
])
def test_the_first_thing_that_is_more_than_plain_takes_the_rest_out_of_place(code, tests):
    assert same_either_place(code, tests)[1] == 1


def test_call_based_jobs_in_place_and_out():
    lines, left = same_either_place("def add(a, b):\n    return (a + b, [a])\n",
                                    calls=("add", [([1, 2], [3, [1]]), ([2, 2], [5, [2]])]))
    assert verdicts(lines) == [True, False] and left == 0  # a tuple equals a list here (JSON cannot tell)
    lines, left = same_either_place("class Solution:\n    def add(self, a, b):\n        return a + b\n",
                                    calls=("add", [([1, 2], 3), ([2, 2], 5)]))
    assert verdicts(lines) == [True, False] and left == 1


def test_mutated_literal_arguments_are_the_calls_own():
    """In place a test's literal arguments come from its plan: a call that changes them must not change what a
    later identical test sends (out of place, each test builds its literals anew)."""
    code = "def f(a):\n    return a.pop() if a else None\n"
    lines, left = same_either_place(code, ["assert f([1]) == 1"] * 3)
    assert verdicts(lines) == [True] * 3 and left == 0


def test_only_a_plain_function_is_taken_in_place():
    stand_ins = judge_stand_ins.StandIns(program=None)
    plain = {"h": 7, "n": "function", "q": "function", "m": "builtins", "e": False, "nt": None, "b": []}
    assert stand_ins.function(plain) and stand_ins.function({"h": 7})
    for forged in ({**plain, "h": 8, "o": ["__eq__"]}, {**plain, "h": 9, "b": [{"h": 1}]},
                   {**plain, "h": 10, "m": "unittest.mock"}, {**plain, "h": 11, "n": "_ANY"},
                   {**plain, "h": 12, "dc": ["x"]}, {**plain, "h": 13, "e": True}, {"h": 14}, {"h": "7"}, [7]):
        assert not stand_ins.function(forged), forged
    decoder = codec.Decoder(stand_ins.remote, stand_ins.klass, 1 << 20)
    decoder.plain_only, decoder.function = True, stand_ins.function
    assert decoder.value(["L", 1, ["T", "a", None], ["D", "k", ["S", 2]], ["I", "ff"], ["C", 0, 1]]) == [
        1, ("a", None), {"k": {2}}, 255, 1j]
    for tree in (["NT", {"h": 1}, 1], ["K", {"h": 1}], ["O", 3, {"h": 1}], ["De", "1", 5, "ROUND_UP"],
                 ["bt", "int"], ["dk", 1], ["J", 0, "f"], ["SV", 4, {"h": 1}, 1], ["L", ["ns", "int64", 1]]):
        with pytest.raises(codec.NotPlain):
            decoder.value(tree)
    with pytest.raises(ValueError, match="unknown tag"):  # a malformed value stays a malformed value
        decoder.value(["ZZ", 1])


def _corpus_jobs() -> list[dict]:
    jobs = []
    for corpus in (test_sandbox_corpus.CORPUS, test_sandbox_corpus_semantics.SEM):
        for entry in corpus:
            if entry.fmt not in ("assert", "call") or "multiprocessing" in entry.code + entry.wrong \
                    or "concurrent" in entry.code + entry.wrong:
                continue
            for twin, code in (("correct", entry.code), ("wrong", entry.wrong)):
                job = {"name": f"{entry.name} [{twin}]", "code": code}
                if entry.fmt == "call":
                    job["calls"] = [entry.fn, [[a, e] for a, e in entry.tests]]
                else:
                    job["tests"] = list(entry.tests)
                jobs.append(job)
    return jobs


def test_both_corpora_judge_the_same_in_place_and_out():
    """Every assert and call-based program of both corpora, correct and twin: the same lines either way. Run in a
    small process of its own (judge_harness.py): it forks a program's process twice per job, which is cheap and
    safe from a single-threaded interpreter and neither from this one."""
    jobs = _corpus_jobs()
    out = subprocess.run([sys.executable, "-m", "tests.unit.judge_harness"], input=json.dumps(jobs),
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["differ"] == [], result["differ"][:3]
    assert result["jobs"] == len(jobs) > 200
    assert 0 < result["moved"] < result["jobs"]  # both kinds of job are in the corpora


def _judges_state() -> dict:
    """What a job in place could leave behind in the judge's process: the modules loaded, every global of the
    judge's modules and of builtins (by identity), the stand-in base classes' attributes, the decimal context."""
    import builtins
    import decimal
    import sys

    from grpo_plugin.sandbox import judge_link, wire

    state = {"modules": sorted(sys.modules), "decimal": repr(decimal.getcontext())}
    for mod in (builtins, judge, judge_link, judge_stand_ins, codec, wire):
        state[mod.__name__] = {k: id(v) for k, v in vars(mod).items()}
    for cls in (judge_stand_ins.Remote, judge_stand_ins.RemoteMeta):
        state[cls.__name__] = {k: id(v) for k, v in vars(cls).items()}
    return state


def test_a_job_in_place_leaves_nothing_in_the_judge():
    """Jobs that stay in place, one with values built to be costly or odd (cycles through aliases, deep nesting,
    big ints, hash-colliding keys, NaN, a forged function description for the next reply), change nothing a later
    job could see."""
    odd = """
import sys
def f(k):
    if k == 0:
        a = []
        a.append(a)
        return a
    if k == 1:
        x = []
        for _ in range(150):
            x = [x]
        return x
    if k == 2:
        return {i * (sys.hash_info.modulus): i for i in range(2000)}
    if k == 3:
        return [float('nan'), 2 ** 4000, -0.0, '\\udcff', b'\\x00' * 1000]
    return (frozenset({1j, 'x'}), b'y', {(): set()})
"""
    tests = [f"assert f({k}) == [1]" for k in range(5)] + ["assert f(3)", "assert abs(f(1) - 1) < 2"]
    judge_lines(odd, tests)  # (imports, caches and the like a first job may fill once)
    before = _judges_state()
    for _ in range(3):
        lines, left = judge_lines(odd, tests)
        assert left == 0 and verdicts(lines) == [False] * 5 + [True, False], lines
        lines, left = judge_lines(COUNTER, [f"assert f() == {k}" for k in (1, 2, 3)])
        assert left == 0 and verdicts(lines) == [True] * 3
    assert _judges_state() == before
