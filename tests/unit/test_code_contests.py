"""Competitive-programming formats: the row shapes of APPS, TACO, CodeContests, Codeforces and LiveCodeBench
(tests/data/code/: rows written for these tests in each dataset's shape), stdin/stdout and call-based tests in the
sandbox — correct, wrong, crashing, slow and flooding programs, and the attacks a stdin program can try — the
transform, both rewards and the dataset check."""

from __future__ import annotations

import base64
import json
import pickle
import time
import zlib
from pathlib import Path

import pytest

from grpo_plugin.codedata.contests import RowError, parse_row
from grpo_plugin.sandbox import CallSuite, Limits, Sandbox, StdioSuite

DATA = Path(__file__).resolve().parents[1] / "data" / "code"


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines()]


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(Limits(wall_s=1.0, memory_mb=512, output_kb=64)) as sb:
        yield sb


def test_every_shape_is_read_with_its_tests_and_time_limit():
    apps_stdio, apps_call = (parse_row(r) for r in rows("apps.jsonl"))
    assert apps_stdio.tests["format"] == "stdio" and apps_stdio.tests["cases"][0] == ["3\n1 2 3\n", "6\n"]
    assert apps_call.tests == {"format": "call", "fn_name": "count_vowels", "time_limit_s": None,
                               "cases": [[["hello"], [2]], [["xyz"], [0]], [["aeiou"], [5]]]}
    taco = [parse_row(r) for r in rows("taco.jsonl")]
    assert taco[0].tests["time_limit_s"] == 1.0 and taco[1].tests["fn_name"] == "twoSum"
    assert "class Solution" in taco[1].prompt_text() and "standard input" in taco[0].prompt_text()
    cc = parse_row(rows("code_contests.jsonl")[0])
    assert len(cc.tests["cases"]) == 4 and cc.tests["time_limit_s"] == 2.5  # public + private + generated
    assert cc.reference.startswith("import sys")  # the Python 3 solution, not the C++ one
    assert parse_row(rows("code_contests.jsonl")[0], max_tests=2).tests["cases"] == cc.tests["cases"][:2]
    # a file mixing shapes: the datasets library gives every row every column, the others None
    mixed = {"question": None, "input_output": None, "starter_code": None, **rows("code_contests.jsonl")[0]}
    assert parse_row(mixed).source == "code_contests"
    cf = parse_row(rows("codeforces.jsonl")[0])
    assert len(cf.tests["cases"]) == 2 and cf.tests["time_limit_s"] == 1.0 and "One integer" in cf.statement
    lcb_stdio, lcb_call = (parse_row(r) for r in rows("livecodebench.jsonl"))
    assert lcb_stdio.tests["cases"] == [["3\n1 2 3\n", "6\n"], ["4\n1 2 3 4\n", "10\n"]]  # + the compressed one
    assert lcb_call.tests["cases"] == [[[1, 2], 3], [[-4, 4], 0]] and lcb_call.tests["fn_name"] == "addTwo"


class _Boom:
    def __reduce__(self):
        return (print, ("pickle ran code",))


@pytest.mark.parametrize(("row", "message"), [
    ({"question": "q", "input_output": json.dumps({"inputs": ["1"], "outputs": []})}, "1 inputs but 0 outputs"),
    ({"question": "q", "input_output": "{not json"}, "'input_output' is not valid JSON"),
    ({"question": "", "input_output": json.dumps({"inputs": ["1"], "outputs": ["1"]})}, "statement is empty"),
    ({"description": "d", "public_tests": {"input": [], "output": []}}, "no tests"),
    ({"question": "q", "input_output": None, "description": "d", "public_tests": None}, "no tests"),
    ({"question_content": "q", "public_test_cases": base64.b64encode(zlib.compress(pickle.dumps(_Boom()))).decode()},
     "is refused"),
    ({"question_content": "q", "public_test_cases": json.dumps([{"input": "1", "output": "1",
                                                                 "testtype": "functional"}])}, "func_name"),
    ({"prompt": "no tests at all"}, "no tests"),
])
def test_a_row_that_cannot_be_read_says_what_is_wrong(row, message, capsys):
    with pytest.raises(RowError, match=message):
        parse_row(row)
    assert "pickle ran code" not in capsys.readouterr().out  # a pickled call is refused, never run


SUM = "import sys\nnums = list(map(int, sys.stdin.read().split()))\nprint(sum(nums[1:]))\n"
CASES = [("3\n1 2 3\n", "6\n"), ("1\n-5\n", "-5"), ("2\n0.5 0.25\n", "0.75")]


def test_stdin_stdout_programs(sandbox):
    programs = {
        "correct": "import sys\nnums = [float(x) for x in sys.stdin.read().split()]\ns = sum(nums[1:])\n"
                   "print(int(s) if s == int(s) else s)\n",
        "wrong": "print(0)\n",
        "crashing": "raise ValueError('no')\n",
        "exit 1 after the right answer": SUM + "import sys\nsys.exit(1)\n",
        "exit 0 after the right answer": SUM + "import sys\nsys.exit(0)\n",
        "slow": "import time\ntime.sleep(5)\n",
        "flooding": "while True:\n    print('x' * 1000)\n",
        "reads beyond its input": "while True:\n    input()\n",
        "writes outside": "open('/tmp/owned-by-a-completion', 'w').write('x')\n" + SUM,
    }
    t0 = time.monotonic()
    res = dict(zip(programs, sandbox.run_suites([StdioSuite(code, CASES) for code in programs.values()])))
    assert time.monotonic() - t0 < 30
    assert res["correct"].passed == [True, True, True]
    assert res["wrong"].passed == [False] * 3 and res["wrong"].detail[0] == "wrong answer"
    assert res["crashing"].passed == [False] * 3 and "ValueError" in res["crashing"].detail[0]
    assert res["exit 1 after the right answer"].passed == [False] * 3  # a runtime error, as judges count it
    assert res["exit 0 after the right answer"].passed[:2] == [True, True]
    assert res["slow"].passed == [False] * 3 and "timed out" in res["slow"].detail[0]
    assert res["flooding"].passed == [False] * 3 and "printed more than 64 KiB" in res["flooding"].detail[0]
    beyond = res["reads beyond its input"]
    assert beyond.passed == [False] * 3 and "EOFError" in beyond.detail[0]
    assert res["writes outside"].passed == [False] * 3 and not Path("/tmp/owned-by-a-completion").exists()



FOUR = [(f"1\n{k}\n", f"{k}\n") for k in (1, 2, 3, 4)]  # one number in, the same number out
ECHO = "n = int(input())\nx = int(input())\n"


def test_how_contest_solutions_end_their_process_is_honoured():
    """The endings fast contest solutions use, as a fresh interpreter would run them: work in a thread nobody
    joins, output buffered until exit (atexit, a replaced sys.stdout), os._exit(0) after a flush, open(0)."""
    programs = {
        "work in an unjoined thread": "import sys, threading\nthreading.stack_size(1 << 24)\n"
                                      "def main():\n    " + ECHO.replace("\n", "\n    ") + "print(x)\n"
                                      "threading.Thread(target=main).start()\n",
        "output flushed by atexit": "import atexit, io, sys\nbuf = io.StringIO()\n"
                                    "atexit.register(lambda: sys.__stdout__.write(buf.getvalue()))\n"
                                    + ECHO + "buf.write(f'{x}\\n')\n",
        "a replaced, buffered sys.stdout": "import io, os, sys\n"
                                           "sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, 'w', "
                                           "closefd=False), 1 << 16))\n" + ECHO + "print(x)\n",
        "os._exit(0) after a flush": "import os, sys\n" + ECHO + "print(x)\nsys.stdout.flush()\nos._exit(0)\n",
        "open(0)": "data = open(0).read().split()\nprint(data[1])\n",
        "os._exit(0) before the flush": "import os\n" + ECHO + "print(x)\nos._exit(0)\n",  # lost, as in Python
    }
    with Sandbox(Limits(wall_s=2.0, memory_mb=512)) as sb:
        res = dict(zip(programs, sb.run_suites([StdioSuite(code, FOUR) for code in programs.values()])))
    for name in list(programs)[:-1]:
        assert res[name].passed == [True] * 4, (name, res[name])
    assert res["os._exit(0) before the flush"].passed == [False] * 4


def test_one_test_that_crashes_floods_or_hangs_costs_only_itself(sandbox):
    """The tests of a stdio program share a process; one that ends it fails alone and the rest still run."""
    crash = "import os\n" + ECHO + "if x == 2:\n    os.abort()\nprint(x)\n"
    flood = ECHO + "while x == 2:\n    print('x' * 4096)\nprint(x)\n"
    hang = ECHO + "while x == 3:\n    pass\nprint(x)\n"
    raises = ECHO + "if x == 1:\n    raise KeyError(x)\nprint(x)\n"
    exits = "import sys\n" + ECHO + "print(x)\nsys.exit(3 if x == 4 else 0)\n"
    res = sandbox.run_suites([StdioSuite(code, FOUR) for code in (crash, flood, hang, raises, exits)])
    assert res[0].passed == [True, False, True, True] and "ended" in res[0].detail[1]
    assert res[1].passed == [True, False, True, True] and "printed more than" in res[1].detail[1]
    assert res[2].passed == [True, True, False, True] and "timed out" in res[2].detail[2]
    assert res[3].passed == [False, True, True, True] and res[3].detail[0] == "the program raised KeyError"
    assert res[4].passed == [True, True, True, False] and res[4].detail[3] == "exit status 3"


def test_a_stdio_program_s_tests_free_their_cycles(sandbox):
    """A stdio program runs all its tests in one child: the garbage collector is on there (the fork server's
    template runs without it), so each test's reference cycles are freed before the next one."""
    code = "import gc\nprint(gc.isenabled())\n"
    assert sandbox.run_suites([StdioSuite(code, [("", "True\n")] * 2)])[0].passed == [True, True]


def test_a_stdio_program_with_many_tests(sandbox):
    """250 tests: a process each, every output where its test is."""
    cases = [(f"{k}\n", f"{2 * k}\n") for k in range(250)]
    res = sandbox.run_suites([StdioSuite("print(2 * int(input()))\n", cases)])[0]
    assert res.passed == [True] * 250, [d for d in res.detail if d != "passed"][:3]


def test_stdio_tests_run_one_per_process():
    from grpo_plugin.sandbox.forkserver_runs import stdio_units

    job = {"tests": [{"input": "x" * n} for n in (5, 5, 5, 12, 1)]}
    assert [(a, b) for _, a, b in stdio_units(job)] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    assert stdio_units({"tests": []}) == []


def test_stdout_comparison_can_be_exact_and_time_limits_come_from_the_row(sandbox):
    code = "print('1.0000001  2')\n"
    tokens, exact = sandbox.run_suites([StdioSuite(code, [("", "1 2")]), StdioSuite(code, [("", "1 2")],
                                                                                  compare="exact")])
    assert tokens.passed == [True] and exact.passed == [False]
    from grpo_plugin.sandbox.suites import suite_for

    row = {"format": "stdio", "cases": [["", "1 2"]]}
    assert [r.passed for r in sandbox.run_suites([
        suite_for(code, row), suite_for(code, row, compare="exact"), suite_for(code, row, tol=1e-9),
        suite_for(code, {**row, "compare": "exact"}, compare="tokens")])] == [[True], [False], [False], [False]]
    with pytest.raises(ValueError, match="'fuzzy'"):
        suite_for(code, row, compare="fuzzy")
    nap = "import time\ntime.sleep(0.6)\nprint(1)\n"
    short, default = sandbox.run_suites([StdioSuite(nap, [("", "1")], wall_s=[0.3]), StdioSuite(nap, [("", "1")])])
    assert short.passed == [False] and "timed out after 0.3 s" in short.detail[0] and default.passed == [True]


def test_call_based_programs(sandbox):
    cases = [(["hello"], [2]), (["xyz"], [0]), (["aeiou"], 5)]
    programs = {
        "correct": "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s)\n",
        "solution class": "class Solution:\n    def count_vowels(self, s):\n"
                          "        return sum(c in 'aeiou' for c in s)\n",
        "wrong": "def count_vowels(s):\n    return 2\n",
        "crashing": "def count_vowels(s):\n    return s[99]\n",
        "slow": "def count_vowels(s):\n    while True:\n        pass\n",
        "fake equality": "class Yes(int):\n    def __eq__(s, o): return True\n    __hash__ = int.__hash__\n"
                         "def count_vowels(s):\n    return Yes(0)\n",
        "missing": "def other(s):\n    return 0\n",
    }
    res = dict(zip(programs, sandbox.run_suites([CallSuite(c, "count_vowels", cases) for c in programs.values()])))
    assert res["correct"].passed == [True] * 3 and res["solution class"].passed == [True] * 3
    assert res["wrong"].passed == [True, False, False]
    assert res["crashing"].passed == [False] * 3 and res["crashing"].detail[0].startswith("IndexError")
    assert res["slow"].passed == [False] * 3 and "timed out" in res["slow"].detail[0]
    assert res["fake equality"].passed == [False, True, False]  # Yes(0) is 0: right for "xyz" only
    assert res["missing"].passed == [False] * 3 and res["missing"].detail[0].startswith("NameError")


def _transformed(name: str) -> list[dict]:
    from rewards.code import code_contest_transform

    fn, kwargs = code_contest_transform()
    assert kwargs == {"remove_columns": "__all__"}
    return [fn(r) for r in rows(name)]


def test_transform_and_rewards_on_contest_rows():
    from rewards.code import code_all_pass_reward, code_execution_reward

    row = _transformed("apps.jsonl")[0]
    assert row["prompt"][1]["content"].startswith("The first line holds n") and row["test_cases"] == "[]"
    completions = [f"```python\n{SUM}```", "```python\nprint(6)\n```", "print(", "no code"]
    kwargs = {"tests": [row["tests"]] * 4, "test_cases": [row["test_cases"]] * 4}
    assert code_execution_reward(completions, **kwargs) == [1.0, pytest.approx(1 / 3), 0.0, 0.0]
    assert code_all_pass_reward(completions, **kwargs) == [1.0, 0.0, 0.0, 0.0]
    call = _transformed("taco.jsonl")[1]
    good = f"```python\n{json.loads(rows('taco.jsonl')[1]['solutions'])[0]}```"
    assert code_execution_reward([good, "```python\nclass Solution:\n    def twoSum(self, n, t):\n"
                                        "        return [0, 1]\n```"], tests=[call["tests"]] * 2) == [1.0, 0.5]
    # an assert-style row and a contest row in one batch, each read from its own column
    mixed = code_execution_reward(["def f():\n    return 1\n", SUM],
                                  test_cases=[json.dumps(["assert f() == 1"]), "[]"], tests=["", row["tests"]])
    assert mixed == [1.0, 1.0]


def test_transform_refuses_a_bad_row_naming_it():
    from rewards.code import code_contest_transform

    fn, _ = code_contest_transform()
    with pytest.raises(ValueError, match=r"1 inputs but 0 outputs \(row 'Sum it'\).*codedata.check"):
        fn({"question": "Sum it", "input_output": json.dumps({"inputs": ["1"], "outputs": []})})


def test_dataset_check_runs_contest_references(tmp_path, capsys):
    from grpo_plugin.codedata.check import main

    for name in ("apps.jsonl", "taco.jsonl", "code_contests.jsonl", "codeforces.jsonl", "livecodebench.jsonl"):
        assert main([str(DATA / name)]) == 0, capsys.readouterr().out
    bad = tmp_path / "bad.jsonl"
    broken = dict(rows("apps.jsonl")[0], solutions=json.dumps(["print(0)\n"]))
    bad.write_text(json.dumps(broken) + "\n" + json.dumps({"question": "q", "input_output": "{"}) + "\n")
    assert main([str(bad)]) == 1
    out = capsys.readouterr().out
    assert "line 1: ERROR the reference fails its test 0 (wrong answer): input '3\\n1 2 3\\n'" in out
    assert "line 2: ERROR 'input_output' is not valid JSON" in out
