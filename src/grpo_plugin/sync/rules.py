"""Each sync mode's config rules, by mode name: the rules live beside their mode (sync/<mode>_rules.py) and need
nothing heavy, so they run when the config loads (grpo_plugin/args.py). They read `grpo:` through the validated
settings (config.lookups.settings_of) and the rest of the config as given."""

from __future__ import annotations

from grpo_plugin.config.lookups import has_settings, settings_of
from grpo_plugin.sync import ipc_rules, lora_rules, restart_rules

RULES = {"ipc": ipc_rules.check, "lora_sync": lora_rules.check, "restart": restart_rules.check}


def check_mode(data: dict) -> None:
    """The chosen mode's rules (`grpo.sync`, lora_sync by default). Raises ValueError naming the key and the fix."""
    if not has_settings(data):
        return
    try:
        settings = settings_of(data)
    except ValueError:  # a block the schema refuses: its own error (naming the key) comes when axolotl validates
        return
    RULES[settings.sync](data, settings)
