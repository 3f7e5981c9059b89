"""ipc on CUDA, on a GPU (skipped without one): a torch-only server process exports an HF model's weights with the
project's export code, the trainer attaches with the project's attach code, trains with AdamW, and after every
step the server's logits equal the trainer's bit for bit, with no GPU memory added by attaching.

Run on a GPU machine (torch and transformers suffice: no vLLM, axolotl or TRL):
    python -m pytest -q tests/gpu/test_cuda_ipc.py
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_trainer_trains_the_servers_memory_and_the_server_computes_with_every_step():
    from grpo_plugin.bench.ipc_cuda import run

    out = run("tiny", steps=3)
    assert out["all_parameters_shared"]
    assert out["bit_identical_steps"] == 3
    assert out["server_changed_steps"] == 2  # the server saw each step's new weights, not just the same ones
    assert out["added_gpu_bytes"] <= 2 * 2**20  # nothing allocated (the free-memory reading moves in 2 MiB pages)
    assert out["own_copy_bytes"] > 0
