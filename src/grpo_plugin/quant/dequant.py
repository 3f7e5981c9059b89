"""The base a quantized trainer computes with, as plain weights — so the server can compute with exactly it.

bitsandbytes keeps a 4-bit (nf4 / fp4, optionally double-quantized) or 8-bit weight; the trainer's forward
dequantizes it and multiplies in the compute dtype. A vLLM server started on the checkpoint computes with the
full-precision weights instead: a different policy than the one being trained (measured on the tiny model: mean
|Δlogp| 0.07 with nf4, 0.005 with 8-bit, where a verified sync is within 1e-4). `dequantized_base()` gives the
trainer's own base in checkpoint naming, each quantized weight replaced by the values the trainer's matmul uses,
bit for bit (tests/unit/test_quant.py), so the server can load it (sync/served_base.py).

Two bitsandbytes behaviours make a layer compute differently from how it trains, and `keep_training_numerics()`
switches them off (both measured on CPU with bitsandbytes 0.50.2):
- a 4-bit layer's first eval-mode forward without grad (the post-sync probe, an eval pass) on a CPU with AVX512-BF16
  repacks the weight in place for a bf16 inference kernel, and from then on EVERY forward, training included, uses
  that kernel (|Δ| 3e-3 per output on the tiny model's q_proj);
- an 8-bit layer computes in eval mode with LLM.int8 (activations quantized to int8, outliers in fp16) and in
  training mode on CPU with the dequantized weight: the probe (eval mode) would measure a path training never
  takes. On CUDA both modes use LLM.int8, which no served weights reproduce (docs/modes.md).
"""

from __future__ import annotations

import copy
import sys

import torch

# PEFT wraps a layer it adapts: `<layer>.base_layer` is the original module, `<layer>.lora_A/B...` the adapter;
# `modules_to_save` layers keep `<layer>.original_module` beside the trained copy.
_WRAPPER_PARTS = ("base_layer", "original_module")


class QuantizedBaseError(RuntimeError):
    """A quantized layer this module cannot turn into the weights the trainer computes with."""


def _bnb():
    return sys.modules.get("bitsandbytes")  # a model with bitsandbytes layers has imported it


def quantized_layers(model) -> dict[str, torch.nn.Module]:
    """Name -> every bitsandbytes 4-bit or 8-bit linear layer of `model` (empty for a plain model)."""
    bnb = _bnb()
    if bnb is None:
        return {}
    kinds = (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)
    return {name: m for name, m in model.named_modules() if isinstance(m, kinds)}


def is_4bit(module) -> bool:
    return getattr(module.weight, "quant_state", None) is not None


def describe(layers: dict[str, torch.nn.Module]) -> str:
    """What the quantized layers are, e.g. '4-bit nf4, double quantization' (for logs and errors)."""
    kinds = set()
    for m in layers.values():
        if is_4bit(m):
            qs = m.weight.quant_state
            kinds.add(f"4-bit {qs.quant_type}" + (", double quantization" if qs.nested else ""))
        else:
            kinds.add("8-bit (LLM.int8)")
    return "; ".join(sorted(kinds)) or "not quantized"


def compute_dtype(module, default: torch.dtype) -> torch.dtype:
    """The dtype the layer multiplies in: bnb_4bit_compute_dtype for 4-bit, the activations' dtype otherwise."""
    return getattr(module, "compute_dtype", None) or default


def dequantize(module, dtype: torch.dtype) -> torch.Tensor:
    """The weight `module`'s matmul uses when it trains, in `dtype`: bitsandbytes' own dequantization, with the
    same arithmetic as its training path (4-bit: dequantized straight into the compute dtype; 8-bit: int8 rows
    times SCB / 127, as its CPU training matmul does)."""
    w = module.weight
    if is_4bit(module):
        state = w.quant_state
        if getattr(state, "packing_format_for_cpu", False):
            raise QuantizedBaseError(
                "a 4-bit layer's weight was repacked for bitsandbytes' CPU inference kernel before "
                "keep_training_numerics() ran: call it before any eval-mode forward")
        state = copy.copy(state)
        state.dtype = dtype
        return _bnb().functional.dequantize_4bit(w.data, state)
    cb = getattr(module.state, "CB", None)
    scb = getattr(module.state, "SCB", None)
    cb = w.data if cb is None else cb
    scb = getattr(w, "SCB", None) if scb is None else scb
    if cb.dtype != torch.int8:  # has_fp16_weights: the layer keeps (and trains) a float weight
        return cb.detach().to(dtype)
    if scb is None:
        raise QuantizedBaseError("an 8-bit layer has int8 weights but no row scales (SCB)")
    return cb.to(dtype).mul_(scb.to(dtype).unsqueeze(1).mul(1.0 / 127.0))


def dequantized_base(model) -> dict[str, torch.Tensor]:
    """The base weights `model` (a PEFT model or a plain one) computes with, in checkpoint naming (HF names, no
    PEFT wrappers, no adapter tensors, no non-persistent buffers), one entry per storage (a tied LM head is the
    embedding, written once), every quantized weight dequantized — and moved to the CPU as it is made, so a GPU
    holds at most one dequantized layer at a time (a 7B base is 15 GB dequantized). Tensors that are not quantized
    are the live ones (detached, not copied)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    quantized = {id(m) for m in quantized_layers(base).values()}
    default = next(base.get_input_embeddings().parameters()).dtype
    out: dict[str, torch.Tensor] = {}
    seen: set = set()
    for name, module in base.named_modules():
        parts = name.split(".") if name else []
        if any(p.startswith("lora_") or p == "modules_to_save" for p in parts):
            continue
        prefix = ".".join(p for p in parts if p not in _WRAPPER_PARTS)
        buffers = [(n, b) for n, b in module.named_buffers(recurse=False)
                   if n not in module._non_persistent_buffers_set]
        for leaf, t in [*module.named_parameters(recurse=False), *buffers]:
            key = (t.device, t.data_ptr(), tuple(t.shape))
            if key in seen:
                continue
            seen.add(key)
            if leaf == "weight" and id(module) in quantized:
                value = dequantize(module, compute_dtype(module, default)).cpu()
            else:
                value = t.detach()
            out[f"{prefix}.{leaf}" if prefix else leaf] = value
    return out


def _as_training(module, args):
    module._grpo_was_training = module.training
    module.training = True


def _restore_mode(module, args, output):
    module.training = module.__dict__.pop("_grpo_was_training", module.training)


def keep_training_numerics(model) -> int:
    """Make every forward of `model`'s quantized layers compute as training does (see the module docstring):
    4-bit layers never switch to the CPU inference kernel (a weight already repacked is restored by bitsandbytes'
    own state_dict path), 8-bit layers take their training matmul in eval mode too. Returns how many layers."""
    layers = quantized_layers(model)
    for module in layers.values():
        if is_4bit(module):
            module.support_avx512bf16_for_cpu = False
            if getattr(module.weight.quant_state, "packing_format_for_cpu", False):
                module.state_dict()  # bitsandbytes unpacks the weight in place when it saves it
        elif not getattr(module, "_grpo_pinned", False):
            module.register_forward_pre_hook(_as_training)
            module.register_forward_hook(_restore_mode)
            module._grpo_pinned = True
    return len(layers)


def upcast_adapter(model, dtype: torch.dtype) -> list[str]:
    """Trainable adapter tensors stored in a float type narrower than `dtype` (the base's compute dtype) are
    promoted to it in place, keeping parameter identity (as axolotl's `lora_fp32_gradients` does). PEFT stores an
    adapter in its base layer's dtype, and a 4-bit layer reports its storage dtype (axolotl's default
    `bnb_4bit_quant_storage: bfloat16`): on an fp32 run the adapter's delta would then be computed in bf16, which
    the server never does (measured: the probe drifts past 1e-4 within 3 steps) and AdamW updates below bf16's
    spacing would round away. Returns the names promoted."""
    promoted = []
    for name, p in model.named_parameters():
        if (p.requires_grad and p.dtype.is_floating_point and p.dtype.itemsize < dtype.itemsize
                and any(part.startswith("lora_") for part in name.split("."))):
            p.data = p.data.to(dtype)
            promoted.append(name)
    return promoted
