"""Check a code dataset before training on it:

    python -m grpo_plugin.codedata.check data/code/train.jsonl [--json] [--no-run]

Per row: is it a JSON object; does it have a prompt (`instruction`, or `input` for input/output rows) and a
reference (`response` / `output`; `follow_up_response` for a multi-turn row); do its `test_cases` parse; does the
reference's code parse; and does the reference pass its own tests in the sandbox (the same one the reward uses).
Competitive-programming rows (APPS, TACO, CodeContests, Codeforces, LiveCodeBench: codedata/contests.py) are read
as `rewards.code_contest_transform` reads them: tests present and well-formed, and the reference solution, when
the row has one, passing its stdin/stdout or call-based tests.
Prints one line per row with a problem, then the counts; exits 1 when any row has an error (warnings — a row
without test cases, which the execution reward scores 0 — do not fail the check).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from grpo_plugin.codedata.contests import RowError, is_contest_row, parse_row
from grpo_plugin.codedata.extract import extract_code, parses
from grpo_plugin.sandbox import Sandbox
from grpo_plugin.sandbox.suites import suite_for

FORMATS = (("instruction", "response"), ("input", "output"))


@dataclass
class RowReport:
    line: int
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _contest_row(rep: RowReport, row: dict) -> tuple[RowReport, tuple[str, dict] | None]:
    try:
        problem = parse_row(row)
    except RowError as exc:
        rep.errors.append(str(exc))
        return rep, None
    if problem.reference is None:
        rep.warnings.append("no reference solution: its tests were checked for shape only, not by running one")
        return rep, None
    code = extract_code(problem.reference)
    if not parses(code):
        rep.warnings.append("the reference solution does not parse as Python 3: its tests were checked for shape only")
        return rep, None
    return rep, (code, problem.tests)


def _describe(tests, i: int) -> str:
    if isinstance(tests, dict):
        return f"input {str(tests['cases'][i][0])[:60]!r}"
    return repr(tests[i][:80])


def inspect_row(line_no: int, text: str) -> tuple[RowReport, tuple[str, list[str] | dict] | None]:
    """Static checks of one line; (report, (reference code, tests) to run, or None)."""
    rep = RowReport(line_no)
    try:
        row = json.loads(text)
    except ValueError as exc:
        rep.errors.append(f"not valid JSON ({exc})")
        return rep, None
    if not isinstance(row, dict):
        rep.errors.append(f"a JSON {type(row).__name__}, not an object")
        return rep, None
    if is_contest_row(row):
        return _contest_row(rep, row)
    fmt = next((f for f in FORMATS if f[0] in row), None)
    if fmt is None:
        rep.errors.append("no prompt field: expected 'instruction' (or 'input'); use a custom transform for other "
                          "field names (docs/code.md#your-own-transform)")
        return rep, None
    prompt_key, response_key = fmt
    if not str(row.get(prompt_key) or "").strip():
        rep.errors.append(f"'{prompt_key}' is empty")
    ref_key = "follow_up_response" if row.get("follow_up") else response_key
    reference = row.get(ref_key)
    if not isinstance(reference, str) or not reference.strip():
        rep.errors.append(f"no reference solution in '{ref_key}'")
        reference = None
    raw_tests = row.get("test_cases")
    tests: list[str] = []
    if raw_tests is None or raw_tests == []:
        rep.warnings.append("no test_cases: code_execution_reward scores every completion of this row 0")
    elif not isinstance(raw_tests, list) or not all(isinstance(t, str) for t in raw_tests):
        rep.errors.append("test_cases must be a list of strings (Python statements)")
    else:
        for i, t in enumerate(raw_tests):
            try:
                ast.parse(t)
                tests.append(t)
            except (SyntaxError, ValueError) as exc:
                rep.errors.append(f"test {i} does not parse ({exc.__class__.__name__}: {exc}): {t[:80]!r}")
    if reference is not None:
        code = extract_code(reference)
        try:
            ast.parse(code)
        except (SyntaxError, ValueError) as exc:  # one parse, which also says where
            where = f"line {exc.lineno}: {exc.msg}" if isinstance(exc, SyntaxError) else str(exc)
            rep.errors.append(f"the reference's code does not parse ({where})")
            return rep, None
        if tests and len(tests) == len(raw_tests):
            return rep, (code, tests)
    return rep, None


def check_file(path: Path, run: bool = True, progress=sys.stderr) -> dict:
    reports: list[RowReport] = []
    to_run: list[tuple[RowReport, tuple[str, list[str] | dict]]] = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for n, text in enumerate(fh, 1):
            if not text.strip():
                continue
            rep, job = inspect_row(n, text)
            reports.append(rep)
            if job is not None:
                to_run.append((rep, job))
    ran = 0
    if run and to_run:
        t0 = time.monotonic()
        with Sandbox() as sb:
            for start in range(0, len(to_run), 64):
                chunk = to_run[start:start + 64]
                results = sb.run_suites([suite_for(code, tests) for _, (code, tests) in chunk])
                for (rep, (_, tests)), res in zip(chunk, results):
                    for i, (ok, why) in enumerate(zip(res.passed, res.detail)):
                        if not ok:
                            rep.errors.append(f"the reference fails its test {i} ({why}): {_describe(tests, i)}")
                ran += len(chunk)
                print(f"[check] ran {ran}/{len(to_run)} references against their tests "
                      f"({time.monotonic() - t0:.0f} s)", file=progress, flush=True)
    bad = [r for r in reports if r.errors]
    return {
        "file": str(path), "rows": len(reports), "ok": len(reports) - len(bad),
        "rows_with_errors": len(bad), "rows_with_warnings": sum(1 for r in reports if r.warnings),
        "references_run": ran,
        "problems": [{"line": r.line, "errors": r.errors, "warnings": r.warnings}
                     for r in reports if r.errors or r.warnings],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m grpo_plugin.codedata.check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", type=Path)
    ap.add_argument("--no-run", action="store_true", help="static checks only (no sandbox)")
    ap.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = ap.parse_args(argv)
    if not args.file.is_file():
        print(f"no such file: {args.file}", file=sys.stderr)
        return 2
    report = check_file(args.file, run=not args.no_run)
    if args.json:
        print(json.dumps(report))
    else:
        for p in report["problems"]:
            for e in p["errors"]:
                print(f"line {p['line']}: ERROR {e}")
            for w in p["warnings"]:
                print(f"line {p['line']}: warning {w}")
        print(f"{report['file']}: {report['rows']} rows, {report['ok']} ok, {report['rows_with_errors']} with "
              f"errors, {report['rows_with_warnings']} with warnings; {report['references_run']} references run "
              "against their tests")
    return 1 if report["rows_with_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
