"""Scoring a GRPO batch of code completions: the sandbox against the naive way, same batch, one run:

    python -m grpo_plugin.bench code [--problems 16] [--group 8] [--json]

The batch: `--problems` HumanEval problems x `--group` completions each (a GRPO batch: prompts x generations), every
completion the canonical solution, half of them broken in their last `return` (so both verdicts occur). The
sandbox runs it twice: every completion made distinct by a comment (each one run: the cost per program), and as
sampled, where the reward's dedupe runs each distinct program once. Naive: a
fresh `python` per test case, program + test, pass = exit status 0 (no isolation at all; the usual way), run with as
many processes at once as this machine has cores. Sandbox: grpo_plugin.sandbox with every limit on (network
namespace, audit hook, rlimits, scratch dirs), programs in parallel on the same cores (its default: one more
program than cores, for the fork server's own share). Both must agree on every
verdict (the code is not adversarial here); the figure is completions scored per second.

The stdin/stdout path (`stdio` in the output): `--problems` synthetic problems (read numbers, print a function of
them) x `--group` completions, half of them wrong, 4 tests each; naive: a fresh `python` per test with the input on
stdin, pass = exit status 0 and the same output tokens; sandbox: StdioSuite (a child per program, a run per test).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from grpo_plugin.bench.common import stack, stack_line


def _batch(problems: int, group: int) -> list[tuple[str, list[str]]]:
    from grpo_plugin.codedata.extract import extract_code
    from grpo_plugin.codedata.humaneval import rows

    batch = []
    for p in rows()[:problems]:
        code = extract_code(p["response"])
        head, _, tail = code.rpartition("return ")
        broken = head + "return None and " + tail if head else code
        for k in range(group):
            batch.append((code if k % 2 == 0 else broken, p["test_cases"]))
    return batch


_STDIO_OPS = ("sum(a)", "max(a)", "min(a)", "len(a)", "sum(x * x for x in a)", "a[0] + a[-1]", "sorted(a)[len(a) // 2]",
              "sum(a) // len(a)")


def _stdio_batch(problems: int, group: int) -> list[tuple[str, list[tuple[str, str]]]]:
    import random

    rng = random.Random(0)
    batch = []
    for p in range(problems):
        op = _STDIO_OPS[p % len(_STDIO_OPS)]
        cases = []
        for _ in range(4):
            a = [rng.randint(1, 99) for _ in range(rng.randint(2, 9))]
            cases.append((f"{len(a)}\n{' '.join(map(str, a))}\n", f"{eval(op, {'a': a})}\n"))  # noqa: S307
        good = f"n = int(input())\na = list(map(int, input().split()))\nprint({op})\n"
        bad = good.replace("print(", "print(1 + ")
        for k in range(group):
            batch.append((good if k % 2 == 0 else bad, cases))
    return batch


def _naive_stdio(code: str, case: tuple[str, str]) -> bool:
    try:
        out = subprocess.run([sys.executable, "-c", code], input=case[0], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0 and out.stdout.split() == case[1].split()


def _best_of(run, rounds: int = 10) -> tuple[float, list]:
    """(best seconds, results) of `rounds` runs of `run()` on the warm fork server (what every step after the
    first costs)."""
    best, results = float("inf"), []
    for _ in range(rounds):
        t1 = time.perf_counter()
        results = run()
        best = min(best, time.perf_counter() - t1)
    return best, results


def _naive_one(code: str, test: str) -> bool:
    try:
        out = subprocess.run([sys.executable, "-c", f"{code}\n{test}\n"], capture_output=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0


def run(problems: int = 16, group: int = 8) -> dict:
    from grpo_plugin.sandbox import Sandbox

    batch = _batch(problems, group)
    cores = len(os.sched_getaffinity(0))
    tests = sum(len(t) for _, t in batch)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(cores) as pool:
        naive = [list(pool.map(lambda t, c=code: _naive_one(c, t), tests_)) for code, tests_ in batch]
    naive_s = time.perf_counter() - t0
    from grpo_plugin.sandbox import AssertSuite

    # every completion made distinct (a comment of its own), so each one is run: the per-program cost; the
    # batch as sampled (half its completions repeat another) is then scored with dedupe on, as the reward does
    distinct = [AssertSuite(f"{code}\n# completion {k}\n", tests_) for k, (code, tests_) in enumerate(batch)]
    t0 = time.perf_counter()
    with Sandbox() as sb:  # its default: cores + 1 programs at once
        start_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        ours = sb.run_suites(distinct)
        sandbox_s = time.perf_counter() - t1
        warm_s, _ = _best_of(lambda: sb.run_suites(distinct))
        dedupe_s, deduped = _best_of(lambda: sb.run(batch))
        unique = sb.last_unique
    agree = sum(n == r.passed == d.passed for n, r, d in zip(naive, ours, deduped))
    stdio = _run_stdio(problems, group, cores)
    return {
        "stack": stack(), "cores": cores, "completions": len(batch), "test_cases": tests,
        "naive": {"seconds": round(naive_s, 3), "completions_per_s": round(len(batch) / naive_s, 1)},
        "sandbox": {"seconds": round(sandbox_s, 3), "completions_per_s": round(len(batch) / sandbox_s, 1),
                    "warm_seconds": round(warm_s, 3), "warm_completions_per_s": round(len(batch) / warm_s, 1),
                    "start_s": round(start_s, 3), "isolation": sb.isolation},
        "sandbox_dedupe": {"unique_programs": unique, "warm_seconds": round(dedupe_s, 3),
                           "warm_completions_per_s": round(len(batch) / dedupe_s, 1)},
        "speedup": round(naive_s / sandbox_s, 1), "speedup_warm": round(naive_s / warm_s, 1),
        "speedup_dedupe": round(naive_s / dedupe_s, 1),
        "verdicts_agree": f"{agree}/{len(batch)}",
        "stdio": stdio,
    }


def _run_stdio(problems: int, group: int, cores: int) -> dict:
    from grpo_plugin.sandbox import Sandbox, StdioSuite

    batch = _stdio_batch(problems, group)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(cores) as pool:
        naive = [list(pool.map(lambda c, code=code: _naive_stdio(code, c), cases)) for code, cases in batch]
    naive_s = time.perf_counter() - t0
    distinct = [StdioSuite(f"{code}# completion {k}\n", cases) for k, (code, cases) in enumerate(batch)]
    with Sandbox() as sb:
        warm_s, ours = _best_of(lambda: sb.run_suites(distinct))
        dedupe_s, deduped = _best_of(lambda: sb.run_suites([StdioSuite(code, cases) for code, cases in batch]))
        unique = sb.last_unique
    agree = sum(n == r.passed == d.passed for n, r, d in zip(naive, ours, deduped))
    return {"completions": len(batch), "tests": sum(len(c) for _, c in batch),
            "naive": {"seconds": round(naive_s, 3), "completions_per_s": round(len(batch) / naive_s, 1)},
            "sandbox": {"warm_seconds": round(warm_s, 3), "warm_completions_per_s": round(len(batch) / warm_s, 1)},
            "sandbox_dedupe": {"unique_programs": unique, "warm_seconds": round(dedupe_s, 3),
                               "warm_completions_per_s": round(len(batch) / dedupe_s, 1)},
            "speedup_warm": round(naive_s / warm_s, 1), "speedup_dedupe": round(naive_s / dedupe_s, 1),
            "verdicts_agree": f"{agree}/{len(batch)}"}


def report(res: dict) -> None:
    print(f"code reward: {res['completions']} completions, {res['test_cases']} test cases, {res['cores']} cores")
    print(stack_line(res["stack"]))
    print(f"  naive (python per test case, no isolation) {res['naive']['completions_per_s']:>8.1f} completions/s")
    print(f"  sandbox (first batch, every completion run) {res['sandbox']['completions_per_s']:>7.1f} completions/s"
          f"  ({res['speedup']:.1f}x)")
    print(f"  sandbox (warm, every completion run)       {res['sandbox']['warm_completions_per_s']:>8.1f} "
          f"completions/s  ({res['speedup_warm']:.1f}x); fork server start {res['sandbox']['start_s']:.2f} s")
    dd = res["sandbox_dedupe"]
    print(f"  sandbox (warm, the batch as sampled: {dd['unique_programs']} distinct programs run) "
          f"{dd['warm_completions_per_s']:>8.1f} completions/s  ({res['speedup_dedupe']:.1f}x)")
    print(f"  verdicts agree: {res['verdicts_agree']}")
    st = res["stdio"]
    print(f"stdin/stdout: {st['completions']} completions, {st['tests']} tests")
    print(f"  naive (python per test, input on stdin)   {st['naive']['completions_per_s']:>8.1f} completions/s")
    print(f"  sandbox (warm, every completion run)       {st['sandbox']['warm_completions_per_s']:>8.1f} "
          f"completions/s  ({st['speedup_warm']:.1f}x)")
    print(f"  sandbox (warm, as sampled: {st['sandbox_dedupe']['unique_programs']} distinct programs run)"
          f"   {st['sandbox_dedupe']['warm_completions_per_s']:>8.1f} completions/s  ({st['speedup_dedupe']:.1f}x); "
          f"verdicts agree: {st['verdicts_agree']}")
