"""Test formats, one small object each: what a job carries to the fork server (`job`) and how its reply becomes a
ProgramResult (`judge`). Asserts and call-based tests are judged in the jail by a judge process (judge.py), never in
the program's process; stdin/stdout outputs are compared here.

- `AssertSuite`: Python statements, usually asserts (HumanEval, MBPP, the seed guide's `test_cases`), any shape: a
  loop, a comprehension, `def check(candidate): ...` — each runs whole in the judge.
- `CallSuite`: call-based tests (APPS / TACO `fn_name`): the function (or `Solution().<fn_name>`) called with each
  argument list, its return compared with the expected one in the judge.
- `StdioSuite`: stdin/stdout tests (APPS, TACO, CodeContests, Codeforces, LiveCodeBench `stdin`): the program run
  as `__main__` with the input on stdin, once per test, its stdout compared here token by token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from grpo_plugin.sandbox.verdicts import outputs_match


@dataclass
class ProgramResult:
    passed: list[bool]
    detail: list[str] = field(default_factory=list)  # per test: "passed", the exception's name, or what ended it
    output: str = ""  # the first KB of what the program wrote to stderr (diagnostics only: never for a verdict)

    @property
    def score(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0

    @property
    def all_passed(self) -> float:
        return 1.0 if self.passed and all(self.passed) else 0.0


class Suite(Protocol):
    def job(self) -> dict: ...

    def judge(self, reply: dict) -> ProgramResult: ...


def _judged(reply: dict) -> ProgramResult:
    """Verdicts the judge made: a test passed only when the judge said so."""
    passed, detail = [], []
    for t in reply["tests"]:
        passed.append(t["status"] == "passed")
        detail.append("passed" if t["status"] == "passed" else (t.get("why") or t["status"] or "not run"))
    return ProgramResult(passed, detail, reply.get("output", ""))


@dataclass
class AssertSuite:
    code: str
    tests: list[str]

    def job(self) -> dict:
        return {"code": self.code, "source": self.code, "mode": "asserts", "tests": [str(t) for t in self.tests]}

    def judge(self, reply: dict) -> ProgramResult:
        return _judged(reply)


@dataclass
class CallSuite:
    code: str
    fn_name: str
    cases: list[tuple[list, Any]]  # (arguments, expected return)
    wall_s: list[float | None] | None = None

    def job(self) -> dict:
        return {"code": self.code, "source": self.code, "mode": "calls", "fn": self.fn_name,
                "cases": [[list(a) if isinstance(a, (list, tuple)) else [a], e] for a, e in self.cases],
                "wall_s": self.wall_s}

    def judge(self, reply: dict) -> ProgramResult:
        return _judged(reply)


@dataclass
class StdioSuite:
    code: str
    cases: list[tuple[str, str]]  # (stdin, expected stdout)
    compare: str = "tokens"  # or "exact"
    tol: float = 1e-6
    wall_s: list[float | None] | None = None

    def job(self) -> dict:
        return {"code": self.code, "mode": "stdio", "tests": [{"input": str(stdin)} for stdin, _ in self.cases],
                "wall_s": self.wall_s}

    def output_verdict(self, test: int, stdout: bytes) -> bool:
        """Whether test `test`'s output (the bytes the program printed, read as UTF-8, an invalid byte as U+FFFD)
        matches; called as each output arrives, so only one is ever held as text."""
        if not 0 <= test < len(self.cases):
            return False
        return outputs_match(stdout.decode("utf-8", "replace"), str(self.cases[test][1]), self.compare, self.tol)

    def judge(self, reply: dict) -> ProgramResult:
        passed, detail = [], []
        for t in reply["tests"][:len(self.cases)]:
            if t["status"] == "returned":
                ok = bool(t.get("match", False))
                why = "passed" if ok else "wrong answer"
            else:
                ok, why = False, t.get("why") or "the program ended the process"
            passed.append(ok)
            detail.append(why)
        return ProgramResult(passed, detail, reply.get("output", ""))


def suite_for(code: str, tests, compare: str | None = None, tol: float | None = None) -> Suite:
    """The suite for a program and its row's tests: a list of assert-style statements, or a contest row's `tests`
    dict (codedata/contests.py: stdio or call, with the row's time limit per test). stdin/stdout comparison: the
    row's own `compare` / `tol` if it has them, else `compare` / `tol` given here (the rewards pass
    GRPO_CODE_COMPARE / GRPO_CODE_FLOAT_TOL), else tokens within 1e-6."""
    if isinstance(tests, dict):
        limit = tests.get("time_limit_s")
        wall = [float(limit)] * len(tests["cases"]) if limit else None
        if tests["format"] == "call":
            return CallSuite(code, tests["fn_name"], [(c[0], c[1]) for c in tests["cases"]], wall_s=wall)
        mode = tests.get("compare") or compare or "tokens"
        if mode not in ("tokens", "exact"):
            raise ValueError(f"stdin/stdout comparison {mode!r}: expected 'tokens' or 'exact'")
        return StdioSuite(code, [(str(c[0]), str(c[1])) for c in tests["cases"]], compare=mode,
                          tol=float(tests.get("tol") or tol or 1e-6), wall_s=wall)
    return AssertSuite(code, [str(t) for t in tests])
