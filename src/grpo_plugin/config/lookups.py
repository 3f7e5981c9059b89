"""Runtime lookups: the config axolotl loaded in this process, and values read at run time from it."""

from __future__ import annotations

from grpo_plugin.config.schema import GRPOSettings

# Tolerance of the post-sync probe: mean |logprob_vLLM - logprob_trainer| over the probe tokens.
DEFAULT_TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 1e-2}


def loaded_cfg() -> dict:
    """The validated config axolotl loaded in this process (set by axolotl after validation)."""
    from axolotl.integrations.base import PluginManager  # here: it imports peft and torch (~15 s on 2 cores)

    return PluginManager.get_instance().cfg or {}


def settings_of(cfg) -> GRPOSettings:
    """The `grpo:` block of an axolotl config (`cfg`: a dict or axolotl's DictDefault), validated: the one way
    code outside config/ reads it. Raises pydantic's ValidationError on a block the schema refuses."""
    block = (cfg or {}).get("grpo")
    return GRPOSettings(**(dict(block) if block else {}))


def has_settings(cfg) -> bool:
    """Whether an axolotl config (a dict or axolotl's DictDefault) has a `grpo:` block at all."""
    return (cfg or {}).get("grpo") is not None


def current_settings() -> GRPOSettings:
    """The validated `grpo:` block of the config axolotl loaded in this process."""
    return settings_of(loaded_cfg())
