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
from contextlib import contextmanager

import torch
from axolotl.core.trainers.grpo.trainer import AxolotlAsyncGRPOTrainer
from trl import GRPOTrainer

from grpo_plugin.args import GRPOSettings, current_settings
from grpo_plugin.checkpoints import save_after_failure
from grpo_plugin.compat.host import host
from grpo_plugin.probe import SyncVerificationError
from grpo_plugin.producers import build
from grpo_plugin.producers.prefetch import PrefetchingProducer
from grpo_plugin.producers.rollout import ROLLOUT_KEY, TEMPERATURES, record_of
from grpo_plugin.producers.spec import GenerationSpec
from grpo_plugin.recorder import StepMetricsCallback, StepRecorder
from grpo_plugin.server.client import ServerError
from grpo_plugin.server.connect import connect, server_urls, wait_for_servers
from grpo_plugin.server.recovery import ServerUnrecoverable
from grpo_plugin.sync.base import ModelHandle, SyncError
from grpo_plugin.sync.ranks import for_accelerator as ranks_for
from grpo_plugin.sync.session import SyncSession


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
        self.recorder = StepRecorder()
        self.sync = SyncSession(self.grpo, self.vllm_server, world_size=training_args.world_size,
                                overlapped=bool(training_args.async_prefetch) or self.grpo.atropos is not None,
                                step=lambda: self.state.global_step, on_result=self.recorder.synced)
        self._row_temperatures: torch.Tensor | None = None  # per-sequence sampling temperatures (Atropos)
        with _without_trl_server_client():
            super().__init__(*args, **kwargs)  # builds the data producer (_create_data_producer)

        tok = self.processing_class
        # axolotl 0.19's deferred scoring reads these (0.21 asks its tokenizer); TRL no longer sets them.
        self.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.eos_token_id = tok.eos_token_id
        wait_for_servers(self.vllm_server, self.grpo.server_timeout)
        model = ModelHandle(unwrap=lambda: self.accelerator.unwrap_model(self.model),
                            num_processes=self.accelerator.num_processes,
                            is_main=self.accelerator.is_main_process, add_callback=self.add_callback)
        self.sync.attach(model, ranks_for(self.accelerator), tok)
        dtype = next(model.unwrap().get_input_embeddings().parameters()).dtype
        self._scores_in_fp32 = dtype == torch.float32
        self.add_callback(StepMetricsCallback(
            self.recorder, self.sync, self.grpo, output_dir=self.args.output_dir,
            write=self.grpo.metrics and self.accelerator.is_main_process,
            model=lambda: self.model, optimizer=lambda: self.optimizer))
        atexit.register(self.close)

    @property
    def guard(self):  # producers/local.py still reads it off the trainer
        return self.sync.guard

    # ---- data ----------------------------------------------------------------------------------
    def _create_data_producer(self, args, train_dataset):
        tok = self.processing_class
        spec = GenerationSpec(
            client=self.vllm_server, gate=self.sync.gate, guard=self.sync.guard, tokenizer=tok,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
            num_generations=self.num_generations, temperature=self.temperature,
            shuffle_dataset=getattr(self, "shuffle_dataset", True),
            scale_rewards=getattr(self, "scale_rewards", "group"),
            vocab_size=self.accelerator.unwrap_model(self.model).get_input_embeddings().num_embeddings,
            device=self.accelerator.device, num_processes=self.accelerator.num_processes,
            step=lambda: self.state.global_step, synced_version=lambda: self.sync.synced_version,
            add_callback=self.add_callback)
        producer = build.build_producer(args, train_dataset, self.grpo, spec, host=self)
        if isinstance(producer, PrefetchingProducer):  # its queue goes when a server is lost under a verification
            self.sync.forget_prefetched = producer.drop_queue
        return producer

    # ---- sync ----------------------------------------------------------------------------------
    def _maybe_sync_vllm_weights(self):
        self.sync.maybe_push(self.state.global_step)

    # ---- nothing trained is lost ------------------------------------------------------------------
    def train(self, *args, **kwargs):
        """A run stopped by its server or a sync (server lost for good, a push that does not verify, a server
        error) saves what it trained first; the error keeps its type and gains a note saying where and how to
        resume. A run that ends closes its producer and weight sync."""
        try:
            output = super().train(*args, **kwargs)
        except (ServerUnrecoverable, ServerError, SyncError, SyncVerificationError) as exc:
            exc.add_note(save_after_failure(self))
            raise
        self.close()
        return output

    def close(self) -> None:
        """The run is over (its end, or the interpreter's exit): no rollout starts, the producer stops, then the
        weight sync ends."""
        if self.sync.closed:
            return
        self.sync.stop_generation()  # a prefetched rollout waiting for a version that will not come gives up
        build.stop(self.data_producer)
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
        self._row_temperatures = rows.get(TEMPERATURES)
        try:
            yield
        finally:
            self._row_temperatures = None

    def _compute_deferred_scores(self, rollout: dict) -> dict:
        if self.sync.must_resample(record_of(rollout).policy_version):
            # sampled with the version whose verification the lost server never answered: sample it again
            rollout = self.data_producer.produce(self.model, self.state.global_step,
                                                 processing_class=self.processing_class,
                                                 accelerator=self.accelerator, args=self.args)._data
        self.recorder.took(record_of(rollout), self.sync.synced_version)  # taken for training now (main thread)
        with self._temperatures_of(rollout):
            scored = super()._compute_deferred_scores(rollout)
        del scored[ROLLOUT_KEY]  # read by _post_advantage_hook; no micro-batch carries it
        return scored

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
        return tuple(GRPOTrainer._get_per_token_logps_and_entropies(
            self, model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
            compute_entropy=compute_entropy, **kwargs))

    # ---- metrics taps --------------------------------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        with self._temperatures_of(inputs):
            loss = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        self.recorder.add_loss(float((loss[0] if isinstance(loss, tuple) else loss).detach()))
        return loss

    def _post_advantage_hook(self, data, rewards_per_func, advantages, inputs, num_generations, mode,
                             *args, **kwargs):
        super()._post_advantage_hook(data, rewards_per_func, advantages, inputs, num_generations, mode,
                                     *args, **kwargs)
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
        # Atropos: the producer's advantages (the env's, or its scores normalised within each real group) replace
        # axolotl's; padding rows (after the real ones, before axolotl shuffles) have no score
        self.recorder.scored(record_of(data).scored_rewards(data, rewards))

    def log(self, logs: dict, *args, **kwargs) -> None:
        if "loss" in logs:  # the sync figures next to axolotl's reward/loss in the per-step log (and wandb etc.)
            logs.update(self.recorder.log_fields())
        super().log(logs, *args, **kwargs)


__all__ = ["GRPOPluginTrainer"]
