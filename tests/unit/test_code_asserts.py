"""sandbox/asserts.py and the strict comparison in sandbox/zygote.py: pure functions, no sandbox."""

from __future__ import annotations

import pytest

from grpo_plugin.sandbox.asserts import as_function, harden, is_plain_literal
from grpo_plugin.sandbox.zygote import strict_eq, strict_ne


@pytest.mark.parametrize(("test", "expected"), [
    ("assert f(1) == 2", "assert __grpo_eq__(f(1), 2)"),
    ("assert 2 == f(1)", "assert __grpo_eq__(f(1), 2)"),  # the literal is always the expected side
    ("assert f(1) != 'a'", "assert __grpo_ne__(f(1), 'a')"),
    ("assert f([1]) == [1, (2, 3), {'a': None}]", "assert __grpo_eq__(f([1]), [1, (2, 3), {'a': None}])"),
    ("assert f(1) == -2.5", "assert __grpo_eq__(f(1), -2.5)"),
    ("assert f(1) == g(2)", "assert f(1) == g(2)"),  # no plain value to hold them to: unchanged
    ("assert f(1) < 2", "assert f(1) < 2"),
    ("assert f(1) == 2 and f(2) == 3", "assert __grpo_eq__(f(1), 2) and __grpo_eq__(f(2), 3)"),
    ("assert 0 < f(1) == 2", "assert 0 < f(1) and __grpo_eq__(f(1), 2)"),
    ("assert abs(f(1) - 0.5) < 1e-6", "assert abs(f(1) - 0.5) < 1e-06"),
])
def test_equality_against_plain_literals_becomes_strict(test, expected):
    assert harden(test) == expected


def test_literal_detection():
    import ast

    lit = lambda s: is_plain_literal(ast.parse(s, mode="eval").body)  # noqa: E731
    assert lit("1") and lit("'x'") and lit("None") and lit("[1, {2: (3,)}]") and lit("{1, 2}") and lit("1+2j")
    assert not lit("x") and not lit("f()") and not lit("[1, x]") and not lit("{**d}")


def test_tests_become_functions_of_the_helpers():
    src = as_function("x = f(1)\nassert x == 2")
    assert src.startswith("def __grpo_test__(__grpo_eq__, __grpo_ne__):\n    x = f(1)\n")
    with pytest.raises(SyntaxError):
        as_function("assert (")


class _ClaimsEverything:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __hash__(self):
        return 0


class _LyingInt(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


class _LyingStr(str):
    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


class _LyingList(list):
    def __eq__(self, other):
        return True

    def __len__(self):
        return 3


@pytest.mark.parametrize("fake", [_ClaimsEverything(), _LyingInt(7), _LyingStr("nope"), _LyingList([0])])
def test_objects_that_claim_equality_are_not_equal(fake):
    expected = {"_ClaimsEverything": 5, "_LyingInt": 5, "_LyingStr": "yes", "_LyingList": [1, 2, 3]}[
        type(fake).__name__]
    assert fake == expected  # what a plain `assert f(x) == expected` would accept
    assert not strict_eq(fake, expected)
    assert not strict_ne(_ClaimsEverything(), expected)  # `!=` is strict too


@pytest.mark.parametrize(("actual", "expected", "equal"), [
    (4.0, 4, True), (True, 1, True), (1 + 0j, 1, True), (3, 3.5, False),  # numbers compare as in Python
    (_LyingInt(5), 5, True),  # a subclass is judged on its builtin value
    ("ab", "ab", True), ([1, [2.0]], [1, [2]], True), ((1, 2), [1, 2], False), ([1, 2], [1, 2, 3], False),
    ({"a": [1]}, {"a": [1]}, True), ({"a": 1}, {"a": 2}, False), ({1, 2}, {2, 1}, True),
    (frozenset({1}), {1}, True), (None, None, True), (0, None, False), (b"x", b"x", True),
    ([_ClaimsEverything()], [1], False), ({"a": _ClaimsEverything()}, {"a": 1}, False),
])
def test_strict_equality_of_plain_values(actual, expected, equal):
    assert strict_eq(actual, expected) is equal
    assert strict_ne(actual, expected) is (not equal)
