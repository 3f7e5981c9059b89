"""The one GRPO trainer of the plugin: axolotl's async GRPO trainer (data-producer path) + a WeightSync.

What it changes in the host:
- TRL's server-mode vLLM client is not built: it would create an NCCL communicator, which asserts on CPU
  (`torch.cuda.current_device()`) and silently broadcasts nothing with PyNccl disabled. We talk to the stock
  vLLM server through our own client.
- Rollouts come from `LocalRolloutProducer` as *deferred* rollouts, so axolotl's main thread does rewards,
  advantages, policy logprobs and the vLLM importance-sampling correction. This path never calls TRL's
  `_generate_and_score_completions` (where axolotl 0.19's `num_tiles` override breaks) nor axolotl 0.19's
  `_generate_only` (which unpacks 7 of TRL 1.9's 8 `_generate` return values).
- What differs between the supported axolotl releases goes through `compat.host` (e.g. how many values
  `_get_per_token_logps_and_entropies` returns).
- fp32 models are scored without axolotl's unconditional bf16 autocast (see
  `_get_per_token_logps_and_entropies`), so the policy logprobs match vLLM's sampling logprobs.
- `_maybe_sync_vllm_weights`, the hook axolotl calls before each new rollout, asks the WeightSync to push
  every `grpo.sync_interval` steps and verifies each push with the logprob probe.
- With `grpo.atropos`, rollouts come from `AtroposProducer` instead (pre-scored by the environments): the
  producer's advantages replace the ones axolotl derives from the scores (`_post_advantage_hook`), and every
  sequence is scored at its own sampling temperature (`_get_per_token_logps_and_entropies`).
"""

from __future__ import annotations

import atexit
import contextlib
import time
from contextlib import contextmanager
from urllib.parse import urlparse

import torch
from axolotl.core.trainers.grpo.trainer import AxolotlAsyncGRPOTrainer
from transformers import TrainerCallback

from grpo_plugin.args import GRPOSettings, current_settings, loaded_cfg
from grpo_plugin.checkpoints import save_after_failure
from grpo_plugin.compat.host import host
from grpo_plugin.metrics import (
    MetricsWriter,
    listening_pid,
    optimizer_name,
    rss_mb,
    server_summary,
    summarize,
)
from grpo_plugin.probe import SyncVerificationError
from grpo_plugin.producers.local import LocalRolloutProducer
from grpo_plugin.producers.prefetch import PrefetchingProducer
from grpo_plugin.server.client import ServerError
from grpo_plugin.server.connect import connect, server_urls, wait_for_servers
from grpo_plugin.server.group import replicas_of
from grpo_plugin.server.recovery import ServerUnrecoverable
from grpo_plugin.sync.base import ModelHandle, SyncError, SyncResult
from grpo_plugin.sync.ranks import for_accelerator as ranks_for
from grpo_plugin.sync.session import SyncSession

LAG_WAIT_S = 1800.0  # longest a rollout waits for the version grpo.max_policy_lag needs (a push that never comes)


@contextmanager
def _without_trl_server_client():
    """Keep TRL from building its server client (and NCCL communicator) while the trainer is constructed."""
    from trl.generation.vllm_generation import VLLMGeneration

    orig = VLLMGeneration._init_vllm

    def _init_vllm(self_vllm):
        if self_vllm.mode == "server":
            self_vllm.vllm_client = None  # grpo_plugin's own client does generation and sync
            return
        orig(self_vllm)

    VLLMGeneration._init_vllm = _init_vllm
    try:
        yield
    finally:
        VLLMGeneration._init_vllm = orig


class GRPOPluginTrainer(AxolotlAsyncGRPOTrainer):
    def __init__(self, *args, grpo_settings: GRPOSettings | None = None, **kwargs):
        self.grpo = grpo_settings or current_settings()
        training_args = kwargs["args"]
        # one server, or several behind one client (server/group.py: rollouts split, every push to all)
        self.vllm_server = connect(server_urls(training_args, self.grpo), timeout=self.grpo.request_timeout)
        self.sync = SyncSession(self.grpo, self.vllm_server, world_size=training_args.world_size,
                                overlapped=bool(training_args.async_prefetch) or self.grpo.atropos is not None,
                                step=lambda: self.state.global_step, on_result=self._synced)
        self._rollout_version: int | None = None
        self._pending_sync: SyncResult | None = None
        self._pending_rollout_ms = 0.0
        self._pending_generate_ms = 0.0
        self._pending_rollout_info: dict = {}
        self._pending_server_rows: list[int] | None = None
        self._row_temperatures: torch.Tensor | None = None  # per-sequence sampling temperatures (Atropos)
        self.atropos_producer = None
        self._step_losses: list[float] = []
        self._reward_stats: tuple[float, float] | None = None
        with _without_trl_server_client():
            super().__init__(*args, **kwargs)

        tok = self.processing_class
        # axolotl 0.19's deferred scoring reads these (0.21 asks its tokenizer); TRL no longer sets them.
        self.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.eos_token_id = tok.eos_token_id
        wait_for_servers(self.vllm_server, self.grpo.server_timeout)
        model = ModelHandle(unwrap=lambda: self.accelerator.unwrap_model(self.model),
                            num_processes=self.accelerator.num_processes,
                            is_main=self.accelerator.is_main_process, add_callback=self.add_callback)
        self.sync.attach(model, ranks_for(self.accelerator), tok)
        if isinstance(self.data_producer, PrefetchingProducer):
            self.sync.forget_prefetched = self.data_producer._drop_queue
        dtype = next(model.unwrap().get_input_embeddings().parameters()).dtype
        self._scores_in_fp32 = dtype == torch.float32
        self.metrics_writer = (
            MetricsWriter(self.args.output_dir) if self.grpo.metrics and self.accelerator.is_main_process
            else None
        )
        self.add_callback(_StepMetricsCallback(self))
        atexit.register(self.close_sync)

    @property
    def guard(self):  # the producers still read it off the trainer
        return self.sync.guard

    @property
    def _synced_version(self):  # the Atropos producer still reads it off the trainer
        return self.sync.synced_version

    def _synced(self, result: SyncResult | None) -> None:
        self._pending_sync = result

    # ---- data ----------------------------------------------------------------------------------
    def _create_data_producer(self, args, train_dataset):
        from axolotl.core.trainers.grpo.async_trainer import ProducerConfig

        config = ProducerConfig(
            mini_epochs=args.num_iterations, max_rollouts=None, eval_during_produce=False,
            empty_cache_before_produce=False, empty_cache_after_produce=False,
            async_prefetch=bool(args.async_prefetch), prefetch_depth=args.prefetch_depth,
        )
        if self.grpo.atropos is not None:  # its fetcher already runs in the background (grpo.atropos.prefetch)
            from grpo_plugin.producers.atropos import AtroposProducer

            self.atropos_producer = AtroposProducer(config, settings=self.grpo.atropos, trainer=self,
                                                    on_rollout=self._on_rollout)
            return self.atropos_producer
        producer = LocalRolloutProducer(
            config=config,
            prompt_dataset=train_dataset,
            num_generations=self.num_generations,
            generation_batch_size=args.generation_batch_size,
            train_batch_size=args.per_device_train_batch_size,
            steps_per_generation=args.steps_per_generation,
            shuffle_dataset=getattr(self, "shuffle_dataset", True),
            seed=args.seed,
            client=self.vllm_server,
            gate=self.sync.gate,
            max_policy_lag=self.grpo.policy_lag_bound,
            lag_timeout=LAG_WAIT_S,
        )
        producer.set_trainer(self)
        if args.async_prefetch:  # axolotl's background producer
            return PrefetchingProducer(producer, background_produce_kwargs={"skip_policy_logps": True})
        return producer

    def _on_rollout(self, rollout_ms: float, policy_version: int | None = None, **info) -> None:
        """The trainer takes a rollout (main thread): the time it waited for it, the policy version that sampled
        it (local rollouts: from the gate's lease; Atropos: its own `policy_lag` from the server's ledger), and
        what else the producer knows of it."""
        self._pending_rollout_ms += rollout_ms
        self._rollout_version = self.sync.synced_version if policy_version is None else policy_version
        rows = info.pop("server_rows", None)
        if rows:  # completions each server sampled, summed over the step's rollouts
            self._pending_server_rows = [a + b for a, b in zip(self._pending_server_rows or [0] * len(rows), rows)]
        self._pending_rollout_info = info

    # ---- sync ----------------------------------------------------------------------------------
    def _maybe_sync_vllm_weights(self):
        self.sync.maybe_push(self.state.global_step)

    # ---- nothing trained is lost ------------------------------------------------------------------
    def train(self, *args, **kwargs):
        """A run stopped by its server or a sync (server lost for good, a push that does not verify, a server
        error) saves what it trained first; the error keeps its type and gains a note saying where and how to
        resume."""
        try:
            return super().train(*args, **kwargs)
        except (ServerUnrecoverable, ServerError, SyncError, SyncVerificationError) as exc:
            exc.add_note(save_after_failure(self))
            raise

    def close_sync(self) -> None:
        """The run is over: no rollout starts, the producers stop, then the sync ends."""
        if self.sync.closed:
            return
        self.sync.stop_generation()  # a prefetched rollout waiting for a version that will not come gives up
        if isinstance(self.data_producer, PrefetchingProducer):
            with contextlib.suppress(Exception):
                self.data_producer.shutdown()  # no prefetched rollout outlives the run
        if self.atropos_producer is not None:
            with contextlib.suppress(Exception):
                self.atropos_producer.close()
        self.sync.close()

    # ---- scoring precision ----------------------------------------------------------------------
    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                           batch_size=None, compute_entropy=False, **kwargs):
        """Per-sequence temperatures (Atropos rollouts carry one per sequence): the rows are scored in groups
        of equal temperature, each with `self.temperature` set to it, as TRL divides the logits by it.
        Returns what the host's callers unpack (compat.host: 2 values on axolotl 0.19, 3 from 0.20 on)."""
        temps = self._row_temperatures
        default = self.temperature
        values = torch.unique(temps) if temps is not None and temps.numel() == input_ids.size(0) else None
        if values is None or values.numel() == 1:
            try:
                if values is not None:
                    self.temperature = float(values[0])
                return host().logps_result(*self._logps_one_temperature(
                    model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, **kwargs))
            finally:
                self.temperature = default
        logps = torch.zeros(input_ids.size(0), logits_to_keep, device=input_ids.device)
        entropies = torch.zeros_like(logps) if compute_entropy else None
        aux_losses = []
        try:
            for value in values.tolist():
                rows = torch.nonzero(temps == value).flatten().to(input_ids.device)
                self.temperature = value
                lp, ent, aux = self._logps_one_temperature(model, input_ids[rows], attention_mask[rows],
                                                           logits_to_keep, batch_size, compute_entropy, **kwargs)
                logps = logps.to(lp.dtype).index_copy(0, rows, lp)
                if compute_entropy:
                    entropies = entropies.to(ent.dtype).index_copy(0, rows, ent)
                if aux is not None:
                    aux_losses.append(aux * rows.numel() / input_ids.size(0))
        finally:
            self.temperature = default
        return host().logps_result(logps, entropies, sum(aux_losses) if aux_losses else None)

    @contextmanager
    def _temperatures_of(self, rows: dict):
        """Score these rows at their own temperatures (when they carry them)."""
        self._row_temperatures = rows.get("temperatures")
        try:
            yield
        finally:
            self._row_temperatures = None

    def _compute_deferred_scores(self, rollout: dict) -> dict:
        if self.sync.must_resample(rollout.get("_grpo_policy_version")):
            # sampled with the version whose verification the lost server never answered: sample it again
            rollout = self.data_producer.produce(self.model, self.state.global_step,
                                                 processing_class=self.processing_class,
                                                 accelerator=self.accelerator, args=self.args)._data
        if "_grpo_policy_version" in rollout:  # a local rollout is taken for training now (main thread)
            self._pending_generate_ms += rollout.pop("_grpo_generate_ms")
            self._on_rollout(rollout.pop("_grpo_wait_ms"), policy_version=rollout.pop("_grpo_policy_version"),
                             server_rows=rollout.pop("_grpo_server_rows", None))
        with self._temperatures_of(rollout):
            return super()._compute_deferred_scores(rollout)

    def _logps_one_temperature(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                               compute_entropy=False, **kwargs) -> tuple:
        """(logps, entropies, aux_loss) at `self.temperature`. axolotl runs this forward under bf16 autocast
        whatever the model's dtype (0.19 and 0.21 alike), so an fp32 run silently scores and trains in bf16
        precision (on the CPU demo its logprobs were 2.3e-3 off a plain forward, while vLLM's matched to 1.5e-8).
        fp32 models use TRL's own implementation, which does not autocast; others keep axolotl's."""
        if not self._scores_in_fp32:
            return host().split_logps(super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, **kwargs))
        from trl import GRPOTrainer

        return tuple(GRPOTrainer._get_per_token_logps_and_entropies(
            self, model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
            compute_entropy=compute_entropy, **kwargs))

    # ---- metrics taps --------------------------------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        with self._temperatures_of(inputs):
            loss = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        value = loss[0] if isinstance(loss, tuple) else loss
        self._step_losses.append(float(value.detach()))
        return loss

    def _post_advantage_hook(self, data, rewards_per_func, advantages, inputs, num_generations, mode,
                             *args, **kwargs):
        super()._post_advantage_hook(data, rewards_per_func, advantages, inputs, num_generations, mode,
                                     *args, **kwargs)
        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        rewards = (rewards_per_func * weights).nansum(dim=1)
        if "atropos_advantages" in data:
            # Atropos: the producer's advantages (the env's, or its scores normalised within each real group);
            # padding rows (after the real ones, before axolotl shuffles) have no score
            data["advantages"] = data.pop("atropos_advantages")
            rewards = rewards[: data.pop("_atropos_real_rows")]
            data.pop("_atropos_padding_rows", None)
        self._reward_stats = (rewards.mean().item(),
                              rewards.std().item() if rewards.numel() > 1 else 0.0)

    def log(self, logs: dict, *args, **kwargs) -> None:
        # Show the sync figures next to axolotl's reward/loss in the per-step log (and in wandb etc.).
        rec = getattr(self, "last_record", None)
        if rec is not None and "loss" in logs:
            logs["grpo/sync_ms"] = rec["sync_ms"]
            if rec["sync_logprob_diff"] is not None:
                logs["grpo/sync_logprob_diff"] = rec["sync_logprob_diff"]
            logs["grpo/rollout_ms"] = rec["rollout_ms"]
            logs["grpo/policy_lag"] = rec["policy_lag"]
            if "atropos_rejected_groups" in rec:
                logs["grpo/atropos_rejected_groups"] = rec["atropos_rejected_groups"]
        super().log(logs, *args, **kwargs)

    def step_record(self, step_ms: float) -> dict:
        step = self.state.global_step
        sync = self._pending_sync
        reward_mean, reward_std = self._reward_stats or (None, None)
        rec = {
            "step": step,
            "reward_mean": reward_mean,
            "reward_std": reward_std,
            "loss": sum(self._step_losses) / len(self._step_losses) if self._step_losses else None,
            "sync_mode": self.sync.mode,
            "sync_ms": round(sync.sync_ms, 3) if sync else 0.0,
            "sync_logprob_diff": sync.logprob_diff if sync else None,
            "rollout_ms": round(self._pending_rollout_ms, 3),  # the trainer's wait for rollouts
            "generate_ms": round(self._pending_generate_ms, 3),  # generating them (overlapped when prefetched)
            "step_ms": round(step_ms, 3),
            "policy_lag": (step - 1 - self._rollout_version) if self._rollout_version is not None else None,
            "trainer_rss_mb": round(rss_mb(), 1),
            "verify_ms": round(sync.verify_ms, 3) if sync else 0.0,
            "sync_pushed": bool(sync and sync.pushed),
            "server_rows": self._pending_server_rows,  # completions sampled by each server
            # each server's probe |Δlogp| (one entry per server)
            "sync_server_diffs": (sync.server_diffs or [sync.logprob_diff]) if sync and sync.logprob_diff is not None
            else None,
        }
        outages = self.sync.guard.new_outages()
        rec["server_outages"] = len(outages)
        rec["server_down_s"] = round(sum(o["down_s"] for o in outages), 3)
        if outages:
            rec["server_outage_detail"] = outages
        rec.update(self._pending_rollout_info)  # Atropos: policy_lag from the ledger, batch, rejected groups
        self._pending_sync, self._pending_rollout_ms, self._step_losses = None, 0.0, []
        self._pending_generate_ms = 0.0
        self._pending_rollout_info, self._pending_server_rows = {}, None
        return rec


class _StepMetricsCallback(TrainerCallback):
    def __init__(self, trainer: GRPOPluginTrainer):
        self.trainer = trainer
        self._t0 = 0.0
        self._server_peak = 0.0
        self._unmanaged_pids: list[int] | None = None

    def _server_pids(self) -> list[int]:
        """The server processes whose memory the summary reports: ours if managed, else the ports' listeners."""
        from grpo_plugin.server import managed

        procs = managed.servers()
        if procs:
            return [p.pid for p in procs if p.pid]
        if self._unmanaged_pids is None:
            ports = [urlparse(c.base_url).port for c in replicas_of(self.trainer.vllm_server)]
            self._unmanaged_pids = [pid for pid in (listening_pid(p) for p in ports if p) if pid]
        return self._unmanaged_pids

    def on_step_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        tr = self.trainer
        rec = tr.step_record((time.perf_counter() - self._t0) * 1e3)
        pids = self._server_pids()
        if pids:  # RSS summed over the servers (with ipc the shared file counts once per server)
            self._server_peak = max(self._server_peak, sum(rss_mb(pid, tree=True) for pid in pids))
        if tr.metrics_writer is not None:
            tr.metrics_writer.write(rec)
        tr.last_record = rec

    def on_train_end(self, args, state, control, **kwargs):
        tr = self.trainer
        if tr.metrics_writer is not None:
            summary = summarize(
                tr.metrics_writer.records, mode=tr.sync.mode,
                model=str(loaded_cfg().get("base_model") or getattr(tr.model, "name_or_path", "")),
                tolerance=tr.sync.tolerance if tr.grpo.verify_sync else None,
                server_peak_rss_mb=round(self._server_peak, 1) if self._server_peak else None,
                extra={"sync_interval": tr.grpo.sync_interval, "optimizer": optimizer_name(tr.optimizer),
                       "servers": server_summary(tr.metrics_writer.records,
                                                 [c.base_url for c in replicas_of(tr.vllm_server)],
                                                 tr.sync.tolerance if tr.grpo.verify_sync else None),
                       **_atropos_summary(tr)},
            )
            tr.metrics_writer.finish(summary, title=f"grpo_plugin · {tr.sync.mode}")
        tr.close_sync()


def _atropos_summary(tr: GRPOPluginTrainer) -> dict:
    producer = tr.atropos_producer
    if producer is None:
        return {}
    recs = tr.metrics_writer.records if tr.metrics_writer is not None else []
    lags = [r["policy_lag"] for r in recs if r.get("policy_lag") is not None]
    return {"atropos": {
        "url": tr.grpo.atropos.url,
        # from the records, which a resumed run carries over: the whole run, not just this process
        "batches_trained": sum(1 for r in recs if r.get("atropos_batch") is not None),
        "rejected_groups": sum(r.get("atropos_rejected_groups") or 0 for r in recs),
        "padding_rows": sum(r.get("atropos_padding_rows") or 0 for r in recs),
        "policy_lag_max": max(lags, default=None),
        "policy_lag_mean": round(sum(lags) / len(lags), 3) if lags else None,
        "policy_lag_source": sorted({r.get("policy_lag_source") for r in recs if r.get("policy_lag_source")}),
    }}


__all__ = ["GRPOPluginTrainer"]
