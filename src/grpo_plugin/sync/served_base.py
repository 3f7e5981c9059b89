"""lora_sync over a quantized base (QLoRA, 8-bit): the server computes with the base the trainer computes with.

A vLLM server started on the checkpoint serves the full-precision base while the trainer computes with its 4-bit
or 8-bit one: rollouts would come from another policy than the one trained (the stock path's silent flaw; the
post-sync probe measures it: mean |Δlogp| 0.07 with nf4 on the tiny model, tolerance 1e-4). So before the first
adapter push, and again on every fresh server after a recovery, this wrapper writes the trainer's own base,
dequantized exactly as its matmul uses it (quant/dequant.py), and the server reloads it in place through the same
path as `grpo.sync: restart` (in_vllm/worker_ext.py: vLLM's reload_weights; runtime LoRA stays on). The adapter
pushes then go on as usual, each verified by the probe against the trainer's quantized model.

The file is written into a private sync directory and removed once loaded; the server keeps its weights in its
own dtype (the dequantized values are exact in the trainer's compute dtype: serve the same dtype — `vllm.dtype`).
When the run ends the server reloads the checkpoint it was started on (a server shared across runs stays as it
was). With a plain base the wrapper does nothing at all.
"""

from __future__ import annotations

import logging
import time

from grpo_plugin.config.storage import SyncDir
from grpo_plugin.sync.base import SyncResult
from grpo_plugin.sync.restart import InPlaceReload

LOG = logging.getLogger("grpo_plugin")


class ServedBase:
    """Wraps a LoraSync: makes the server's base the trainer's (dequantized) base before an adapter is pushed."""

    def __init__(self, inner, client, *, sync_dir: str | None = None, rpc_timeout: float = 300.0):
        self.inner, self.client = inner, client
        self.mode = inner.mode
        self.needs_initial_push = inner.needs_initial_push
        self.starts_server = inner.starts_server
        self.hands_files = inner.hands_files
        self._sync_dir, self._rpc_timeout = sync_dir, rpc_timeout
        self._model = None
        self._reload: InPlaceReload | None = None
        self.quantization = ""  # e.g. "4-bit nf4, double quantization"; "" for a plain base
        self.base_sent = False
        self.last_report: dict = {}

    @property
    def generation_model(self) -> str:
        return self.inner.generation_model

    @property
    def writes_in_place(self) -> bool:
        """The push that loads the base rewrites weights the server computes with: the trainer's policy gate then
        waits for any generation in flight (sync/gate.py). Adapter pushes serve new names, as lora_sync's do."""
        return (self._model is not None and not self.base_sent) or self.inner.writes_in_place

    @property
    def reads(self) -> str:
        """What a push reads (gathered first under ZeRO-3, sync/ranks.py): every weight while the base is still to
        be sent, then the adapter."""
        return "all" if self._model is not None and not self.base_sent else self.inner.reads

    @property
    def verify_context(self) -> str:
        """Said with a failed probe: what the server and the trainer compute with, and the explicit way to accept
        a difference the quantized matmul itself adds."""
        if not self.quantization:
            return getattr(self.inner, "verify_context", "")
        loaded = "loaded before the first push" if self.base_sent else "not loaded yet"
        return (f"The trainer computes with a {self.quantization} base and the server with its dequantized weights "
                f"({loaded}). Where the quantized matmul itself differs from any served weights (8-bit LLM.int8 on "
                "CUDA quantizes activations too), measure the difference and accept it explicitly with "
                "`grpo.verify_tolerance` (docs/modes.md, QLoRA).")

    def prepare(self, handle) -> None:
        from grpo_plugin.quant.dequant import (  # here: bitsandbytes, for quantized bases only
            compute_dtype,
            describe,
            keep_training_numerics,
            quantized_layers,
            upcast_adapter,
        )

        self.inner.prepare(handle)
        model = handle.unwrap()
        layers = quantized_layers(model)
        if not layers:
            return
        self.quantization = describe(layers)
        keep_training_numerics(model)  # before any eval-mode forward (the probe is one)
        dtype = compute_dtype(next(iter(layers.values())), next(model.get_input_embeddings().parameters()).dtype)
        promoted = upcast_adapter(model, dtype)  # before the optimizer's first step
        if promoted:
            LOG.warning("grpo_plugin: the LoRA adapter was stored in a narrower dtype than the base computes in "
                        "(%s); %d adapter tensors now train in %s, as the server computes them (docs/modes.md, "
                        "QLoRA)", self.quantization, len(promoted), str(dtype).removeprefix("torch."))
        self._model = model
        self._reload = InPlaceReload(self.client, self._rpc_timeout, label=f"{self.mode} (quantized base)")
        self._reload.prepare()

    def _send_base(self) -> None:
        from grpo_plugin.quant.dequant import dequantized_base  # here: bitsandbytes, for quantized bases only

        t0 = time.perf_counter()
        tensors = dequantized_base(self._model)
        storage = SyncDir("base", self._sync_dir)
        try:
            path = storage.write_checkpoint(tensors, f"writing the dequantized base for grpo.sync={self.mode}")
            nbytes = path.stat().st_size
            t1 = time.perf_counter()
            report = self._reload.apply(str(storage.path))
        finally:
            storage.close()  # loaded (or failed): the file is not needed again
        self.base_sent = True
        self.last_report = {"base_write_ms": (t1 - t0) * 1e3, "base_bytes": nbytes, **report}
        LOG.warning("grpo_plugin: the server now serves the trainer's %s base, dequantized (%d tensors, %.0f MiB, "
                    "%.1f s)", self.quantization, len(tensors), nbytes / 2**20, time.perf_counter() - t0)

    def push(self, step: int, tensors: dict | None = None) -> SyncResult:
        t0 = time.perf_counter()
        if self._model is not None and not self.base_sent:
            self._send_base()
        result = self.inner.push(step, tensors)
        result.sync_ms = (time.perf_counter() - t0) * 1e3  # the trainer's whole pause, the base included
        return result

    def server_restarted(self) -> None:
        self.base_sent = False  # a fresh server starts on the checkpoint again
        self.inner.server_restarted()

    def close(self) -> None:
        """Unload the adapters, then give the server its own checkpoint back: a server that outlives the run
        (`axolotl vllm-serve`) would otherwise serve this run's dequantized base to the next one."""
        self.inner.close()
        if self._reload is None:
            return
        try:
            if self.base_sent:
                self._reload.apply(None)
                self.base_sent = False
        except Exception as exc:  # the run's results are safe; say what the server holds now
            LOG.warning("grpo_plugin: could not reload the server's own checkpoint after this run (%s); it still "
                        "serves this run's dequantized %s base: restart it before another run uses it", exc,
                        self.quantization)
        finally:
            self._reload.close()
