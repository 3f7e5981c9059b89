"""The doorway to the config: the validated `grpo:` block (settings_of), one run's views of the whole config
(run_config: config/views.py), and the config axolotl loaded in this process (loaded_run)."""

from __future__ import annotations

import copy
from typing import Any

from grpo_plugin.config.runtime import world_size
from grpo_plugin.config.schema import GRPOSettings
from grpo_plugin.config.views import TOP_KEYS, RunConfig

# Tolerance of the post-sync probe: mean |logprob_vLLM - logprob_trainer| over the probe tokens.
DEFAULT_TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 1e-2}


def settings_of(cfg) -> GRPOSettings:
    """The `grpo:` block of an axolotl config (`cfg`: a dict or axolotl's DictDefault), validated. Raises
    pydantic's ValidationError on a block the schema refuses."""
    block = (cfg or {}).get("grpo")
    return GRPOSettings(**(dict(block) if block else {}))


def has_settings(cfg) -> bool:
    """Whether an axolotl config (a dict or axolotl's DictDefault) has a `grpo:` block at all."""
    return (cfg or {}).get("grpo") is not None


# the last config run_config read (a copy of what it read, with the trainer ranks the schema's defaults depend on)
# and its views: the plugin's hooks, the trainer and the reward functions of one process resolve the same config
_last: tuple[Any, RunConfig] | None = None


def run_config(cfg) -> RunConfig:
    """One run's config as the plugin reads it (config/views.py), the `grpo:` block validated: the way code outside
    config/ reads a config. Validated once per process: asked again for a config that reads the same, it hands out
    the same views. Raises pydantic's ValidationError on a `grpo:` block the schema refuses."""
    global _last
    cfg = cfg or {}
    read = (world_size(), {key: cfg.get(key) for key in ("grpo", "vllm", "trl", *TOP_KEYS)})
    if _last is not None and _last[0] == read:
        return _last[1]
    run = RunConfig.of(cfg, settings_of(cfg))
    _last = (copy.deepcopy(read), run)
    return run


def loaded_run() -> RunConfig:
    """run_config of the config axolotl loaded in this process (set by axolotl after validation): for the entry
    points axolotl calls without it (the serve module, the trainer class, reward functions named by path)."""
    from axolotl.integrations.base import PluginManager  # here: it imports peft and torch (~15 s on 2 cores)

    return run_config(PluginManager.get_instance().cfg)
