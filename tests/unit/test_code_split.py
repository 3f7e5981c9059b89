"""sandbox/split.py, judge.py, values.py: pure functions, no sandbox. The expected side of a test must never reach
the program's process; the judge must hold plain values to the test's own Python semantics."""

from __future__ import annotations

import pytest

from grpo_plugin.sandbox.judge import judge_split, outputs_match, returns_match
from grpo_plugin.sandbox.split import program_names, split_test
from grpo_plugin.sandbox.values import Opaque, decode


@pytest.mark.parametrize(("test", "child_has", "child_lacks", "judge"), [
    ("assert f(1) == 2", ["f(1)"], ["== 2"], "assert __slot__(0) == 2"),
    ("assert 2 == f(1)", ["f(1)"], ["2 =="], "assert 2 == __slot__(0)"),
    ("assert abs(f(1) - 0.5) < 1e-6", ["f(1)"], ["0.5", "abs"], "assert abs(__slot__(0) - 0.5) < 1e-06"),
    ("import math\nassert math.isclose(f(2), 12.566, rel_tol=1e-3)", ["f(2)"], ["12.566", "isclose"],
     "import math\nassert math.isclose(__slot__(0), 12.566, rel_tol=0.001)"),
    ("assert f(1) == 2 * 3", ["f(1)"], ["2 * 3"], "assert __slot__(0) == 2 * 3"),
    ("assert 3 in f([1, 2, 3])", ["f([1, 2, 3])"], ["3 in"], "assert 3 in __slot__(0)"),
    # a value builtin on the program's own object: in the child, as the builtin was before the program ran
    ("assert len(Stack()) == 0", ["builtins['len'](Stack())"], ["== 0"], "assert __slot__(0) == 0"),
    ("assert sorted(f(1)) == [1, 2]", ["builtins['sorted'](f(1))"], ["[1, 2]"], "assert __slot__(0) == [1, 2]"),
    ("s = Stack()\ns.push(1)\nassert s.pop() == 1", ["s = Stack()", "s.push(1)", "s.pop()"], ["== 1"],
     "assert __slot__(0) == 1"),
    ("x = [3, 1]\nexpected = [1, 3]\nassert f(x) == expected", ["x = [3, 1]", "f(x)"], ["expected", "[1, 3]"],
     "x = [3, 1]\nexpected = [1, 3]\nassert __slot__(0) == expected"),
    ("assert Solution().twoSum([2, 7], 9) == [0, 1]", ["Solution().twoSum([2, 7], 9)"], ["[0, 1]"],
     "assert __slot__(0) == [0, 1]"),
    ("assert f(1) is None or g(2) > 3", ["f(1)", "g(2)"], ["> 3"], "assert __slot__(0) is None or __slot__(1) > 3"),
    ("assert f(5) == [i * i for i in range(5)]", ["f(5)"], ["i * i"],
     "assert __slot__(0) == [i * i for i in range(5)]"),
])
def test_the_expected_side_stays_in_the_judge(test, child_has, child_lacks, judge):
    s = split_test(test)
    assert not s.in_child and s.judge == judge
    for part in child_has:
        assert part in s.child, (part, s.child)
    for part in child_lacks:
        assert part not in s.child, (part, s.child)


def test_a_name_the_program_defines_is_the_programs_even_if_builtin():
    s = split_test("assert sorted([3, 1]) == [1, 3]", program_names("def sorted(x):\n    return x\n"))
    assert "sorted([3, 1])" in s.child and "builtins" not in s.child and s.judge == "assert __slot__(0) == [1, 3]"
    assert split_test("assert sorted([3, 1]) == [1, 3]").slots == 0  # the builtin otherwise: all in the judge


@pytest.mark.parametrize("test", [
    "for i in range(3):\n    assert f(i) == i",
    "assert all(f(i) == i for i in range(3))",  # the comparison would run beside the program
    "assert getattr(f(1), 'x') == 2",  # not in the judge's builtins
    "import os\nassert f(1) == 2",  # not a module the judge imports
    "assert [x + 1 for x in f(3)] == [2]",  # a comprehension over the program's values
])
def test_what_cannot_be_split_is_judged_in_the_child_with_plain_values(test):
    s = split_test(test)
    assert s.in_child and s.judge is None
    assert "__plain__(" in s.child and s.child.rstrip().endswith("return True")


def test_a_test_that_does_not_parse_is_a_syntax_error():
    with pytest.raises(SyntaxError):
        split_test("assert (")


def _slots(*values):
    from grpo_plugin.sandbox.child import _make_plain

    _, encode = _make_plain()
    return {str(k): ["V", encode(v)] for k, v in enumerate(values)}


def test_judge_on_slot_values():
    s = split_test("import math\nassert math.isclose(f(2), 12.566, rel_tol=1e-3)")
    assert judge_split(s, _slots(12.5664)) == (True, "passed")
    assert judge_split(s, _slots(12.0)) == (False, "AssertionError")
    s = split_test("assert f(1) == (1, 2)")
    assert judge_split(s, _slots([1, 2])) == (False, "AssertionError")  # a list is not a tuple, as in Python
    assert judge_split(s, {"0": ["R", "ValueError"]}) == (False, "ValueError")  # what the call raised
    assert judge_split(s, {}) == (False, "NotComputed")
    assert judge_split(s, {"0": ["V", '{"t": [{"i": "0x1"}, {"i": "0x2"}]}']}) == (True, "passed")
    assert judge_split(s, {"0": ["V", "[[[[not json"]})[0] is False


def test_values_round_trip_and_fakes_lose_their_lies():
    from grpo_plugin.sandbox.child import _make_plain

    plain, encode = _make_plain()

    class LyingInt(int):
        def __eq__(self, other):
            return True
        __hash__ = int.__hash__

    class Claims:
        def __eq__(self, other):
            return True

    big = 3 ** 20000  # more digits than int(str) allows: sent as hex
    values = [None, True, 1, -2.5, float("inf"), 1 + 2j, "s", b"b", bytearray(b"x"), [1, (2, {3: {4}})],
              frozenset({1}), range(1, 5, 2), int, big]
    assert decode(encode(values)) == values
    assert decode(encode(LyingInt(5))) == 5 and decode(encode(LyingInt(5))) != 6
    fake = decode(encode(Claims()))
    assert isinstance(fake, Opaque) and fake != fake and fake != 1
    with pytest.raises(TypeError):
        bool(fake)
    assert plain([LyingInt(2)]) == [2] and type(plain([LyingInt(2)])[0]) is int
    deep = []
    for _ in range(150):
        deep = [deep]
    with pytest.raises(ValueError):
        encode(deep)
    for bad in ('{"zz": 1}', '{"i": "nothex"}', '{"s": [[1]]}', "[" * 10000 + "]" * 10000, '{"y": "os"}'):
        with pytest.raises(ValueError):
            decode(bad)


@pytest.mark.parametrize(("actual", "expected", "mode", "ok"), [
    ("3\n", "3", "tokens", True),
    ("1 2  3\n\n", "1 2 3", "tokens", True),
    ("0.3333333", "0.333333333", "tokens", True),
    ("0.33", "0.333333333", "tokens", False),
    ("1000000.1", "1000000.0", "tokens", True),  # relative to the expected value
    ("YES", "yes", "tokens", False),
    ("3 4", "3", "tokens", False),
    ("nan", "nan", "tokens", True),  # the same token
    ("a b\n", "a b", "exact", True),
    ("a  b", "a b", "exact", False),
])
def test_stdout_comparison(actual, expected, mode, ok):
    assert outputs_match(actual, expected, mode) is ok


def test_call_returns_as_json_datasets_store_them():
    assert returns_match((1, 2), [1, 2]) and returns_match(3, [3]) and returns_match([[1]], [[1]])
    assert not returns_match(3, [[3]]) and not returns_match(Opaque("X"), 3) and not returns_match("3", 3)
