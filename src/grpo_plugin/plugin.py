"""GRPOPlugin: wiring only. Listed under `plugins:` as `grpo_plugin.GRPOPlugin`.

axolotl imports this module whenever it loads a config (also for `axolotl vllm-serve` and `axolotl preprocess`):
each hook imports what it needs when it runs, so loading a config does not load the trainer, the servers or torch.
"""

from __future__ import annotations

import logging
import os

from axolotl.integrations.base import BasePlugin

LOG = logging.getLogger("grpo_plugin")

TRAINER_CLS = "grpo_plugin.trainer.GRPOPluginTrainer"
SERVE_MODULE = "grpo_plugin.serve"


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
        from grpo_plugin.config.checks import uses_fsdp
        from grpo_plugin.runtime import world_size

        check_host_versions()
        freeze_at_exit()  # the process ends in ~2 s, not after ~15 s of final garbage collection
        # several trainer ranks on a machine without CUDA, as DDP or DeepSpeed (compat/cpu_ranks.py)
        allow_cpu_ranks(deepspeed=bool(cfg.get("deepspeed")), fsdp=uses_fsdp(cfg))
        if cfg.get("grpo") is None:
            cfg["grpo"] = {}
        if cfg.get("trainer_cls") not in (None, TRAINER_CLS):
            LOG.warning("grpo_plugin: replacing trainer_cls %r with %s", cfg.get("trainer_cls"), TRAINER_CLS)
        cfg["trainer_cls"] = TRAINER_CLS
        trl = cfg.get("trl")
        if trl is None:
            trl = cfg["trl"] = {}
        vllm = cfg.get("vllm")
        if vllm is None:
            vllm = cfg["vllm"] = {}
        trl.setdefault("use_vllm", True)
        trl.setdefault("vllm_mode", "server")
        trl.setdefault("use_data_producer", True)
        if world_size() > 1:
            # several ranks: a rank skipping its zero-advantage micro-batch skips the loss's collectives while the
            # others wait in them (a deadlock; config/checks.py refuses an explicit true)
            trl.setdefault("skip_zero_advantage_batches", False)
        vllm.setdefault("serve_module", SERVE_MODULE)
        vllm.setdefault("host", "127.0.0.1")
        vllm.setdefault("port", 8000)
        trl.setdefault("vllm_server_host", vllm["host"])
        trl.setdefault("vllm_server_port", vllm["port"])
        atropos = (cfg.get("grpo") or {}).get("atropos")
        if atropos is not None:
            self._register_atropos(cfg, trl, atropos if isinstance(atropos, dict) else {})

    @staticmethod
    def _register_atropos(cfg, trl, atropos: dict) -> None:
        """Rollouts come from Atropos: the environments' scores are the reward, and axolotl's required
        `datasets:` gets a marker (the plugin's load_datasets hook supplies the placeholder prompt rows)."""
        from grpo_plugin.config.checks import ATROPOS_DATASET_MARKER, ENV_SCORE_REWARD, atropos_batch_size

        if not trl.get("reward_funcs"):
            trl["reward_funcs"] = [ENV_SCORE_REWARD]
        if not cfg.get("datasets"):
            cfg["datasets"] = [{"path": ATROPOS_DATASET_MARKER}]
        if trl.get("num_generations") is None:
            # axolotl's reward path groups rows by num_generations; the real groups come from the envs
            trl["num_generations"] = int(atropos.get("group_size") or atropos_batch_size(cfg))

    def load_datasets(self, cfg, preprocess: bool = False):
        grpo = cfg.get("grpo") or {}
        if not grpo.get("atropos"):
            return None
        from grpo_plugin.producers.atropos import placeholder_dataset

        return placeholder_dataset(cfg)

    def pre_model_load(self, cfg) -> None:
        from grpo_plugin.compat.collector import freeze_loaded

        # the host's imports are done: its collections after each model load skip them (compat/collector.py)
        freeze_loaded()
        # Start the managed server as early as possible: it boots while axolotl loads the model.
        grpo = cfg.get("grpo") or {}
        # One server per run: with several trainer processes only global rank 0 starts it (the others wait
        # for its /health like any client).
        if grpo.get("managed_server") and os.environ.get("RANK", "0") == "0":
            from grpo_plugin.server import managed

            managed.start(cfg)

    def post_trainer_create(self, cfg, trainer) -> None:
        # Runs just before axolotl picks the checkpoint to resume from: make it the newest COMPLETE one.
        from grpo_plugin.checkpoints import settle_resume

        settle_resume(cfg, rank=int(os.environ.get("RANK", "0")))
        acc = trainer.accelerator
        if acc.num_processes > 1:
            from grpo_plugin.compat.cpu_ranks import describe_ranks

            print(f"[grpo_plugin] {describe_ranks(acc)}", flush=True)

    def post_train_unload(self, cfg) -> None:
        from grpo_plugin.server import managed

        managed.stop()
