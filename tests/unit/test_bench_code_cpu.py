"""The code benchmark's CPU figures: what each side's processes spent per completion, beside the wall clock. The
arithmetic on a fake meter, and the sandbox's meter on a real sandbox (its processes are read from /proc)."""

from __future__ import annotations

import itertools

import pytest

from grpo_plugin.bench import code as bench_code
from grpo_plugin.sandbox import AssertSuite, Sandbox, SandboxUnavailable


def test_cpu_figure_is_the_median_per_completion_in_all_and_by_part():
    rounds = [{"a": 0.010, "b": 0.002}, {"a": 0.030, "b": 0.001}, {"a": 0.020, "b": 0.004}]
    fig = bench_code._cpu_figure(rounds, completions=10)
    assert fig["parts_ms"] == {"a": 2.0, "b": 0.2}
    assert fig["ms_per_completion"] == 2.4  # the median of the rounds' sums (12, 31, 24 ms): not 2.2, the medians' sum
    assert bench_code._cpu_figure([], 10) is None
    assert bench_code._cpu_figure([{"a": 1.0}, {}], 10) is None  # a round that could not be read: no figure


def test_alternated_keeps_each_rounds_cpu_by_part_for_the_sides_that_have_a_meter():
    clock = itertools.count()
    meter = lambda: {"x": float(next(clock))}  # noqa: E731 - each reading one second after the last
    seen = []
    out = bench_code._alternated(3, {"metered": lambda: [[True]], "plain": lambda: [[False]]},
                                 lambda side, v: seen.append(side), cpu={"metered": meter})
    assert out["metered/cpu"] == [{"x": 1.0}] * 3 and "plain/cpu" not in out
    assert len(out["metered"]) == len(out["plain"]) == 3
    assert seen == ["metered", "plain", "plain", "metered", "metered", "plain"]  # order reversed every round


def test_the_sandbox_meter_sees_the_programs_and_their_judges_spend_cpu():
    try:
        sb = Sandbox(workers=2)
    except SandboxUnavailable as exc:
        pytest.skip(f"no sandbox here: {exc}")
    with sb:
        suites = [AssertSuite(f"def f(x):\n    return sum(i * i for i in range(x))\n# {k}\n",
                              [f"assert f({n}) == {sum(i * i for i in range(n))}" for n in (10, 20000, 40000)])
                  for k in range(12)]
        assert all(all(r.passed) for r in sb.run_suites(suites))
        meter = bench_code._SandboxCPU(sb)
        before = meter()
        assert set(before) == {"trainer", "fork_server", "programs_and_templates", "judges"}
        assert all(all(r.passed) for r in sb.run_suites(suites))
        after = meter()
    spent = {k: after[k] - before[k] for k in after}
    assert all(v >= 0 for v in spent.values())
    # 12 programs each summing 60,000 squares: their processes' CPU is counted (clock ticks: at least one)
    assert spent["programs_and_templates"] > 0
