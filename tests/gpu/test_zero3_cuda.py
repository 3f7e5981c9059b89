"""DeepSpeed ZeRO-3 on a GPU, one rank (skipped without CUDA or deepspeed): the push's gather (sync/ranks.py) gives
the full weights — bit-identical to the loaded model, and within 1e-6 of an unsharded model after one SGD step —
and the probe's forward pass under ZeRO-3 equals the unsharded model's. Two CPU ranks run the same code through
`axolotl train` in tests/e2e/test_multiprocess_train.py.

Run on a GPU machine (torch, transformers and deepspeed suffice: no vLLM, axolotl or TRL):
    python -m pytest -q tests/gpu/test_zero3_cuda.py
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_zero3_gather_gives_the_trained_weights_and_the_probe_forward_matches():
    pytest.importorskip("deepspeed")
    from grpo_plugin.bench.zero3_cuda import run

    out = run("tiny", repeats=1)
    assert out["partitioned_outside_a_push"]
    assert out["bit_identical_after_load"]
    assert out["changed_by_the_step"]
    assert out["max_abs_diff_after_a_step_vs_unsharded"] <= 1e-6
    assert out["probe_max_abs_diff_vs_unsharded"] <= 1e-5
