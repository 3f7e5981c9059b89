"""The one GRPO trainer of the plugin: axolotl's async GRPO trainer (data-producer path), with short overrides of
the host's hooks that hand each job to the object that owns it:

- `__init__`: TRL's server client is not built (compat/trl_client.py); the run's vLLM server(s), its weight sync
  (sync/session.py: gate, mode, guard, probe, versions), its step recorder (reporting/recorder.py) and its row
  scoring (training/forward.py) are made here and nowhere else.
- `_create_data_producer`: the producer (producers/build.py) gets what it needs once (producers/spec.py). Its
  rollouts are *deferred*: axolotl's main thread computes rewards, advantages, policy logprobs and the vLLM
  importance-sampling correction (never through TRL's `_generate_and_score_completions` nor axolotl 0.19's
  `_generate_only`, which break on axolotl 0.19).
- `_maybe_sync_vllm_weights` (before each new rollout): the session pushes every `grpo.sync_interval` steps and
  verifies each push with the logprob probe.
- `_compute_deferred_scores`: a rollout sampled with a version whose verification its lost server never answered
  is sampled again; its record (producers/rollout.py) goes to the recorder; a multi-turn rollout's length metrics
  count the model's tokens (producers/model_tokens.py).
- `_post_advantage_hook`: the producer's own advantages (Atropos) replace axolotl's; the rewards are recorded.
- `_get_per_token_logps_and_entropies`, `compute_loss`: each row at its own sampling temperature, fp32 models
  without axolotl's bf16 autocast (training/forward.py); what differs between the supported axolotl releases goes
  through `compat.host` (how many values this hook returns).
- evaluation (`eval_strategy`) stays TRL's, its generation served by `producers/evaluation.py` on the run's server
  with the current step's weights; with a tool loop, `_generate_and_score_completions` / `_generate` hand it the
  batch's rows and the rewards its messages (agents/evaluation.py); while a rollout is scored, its environment
  instances are TRL's `environments` (agents/environments.py `lent`).
- `log`: the sync figures beside axolotl's.
- `train`: a run stopped by its server, a sync or its rollout_func saves what it trained (training/checkpoints.py);
  a run that ends closes what it opened.
"""

from __future__ import annotations

import atexit

from accelerate.utils import gather_object
from axolotl.core.trainers.grpo.trainer import AxolotlAsyncGRPOTrainer
from trl import GRPOTrainer

from grpo_plugin.agents.attach import attach as attach_agents
from grpo_plugin.agents.attach import environment_rewards
from grpo_plugin.agents.environments import lent, release
from grpo_plugin.agents.evaluation import AgentEvaluation
from grpo_plugin.atropos.fetcher import AtroposTimeout
from grpo_plugin.compat.host import host
from grpo_plugin.compat.trl_client import without_trl_server_client
from grpo_plugin.config.lookups import loaded_run
from grpo_plugin.config.views import RunConfig
from grpo_plugin.producers import build, model_tokens
from grpo_plugin.producers.agent_output import RolloutFuncError
from grpo_plugin.producers.evaluation import EvalGeneration
from grpo_plugin.producers.local import generation_kwargs, sampling_kwargs
from grpo_plugin.producers.prefetch import PrefetchingProducer
from grpo_plugin.producers.rollout import ROLLOUT_KEY, record_of
from grpo_plugin.producers.seeds import PromptSeeds
from grpo_plugin.producers.spec import GenerationSpec, broadcast_from_rank_0, pad_token_id
from grpo_plugin.producers.streaming import StreamingProducer
from grpo_plugin.reporting.recorder import StepMetricsCallback, StepRecorder
from grpo_plugin.reporting.reward_log import RewardLog, weighted_rewards
from grpo_plugin.server.client import ServerError
from grpo_plugin.server.connect import connect, require_whole_prefills, server_urls, wait_for_servers
from grpo_plugin.server.recovery import ServerUnrecoverable
from grpo_plugin.sync.base import ModelHandle, SyncError
from grpo_plugin.sync.probe import SyncVerificationError
from grpo_plugin.sync.ranks import for_accelerator as ranks_for
from grpo_plugin.sync.session import SyncSession
from grpo_plugin.training.checkpoints import save_after_failure
from grpo_plugin.training.forward import RowScoring


class GRPOPluginTrainer(AxolotlAsyncGRPOTrainer):
    def __init__(self, *args, run_config: RunConfig | None = None, **kwargs):
        # the run's config, read once: what the run's parts read of it is handed to them from here
        self.run_config = run_config or loaded_run()
        self.grpo = self.run_config.grpo
        training_args = kwargs["args"]
        client = connect(server_urls(training_args, self.grpo), timeout=self.grpo.request_timeout)  # 1+ servers
        self.recorder = StepRecorder()
        self.reward_log = RewardLog()
        streaming = self.run_config.trl.streaming
        if streaming:  # the plugin streams whole groups itself; axolotl's chunked scorer would bypass its scoring
            training_args.streaming_partial_batch = False
        self.sync = SyncSession(self.grpo, client, world_size=training_args.world_size, streaming=streaming,
                                overlapped=(bool(training_args.async_prefetch) or streaming
                                            or self.grpo.atropos is not None),
                                step=lambda: self.state.global_step, on_result=self.recorder.synced,
                                max_model_len=self.run_config.vllm.max_model_len)
        # grpo.environment_factory: environments with get_reward() are reward columns (TRL wants one at init)
        args, self.grpo_environments = environment_rewards(self.grpo, args, kwargs)
        with without_trl_server_client():
            super().__init__(*args, **kwargs)  # builds the data producer (_create_data_producer)

        tok = self.processing_class
        # axolotl 0.19's deferred scoring reads these (0.21 asks its tokenizer); TRL no longer sets them.
        self.pad_token_id, self.eos_token_id = pad_token_id(tok), tok.eos_token_id
        wait_for_servers(client, self.grpo.server_timeout,
                         started_by_rank_0=self.grpo.managed_server and not self.accelerator.is_main_process)
        if self.grpo.seeded_sampling:
            require_whole_prefills(client)
        model = ModelHandle(unwrap=lambda: self.accelerator.unwrap_model(self.model),
                            num_processes=self.accelerator.num_processes,
                            is_main=self.accelerator.is_main_process, add_callback=self.add_callback)
        self.sync.attach(model, ranks_for(self.accelerator), tok)
        self.vllm_generation = EvalGeneration(  # TRL's evaluation generates through the plugin's server, session
            client=client, gate=self.sync.gate, guard=self.sync.guard, step=lambda: self.state.global_step,
            bring_current=lambda: self.sync.bring_current(self.state.global_step),
            sampling=lambda: sampling_kwargs(self, generation_kwargs(self.args, self.run_config.trl)),
            lag_timeout=build.LAG_WAIT_S,
            seeds=self.prompt_seeds)
        self.grpo_generation = self.vllm_generation.rollout_handle()  # trl.rollout_func's (docs/agents.md)
        self._patched_sync_weights = True  # axolotl would rebind its sync_weights to its own (no-client) sync
        self.scoring = RowScoring(model.unwrap())
        self.metrics_callback = StepMetricsCallback(
            self.recorder, self.sync, self.grpo, output_dir=self.args.output_dir,
            write=self.grpo.metrics and self.accelerator.is_main_process, base_model=self.run_config.base_model,
            model=lambda: self.model, optimizer=lambda: self.optimizer)
        self.add_callback(self.metrics_callback)
        atexit.register(self.close)

    # ---- rollouts ------------------------------------------------------------------------------
    @property
    def prompt_seeds(self) -> PromptSeeds | None:
        """grpo.seeded_sampling: each prompt's sampling seed (producers/seeds.py); None: vLLM's own draws."""
        return PromptSeeds(self.args.seed, self.accelerator.process_index) if self.grpo.seeded_sampling else None

    def _create_data_producer(self, args, train_dataset):
        # grpo.tools / environment_factory: the tool loop, for training and for evaluation
        self.agent_evaluation = AgentEvaluation(attach_agents(self, self.grpo, self.grpo_environments))
        tok = self.processing_class
        spec = GenerationSpec(
            client=self.sync.client, gate=self.sync.gate, guard=self.sync.guard, tokenizer=tok,
            pad_token_id=pad_token_id(tok), num_generations=self.num_generations,
            temperature=self.temperature, sampling=sampling_kwargs(self, generation_kwargs(args, self.run_config.trl)),
            tokenize_prompts=self._tokenize_prompts, mask_truncated=bool(self.mask_truncated_completions),
            stop_token_ids=tuple({t for t in (pad_token_id(tok), tok.eos_token_id) if t is not None}),
            shuffle_dataset=getattr(self, "shuffle_dataset", True),
            scale_rewards=getattr(self, "scale_rewards", "group"),
            vocab_size=self.accelerator.unwrap_model(self.model).get_input_embeddings().num_embeddings,
            device=self.accelerator.device, num_processes=self.accelerator.num_processes,
            gather=self.accelerator.gather, gather_object=gather_object, step=lambda: self.state.global_step,
            synced_version=lambda: self.sync.synced_version, add_callback=self.add_callback,
            process_index=self.accelerator.process_index, broadcast_object=broadcast_from_rank_0,
            seeds=self.prompt_seeds)
        producer = build.build_producer(args, train_dataset, self.run_config, spec, host=self)
        if isinstance(producer, (PrefetchingProducer, StreamingProducer)):  # what a lost server may have sampled
            self.sync.forget_prefetched = producer.drop_queue
        return producer

    def _maybe_sync_vllm_weights(self):
        self.sync.maybe_push(self.state.global_step)

    def _compute_deferred_scores(self, rollout: dict) -> dict:
        if self.sync.must_resample(record_of(rollout).sampled_up_to):
            # sampled with the version whose verification the lost server never answered: sample it again
            release(record_of(rollout).environments)  # never scored: its environments go back to the pool
            rollout = self.data_producer.produce(self.model, self.state.global_step,
                                                 processing_class=self.processing_class,
                                                 accelerator=self.accelerator, args=self.args)._data
        self.recorder.took(record_of(rollout), self.sync.synced_version)  # taken for training now (main thread)
        # the reward functions get the rollout's environment instances (TRL's environments=) while it is scored
        with self.scoring.rows_of(rollout), lent(self, record_of(rollout).environments):
            scored = super()._compute_deferred_scores(rollout)
        self.reward_log.correct(self._metrics)
        if "tool_mask" in scored:  # a multi-turn rollout: lengths and token count over the model's tokens (TRL's)
            model_tokens.recount(self._metrics["train"], self.state, scored, self.accelerator.gather,
                                 [self.eos_token_id, self.pad_token_id])
        del scored[ROLLOUT_KEY]  # read by _post_advantage_hook; no micro-batch carries it
        return scored

    def _generate_and_score_completions(self, inputs):
        """Evaluation only (training rollouts come from the producers): a tool loop gets the batch's rows."""
        with self.agent_evaluation.batch(self, inputs):
            return super()._generate_and_score_completions(inputs)

    def _generate(self, prompts):
        return self.agent_evaluation.generated(prompts, super()._generate(prompts))

    def _post_advantage_hook(self, data, rewards_per_func, advantages, inputs, num_generations, mode,
                             *args, **kwargs):
        super()._post_advantage_hook(data, rewards_per_func, advantages, inputs, num_generations, mode,
                                     *args, **kwargs)
        # the logged reward as TRL means it (axolotl's ignores the weights)
        self.reward_log.scored(mode, weighted_rewards(rewards_per_func, self.reward_weights))
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
        # Atropos: the producer's advantages replace axolotl's (less off-policy groups); padding rows have no score
        record = record_of(data)
        self.recorder.scored(record.scored_rewards(data, rewards, gather_object), record)

    # ---- scoring and the loss ------------------------------------------------------------------
    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                           batch_size=None, compute_entropy=False, **kwargs):
        """Each row at its own sampling temperature (training/forward.py). Returns what the host's callers unpack
        (compat.host: 2 values on axolotl 0.19's scoring, 3 from 0.20 on and in TRL's evaluation)."""
        def at(temperature, ids, mask):
            return self._logps_at(temperature, model, ids, mask, logits_to_keep, batch_size, compute_entropy,
                                  **kwargs)

        rows = self.scoring.by_temperature(at, input_ids, attention_mask, logits_to_keep, compute_entropy)
        return host().logps_result(*rows, evaluating=not self.scoring.hosts_call)

    def _logps_at(self, temperature, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                  **kwargs) -> tuple:
        """(logps, entropies, aux_loss), logits divided by `temperature` (None: the trainer's own) as TRL does; fp32
        models through TRL's implementation, without axolotl's bf16 autocast (training/forward.py), others axolotl's."""
        default = self.temperature
        self.temperature = default if temperature is None else temperature
        try:
            if self.scoring.fp32:
                return tuple(GRPOTrainer._get_per_token_logps_and_entropies(
                    self, model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                    compute_entropy=compute_entropy, **kwargs))
            return host().split_logps(super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, **kwargs))
        finally:
            self.temperature = default

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        with self.scoring.rows_of(inputs):
            loss = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        if self.model.training:  # evaluation computes the loss of its batches too: not a training step's
            self.recorder.add_loss(float((loss[0] if isinstance(loss, tuple) else loss).detach()))
        return loss

    # ---- logs and the end of the run -----------------------------------------------------------
    def log(self, logs: dict, *args, **kwargs) -> None:
        if "loss" in logs:  # the sync figures next to axolotl's reward/loss in the per-step log (and wandb etc.)
            logs.update(self.recorder.log_fields())
        super().log(logs, *args, **kwargs)

    def train(self, *args, **kwargs):
        """A run stopped by its server, a sync, its run-api or its rollout_func saves what it trained first; the
        error keeps its type and gains a note saying how to resume. A run that ends closes what it opened."""
        try:
            output = super().train(*args, **kwargs)
        except (ServerUnrecoverable, ServerError, SyncError, SyncVerificationError, AtroposTimeout,
                RolloutFuncError) as exc:
            exc.add_note(save_after_failure(self))
            self.close()  # what the run holds on the server goes now (atexit may not run in a failed launch)
            raise
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C (axolotl's SIGINT handler saves the model and exits):
            # the summary of the steps trained so far, as at the end
            try:
                self.metrics_callback.on_train_end(self.args, self.state, self.control)
            except Exception as exc:  # noqa: BLE001 - the interrupt is what the user must see
                print(f"[grpo_plugin] no run summary: {type(exc).__name__}: {exc}", flush=True)
            raise
        self.close()
        return output

    def close(self) -> None:
        """The run is over (its end, or exit): no rollout starts, the producer stops, then the weight sync."""
        if self.sync.closed:
            return
        self.sync.stop_generation()  # a prefetched rollout waiting for a version that will not come gives up
        build.stop(self.data_producer)
        self.sync.close()


__all__ = ["GRPOPluginTrainer"]
