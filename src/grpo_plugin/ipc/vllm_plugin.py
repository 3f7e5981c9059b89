"""vLLM general plugin (entry point group `vllm.general_plugins`) that makes the server's weights shareable.

Inert unless `GRPO_IPC_EXPORT=<dir>` is set in the server's environment. Then, in every vLLM process:
1. `dispatch_cpu_unquantized_gemm` is replaced BEFORE the model loads: linear layers keep their plain weight and
   compute with it on every call (vLLM-CPU otherwise prepacks a private copy and empties `layer.weight`);
2. after `load_model` (weights loaded and processed, before compile/warm-up) every parameter storage is moved,
   once, into one file in the export dir that another process can map (`torch.from_file(..., shared=True)`),
   parameters are re-pointed at it (tied ones stay tied), and a manifest (`manifest.json`: file, size, pid,
   per-parameter dtype/shape/byte offset in vLLM naming) is written atomically.

Work in progress for `grpo.sync: ipc`: not wired into the plugin's modes yet.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
from pathlib import Path

ENV = "GRPO_IPC_EXPORT"
MANIFEST = "manifest.json"
_ALIGN = 64


def register() -> None:
    export_dir = os.environ.get(ENV)
    if not export_dir:
        return
    from vllm.model_executor.layers import utils as layer_utils
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    if getattr(layer_utils, "_grpo_ipc_patched", False):
        return
    layer_utils._grpo_ipc_patched = True

    def keep_plain_weight(layer, remove_weight: bool) -> None:
        import torch

        layer.cpu_linear = torch.nn.functional.linear  # reads layer.weight (the shared tensor) on every call

    layer_utils.dispatch_cpu_unquantized_gemm = keep_plain_weight
    original_load = BaseModelLoader.load_model

    def load_model(self, vllm_config, model_config, prefix: str = ""):
        model = original_load(self, vllm_config, model_config, prefix=prefix)
        export(model, Path(export_dir), model_name=str(model_config.model))
        return model

    BaseModelLoader.load_model = load_model


def export(model, export_dir: Path, model_name: str = "") -> Path:
    """Move every parameter storage of `model` into one shared file; returns the manifest path."""
    import torch

    export_dir.mkdir(parents=True, exist_ok=True)
    named = list(model.named_parameters(remove_duplicate=False))
    first_name: dict[int, str] = {}
    entries: dict[str, dict] = {}
    offset = 0
    for name, p in named:
        key = p.data_ptr()
        if key in first_name:
            entries[name] = dict(entries[first_name[key]], alias_of=first_name[key])
            continue
        if not p.is_contiguous():
            raise RuntimeError(f"grpo ipc export: parameter {name} is not contiguous")
        first_name[key] = name
        nbytes = p.numel() * p.element_size()
        entries[name] = {"dtype": str(p.dtype).removeprefix("torch."), "shape": list(p.shape), "offset": offset,
                         "nbytes": nbytes}
        offset += -(-nbytes // _ALIGN) * _ALIGN
    path = export_dir / f"weights-{os.getpid()}.bin"
    buf = torch.from_file(str(path), shared=True, size=max(offset, 1), dtype=torch.uint8)
    views = {}
    with torch.no_grad():
        for name, p in named:  # copy every storage once; re-point only after all copies are done
            e = entries[name]
            if "alias_of" in e:
                continue
            view = buf[e["offset"]: e["offset"] + e["nbytes"]].view(p.dtype).view(p.shape)
            view.copy_(p.data)
            views[name] = view
        for name, p in named:
            p.data = views[entries[name].get("alias_of", name)]
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # give the original weights' pages back
    manifest = {"file": str(path), "nbytes": offset, "pid": os.getpid(), "model": model_name,
                "params": entries}
    tmp = export_dir / f".{MANIFEST}.{os.getpid()}"
    tmp.write_text(json.dumps(manifest))
    os.replace(tmp, export_dir / MANIFEST)

    def _cleanup() -> None:
        with contextlib.suppress(OSError):
            path.unlink()
        with contextlib.suppress(OSError, ValueError):
            if json.loads((export_dir / MANIFEST).read_text()).get("pid") == os.getpid():
                (export_dir / MANIFEST).unlink()

    atexit.register(_cleanup)
    return export_dir / MANIFEST


def attach_tensors(manifest_path: Path) -> tuple[dict, dict]:
    """Trainer side: map the exported file and return (manifest, {vLLM name: shared tensor view})."""
    import torch

    manifest = json.loads(Path(manifest_path).read_text())
    buf = torch.from_file(manifest["file"], shared=True, size=max(manifest["nbytes"], 1), dtype=torch.uint8)
    tensors, made = {}, {}
    for name, e in manifest["params"].items():
        source = e.get("alias_of", name)
        if source not in made:
            se = manifest["params"][source]
            made[source] = buf[se["offset"]: se["offset"] + se["nbytes"]].view(getattr(torch, se["dtype"])).view(
                se["shape"])
        tensors[name] = made[source]
    return manifest, tensors
