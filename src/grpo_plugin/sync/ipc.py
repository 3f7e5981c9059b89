"""`grpo.sync: ipc` — the trainer and the vLLM server share ONE copy of the weights; the optimizer step is the sync.

The server (started for ipc: in_vllm/ipc_export.py) shares every weight it computes with — on vLLM-CPU through one
shared-memory file, on CUDA through CUDA IPC handles (ipc/transport.py picks by the server's manifest). `prepare`
attaches those tensors in the trainer and makes every parameter of the trainer's model a view of them
(ipc/layout.py: fused q/k/v and gate/up row slices, padded vocabulary, tied embeddings; anything unmapped is an
error, never zero-filled). The trainer's initial values are written into the shared copy once,
and its own copy is dropped. From then on `optimizer.step()` writes the server's weights in place.

Ordering (`grpo.ipc_fence`), around every optimizer step, via the trainer's callbacks:
- `trainer` (default): the trainer is the server's only client and generates synchronously, so no request is
  in flight while the optimizer writes. The prefix-cache reset (KV computed with the old weights) runs in a
  background thread *during* the step; the step waits for it only if it is slower than the step itself.
- `server`: vLLM's own `/pause?mode=wait` before the step (in-flight requests finish on the old weights, new
  ones are queued, the prefix cache is dropped) and `/resume` after it. For servers other clients also use.

Every step's weights are verified by the probe, as for every mode (sync/session.py, sync/verify.py). A server
restart is detected (its worker is gone or its file was removed) and the trainer re-attaches to the new
server's file, copying its current weights in, instead of training on an orphaned mapping.
"""

from __future__ import annotations

import logging
import sys
import time

import torch
from transformers import TrainerCallback

from grpo_plugin.ipc.cuda import CudaIpcError
from grpo_plugin.ipc.layout import UnmappedParameterError, attach, check, views_from_layout
from grpo_plugin.ipc.transport import Transport, transport_for
from grpo_plugin.server.client import ServerError
from grpo_plugin.server.group import replicas_of
from grpo_plugin.sync.base import (
    PrefixCacheReset,
    SyncError,
    SyncResult,
    explain_rpc_failure,
    full_weight_model,
    require_worker_extension,
)
from grpo_plugin.sync.fence import ServerFence
from grpo_plugin.sync.gate import PolicyGate

LOG = logging.getLogger("grpo_plugin")
MANIFEST_METHOD = "grpo_ipc_manifest"
FENCES = ("trainer", "server")


class IpcSync:
    mode = "ipc"
    hands_files = False  # the server computes with the trainer's own copy
    needs_initial_push = False  # the server computes with the trainer's own tensors from the start
    starts_server = False
    writes_in_place = True  # a re-attach copies weights in; every optimizer step writes them (gate in _StepFence)
    reads = "all"  # every weight (gathered for a push under ZeRO-3, sync/ranks.py)

    def __init__(self, client, *, fence: str = "trainer", rpc_timeout: float = 300.0, announce: bool = False,
                 gate: PolicyGate | None = None):
        """`announce`: tell the server the policy version after every step, inside the server fence (the
        Atropos producer looks up which version generated each sequence)."""
        if fence not in FENCES:
            raise ValueError(f"grpo.ipc_fence: {fence!r}; expected one of {', '.join(FENCES)}")
        if announce and fence != "server":
            raise ValueError("ipc: announcing policy versions needs grpo.ipc_fence: server")
        self.client, self.fence, self.rpc_timeout, self.announce = client, fence, rpc_timeout, announce
        self.gate = gate or PolicyGate()
        self._reset = PrefixCacheReset(client, "ipc")
        self._server_fence = ServerFence(client, "ipc")
        self._blocked_ms = 0.0  # trainer time spent on fencing since the last push
        self._served: str | None = None
        self._model = None
        self.transport: Transport | None = None
        self._views: dict[str, int] = {}  # parameter name -> the data_ptr of its shared view
        self.reattached = 0

    @property
    def manifest(self) -> dict | None:
        """The manifest of the server the trainer is attached to (its transport keeps it)."""
        return self.transport.manifest if self.transport is not None else None

    @property
    def generation_model(self) -> str:
        if self._served is None:
            self._served = self.client.base_model()
        return self._served

    # ---- attach ---------------------------------------------------------------------------------
    def prepare(self, handle) -> None:
        """With several trainer ranks (DDP: every rank holds the same weights and takes the same optimizer step),
        rank 0's model is the shared copy and its optimizer step is the write; the other ranks keep their own
        replicas and never touch the shared file (config/ makes the fence `server` then: another rank may be
        generating while rank 0 writes)."""
        if handle.num_processes > 1 and not handle.is_main:
            return
        self._model = full_weight_model(handle, self.mode)
        _ = self.generation_model  # fail early if the server serves nothing
        require_worker_extension(self.client, "ipc", "share its weights")
        self._attach(self._fetch_manifest(), initial=True)
        handle.add_callback(_StepFence(self))

    def _fetch_manifest(self) -> dict:
        """The manifest of the shared weights. Several servers (server/group.py) must all compute with ONE file:
        the first exported it, the others map it (ipc/shm.py `adopt`); the exporter's manifest is returned."""
        servers = replicas_of(self.client)
        try:
            results = self.client.collective_rpc(MANIFEST_METHOD, timeout=self.rpc_timeout)
        except ServerError as exc:
            raise SyncError(explain_rpc_failure("ipc", str(exc), "the server could not describe its weights")) \
                from exc
        if len(results) != len(servers) or not all(isinstance(m, dict) for m in results):
            raise SyncError(f"grpo.sync=ipc needs exactly one vLLM worker per server (tensor_parallel_size 1); "
                            f"{len(servers)} server(s) answered {len(results)} worker manifest(s)")
        for url, manifest in zip((c.base_url for c in servers), results):
            if manifest.get("error"):
                raise SyncError(f"grpo.sync=ipc: {manifest['error']} ({url}). Start the server with `axolotl "
                                "vllm-serve <config.yaml>` on a config with `grpo.sync: ipc`, or "
                                "`grpo.managed_server: true`.")
        files = [m.get("file") for m in results]
        if len(servers) > 1 and (None in files or len(set(files)) > 1):
            where = "; ".join(f"{c.base_url}: {f or m.get('transport', '?')}"
                              for c, f, m in zip(servers, files, results))
            raise SyncError(f"grpo.sync=ipc: the {len(servers)} servers do not compute with one shared weight file "
                            f"({where}), so the trainer's steps would reach only one of them. Start them together "
                            "from this config (`grpo.num_servers` with `axolotl vllm-serve <config.yaml>` or "
                            "`grpo.managed_server: true`): the first exports the file, the others map it.")
        manifest = next((m for m in results if "owner_pid" not in m), results[0])
        if manifest.get("hf_error"):
            raise UnmappedParameterError(f"grpo.sync=ipc: the server's weights cannot be mapped to the trainer's "
                                         f"model: {manifest['hf_error']}")
        return manifest

    def _attach(self, manifest: dict, *, initial: bool) -> None:
        """Make every trainer parameter a view of the server's shared tensors, writing the trainer's current
        values into them first (the trainer's weights are the truth: its own load, or steps already taken)."""
        model = self._model
        try:
            transport = transport_for(manifest)
            views = views_from_layout(manifest["hf"], transport.attach(manifest))
        except (FileNotFoundError, ValueError, CudaIpcError) as exc:
            raise SyncError(f"grpo.sync=ipc: {exc}") from exc
        params = dict(model.named_parameters(remove_duplicate=False))
        devices = {p.device.type for p in params.values()} - {v.device.type for v in views.values()}
        if devices:
            raise SyncError(f"grpo.sync=ipc: the trainer's model is on {sorted(devices)} but the server's weights "
                            f"are on {sorted({v.device.type for v in views.values()})}; one shared copy lives on "
                            "one device: run the trainer where the server computes.")
        dtypes = {str(p.dtype) for p in params.values()} - {str(v.dtype) for v in views.values()}
        if dtypes:
            served = sorted({str(v.dtype) for v in views.values()})
            raise SyncError(f"grpo.sync=ipc: the trainer's model is in {sorted(dtypes)} but the server holds "
                            f"{served}; one shared copy needs one dtype. Set `vllm.dtype` to the trainer's "
                            "(or leave it unset: the plugin then passes the trainer's dtype).")
        check(model, views)  # names every unmapped / mis-shaped parameter; nothing is written on failure
        copied, largest = 0, 0.0
        with torch.no_grad():
            done = set()
            for name, p in params.items():
                view = views[name]
                if id(view) in done:
                    continue
                done.add(id(view))
                if initial and p.numel():
                    largest = max(largest, float((view - p.data).abs().max()))
                view.copy_(p.data)
                copied += p.numel() * p.element_size()
        if initial:
            attach(model, views)  # new Parameters (no optimizer exists yet); the trainer's own copy is freed
            if largest > 0:
                LOG.warning("grpo_plugin: ipc: the trainer's initial weights differed from the server's "
                            "(max |Δ| %.3g); the shared copy now holds the trainer's", largest)
        else:  # keep the Parameter objects (the optimizer's state is keyed by them); move their storage
            for name, p in params.items():
                p.data = views[name]
        self._views = {n: p.data_ptr() for n, p in model.named_parameters(remove_duplicate=False)}
        transport.after_write()  # the copies above are complete before the server computes again
        if self.transport is not None and self.transport is not transport:
            self.transport.close()
        self.transport = transport
        self.client.reset_prefix_cache()
        others = len(replicas_of(self.client)) - 1
        print(f"[grpo_plugin] ipc: {len(params)} parameters attached to {transport.describe()} "
              f"({copied / 2**20:.1f} MiB shared with vLLM worker pid {manifest['pid']}"
              + (f" and {others} more server(s) mapping the same file" if others else "")
              + "); the trainer holds no copy of its own", file=sys.stderr, flush=True)

    def orphaned(self) -> str | None:
        """Why the mapping no longer belongs to a live server (its file was removed, its worker is gone)."""
        return self.transport.orphaned() if self.transport is not None else None

    def detached(self) -> list[str]:
        """Trainer parameters whose storage is no longer their shared view: a host that moves the model copies it
        (measured: with two CPU ranks accelerate moves the model to `cpu:0`, a copy; the optimizer then wrote the
        copy and the probe caught it, 0.215 nats off)."""
        if self._model is None or not self._views:
            return []
        return [n for n, p in self._model.named_parameters(remove_duplicate=False)
                if n in self._views and p.data_ptr() != self._views[n]]

    def ensure_attached(self) -> None:
        why = self.orphaned()
        if why is None:
            moved = self.detached()
            if moved:
                LOG.warning("grpo_plugin: ipc: %d of the trainer's parameters were moved off the shared copy (e.g. "
                            "%s; a device move copies them); putting them back, with their current values",
                            len(moved), moved[0])
                self._attach(self.manifest, initial=False)
            return
        LOG.warning("grpo_plugin: ipc: the vLLM server was restarted (%s); re-attaching to the new server",
                    why)
        try:
            require_worker_extension(self.client, "ipc", "share its weights")  # before any RPC to the new server
            manifest = self._fetch_manifest()
        except SyncError as exc:
            raise SyncError(f"grpo.sync=ipc: the server the trainer shared weights with is gone ({why}) and no "
                            f"new one answers at {self.client.base_url}: {exc}. Training stops rather than "
                            "continue on an orphaned copy.") from exc
        self._attach(manifest, initial=False)
        self.reattached += 1

    # ---- the fence around optimizer.step() --------------------------------------------------------
    def before_step(self) -> None:
        t0 = time.perf_counter()
        if self.fence == "server":
            self._server_fence.hold()
        else:  # nothing of ours is in flight: the reset may run while the optimizer writes
            self._reset.start()
        self._blocked_ms += (time.perf_counter() - t0) * 1e3

    def after_step(self, version: int | None = None) -> None:
        """`version`: the optimizer steps the shared weights now hold (announced before generation resumes)."""
        t0 = time.perf_counter()
        try:
            if self.transport is not None:
                self.transport.after_write()  # CUDA: the step's kernels are done before the server computes
            if self.fence == "server":
                self._server_fence.release(version if self.announce else None, self.generation_model)
            else:
                self._reset.wait()
        except ServerError as exc:
            if self.fence == "trainer" and not self.client.healthy():
                # the server is gone (or hung): there is no cache to reset; the next rollout or push goes
                # through the trainer's ServerGuard, which restarts it and re-attaches (push -> ensure_attached)
                LOG.warning("grpo_plugin: ipc: the vLLM server did not answer the post-step cache reset (%s); "
                            "it is recovered before the next rollout", exc)
                return
            raise SyncError(explain_rpc_failure("ipc", str(exc), "the post-step cache reset / resume failed")) \
                from exc
        self._blocked_ms += (time.perf_counter() - t0) * 1e3

    def server_restarted(self) -> None:
        """Nothing to forget: the next push sees the orphaned mapping and re-attaches (ensure_attached)."""
        self._served = None

    def push(self, step: int, tensors: dict | None = None) -> SyncResult:
        """Nothing to copy: the weights are already the server's (`tensors` is never given: ipc refuses sharded
        trainers). Reports the fencing time since the last push (and re-attaches first if the server was restarted
        in between: writes made meanwhile went to the old mapping, which is what the re-attach copies from)."""
        self.ensure_attached()
        ms, self._blocked_ms = self._blocked_ms, 0.0
        return SyncResult(step=step, sync_ms=ms)

    def close(self) -> None:
        self._reset.close()
        if self.transport is not None:
            self.transport.close()


class _StepFence(TrainerCallback):
    def __init__(self, sync: IpcSync):
        self.sync = sync

    """Around every optimizer step: no generation in flight (a prefetched rollout finishes first, none starts),
    the fence of `grpo.ipc_fence`, and the new version published before generation may go on."""

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.sync.gate.begin_write()
        try:
            self.sync.before_step()
        except BaseException:
            self.sync.gate.end_write()
            raise

    def on_optimizer_step(self, args, state, control, **kwargs):
        version = state.global_step + 1  # the Trainer counts the step right after this callback
        try:
            self.sync.after_step(version)
            self.sync.gate.publish(version, self.sync.generation_model)
        finally:
            self.sync.gate.end_write()
