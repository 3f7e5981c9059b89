"""vLLM's parameter layout → HF parameters as views (pure; no vLLM import).

vLLM fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj`, and pads the vocabulary rows of the embedding
and LM head. Every HF parameter of a Llama/Qwen2-style decoder is a row slice (a view) of one vLLM tensor, so
the trainer can train on the server's own storage. Anything that cannot be mapped is an error — never
zero-filled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

# vLLM fused module -> the HF modules stacked in it, in row order
FUSED = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
VOCAB_PARAMS = ("model.embed_tokens.weight", "lm_head.weight")


class UnmappedParameterError(ValueError):
    """Some HF parameter has no shared tensor behind it (or shapes disagree)."""


def _row_sizes(config, fused: str) -> tuple[int, ...]:
    if fused == "qkv_proj":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        return config.num_attention_heads * head_dim, kv * head_dim, kv * head_dim
    return config.intermediate_size, config.intermediate_size


def hf_layout(config, shapes: Mapping[str, Sequence[int]]) -> dict[str, dict]:
    """HF parameter name -> {"source": vLLM name, "start": first row, "rows": row count} (rows None: the whole
    tensor). Pure: works on shapes, so the server can put the map in its manifest."""
    out: dict[str, dict] = {}
    for name, shape in shapes.items():
        module, _, leaf = name.rpartition(".")
        parent, _, last = module.rpartition(".")
        if last in FUSED:
            sizes = _row_sizes(config, last)
            if shape[0] != sum(sizes):
                raise UnmappedParameterError(
                    f"{name}: {shape[0]} rows, expected {sum(sizes)} ({'+'.join(map(str, sizes))})"
                )
            start = 0
            for hf_module, rows in zip(FUSED[last], sizes, strict=True):
                out[f"{parent}.{hf_module}.{leaf}"] = {"source": name, "start": start, "rows": rows}
                start += rows
        elif name in VOCAB_PARAMS:
            if shape[0] < config.vocab_size:
                raise UnmappedParameterError(f"{name}: {shape[0]} rows < vocab_size {config.vocab_size}")
            out[name] = {"source": name, "start": 0, "rows": config.vocab_size}
        else:
            out[name] = {"source": name, "start": 0, "rows": None}
    if getattr(config, "tie_word_embeddings", False) and "model.embed_tokens.weight" in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def views_from_layout(layout: Mapping[str, Mapping], vllm_params: Mapping[str, torch.Tensor]
                      ) -> dict[str, torch.Tensor]:
    """Apply a `hf_layout` map to the vLLM tensors. Entries with the same source and rows share one view
    object (so tied parameters stay tied)."""
    out: dict[str, torch.Tensor] = {}
    made: dict[tuple, torch.Tensor] = {}
    for hf_name, e in layout.items():
        if e["source"] not in vllm_params:
            raise UnmappedParameterError(f"{hf_name}: the server has no tensor {e['source']!r}")
        key = (e["source"], e["start"], e["rows"])
        if key not in made:
            t = vllm_params[e["source"]]
            made[key] = t if e["rows"] is None else t.narrow(0, e["start"], e["rows"])
        out[hf_name] = made[key]
    return out


def hf_views(config, vllm_params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF parameter name -> a view of the vLLM tensor holding it (row slices of fused / padded tensors)."""
    return views_from_layout(hf_layout(config, {n: t.shape for n, t in vllm_params.items()}), vllm_params)


def mismatches(model: torch.nn.Module, views: Mapping[str, torch.Tensor]) -> list[str]:
    """Every parameter of `model` without a shared view of the same shape and dtype."""
    problems = []
    for name, param in model.named_parameters(remove_duplicate=False):
        view = views.get(name)
        if view is None:
            problems.append(f"{name}: no shared tensor")
        elif tuple(view.shape) != tuple(param.shape) or view.dtype != param.dtype:
            problems.append(f"{name}: shared {tuple(view.shape)} {view.dtype} vs model {tuple(param.shape)} "
                            f"{param.dtype}")
    return problems


def check(model: torch.nn.Module, views: Mapping[str, torch.Tensor]) -> None:
    problems = mismatches(model, views)
    if problems:
        raise UnmappedParameterError(
            "grpo.sync=ipc: cannot attach the trainer to the server's weights; refusing to start rather than "
            "train on zero-filled or mismatched parameters:\n  " + "\n  ".join(problems)
        )


def attach(model: torch.nn.Module, views: Mapping[str, torch.Tensor]) -> list[str]:
    """Replace every parameter of `model` by the shared view of the same name (new Parameters, same
    requires_grad). Raises UnmappedParameterError naming every parameter without a view or with a wrong
    shape/dtype (nothing is replaced then); returns the names attached. Tied parameters stay tied."""
    check(model, views)
    attached, made = [], {}
    for name, param in model.named_parameters(remove_duplicate=False):
        module_name, _, leaf = name.rpartition(".")
        module = model.get_submodule(module_name)
        key = id(views[name])
        if key not in made:
            made[key] = torch.nn.Parameter(views[name], requires_grad=param.requires_grad)
        setattr(module, leaf, made[key])
        attached.append(name)
    return attached
