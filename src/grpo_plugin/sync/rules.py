"""Each sync mode's config rules, by mode name: the rules live beside their mode (sync/<mode>_rules.py) and need
nothing heavy, so they run when the config loads (grpo_plugin/args.py)."""

from __future__ import annotations

from grpo_plugin.config.schema import DEFAULT_SYNC
from grpo_plugin.runtime import config_value
from grpo_plugin.sync import ipc_rules, lora_rules, restart_rules

RULES = {"ipc": ipc_rules.check, "lora_sync": lora_rules.check, "restart": restart_rules.check}


def check_mode(data: dict) -> None:
    """The chosen mode's rules (`grpo.sync`, lora_sync by default). Raises ValueError naming the key and the fix."""
    grpo = data.get("grpo")
    if grpo is None:
        return
    rules = RULES.get(config_value(grpo, "sync") or DEFAULT_SYNC)
    if rules is not None:  # an unknown mode: the schema's error names the modes there are
        rules(data)
