"""vLLM general plugin (entry point group `vllm.general_plugins`, declared in pyproject.toml) that makes the
server's weights shareable for `grpo.sync: ipc`.

Inert unless `GRPO_IPC_EXPORT=<dir>` is in the server's environment (the serve module and the managed server
set it for ipc). On CUDA (ipc/cuda.py): after `load_model` (weights loaded and processed, before CUDA graphs are
captured) one CUDA IPC handle per parameter storage is exported, nothing moved — or, for a server that cannot
share (quantized, tensor parallel, sleep mode), the reason, which the trainer raises. On vLLM-CPU, in every vLLM
process it is loaded into:
1. `dispatch_cpu_unquantized_gemm` is replaced BEFORE the model loads: every linear layer (and the LM head)
   keeps its plain weight and reads it on every call through the GEMM of ipc/gemm.py. Stock vLLM-CPU would
   prepack a private copy and empty `layer.weight`, so in-place writes would never be seen.
2. after `load_model` (weights loaded and processed, before torch.compile / warm-up) every parameter storage
   is moved once into one shared file in the export dir (ipc/shm.py) and a manifest is written; the worker
   extension hands it to the trainer (`grpo_ipc_manifest`). With `GRPO_IPC_SHARE=1` (the second and later of
   several servers) the server instead waits for the first server's manifest in that dir and maps ITS file:
   every server and the trainer compute with one copy of the weights.
"""

from __future__ import annotations

import os
from pathlib import Path

# vLLM loads this module in every one of its processes, ipc or not: anything beyond the environment check is imported
# only when GRPO_IPC_EXPORT asks for it (and the CUDA side only on CUDA).
from grpo_plugin.config.server import IPC_EXPORT_ENV as ENV
from grpo_plugin.config.server import IPC_SHARE_ENV as SHARE_ENV

EXPORTED: dict | None = None  # this worker's manifest, once exported


def register() -> None:
    export_dir = os.environ.get(ENV)
    if not export_dir:
        return
    # here: vLLM loads this module in every process, ipc or not (the note above the module's imports)
    from vllm.model_executor.layers import utils as layer_utils
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    from vllm.platforms import current_platform

    if getattr(layer_utils, "_grpo_ipc_patched", False):
        return
    layer_utils._grpo_ipc_patched = True
    if current_platform.is_cuda():
        _export_cuda_after_load(BaseModelLoader)
        return
    from grpo_plugin.ipc import gemm  # here: vLLM-CPU's GEMM, not loaded on CUDA

    gemm.pick()  # a bad GRPO_IPC_GEMM fails here, before the model loads

    def keep_plain_weight(layer, remove_weight: bool) -> None:
        layer.cpu_linear = gemm.pick(weight=layer.weight)  # reads layer.weight (the shared tensor) on every call

    layer_utils.dispatch_cpu_unquantized_gemm = keep_plain_weight
    original_load = BaseModelLoader.load_model

    def load_model(self, vllm_config, model_config, prefix: str = ""):
        from grpo_plugin.ipc.shm import adopt, export  # here: vLLM-CPU's shared file, not loaded on CUDA

        model = original_load(self, vllm_config, model_config, prefix=prefix)
        global EXPORTED
        if os.environ.get(SHARE_ENV) == "1":
            EXPORTED = adopt(model, Path(export_dir))
        else:
            EXPORTED = export(model, Path(export_dir), model_name=str(model_config.model),
                              hf_config=model_config.hf_config)
        return model

    BaseModelLoader.load_model = load_model


def _export_cuda_after_load(loader_cls) -> None:
    original_load = loader_cls.load_model

    def load_model(self, vllm_config, model_config, prefix: str = ""):
        from grpo_plugin.ipc import cuda  # here: the CUDA side, loaded on CUDA only

        model = original_load(self, vllm_config, model_config, prefix=prefix)
        global EXPORTED
        why = cuda.refusal(quantization=getattr(model_config, "quantization", None),
                           tensor_parallel_size=vllm_config.parallel_config.tensor_parallel_size,
                           sleep_mode=bool(getattr(model_config, "enable_sleep_mode", False)))
        if why is None:
            try:
                EXPORTED = cuda.export(model, model_name=str(model_config.model), hf_config=model_config.hf_config)
            except cuda.CudaIpcError as exc:  # the server still serves; the trainer refuses to attach, saying why
                why = str(exc)
        if why is not None:
            EXPORTED = {"error": f"this vLLM server cannot share its weights through CUDA IPC: {why}"}
        return model

    loader_cls.load_model = load_model
