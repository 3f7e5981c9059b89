"""`grpo.sync: ipc` on CUDA: the server's weights shared through CUDA IPC handles — both sides.

Server side (`export`, inside vLLM's worker after the weights are loaded and processed, before CUDA graphs are
captured): one handle per parameter storage, made by torch's own `torch.multiprocessing.reductions.reduce_tensor`
(no home-made driver calls); tied parameters once (`alias_of`). Nothing is copied or moved: the pointers vLLM's
kernels and CUDA graphs use stay what they are, which is what makes in-place writes visible to them. Manifest:
`{transport: "cuda", pid, model, device_uuid, params: {vLLM name: {dtype, shape, handle | alias_of}}, hf: {...}}`
(`hf`: the HF -> vLLM map of layout.py, as for the CPU transport).

Trainer side (`attach`): rebuilds every handle on the local device with the same UUID (CUDA_VISIBLE_DEVICES may
number it differently) and returns {vLLM name: tensor}: the server's memory, no copy.

A handle is the pickled `(rebuild function, arguments)` pair torch's reductions return, base64-encoded; the
trainer unpickles it with an unpickler that only resolves names from `torch` (the manifest comes from a server on
the same machine, but is still not allowed to name arbitrary callables).

Run on a GPU (an H200) with a torch-only server process: `tests/gpu/test_cuda_ipc.py` and
`python -m grpo_plugin.bench ipc --cuda --json` (docs/benchmarks.md, ipc on CUDA). NOT run on a GPU: the export
from inside vLLM's worker (in_vllm/ipc_export.py) and vLLM computing with the shared weights — no vLLM on that machine.
"""

from __future__ import annotations

import base64
import inspect
import io
import os
import pickle

import torch
from torch.multiprocessing.reductions import reduce_tensor

from grpo_plugin.ipc.layout import hf_layout


class CudaIpcError(RuntimeError):
    """The server's weights cannot be shared with this trainer through CUDA IPC (the message says why)."""


def refusal(*, quantization: str | None, tensor_parallel_size: int, sleep_mode: bool) -> str | None:
    """Why a vLLM server with these settings cannot share its weights through CUDA IPC (None: it can)."""
    if quantization:
        return (f"the server's weights are quantized ({quantization}): vLLM repacks them for its kernels, so they "
                "are not the tensors the trainer trains. Serve the unquantized model for ipc, or use "
                "grpo.sync: lora_sync (a QLoRA base is served exactly, docs/modes.md).")
    if tensor_parallel_size > 1:
        return (f"tensor_parallel_size {tensor_parallel_size}: each vLLM rank holds a shard of every weight, and "
                "the trainer would have to train the shards of all ranks. Use tensor_parallel_size 1 for ipc, or "
                "grpo.sync: restart / lora_sync.")
    if sleep_mode:
        return ("vLLM sleep mode (enable_sleep_mode) frees and re-allocates the weights: the shared pointers "
                "would dangle. Turn sleep mode off for ipc.")
    return None


def _encode(obj) -> str:
    return base64.b64encode(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).decode("ascii")


class _TorchOnly(pickle.Unpickler):
    """Resolves only torch's own names (the rebuild function, tensor/storage classes, dtypes) and `builtins`
    containers; anything else in a handle is refused."""

    def find_class(self, module, name):
        if module == "torch" or module.startswith("torch.") or (module == "builtins" and name in (
                "tuple", "list", "dict", "int", "float", "bool", "bytes", "str", "slice")):
            return super().find_class(module, name)
        raise CudaIpcError(f"a CUDA IPC handle names {module}.{name}: only torch's own names are accepted")


def _decode(text: str):
    return _TorchOnly(io.BytesIO(base64.b64decode(text))).load()


def device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def local_index(uuid: str) -> int:
    """The index under which this process sees the GPU with `uuid`; CudaIpcError if it does not see it."""
    for i in range(torch.cuda.device_count()):
        if device_uuid(i) == uuid:
            return i
    raise CudaIpcError(
        f"the server's GPU (uuid {uuid}) is not visible to this trainer process (it sees "
        f"{torch.cuda.device_count()} GPU(s); CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}). "
        "ipc shares the memory of ONE GPU: run the trainer on the server's GPU, or use grpo.sync: restart / "
        "lora_sync across GPUs.")


def export(model, *, model_name: str = "", hf_config=None) -> dict:
    """One CUDA IPC handle per parameter storage of `model` (all on one CUDA device); returns the manifest. The
    caller keeps `model` alive: its memory is what the trainer maps."""
    named = list(model.named_parameters(remove_duplicate=False))
    devices = {p.device for _, p in named}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        raise CudaIpcError("CUDA IPC export needs every parameter on one CUDA device; found "
                           f"{sorted(map(str, devices))}")
    device = next(iter(devices))
    first: dict[int, str] = {}
    params: dict[str, dict] = {}
    for name, p in named:
        key = p.data_ptr()
        if key in first:
            source = params[first[key]]
            params[name] = {"dtype": source["dtype"], "shape": source["shape"], "alias_of": first[key]}
            continue
        if not p.is_contiguous():
            raise CudaIpcError(f"parameter {name} is not contiguous")
        first[key] = name
        params[name] = {"dtype": str(p.dtype).removeprefix("torch."), "shape": list(p.shape),
                        "handle": _encode(reduce_tensor(p.detach()))}
    manifest = {"transport": "cuda", "pid": os.getpid(), "model": model_name,
                "device_uuid": device_uuid(device.index if device.index is not None else torch.cuda.current_device()),
                "params": params}
    if hf_config is not None:
        try:
            manifest["hf"] = hf_layout(hf_config, {n: e["shape"] for n, e in params.items()})
        except ValueError as exc:  # reported to the trainer, which refuses to attach; the server still serves
            manifest["hf_error"] = str(exc)
    return manifest


def _on_device(rebuild, args: tuple, index: int) -> tuple:
    """`args` with the storage device replaced by this process's index of the same GPU (found by parameter name
    in torch's rebuild function, so a torch that reorders its arguments still works)."""
    names = list(inspect.signature(rebuild).parameters)
    if "storage_device" not in names:
        raise CudaIpcError(f"torch's {rebuild.__name__} has no storage_device argument: unsupported torch version")
    args = list(args)
    args[names.index("storage_device")] = index
    return tuple(args)


def attach(manifest: dict) -> dict[str, torch.Tensor]:
    """Trainer side: {vLLM name: the server's tensor}, rebuilt from the handles on the local index of the server's
    GPU. Aliases (tied) share one tensor."""
    if not torch.cuda.is_available():
        raise CudaIpcError("the server shares its weights through CUDA IPC, but this trainer process has no CUDA")
    index = local_index(manifest["device_uuid"])
    tensors: dict[str, torch.Tensor] = {}
    for name, entry in manifest["params"].items():
        if "alias_of" in entry:
            continue
        rebuild, args = _decode(entry["handle"])
        t = rebuild(*_on_device(rebuild, args, index))
        if list(t.shape) != entry["shape"] or str(t.dtype).removeprefix("torch.") != entry["dtype"]:
            raise CudaIpcError(f"{name}: the handle rebuilt {tuple(t.shape)} {t.dtype}, the manifest says "
                               f"{tuple(entry['shape'])} {entry['dtype']}")
        tensors[name] = t.detach()
    for name, entry in manifest["params"].items():
        if "alias_of" in entry:
            tensors[name] = tensors[entry["alias_of"]]
    return tensors
