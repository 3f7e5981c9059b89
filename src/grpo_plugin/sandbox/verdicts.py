"""How a stdin/stdout test's output is compared with the expected one (pure; in the trainer)."""

from __future__ import annotations

import math


def outputs_match(actual: str, expected: str, mode: str = "tokens", tol: float = 1e-6) -> bool:
    """`tokens`: the same whitespace-separated tokens, numbers equal within `tol` (absolute, or relative to the
    expected value, whichever is larger); `exact`: the same lines, trailing whitespace aside."""
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
