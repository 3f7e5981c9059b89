"""The plain-weight GEMMs ipc's server computes with: same result as F.linear, and an in-place write to the
weight is seen by the next call (a prepacked copy would not see it)."""

from __future__ import annotations

import pytest
import torch

from grpo_plugin.ipc import gemm


@pytest.mark.parametrize(("n", "k"), [(64, 64), (1024, 512)])  # below / above ONEDNN_MIN_ELEMENTS
@pytest.mark.parametrize("name", gemm.GEMMS)
def test_plain_weight_gemm_reads_the_weight_on_every_call(name, n, k):
    g = torch.Generator().manual_seed(0)
    w, b, x = torch.randn(n, k, generator=g), torch.randn(n, generator=g), torch.randn(3, 5, k, generator=g)
    f = gemm.pick(name, weight=w)
    if name == "onednn" and gemm.onednn_available():
        assert (f is gemm.onednn_linear) == (w.numel() >= gemm.ONEDNN_MIN_ELEMENTS)
    torch.testing.assert_close(f(x, w, b), torch.nn.functional.linear(x, w, b), rtol=1e-4, atol=1e-4)
    w.mul_(-2.0)  # the trainer's in-place write
    torch.testing.assert_close(f(x, w, b), torch.nn.functional.linear(x, w, b), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not gemm.onednn_available(), reason="no oneDNN in this torch build")
def test_custom_op_is_well_formed_for_torch_compile():
    g = torch.Generator().manual_seed(1)
    args = (torch.randn(4, 512, generator=g), torch.randn(512, 512, generator=g), torch.randn(512, generator=g))
    torch.library.opcheck(gemm.shared_linear, args, test_utils=("test_schema", "test_faketensor"))


def test_unknown_gemm_is_an_error():
    with pytest.raises(ValueError, match="GRPO_IPC_GEMM='blas'"):
        gemm.pick("blas")
