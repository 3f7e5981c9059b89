"""The plugin's config model: `grpo:` (config/schema.py) merged into axolotl's, and what runs when a config loads, in
order: the cross-key checks (config/checks.py), the sync mode's own rules (sync/rules.py: each mode's beside it),
then the checks of what the config points at (config/preflight.py: all problems in one message). Nothing heavy
is imported: this runs before any model loads, also for `axolotl vllm-serve`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, model_validator

from grpo_plugin.config.checks import ATROPOS_DATASET_MARKER, check_cross_keys
from grpo_plugin.config.preflight import config_problems
from grpo_plugin.config.schema import GRPOSettings
from grpo_plugin.sync.rules import check_mode


class GRPOPluginArgs(BaseModel):
    """Mixed into axolotl's config model by `GRPOPlugin.get_input_args()`."""

    grpo: GRPOSettings | None = None

    @model_validator(mode="before")
    @classmethod
    def _grpo_cross_checks(cls, data: Any) -> Any:
        if isinstance(data, dict):
            check_cross_keys(data)
            check_mode(data)
            problems = config_problems(data, atropos_marker=ATROPOS_DATASET_MARKER)
            if problems:
                raise ValueError(f"grpo_plugin found {len(problems)} problem(s) in the config (nothing was "
                                 "loaded):\n" + "\n".join(f"  - {p}" for p in problems))
        return data
