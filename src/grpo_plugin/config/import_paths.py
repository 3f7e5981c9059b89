"""Import paths the config names (`module.function`: reward functions, tools, environment factories), imported as
axolotl imports them: from the run's directory. Preflight checks them with this before the model loads; the agents
and the Atropos producer import what they name with it while training."""

from __future__ import annotations

import importlib
import os
import sys
from contextlib import contextmanager


@contextmanager
def cwd_importable():
    """axolotl's trainer runs as `python -m ...` from the working directory, which is then on sys.path."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added:
            sys.path.remove(cwd)


def import_callable(fqn: str):
    """The function `module.attr` names (the run's directory importable, as for trl.reward_funcs); the config
    check (preflight.reward_func_problem) has already said what is wrong with a path that does not resolve."""
    module_name, _, attr = fqn.rpartition(".")
    with cwd_importable():
        return getattr(importlib.import_module(module_name), attr)
