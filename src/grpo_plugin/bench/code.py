"""Scoring a GRPO batch of code completions: the sandbox against the naive way, same batch, one run:

    python -m grpo_plugin.bench code [--problems 16] [--group 8] [--json]

The batch: `--problems` HumanEval problems x `--group` completions each (a GRPO batch: prompts x generations), every
completion the canonical solution, half of them broken in their last `return` (so both verdicts occur). Naive: a
fresh `python` per test case, program + test, pass = exit status 0 (no isolation at all; the usual way), run with as
many processes at once as this machine has cores. Sandbox: grpo_plugin.sandbox with every limit on (network
namespace, audit hook, rlimits, scratch dirs), programs in parallel on the same cores (its default: one more
program than cores, for the fork server's own share). Both must agree on every
verdict (the code is not adversarial here); the figure is completions scored per second.
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
    t0 = time.perf_counter()
    with Sandbox() as sb:  # its default: cores + 1 programs at once
        start_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        ours = sb.run(batch)
        sandbox_s = time.perf_counter() - t1
        warm_s = float("inf")
        for _ in range(3):  # later batches on the warm fork server (what every step after the first costs): best
            t1 = time.perf_counter()
            sb.run(batch)
            warm_s = min(warm_s, time.perf_counter() - t1)
    agree = sum(n == r.passed for n, r in zip(naive, ours))
    return {
        "stack": stack(), "cores": cores, "completions": len(batch), "test_cases": tests,
        "naive": {"seconds": round(naive_s, 3), "completions_per_s": round(len(batch) / naive_s, 1)},
        "sandbox": {"seconds": round(sandbox_s, 3), "completions_per_s": round(len(batch) / sandbox_s, 1),
                    "warm_seconds": round(warm_s, 3), "warm_completions_per_s": round(len(batch) / warm_s, 1),
                    "start_s": round(start_s, 3), "isolation": sb.isolation},
        "speedup": round(naive_s / sandbox_s, 1), "speedup_warm": round(naive_s / warm_s, 1),
        "verdicts_agree": f"{agree}/{len(batch)}",
    }


def report(res: dict) -> None:
    print(f"code reward: {res['completions']} completions, {res['test_cases']} test cases, {res['cores']} cores")
    print(stack_line(res["stack"]))
    print(f"  naive (python per test case, no isolation) {res['naive']['completions_per_s']:>8.1f} completions/s")
    print(f"  sandbox (first batch)                      {res['sandbox']['completions_per_s']:>8.1f} completions/s"
          f"  ({res['speedup']:.1f}x)")
    print(f"  sandbox (warm)                             {res['sandbox']['warm_completions_per_s']:>8.1f} "
          f"completions/s  ({res['speedup_warm']:.1f}x); fork server start {res['sandbox']['start_s']:.2f} s")
    print(f"  verdicts agree: {res['verdicts_agree']}")
