"""Every GRPO option of the host and what the grpo_plugin does with it: data only.

The rows: each field TRL's `GRPOConfig` adds to transformers' `TrainingArguments`, and each key of axolotl's `trl:`
block (its `TRLConfig`). Each is one of
- WORKS: the plugin honours it; the evidence is a test (`tests/...::name`) or the plugin code that handles it;
- INHERITED: host code reads it on a path the plugin does not change (the evidence names that code);
- REFUSED: config validation stops the run before the model loads, with a message naming the key, why, and what to
  use instead (`config.checks.trl_problems` reads the refusals below; a few have their own check in
  `config.checks.check_cross_keys`).

docs/config.md ("Every TRL GRPOConfig field and axolotl `trl:` key") mirrors OPTIONS row for row;
tests/unit/test_grpo_options.py checks OPTIONS against the installed TRL and axolotl, and the docs against OPTIONS.
"""

from __future__ import annotations

WORKS, INHERITED, REFUSED = "works", "inherited", "refused"

_GEN = "tests/unit/test_grpo_options.py::test_every_sampling_option_reaches_the_server_request"
_AX = "axolotl.core.trainers.grpo."
_LOSS = _AX + "async_trainer.AsyncGRPOTrainer._compute_loss"
_SCORES = _AX + "async_trainer.AsyncGRPOTrainer._compute_deferred_scores"
_FAST = _AX + "fast_async_trainer.FastAsyncGRPOTrainer."
_PRODUCER = "grpo_plugin.trainer.GRPOPluginTrainer._create_data_producer"
_WIRED = "tests/unit/test_args.py::test_good_config_is_wired"
_LOG = "trl.trainer.grpo_trainer.GRPOTrainer.log"
_REF_SYNC = "trl.trainer.callbacks.SyncRefModelCallback"
_URLS = "tests/unit/test_server_group.py::test_server_urls_and_num_servers_say_how_many_servers_and_where"
_CHECK = "grpo_plugin.config.checks.trl_problems"  # REFUSED_WHEN_SET below, or not an axolotl key at all

# name -> (status, evidence: "; "-separated tests (path::name) and dotted code paths, each checked to exist)
OPTIONS: dict[str, tuple[str, str]] = {
    # -- model and reference model --
    "model_init_kwargs": (REFUSED, _CHECK),
    "trust_remote_code": (REFUSED, _CHECK),
    "router_aux_loss_coef": (REFUSED, _CHECK),
    "disable_dropout": (REFUSED, _CHECK),
    "cast_lm_head_to_fp32": (REFUSED, _CHECK),
    "beta": (WORKS, "grpo_plugin.trainer.GRPOPluginTrainer._get_per_token_logps_and_entropies; " + _LOSS),
    "sync_ref_model": (INHERITED, _REF_SYNC),
    "ref_model_mixup_alpha": (INHERITED, _REF_SYNC),
    "ref_model_sync_steps": (INHERITED, _REF_SYNC),
    # -- rollouts: what is generated, and how --
    "num_generations": (WORKS, _GEN),
    "num_generations_eval": (REFUSED, _CHECK),
    "max_completion_length": (WORKS, _GEN),
    "generation_batch_size": (WORKS, _PRODUCER),
    "steps_per_generation": (REFUSED, _CHECK),
    "shuffle_dataset": (REFUSED, _CHECK),
    "pad_to_multiple_of": (REFUSED, _CHECK),
    "temperature": (WORKS, _GEN),
    "top_p": (WORKS, _GEN),
    "top_k": (WORKS, _GEN),
    "min_p": (WORKS, _GEN),
    "repetition_penalty": (WORKS, _GEN),
    "generation_kwargs": (WORKS, _GEN),
    "chat_template_kwargs": (REFUSED, _CHECK),
    "cache_implementation": (REFUSED, _CHECK),
    "ds3_gather_for_generation": (REFUSED, _CHECK),
    "max_tool_calling_iterations": (REFUSED, _CHECK),
    "use_transformers_continuous_batching": (REFUSED, _CHECK),
    "transformers_continuous_batching_config": (REFUSED, _CHECK),
    "use_transformers_paged": (REFUSED, _CHECK),
    "rollout_func": (WORKS, "grpo_plugin.producers.agent.AgentRolloutProducer; "
                     "tests/unit/test_agent_rollouts.py::test_a_two_turn_rollout_func_trains_only_the_models_tokens"),
    "reward_funcs": (
        WORKS, "tests/unit/test_preflight.py::test_reward_paths_resolve_like_axolotl_or_say_what_is_wrong"),
    "reward_num_workers": (INHERITED, _FAST + "_launch_reward_workers"),
    "mask_truncated_completions": (
        WORKS, "tests/unit/test_tensorize.py::test_mask_truncated_zeroes_completions_without_stop_token"),
    # -- the vLLM server --
    "use_vllm": (WORKS, _WIRED),
    "vllm_mode": (
        WORKS, _WIRED + "; tests/unit/test_grpo_options.py::test_colocate_is_refused_pointing_one_gpu_users_at_ipc"),
    "vllm_model_impl": (REFUSED, _CHECK),
    "vllm_enable_sleep_mode": (REFUSED, _CHECK),
    "vllm_structured_outputs_regex": (REFUSED, _CHECK),
    "vllm_guided_decoding_regex": (REFUSED, _CHECK),
    "vllm_server_base_url": (REFUSED, _CHECK),
    "vllm_server_host": (WORKS, _URLS),
    "vllm_server_port": (WORKS, _URLS),
    "vllm_server_timeout": (REFUSED, _CHECK),
    "vllm_group_port": (REFUSED, _CHECK),
    "vllm_gpu_memory_utilization": (REFUSED, _CHECK),
    "vllm_max_model_length": (REFUSED, _CHECK),
    "vllm_tensor_parallel_size": (REFUSED, _CHECK),
    "vllm_lora_sync": (REFUSED, "grpo_plugin.config.checks.check_cross_keys"),
    "vllm_sync_interval": (REFUSED, _CHECK),
    "use_data_producer": (WORKS, _WIRED),
    "async_prefetch": (WORKS, "tests/e2e/test_async_prefetch.py::test_async_prefetch_on_a_managed_server"),
    "prefetch_depth": (WORKS, _PRODUCER + "; grpo_plugin.producers.prefetch.PrefetchingProducer"),
    "streaming_partial_batch": (WORKS, "tests/e2e/test_async_prefetch.py::test_streaming_in_flight_updates; "
                                "grpo_plugin.producers.streaming.StreamingProducer"),
    "streaming_min_groups": (REFUSED, _CHECK),
    # -- advantages --
    "reward_weights": (INHERITED, _SCORES),
    "multi_objective_aggregation": (INHERITED, _SCORES),
    "scale_rewards": (INHERITED, _SCORES),
    "replay_buffer_size": (INHERITED, _FAST + "_post_advantage_hook"),
    "replay_recompute_logps": (INHERITED, _FAST + "_post_advantage_hook"),
    "reroll_start_fraction": (REFUSED, _CHECK),
    "reroll_max_groups": (REFUSED, _CHECK),
    # -- the loss --
    "loss_type": (INHERITED, _LOSS),
    "num_iterations": (WORKS, _PRODUCER + "; " + _AX + "async_trainer.AsyncGRPOTrainer._prepare_inputs_data_producer"),
    "epsilon": (INHERITED, _LOSS),
    "epsilon_high": (INHERITED, _LOSS),
    "delta": (REFUSED, _CHECK),
    "importance_sampling_level": (INHERITED, _LOSS),
    "sapo_temperature_neg": (REFUSED, _CHECK),
    "sapo_temperature_pos": (REFUSED, _CHECK),
    "vespo_k_pos": (REFUSED, _CHECK),
    "vespo_lambda_pos": (REFUSED, _CHECK),
    "vespo_k_neg": (REFUSED, _CHECK),
    "vespo_lambda_neg": (REFUSED, _CHECK),
    "top_entropy_quantile": (REFUSED, _CHECK),
    "entropy_coef": (REFUSED, _CHECK),
    "use_adaptive_entropy": (REFUSED, _CHECK),
    "entropy_coef_min": (REFUSED, _CHECK),
    "entropy_coef_max": (REFUSED, _CHECK),
    "entropy_coef_delta": (REFUSED, _CHECK),
    "entropy_target": (REFUSED, _CHECK),
    "use_liger_loss": (INHERITED, "trl.trainer.grpo_trainer.GRPOTrainer.compute_loss"),
    "skip_zero_advantage_batches": (
        WORKS, "grpo_plugin.plugin.GRPOPlugin.register; grpo_plugin.config.checks.check_cross_keys; "
        + _FAST + "_compute_loss; tests/unit/test_kl_on_skipped_steps.py::"
        "test_with_the_skip_off_a_zero_advantage_micro_batch_still_pulls_towards_the_reference"),
    "vllm_importance_sampling_correction": (
        WORKS, "tests/unit/test_tensorize.py::test_padding_sides_masks_and_logprobs"),
    "vllm_importance_sampling_mode": (INHERITED, _SCORES),
    "vllm_importance_sampling_cap": (INHERITED, _SCORES),
    "vllm_importance_sampling_clip_min": (REFUSED, _CHECK),
    "vllm_importance_sampling_clip_max": (REFUSED, _CHECK),
    "off_policy_mask_threshold": (INHERITED, _LOSS),
    "use_bias_correction_kl": (INHERITED, _LOSS),
    # -- logging --
    "log_completions": (INHERITED, _LOG),
    "num_completions_to_print": (INHERITED, _LOG),
    "log_multimodal": (INHERITED, _LOG),
    "log_unique_prompts": (REFUSED, _CHECK),
    "log_completions_hub_repo": (REFUSED, _CHECK),
}

# The losses axolotl's GRPO loss implements (AsyncGRPOTrainer._compute_loss replaces TRL's; TRL's "vespo" is not
# among them): another trl.loss_type is refused.
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo")

_ENTROPY = ("axolotl's GRPO loss (AsyncGRPOTrainer._compute_loss, which replaces TRL's) has no entropy bonus, so it "
            "would be ignored. Remove it.")
_IS_CLIP = ("axolotl's scoring (AsyncGRPOTrainer._compute_deferred_scores) bounds the vLLM importance-sampling ratio "
            "to [1/cap, cap] with trl.vllm_importance_sampling_cap and never reads TRL's clip bounds. Use "
            "trl.vllm_importance_sampling_cap.")

# axolotl `trl:` keys refused when set to anything but their "off" values: key -> (off values, why + what instead)
REFUSED_WHEN_SET: dict[str, tuple[tuple, str]] = {
    "vllm_server_timeout": ((None,), "TRL's own vLLM client reads it, and the plugin never builds that client. Use "
                            "grpo.server_timeout (seconds to wait for the server's /health)."),
    "vllm_guided_decoding_regex": ((None,), "the plugin builds its own generation requests and does not pass it on. "
                                   "Use vLLM's request field: trl.generation_kwargs: {structured_outputs: {regex: "
                                   "...}}."),
    "vllm_enable_sleep_mode": ((None, False), "it applies to trl.vllm_mode: colocate only, which the plugin does not "
                               "run. Remove it."),
    "chat_template_kwargs": ((None, {}), "axolotl does not pass it on to TRL (GRPOStrategy.set_training_args_kwargs "
                             "has no line for it), so the prompts would be rendered without it. Remove it."),
    "vllm_sync_interval": ((None,), "the plugin's weight sync replaces axolotl's, which reads it. Use "
                           "grpo.sync_interval."),
    "streaming_min_groups": ((None, 1), "axolotl's chunked scorer is not used: the plugin streams whole groups into "
                             "each batch in the order they finish (trl.streaming_partial_batch). Use "
                             "grpo.stream_groups for how many groups generate at once. Remove it."),
    "reroll_start_fraction": ((None, 1, 1.0), "axolotl collects the prompts to re-roll, but nothing puts them back "
                              "into a batch (RerollDataProducer._pre_produce_hook has no caller in axolotl 0.19 or "
                              "0.21), so it would only grow a list. Remove it."),
    "reroll_max_groups": ((None, 1), "it applies to trl.reroll_start_fraction only, which the plugin refuses. Remove "
                          "it."),
    "entropy_coef": ((None, 0, 0.0), _ENTROPY),
    "use_adaptive_entropy": ((None, False), _ENTROPY),
    "entropy_coef_min": ((None,), _ENTROPY),
    "entropy_coef_max": ((None,), _ENTROPY),
    "entropy_coef_delta": ((None,), _ENTROPY),
    "entropy_target": ((None,), _ENTROPY),
    "vllm_importance_sampling_clip_min": ((None,), _IS_CLIP),
    "vllm_importance_sampling_clip_max": ((None,), _IS_CLIP),
}

# TRL fields axolotl's `trl:` block has no key for (axolotl would drop them silently, so the plugin refuses them):
# what to use instead, where there is something
NOT_AXOLOTL_KEYS_INSTEAD: dict[str, str] = {
    "trust_remote_code": "the top-level `trust_remote_code:` (axolotl's model loading)",
    "num_generations_eval": "the evaluation settings in docs/config.md#evaluation",
    "steps_per_generation": "trl.generation_batch_size",
    "vllm_structured_outputs_regex": "trl.generation_kwargs: {structured_outputs: {regex: ...}}",
    "vllm_server_base_url": "grpo.server_urls",
    "vllm_gpu_memory_utilization": "vllm.gpu_memory_utilization",
    "vllm_max_model_length": "vllm.max_model_len",
    "vllm_tensor_parallel_size": "vllm.tensor_parallel_size",
    "max_tool_calling_iterations": "grpo.max_tool_calling_iterations (with grpo.tools / grpo.environment_factory)",
    # not in TRL 1.x's GRPOConfig any more: configs written for older TRL still carry it
    "max_prompt_length": "shorten or filter long prompts in the dataset transform (TRL 1.x removed this key and "
                         "axolotl has no prompt cap)",
}

# Fields of the generation request the plugin sets itself (server/client.py generate), so trl.generation_kwargs may
# not: why, and what to use instead
GENERATION_KWARGS_INSTEAD: dict[str, str] = {
    "model": "it names the policy it serves",
    "prompt": "it sends the dataset's prompts",
    "n": "use trl.num_generations",
    "max_tokens": "use trl.max_completion_length",
    "temperature": "use trl.temperature; the trainer scores at it too",
    "top_p": "use trl.top_p",
    "top_k": "use trl.top_k",
    "min_p": "use trl.min_p",
    "repetition_penalty": "use trl.repetition_penalty",
    "seed": "use grpo.seeded_sampling: a seed per prompt and step, from the top-level `seed:`; one seed in every "
            "request would draw the same completions for a prompt at every step",
    "logprobs": "it reads the sampled tokens' logprobs from the reply",
    "return_tokens_as_token_ids": "it reads the sampled token ids from the reply",
    "skip_special_tokens": "it reads the sampled token ids from the reply",
    "echo": "it reads only the completion from the reply",
    "stream": "it reads one JSON reply",
}
# the same fields, as the request builder checks them (server/client.py)
GENERATE_FIELDS = tuple(GENERATION_KWARGS_INSTEAD)
