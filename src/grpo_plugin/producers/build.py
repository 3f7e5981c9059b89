"""Which data producer a run gets, and stopping it at the end.

- `grpo.atropos` set: `AtroposProducer` (pre-scored groups from the run-api; its fetcher already runs in the
  background, `grpo.atropos.prefetch`);
- `trl.rollout_func` set: `AgentRolloutProducer` (the user's function makes each rollout, multi-turn agents
  included, generating on the vLLM server through the plugin's handle or its OpenAI routes);
- otherwise `LocalRolloutProducer` (generation on the vLLM server), or with `trl.streaming_partial_batch`
  `StreamingProducer` (groups in the order they finish, pushes under running rollouts);
either (but the streaming one) wrapped in `PrefetchingProducer` with `trl.async_prefetch` (axolotl's background
producer).
"""

from __future__ import annotations

import contextlib

from axolotl.core.trainers.grpo.async_trainer import ProducerConfig

from grpo_plugin.config.views import RunConfig
from grpo_plugin.producers.agent import AgentRolloutProducer
from grpo_plugin.producers.atropos import AtroposProducer
from grpo_plugin.producers.local import LocalRolloutProducer
from grpo_plugin.producers.prefetch import PrefetchingProducer
from grpo_plugin.producers.spec import GenerationSpec
from grpo_plugin.producers.streaming import StreamingProducer

LAG_WAIT_S = 1800.0  # longest a rollout waits for the version grpo.max_policy_lag needs (a push that never comes)


def build_producer(args, train_dataset, run: RunConfig, spec: GenerationSpec, *, host):
    """`args`: the trainer's TrainingArguments; `run`: the run's config; `host`: the trainer, which axolotl's prompt
    sampler reads (rank, collator, dataloader settings: `GRPODataProducer.set_trainer`)."""
    settings = run.grpo
    config = ProducerConfig(
        mini_epochs=args.num_iterations, max_rollouts=None, eval_during_produce=False,
        empty_cache_before_produce=False, empty_cache_after_produce=False,
        async_prefetch=bool(args.async_prefetch), prefetch_depth=args.prefetch_depth,
    )
    if settings.atropos is not None:
        return AtroposProducer(config, settings=settings.atropos, args=args, spec=spec, sequence_len=run.sequence_len,
                               wandb=(run.wandb_project, run.wandb_run_id))
    rollout_func = getattr(host, "rollout_func", None)  # trl.rollout_func, as axolotl handed it to TRL
    local, extra, lag = LocalRolloutProducer, {}, settings.policy_lag_bound
    if run.trl.streaming:  # config checks refuse it with rollout functions, Atropos and several ranks
        local, extra, lag = StreamingProducer, dict(capacity=settings.stream_groups), settings.stream_lag_bound
    elif rollout_func is not None:
        local, extra = AgentRolloutProducer, dict(rollout_func=rollout_func, rollout_timeout=settings.rollout_timeout,
                                                  vocab_size=spec.vocab_size, offpolicy=(settings.offpolicy_reject,
                                                                                         settings.offpolicy_action))
    producer = local(
        config=config,
        prompt_dataset=train_dataset,
        num_generations=spec.num_generations,
        generation_batch_size=args.generation_batch_size,
        train_batch_size=args.per_device_train_batch_size,
        steps_per_generation=args.steps_per_generation,
        shuffle_dataset=spec.shuffle_dataset,
        seed=args.seed,
        spec=spec,
        max_policy_lag=lag,
        lag_timeout=LAG_WAIT_S,
        **extra,
    )
    producer.set_trainer(host)
    if args.async_prefetch and not run.trl.streaming:  # streaming generates in the background itself
        return PrefetchingProducer(producer, guard=spec.guard, background_produce_kwargs={"skip_policy_logps": True})
    return producer


def stop(producer) -> None:
    """The run is over: what produces in the background stops (no prefetched rollout outlives the run; the Atropos
    fetcher stops and says what stays spooled)."""
    if isinstance(producer, (PrefetchingProducer, AtroposProducer, StreamingProducer)):
        with contextlib.suppress(Exception):
            producer.shutdown()
