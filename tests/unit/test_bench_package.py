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
    # no benchmark reaches into another one: no cycles, and each can move or go on its own
    allowed = set() if module == "common" else {"grpo_plugin.bench.common"}
    assert _bench_imports(module) <= allowed


@pytest.mark.parametrize("module", ["grpo_plugin.bench"] + [f"grpo_plugin.bench.{m}" for m in MODULES])
def test_each_module_imports_alone(module):
    out = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
