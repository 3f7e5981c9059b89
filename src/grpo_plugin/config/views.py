"""One run's config as the plugin reads it: the validated `grpo:` block (schema.py) beside typed views of the
`vllm:` and `trl:` blocks and of the few top-level keys the plugin reads, with the defaults it relies on.

Built once per process (config.lookups.run_config) at the top (the plugin's hooks, the trainer, the serve module,
the Atropos launcher) and handed down as values: code outside config/ reads no raw config.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from grpo_plugin.config.runtime import config_value
from grpo_plugin.config.schema import GRPOSettings
from grpo_plugin.config.server import trainer_dtype


@dataclass(frozen=True)
class VLLMView:
    """The `vllm:` block's keys the plugin reads (axolotl's VllmConfig validates them); None: not set."""

    host: str | None = None
    port: int | None = None
    dtype: str | None = None
    max_model_len: int | None = None
    enforce_eager: bool | None = None
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int | None = None
    data_parallel_size: int | None = None
    enable_prefix_caching: bool | None = None

    @classmethod
    def of(cls, block: Any) -> VLLMView:
        """`block`: the `vllm:` block as a dict, axolotl's model of it, or None."""
        block = block or {}
        return cls(**{f.name: config_value(block, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class TRLView:
    """The `trl:` block's keys the plugin reads past TRL's own args."""

    # more fields of each generation request: axolotl (0.19, 0.21) does not pass it on to TRL's args
    generation_kwargs: dict | None = None
    # groups train in the order they finish, pushes interrupt the rollouts in flight (producers/streaming.py);
    # axolotl's own streaming scorer is kept off (it would bypass the plugin's scoring hook)
    streaming: bool = False

    @classmethod
    def of(cls, block: Any) -> TRLView:
        block = block or {}
        kwargs = config_value(block, "generation_kwargs")
        return cls(generation_kwargs=dict(kwargs) if kwargs else None,
                   streaming=bool(config_value(block, "streaming_partial_batch")))


# the top-level keys a RunConfig reads (with the blocks: what config.lookups.run_config compares)
TOP_KEYS = ("base_model", "output_dir", "adapter", "lora_r", "seed", "trust_remote_code", "sequence_len",
            "wandb_project", "wandb_run_id", "torch_dtype", "bf16", "bfloat16", "fp16", "float16", "load_in_8bit")


@dataclass(frozen=True)
class RunConfig:
    """One run's config: what the plugin reads of it, read once (config.lookups.run_config)."""

    grpo: GRPOSettings
    vllm: VLLMView
    trl: TRLView
    base_model: str | None = None
    output_dir: str | None = None
    adapter: str | None = None  # lora | qlora | None
    lora_r: int = 16  # sizes vLLM's --max-lora-rank when the config sets none
    seed: int | None = None
    trust_remote_code: bool = False
    sequence_len: int = 2048  # axolotl's default
    wandb_project: str = ""
    wandb_run_id: str = ""
    # the dtype axolotl trains in, as vLLM names it; None while `bf16: auto` is unresolved (config/server.py)
    trainer_dtype: str | None = None

    @classmethod
    def of(cls, cfg: Any, grpo: GRPOSettings) -> RunConfig:
        """`cfg`: an axolotl config (a dict or axolotl's DictDefault); `grpo`: its `grpo:` block, validated."""
        cfg = cfg or {}
        seed = cfg.get("seed")
        return cls(
            grpo=grpo, vllm=VLLMView.of(cfg.get("vllm")), trl=TRLView.of(cfg.get("trl")),
            base_model=cfg.get("base_model"), output_dir=cfg.get("output_dir"), adapter=cfg.get("adapter"),
            lora_r=int(cfg.get("lora_r") or 16), seed=int(seed) if seed is not None else None,
            trust_remote_code=bool(cfg.get("trust_remote_code")), sequence_len=int(cfg.get("sequence_len") or 2048),
            wandb_project=str(cfg.get("wandb_project") or ""), wandb_run_id=str(cfg.get("wandb_run_id") or ""),
            trainer_dtype=trainer_dtype(cfg))
