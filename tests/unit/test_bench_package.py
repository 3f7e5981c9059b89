"""grpo_plugin.bench: one module per benchmark, shared helpers only in common.py, each importable on its own."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import grpo_plugin.bench

BENCH = Path(grpo_plugin.bench.__file__).parent
MODULES = sorted(m.name for m in pkgutil.iter_modules([str(BENCH)]))


def _bench_imports(module: str) -> set[str]:
    """The grpo_plugin.bench.* modules this one imports (anywhere in it, also inside functions)."""
    tree = ast.parse((BENCH / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("grpo_plugin.bench"):
            found |= ({node.module} if node.module != "grpo_plugin.bench"
                      else {f"grpo_plugin.bench.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("grpo_plugin.bench.")}
    return found - {f"grpo_plugin.bench.{module}"}


def test_the_benchmarks_are_the_expected_modules():
    assert {"common", "lora", "restart", "ipc", "atropos", "__main__"} <= set(MODULES)


@pytest.mark.parametrize("module", [m for m in MODULES if m != "__main__"])
def test_a_benchmark_imports_only_the_shared_helpers(module):
    # no benchmark reaches into another one: no cycles, and each can move or go on its own (the helpers: common,
    # netns, the veth link a benchmark may reach its server over, tail_lengths,
    # the server-side length law of bench async; runs: the `axolotl train` runs the training benchmarks share)
    helpers = ("common", "netns", "runs", "tail_lengths")
    allowed = {"grpo_plugin.bench.common"} if module in helpers else {f"grpo_plugin.bench.{h}" for h in helpers}
    assert _bench_imports(module) <= allowed


@pytest.mark.parametrize("module", ["grpo_plugin.bench"] + [f"grpo_plugin.bench.{m}" for m in MODULES])
def test_each_module_imports_alone(module):
    out = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_e2e_runs_differ_only_where_the_benchmark_says(tmp_path):
    # the sync, async and stock runs of one mode share model, data, batch, learning rate and seed: only prefetch
    # (and, for stock, the plugin lines and vLLM) differ, so their steps/s and rewards compare
    from grpo_plugin.bench import runs

    def cfg(mode, prefetch, seed=None):
        return runs.config(mode, tmp_path / "m", tmp_path / "d.jsonl", tmp_path / "o", 5, 32, 1234, prefetch, 2, seed)

    sync, asyn, stock = cfg("lora_sync", False), cfg("lora_sync", True), cfg("lora_sync", None)
    assert (sync["trl"]["async_prefetch"], asyn["trl"]["async_prefetch"]) == (False, True)
    assert "plugins" not in stock and "grpo" not in stock and stock["trl"]["use_vllm"] is False
    for c in (sync, asyn, stock):
        assert c["learning_rate"] == runs.LORA_LR and c["micro_batch_size"] == 2 * c["trl"]["num_generations"]
        assert c["trl"]["skip_zero_advantage_batches"] is False and c["seed"] == sync["seed"]
    assert cfg("ipc", True)["learning_rate"] == cfg("restart", None)["learning_rate"] == runs.FULL_WEIGHT_LR
    assert cfg("lora_sync", True, seed=7)["seed"] == cfg("lora_sync", None, seed=7)["seed"] == 7
