"""The verdicts, in the trainer: pure functions of what a program's process computed (slot values, its stdout)
and what the test expects, which that process never saw. Nothing a program does can reach this code."""

from __future__ import annotations

import builtins
import functools
import math

from grpo_plugin.sandbox.split import JUDGE_BUILTINS, JUDGE_MODULES, SLOT, Split
from grpo_plugin.sandbox.values import decode


class Raised(Exception):
    """A slot's expression raised in the program's process; `name` is its exception's type name."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def _import(name, globals=None, locals=None, fromlist=(), level=0):
    if level or name.partition(".")[0] not in JUDGE_MODULES:
        raise ImportError(f"{name} is not importable in the judge")
    return builtins.__import__(name, globals, locals, fromlist, level)


_BUILTINS = {name: getattr(builtins, name) for name in JUDGE_BUILTINS}
_BUILTINS["__import__"] = _import


def slot_value(entry: list[str] | None):
    """One slot as the fork server relayed it: its value, or raise what the program's expression raised."""
    if entry is None:
        raise Raised("NotComputed")  # the program's process never reached it (or ended before)
    kind, payload = entry[0], entry[1] if len(entry) > 1 else ""
    if kind == "V":
        return decode(payload)
    if kind == "R":
        raise Raised(payload[:80] or "Exception")
    raise Raised(f"UnjudgeableValue({payload[:60]})")  # "U": the value could not be copied as plain data


@functools.lru_cache(maxsize=65536)
def _compiled(source: str):
    return compile(source, "<judge>", "exec", dont_inherit=True)


def judge_split(split: Split, slots: dict[str, list[str]]) -> tuple[bool, str]:
    """Run a split test's judge side on the slot values: (passed, detail)."""
    def get(k: int):
        return slot_value(slots.get(str(k)))

    try:
        exec(_compiled(split.judge), {"__builtins__": _BUILTINS, SLOT: get})  # noqa: S102
    except Raised as exc:
        return False, exc.name
    except AssertionError:
        return False, "AssertionError"
    except Exception as exc:  # noqa: BLE001 - e.g. a TypeError on a wrong kind of value: the test fails
        return False, type(exc).__name__
    return True, "passed"


def outputs_match(actual: str, expected: str, mode: str = "tokens", tol: float = 1e-6) -> bool:
    """stdin/stdout tests. `tokens`: the same whitespace-separated tokens, numbers equal within `tol` (absolute,
    or relative to the expected value, whichever is larger); `exact`: the same lines, trailing whitespace aside."""
    if mode == "exact":
        def lines(s):
            return [line.rstrip() for line in s.rstrip().split("\n")]
        return lines(actual) == lines(expected)
    a, e = actual.split(), expected.split()
    if len(a) != len(e):
        return False
    for x, y in zip(a, e):
        if x == y:
            continue
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            return False
        if not (math.isfinite(fx) and math.isfinite(fy)) or abs(fx - fy) > tol * max(1.0, abs(fy)):
            return False
    return True


def _jsonish(x):
    """A result as JSON would hold it (datasets store expected returns as JSON): tuples are lists."""
    if isinstance(x, (list, tuple)):
        return [_jsonish(e) for e in x]
    if isinstance(x, dict):
        return {k: _jsonish(v) for k, v in x.items()}
    return x


def returns_match(actual, expected) -> bool:
    """Call-based tests: the function's return equals the expected value (plain data, as Python's == on builtin
    values; tuples equal lists, as JSON cannot tell them apart), or the one element of a one-element expected
    list (APPS and TACO wrap some expected returns so)."""
    got = _jsonish(actual)
    if got == _jsonish(expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and got == _jsonish(expected[0])
