"""GRPOPlugin: wiring only. Listed under `plugins:` as `grpo_plugin.GRPOPlugin`.

axolotl imports this module whenever it loads a config (also for `axolotl vllm-serve` and `axolotl preprocess`):
each hook imports what it needs when it runs, so loading a config does not load the trainer, the servers or torch.
"""

from __future__ import annotations

import logging

from axolotl.integrations.base import BasePlugin

from grpo_plugin.config.defaults import fill_defaults
from grpo_plugin.config.lookups import run_config
from grpo_plugin.config.runtime import global_rank

LOG = logging.getLogger("grpo_plugin")


class GRPOPlugin(BasePlugin):
    def get_input_args(self) -> str:
        return "grpo_plugin.args.GRPOPluginArgs"

    def register(self, cfg) -> None:
        """Runs on the raw config before validation (also for `axolotl vllm-serve`). axolotl reads
        trainer_cls / trl.use_data_producer / vllm.serve_module before any later hook, so they are set here.
        Only defaults are filled in: an explicit conflicting value is left for validation to reject.
        First of all: the installed axolotl / TRL must be a supported stack (a clear error, before any model loads).
        """
        from grpo_plugin.compat.collector import freeze_at_exit
        from grpo_plugin.compat.cpu_ranks import allow_cpu_ranks
        from grpo_plugin.compat.host import check_host_versions
        from grpo_plugin.config.checks import uses_deepspeed, uses_fsdp
        from grpo_plugin.config.errors import install_excepthook

        check_host_versions()
        # a config the validation below refuses: one block naming every problem, not a traceback
        install_excepthook(rank=global_rank())
        freeze_at_exit()  # the process ends in ~2 s, not after ~15 s of final garbage collection
        # several trainer ranks on a machine without CUDA, as DDP or DeepSpeed (compat/cpu_ranks.py)
        allow_cpu_ranks(deepspeed=uses_deepspeed(cfg), fsdp=uses_fsdp(cfg))
        fill_defaults(cfg)

    def load_datasets(self, cfg, preprocess: bool = False):
        if run_config(cfg).grpo.atropos is None:
            return None
        from grpo_plugin.producers.atropos import placeholder_dataset

        return placeholder_dataset(cfg)

    def pre_model_load(self, cfg) -> None:
        from grpo_plugin.compat.collector import freeze_loaded

        # the host's imports are done: its collections after each model load skip them (compat/collector.py)
        freeze_loaded()
        # Start the managed server as early as possible: it boots while axolotl loads the model.
        # One server per run: with several trainer processes only global rank 0 starts it (the others wait
        # for its /health like any client).
        run = run_config(cfg)  # read once per process: the trainer's loaded_run() is these views
        if run.grpo.managed_server and global_rank() == 0:
            from grpo_plugin.server import managed

            managed.start(run)

    def post_trainer_create(self, cfg, trainer) -> None:
        # Runs just before axolotl picks the checkpoint to resume from: make it the newest COMPLETE one.
        from grpo_plugin.training.checkpoints import settle_resume

        settle_resume(cfg, rank=global_rank())
        acc = trainer.accelerator
        if acc.num_processes > 1:
            from grpo_plugin.compat.cpu_ranks import describe_ranks

            print(f"[grpo_plugin] {describe_ranks(acc)}", flush=True)

    def post_train_unload(self, cfg) -> None:
        from grpo_plugin.server import managed

        managed.stop()
