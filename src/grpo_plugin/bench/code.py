"""Scoring a GRPO batch of code completions: the sandbox against what a user would run instead, on one machine:

    python -m grpo_plugin.bench code [--problems 16] [--group 8] [--json]
    python -m grpo_plugin.bench.code [--problems 16] [--group 8] [--rounds 5] [--json]

The batch: `--problems` HumanEval problems x `--group` completions each (a GRPO batch: prompts x generations), every
completion the canonical solution, every second one broken in its last `return` (so both verdicts occur), and EVERY
completion made distinct by a comment with its index (so no side can skip a repeated program: each one is run).
Every side below scores that exact batch; the figure is completions scored per second, from the MEDIAN over the
same number of timed rounds for both sides of a comparison, the two sides alternated round by round (ABAB..., the
first of each pair swapped every round) so machine noise hits both. One untimed warm-up run of each side comes first
(the sandbox's is reported as its first batch, together with the fork server's start).

- Headline, `speedup_vs_per_completion`: the HumanEval harness's shape. ONE fresh `python` per completion runs the
  program, then each test in its own try/except, and prints one line with a 0/1 per test, which the parent parses
  (no isolation at all); as many such interpreters at once as this machine has cores (threads launching
  subprocesses), `--rounds` rounds (default 5). Sandbox: `Sandbox().run_suites([AssertSuite(code, tests), ...])` with
  every limit on, programs in parallel on the same cores (its default), the same `--rounds` rounds.
- `speedup_vs_per_test` (the old baseline): a fresh `python` per TEST (program + that one test, pass = exit status
  0), as many at once as cores, against the sandbox on min(3, `--rounds`) rounds of its own, alternated the same way.
- `stdio.speedup`: `--problems` synthetic stdin/stdout problems (read numbers, print a function of them) x `--group`
  completions, every second one wrong, 4 tests each, all distinct; baseline a fresh `python` per test with the input
  on stdin (pass = exit status 0 and the same output tokens), as many at once as cores; sandbox `StdioSuite`;
  `--rounds` rounds, alternated.

Beside each headline round's wall clock, the CPU each side's processes spent (`cpu`, milliseconds per completion,
median over the rounds; the sandbox's by part: the trainer's side, the fork server, the programs' processes with
the templates that fork them, the judges), and their ratio `cpu_ratio_vs_per_completion`: with every core busy on
both sides the wall-clock ratio reaches it, where a side leaves cores idle it stays below; unlike the wall clock it
moves little when other work shares the machine.

Every baseline round and every sandbox round must give the same verdict for every test of every completion (the code
is not adversarial here): a mismatch fails the benchmark with the mismatches listed. Also reported, not compared:
the sandbox on the batch as sampled (repeated completions not made distinct: the reward's dedupe runs each distinct
program once), median over `--rounds` rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

from grpo_plugin.bench.common import stack, stack_line
from grpo_plugin.codedata.extract import extract_code
from grpo_plugin.codedata.humaneval import rows
from grpo_plugin.sandbox import AssertSuite, Sandbox, StdioSuite

_MARK = "__grpo_bench_verdicts__ "
_TIMEOUT_S = 10  # per interpreter (a completion's whole run in the per-completion baseline, one test otherwise)


# ---- the batches ------------------------------------------------------------------------------------------------
def _batch(problems: int, group: int) -> list[tuple[str, list[str]]]:
    """The batch as sampled: per problem, `group` completions alternating the canonical solution and a broken one
    (half of them repeat another one)."""
    batch = []
    for p in rows()[:problems]:
        code = extract_code(p["response"])
        head, _, tail = code.rpartition("return ")
        broken = head + "return None and " + tail if head else code
        for k in range(group):
            batch.append((code if k % 2 == 0 else broken, p["test_cases"]))
    return batch


def _distinct(batch: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """Every completion made unique by a comment with its index: no side can run a repeated program once."""
    return [(f"{code.rstrip()}\n# completion {k}\n", tests) for k, (code, tests) in enumerate(batch)]


_STDIO_OPS = ("sum(a)", "max(a)", "min(a)", "len(a)", "sum(x * x for x in a)", "a[0] + a[-1]", "sorted(a)[len(a) // 2]",
              "sum(a) // len(a)")


def _stdio_batch(problems: int, group: int) -> list[tuple[str, list[tuple[str, str]]]]:
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


# ---- the baselines: fresh interpreters, as many at once as cores ------------------------------------------------
def _harness(code: str, tests: list[str]) -> str:
    """The HumanEval harness's shape as one script: the program, then each test in its own try/except, then one line
    with a 0/1 per test. A test that does not compile fails alone (as in the sandbox) instead of the whole script."""
    parts = [code, "", "__grpo_v = []"]
    for t in tests:
        try:
            compile(t, "<test>", "exec")
        except SyntaxError:
            t = "raise SyntaxError('the test does not compile')"
        parts += ["try:", textwrap.indent(t, "    "), "except BaseException:", "    __grpo_v.append('0')", "else:",
                  "    __grpo_v.append('1')"]
    parts.append(f"print({chr(10) + _MARK!r} + ''.join(__grpo_v), flush=True)")
    return "\n".join(parts) + "\n"


def _per_completion_one(code: str, tests: list[str]) -> list[bool]:
    """One fresh interpreter runs the program and all its tests; its last marked line holds the verdicts (a program
    that dies at top level, or an interpreter past its deadline, fails every test)."""
    try:
        out = subprocess.run([sys.executable, "-c", _harness(code, tests)], capture_output=True, text=True,
                             timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return [False] * len(tests)
    line = next((ln for ln in reversed(out.stdout.splitlines()) if ln.startswith(_MARK)), None)
    bits = line[len(_MARK):].strip() if line is not None else ""
    return [b == "1" for b in bits] if len(bits) == len(tests) else [False] * len(tests)


def _per_test_one(code: str, test: str) -> bool:
    try:
        out = subprocess.run([sys.executable, "-c", f"{code}\n{test}\n"], capture_output=True, timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0


def _stdio_one(code: str, case: tuple[str, str]) -> bool:
    try:
        out = subprocess.run([sys.executable, "-c", code], input=case[0], capture_output=True, text=True,
                             timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0 and out.stdout.split() == case[1].split()


def _per_completion(batch, cores: int) -> list[list[bool]]:
    with ThreadPoolExecutor(cores) as pool:
        return list(pool.map(lambda p: _per_completion_one(*p), batch))


def _per_test(batch, cores: int, one) -> list[list[bool]]:
    """A fresh interpreter per test: every (completion, test) of the batch queued at once on `cores` threads."""
    jobs = [(i, t) for i, (_, tests) in enumerate(batch) for t in tests]
    with ThreadPoolExecutor(cores) as pool:
        flat = list(pool.map(lambda j: one(batch[j[0]][0], j[1]), jobs))
    out: list[list[bool]] = [[] for _ in batch]
    for (i, _), ok in zip(jobs, flat):
        out[i].append(ok)
    return out


# ---- CPU: what each side's processes spent, beside the wall clock ----------------------------------------------
def _rusage_s(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _baseline_cpu() -> dict[str, float]:
    """CPU seconds so far of this process and of the interpreters it started and collected (the baselines)."""
    return {"bench": _rusage_s(resource.RUSAGE_SELF), "interpreters": _rusage_s(resource.RUSAGE_CHILDREN)}


class _SandboxCPU:
    """CPU seconds so far of the sandbox's processes, read from /proc: the fork server; the templates with every
    process they forked and collected (programs, replaced judges); the judges alive now; and this process (the
    trainer's side of the sandbox). A judge collected between two readings left the judges' sum with what it had
    spent at the first and entered its template's with all it spent: the difference is what it spent between them.
    Empty where /proc does not list a process's children."""

    def __init__(self, sb: Sandbox):
        self.server, self.templates = sb.fork_server_pid, [p for p in sb.template_pids if p > 0]
        self.tick = os.sysconf("SC_CLK_TCK")

    def _stat(self, pid: int) -> list[float]:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return [int(x) / self.tick for x in fields[11:15]]  # utime, stime, and of collected children

    def __call__(self) -> dict[str, float]:
        try:
            server = sum(self._stat(self.server)[:2])
            judges = 0.0
            for t in self.templates:
                with open(f"/proc/{t}/task/{t}/children") as f:
                    for pid in map(int, f.read().split()):
                        with contextlib.suppress(OSError):  # (collected meanwhile: counted with its template)
                            judges += sum(self._stat(pid)[:2])
            templates = sum(sum(self._stat(t)) for t in self.templates)
        except (OSError, ValueError, IndexError):
            return {}
        return {"trainer": _rusage_s(resource.RUSAGE_SELF), "fork_server": server,
                "programs_and_templates": templates, "judges": judges}


# ---- timing: the same statistic over the same rounds, alternated ------------------------------------------------
def _timed(fn) -> tuple[float, list[list[bool]]]:
    t0 = time.perf_counter()
    verdicts = fn()
    return time.perf_counter() - t0, verdicts


def _alternated(rounds: int, sides: dict, check, cpu: dict | None = None) -> dict[str, list[float]]:
    """`rounds` rounds of every side (the order reversed every other round); seconds per round for each side.
    `check(side, verdicts)` is called with every run's verdicts. `cpu` (side -> a function giving that side's CPU
    seconds so far, by part): each round's CPU by part is kept under "<side>/cpu"."""
    names = list(sides)
    seconds: dict[str, list] = {n: [] for n in names}
    for name in cpu or {}:
        seconds[f"{name}/cpu"] = []
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            before = cpu[name]() if cpu and name in cpu else None
            s, verdicts = _timed(sides[name])
            seconds[name].append(s)
            if before is not None:
                after = cpu[name]()
                seconds[f"{name}/cpu"].append({k: after[k] - before[k] for k in after if k in before})
            check(name, verdicts)
    return seconds


def _cpu_figure(rounds: list[dict], completions: int) -> dict | None:
    """Median CPU milliseconds per completion, in all and by part (None where it could not be read)."""
    if not rounds or not all(rounds):
        return None
    parts = {k: statistics.median(r[k] for r in rounds) * 1000 / completions for k in rounds[0]}
    total = statistics.median(sum(r.values()) for r in rounds) * 1000 / completions
    return {"ms_per_completion": round(total, 3), "parts_ms": {k: round(v, 3) for k, v in parts.items()}}


def _figure(seconds: list[float], completions: int) -> dict:
    med = statistics.median(seconds)
    return {"median_s": round(med, 4), "min_s": round(min(seconds), 4), "rounds_s": [round(s, 4) for s in seconds],
            "completions_per_s": round(completions / med, 1)}


class _Verdicts:
    """Every run's verdicts against the reference (the first sandbox run): mismatches by (side, completion, test)."""

    def __init__(self, batch, reference: list[list[bool]]):
        self.batch, self.ref, self.mismatches, self.runs = batch, reference, {}, 0

    def check(self, side: str, verdicts: list[list[bool]]) -> None:
        self.runs += 1
        for i, (want, got) in enumerate(zip(self.ref, verdicts)):
            if len(want) != len(got):
                self.mismatches.setdefault((side, i, None), (want, got))
                continue
            for j, (a, b) in enumerate(zip(want, got)):
                if a != b:
                    self.mismatches.setdefault((side, i, j), (a, b))

    def agree(self) -> int:
        return len(self.batch) - len({i for _, i, _ in self.mismatches})

    def listed(self, limit: int = 20) -> list[dict]:
        out = []
        for (side, i, j), (sandbox, other) in list(self.mismatches.items())[:limit]:
            tests = self.batch[i][1]
            out.append({"side": side, "completion": i, "test": j,
                        "test_text": str(tests[j])[:200] if j is not None else None,
                        "sandbox": sandbox, side: other})
        return out


def _results(results) -> list[list[bool]]:
    return [list(r.passed) for r in results]


# ---- the benchmark ----------------------------------------------------------------------------------------------
def run(problems: int = 16, group: int = 8, rounds: int = 5) -> dict:
    t_start = time.perf_counter()
    rounds = max(1, rounds)
    per_test_rounds = min(3, rounds)
    cores = len(os.sched_getaffinity(0))
    sampled = _batch(problems, group)
    batch = _distinct(sampled)
    tests = sum(len(t) for _, t in batch)
    suites = [AssertSuite(code, tests_) for code, tests_ in batch]
    t0 = time.perf_counter()
    with Sandbox() as sb:  # its default number of programs at once (host.default_workers)
        start_s = time.perf_counter() - t0
        first_s, reference = _timed(lambda: _results(sb.run_suites(suites)))  # warm-up (the first batch)
        isolation = getattr(sb, "isolation", "")
        v = _Verdicts(batch, reference)
        v.check("per_completion", _per_completion(batch, cores))  # the baseline's warm-up (untimed)

        def sandbox() -> list[list[bool]]:
            return _results(sb.run_suites(suites))

        head = _alternated(rounds, {"per_completion": lambda: _per_completion(batch, cores), "sandbox": sandbox},
                           v.check, cpu={"per_completion": _baseline_cpu, "sandbox": _SandboxCPU(sb)})
        slow = _alternated(per_test_rounds, {"per_test": lambda: _per_test(batch, cores, _per_test_one),
                                             "sandbox": sandbox}, v.check)
        as_sampled = _alternated(rounds, {"sandbox_as_sampled": lambda: _results(sb.run(sampled))}, v.check)
        unique = getattr(sb, "last_unique", None)
    stdio = _run_stdio(problems, group, cores, rounds)
    mismatched = v.listed()
    if mismatched or stdio["mismatches"]:
        raise AssertionError(f"the sandbox and the baselines disagree on verdicts (first ones listed): "
                             f"asserts {mismatched}; stdin/stdout {stdio['mismatches']}")
    pc, sb_head = _figure(head["per_completion"], len(batch)), _figure(head["sandbox"], len(batch))
    pc["cpu"] = _cpu_figure(head["per_completion/cpu"], len(batch))
    sb_head["cpu"] = _cpu_figure(head["sandbox/cpu"], len(batch))
    cpu_ratio = (round(pc["cpu"]["ms_per_completion"] / sb_head["cpu"]["ms_per_completion"], 2)
                 if pc["cpu"] and sb_head["cpu"] else None)
    pt, sb_slow = _figure(slow["per_test"], len(batch)), _figure(slow["sandbox"], len(batch))
    return {
        "stack": stack(), "cores": cores, "completions": len(batch), "test_cases": tests, "distinct": True,
        "statistic": "median", "rounds": rounds,
        "sandbox_isolation": isolation, "sandbox_start_s": round(start_s, 3),
        "sandbox_first_batch_s": round(first_s, 3),
        "per_completion": {**pc, "interpreters": len(batch)},
        "sandbox": sb_head,
        "speedup_vs_per_completion": round(pc["median_s"] / sb_head["median_s"], 2),
        "cpu_ratio_vs_per_completion": cpu_ratio,
        "per_test": {**pt, "interpreters": tests, "rounds": per_test_rounds, "sandbox": sb_slow},
        "speedup_vs_per_test": round(pt["median_s"] / sb_slow["median_s"], 2),
        "sandbox_as_sampled": {**_figure(as_sampled["sandbox_as_sampled"], len(batch)), "unique_programs": unique},
        "verdicts_agree": f"{v.agree()}/{len(batch)}", "verdict_runs_checked": v.runs, "mismatches": mismatched,
        "stdio": stdio,
        "wall_s": round(time.perf_counter() - t_start, 1),
    }


def _run_stdio(problems: int, group: int, cores: int, rounds: int) -> dict:
    batch = _distinct(_stdio_batch(problems, group))
    suites = [StdioSuite(code, cases) for code, cases in batch]
    with Sandbox() as sb:
        _, reference = _timed(lambda: _results(sb.run_suites(suites)))  # warm-up
        v = _Verdicts(batch, reference)
        v.check("per_test", _per_test(batch, cores, _stdio_one))  # the baseline's warm-up (untimed)
        sec = _alternated(rounds, {"per_test": lambda: _per_test(batch, cores, _stdio_one),
                                   "sandbox": lambda: _results(sb.run_suites(suites))}, v.check)
    base, ours = _figure(sec["per_test"], len(batch)), _figure(sec["sandbox"], len(batch))
    return {"completions": len(batch), "tests": sum(len(c) for _, c in batch), "rounds": rounds,
            "per_test": {**base, "interpreters": sum(len(c) for _, c in batch)}, "sandbox": ours,
            "speedup": round(base["median_s"] / ours["median_s"], 2),
            "verdicts_agree": f"{v.agree()}/{len(batch)}", "mismatches": v.listed()}


def report(res: dict) -> None:
    def line(label: str, fig: dict, extra: str = "") -> None:
        print(f"  {label:<52} {fig['completions_per_s']:>8.1f} completions/s  median {fig['median_s']:.3f} s "
              f"(min {fig['min_s']:.3f}){extra}")

    print(f"code reward: {res['completions']} distinct completions, {res['test_cases']} test cases, "
          f"{res['cores']} cores; median of {res['rounds']} alternated rounds per side")
    print(stack_line(res["stack"]))
    print(f"  sandbox: {res['sandbox_isolation'] or '?'}; fork server start {res['sandbox_start_s']:.2f} s, "
          f"first batch {res['sandbox_first_batch_s']:.3f} s (untimed warm-up)")
    line(f"python per completion, all its tests ({res['per_completion']['interpreters']} starts)",
         res["per_completion"])
    line("sandbox", res["sandbox"], f"  -> {res['speedup_vs_per_completion']:.1f}x  (speedup_vs_per_completion)")
    pc_cpu, sb_cpu = res["per_completion"]["cpu"], res["sandbox"]["cpu"]
    if pc_cpu and sb_cpu:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in sb_cpu["parts_ms"].items())
        print(f"  CPU per completion (median): python {pc_cpu['ms_per_completion']:.2f} ms, sandbox "
              f"{sb_cpu['ms_per_completion']:.2f} ms ({parts}) -> {res['cpu_ratio_vs_per_completion']:.1f}x "
              f"(cpu_ratio_vs_per_completion: the most the wall-clock ratio reaches with every core busy)")
    pt = res["per_test"]
    print(f"  per test (old baseline), median of {pt['rounds']} alternated rounds per side:")
    line(f"python per test ({pt['interpreters']} starts)", pt)
    line("sandbox", pt["sandbox"], f"  -> {res['speedup_vs_per_test']:.1f}x  (speedup_vs_per_test)")
    sa = res["sandbox_as_sampled"]
    line(f"sandbox, batch as sampled ({sa['unique_programs']} programs run)", sa, "  (not compared)")
    print(f"  verdicts agree: {res['verdicts_agree']} ({res['verdict_runs_checked']} runs checked)")
    st = res["stdio"]
    print(f"stdin/stdout: {st['completions']} distinct completions, {st['tests']} tests; median of {st['rounds']} "
          f"alternated rounds per side")
    line(f"python per test, input on stdin ({st['per_test']['interpreters']} starts)", st["per_test"])
    line("sandbox", st["sandbox"], f"  -> {st['speedup']:.1f}x")
    print(f"  verdicts agree: {st['verdicts_agree']}")
    print(f"  benchmark wall time {res['wall_s']:.1f} s")


def main(argv: list[str] | None = None) -> None:
    """`python -m grpo_plugin.bench.code`: the same benchmark with `--rounds` settable."""
    ap = argparse.ArgumentParser(prog="python -m grpo_plugin.bench.code", description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=16, help="HumanEval problems in the batch")
    ap.add_argument("--group", type=int, default=8, help="completions per problem")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per side (median); per test: min(3, this)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    for name in ("problems", "group", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} {getattr(args, name)}: at least 1")
    with contextlib.redirect_stdout(sys.stderr):
        out = run(args.problems, args.group, args.rounds)
    if args.json:
        print(json.dumps(out))
    else:
        report(out)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
