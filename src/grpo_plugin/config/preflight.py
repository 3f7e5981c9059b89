"""Checks of what the config points at, run by the plugin's schema validation, before anything loads.

A typo in a reward function's import path otherwise shows up after the model has loaded; a quickstart run before
its model was built fails inside transformers with a hub-id error; a full-weight sync into a /dev/shm smaller
than the model fails at the first push. All problems are collected and reported in ONE message.

Only what can be checked without loading anything: import paths (imported as axolotl will, from the working
directory), local paths (a value that starts with `./`, `../`, `/` or `~`, or a dataset file name), and the
sync directory (writable; for full-weight modes, room for one copy of the weights, sized from the local
checkpoint's safetensors headers). Hub ids are left to the hub.

`GRPOPluginArgs` (grpo_plugin/args.py, what axolotl merges into its config model) runs these after the cross-key
checks and the sync mode's own rules.
"""

from __future__ import annotations

import difflib
import importlib
import math
import os
import pkgutil
import shutil
from pathlib import Path
from typing import Any

from grpo_plugin.config.import_paths import cwd_importable, import_callable
from grpo_plugin.config.modes import DEFAULT_SYNC, MODES
from grpo_plugin.config.request_check import request_problems
from grpo_plugin.config.server import trainer_dtype
from grpo_plugin.config.storage import default_sync_root

DATA_SUFFIXES = (".json", ".jsonl", ".parquet", ".csv", ".arrow", ".txt", ".tsv")
TINY_BUILD = "python -m grpo_plugin.demo --out demo"  # builds ./demo/tiny-qwen2 and ./demo/data (quickstarts)


def _as_dict(value: Any) -> dict:
    """Config sections arrive as dicts or as axolotl's pydantic models (datasets are SFTDataset objects)."""
    if isinstance(value, dict):
        return value
    dump = getattr(value, "model_dump", None)
    return dump() if callable(dump) else {}


def looks_local(value: str) -> bool:
    return value.startswith(("./", "../", "/", "~")) or value in (".", "..")


TOOL_DEMO = ("-tools", "lookup.jsonl", "code_agent.jsonl")  # what only `--tool-warm-start` builds


def _demo_hint(value: str) -> str:
    if "demo/" not in value:
        return ""
    build = f"{TINY_BUILD} --tool-warm-start" if any(part in value for part in TOOL_DEMO) else TINY_BUILD
    return f" Build the demo model and data first: `{build}` (from the repo root)."


def _suggest(name: str, candidates) -> str:
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def _submodules(package: str) -> list[str]:
    try:
        pkg = importlib.import_module(package)
    except Exception:
        return []
    return [m.name for m in pkgutil.iter_modules(getattr(pkg, "__path__", []))]


def reward_func_problem(fqn: Any, key: str = "trl.reward_funcs", *, models: bool = True) -> str | None:
    """None if `fqn` resolves as axolotl will resolve it (a callable, or with `models` a reward-model path / hub id);
    else what is wrong, naming `key`. The module stays imported: axolotl finds it then even where the run's directory
    is not on sys.path (`--launcher python`)."""
    if not isinstance(fqn, str) or not fqn:
        return f"{key}: {fqn!r} is not an import path (module.function)"
    if models and (os.path.isdir(fqn) or "/" in fqn):
        return None  # a reward model (local dir or hub id): axolotl loads it
    module_name, _, attr = fqn.rpartition(".")
    if not module_name:
        return f"{key}: {fqn!r} is not an import path (module.function)"
    with cwd_importable():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = exc.name or module_name
            parent = missing.rpartition(".")[0]
            hint = _suggest(missing, [f"{parent}.{m}" for m in _submodules(parent)]) if parent else ""
            return (f"{key}: {fqn!r}: module {missing!r} not found (imported from {os.getcwd()})."
                    f"{hint}")
        except Exception as exc:  # the module exists but fails to import
            return f"{key}: {fqn!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
    fn = getattr(module, attr, None)
    if fn is None:
        public = [n for n in dir(module) if not n.startswith("_")]
        return f"{key}: {fqn!r}: {module_name!r} has no {attr!r}.{_suggest(attr, public)}"
    if not callable(fn):
        return f"{key}: {fqn!r} is a {type(fn).__name__}, not a function"
    return None


def tool_problem(fqn: Any, key: str = "grpo.tools") -> str | None:
    """None if `fqn` names a function the chat template can show the model (type hints and an Args docstring:
    transformers' get_json_schema, as TRL's tools need); else what is wrong."""
    problem = reward_func_problem(fqn, key)
    if problem or not isinstance(fqn, str) or "/" in fqn:
        return problem or (f"{key}: {fqn!r} is not an import path (module.function)" if "/" in str(fqn) else None)
    from transformers.utils import get_json_schema  # here: tools are rare, and transformers is loaded by then

    try:
        get_json_schema(import_callable(fqn))
    except Exception as exc:  # transformers' DocstringParsingException / TypeHintParsingException
        return (f"{key}: {fqn!r} cannot be shown to the model as a tool: {' '.join(str(exc).split())} (a tool "
                "needs type hints and a docstring with an Args: section describing each argument)")
    return None


def agent_problems(grpo: dict) -> list[str]:
    """grpo.tools and grpo.environment_factory: every import path resolves (a tool to a function the model can be
    shown, an environment to a class or factory)."""
    problems = [tool_problem(fqn) for fqn in grpo.get("tools") or []]
    factory = grpo.get("environment_factory")
    named = factory.items() if isinstance(factory, dict) else [(None, factory)] if factory else []
    for name, fqn in named:
        problems.append(reward_func_problem(
            fqn, "grpo.environment_factory" + (f".{name}" if name is not None else "")))
    return problems


def _path_problem(key: str, value: Any, *, data_file: bool = False) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    local = looks_local(value) or (data_file and value.lower().endswith(DATA_SUFFIXES))
    if not local or Path(value).expanduser().exists():
        return None
    return f"{key}: {value!r} does not exist (relative to {os.getcwd()}).{_demo_hint(value)}"


def dataset_problems(datasets: Any, marker: str | None = None) -> list[str]:
    out = []
    for i, ds in enumerate(datasets or []):
        ds = _as_dict(ds)
        if ds.get("path") == marker:
            continue
        out.append(_path_problem(f"datasets[{i}].path", ds.get("path"), data_file=True))
        files = ds.get("data_files")
        for f in [files] if isinstance(files, str) else (files or []):
            out.append(_path_problem(f"datasets[{i}].data_files", f, data_file=True))
    return [p for p in out if p]


def checkpoint_numel(model_dir: Path) -> int | None:
    """Parameters stored in a local checkpoint's safetensors files (headers only), or None if it has none."""
    from safetensors import safe_open  # here: only for a local checkpoint's size (ipc's memory check)

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with safe_open(str(f), framework="pt") as st:  # reads the header; no tensor is loaded
            total += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())  # noqa: SIM118 - safe_open is not iterable
    return total


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def sync_dir_problems(data: dict) -> list[str]:
    """The sync directory must be writable; full-weight modes need room for one copy of the weights."""
    grpo = _as_dict(data.get("grpo"))
    configured = grpo.get("sync_dir")
    root = Path(configured).expanduser() if configured else default_sync_root()
    where = f"grpo.sync_dir {str(root)!r}" if configured else f"the default sync directory {str(root)!r}"
    target = _existing_parent(root)
    if not target.is_dir() or not os.access(target, os.W_OK | os.X_OK):
        return [f"{where} is not writable ({target} is not a writable directory). Set grpo.sync_dir to a "
                "directory you can write (fast local disk or tmpfs)."]
    mode = MODES.get(str(grpo.get("sync") or DEFAULT_SYNC))
    if mode is not None and not mode.full_weights:
        return []  # an adapter: megabytes
    base = data.get("base_model")
    if not isinstance(base, str) or not Path(base).expanduser().is_dir():
        return []  # a hub id: its size is not known before download
    numel = checkpoint_numel(Path(base).expanduser())
    if not numel:
        return []
    dtype = trainer_dtype(data) or "bfloat16"
    need = numel * (4 if dtype == "float32" else 2)
    free = shutil.disk_usage(target).free
    if need > free:
        return [f"{where} has {free / 2**20:.0f} MiB free, but grpo.sync={grpo.get('sync')} writes one copy of "
                f"the weights there ({numel / 1e6:.0f}M parameters in {dtype}: {need / 2**20:.0f} MiB). Set "
                "grpo.sync_dir to a filesystem with more room (e.g. a local disk; in Docker, /dev/shm is 64 MiB "
                "unless you pass --shm-size)."]
    return []


def config_problems(data: dict, *, atropos_marker: str | None = None) -> list[str]:
    """Every problem found, each a sentence naming the key, the value and what to do."""
    problems = []
    trl = _as_dict(data.get("trl"))
    for fqn in trl.get("reward_funcs") or []:
        problems.append(reward_func_problem(fqn))
    if trl.get("rollout_func"):
        problems.append(reward_func_problem(trl["rollout_func"], "trl.rollout_func", models=False))
    grpo = _as_dict(data.get("grpo"))
    atropos = _as_dict(grpo.get("atropos"))
    for fqn in atropos.get("eval_reward_funcs") or []:
        problems.append(reward_func_problem(fqn, "grpo.atropos.eval_reward_funcs"))
    problems += agent_problems(grpo)
    problems += request_problems(trl)
    base = data.get("base_model")
    p = _path_problem("base_model", base)
    if p:
        problems.append(p if "demo/" in str(base) else p + " Fix the path, or use a Hugging Face model id.")
    problems.append(_path_problem("tokenizer_config", data.get("tokenizer_config")))
    problems += dataset_problems(data.get("datasets"), atropos_marker)
    problems += sync_dir_problems(data)
    return [p for p in problems if p]
