"""The plugin's config model: `grpo:` (config/schema.py) merged into axolotl's, and what runs when a config loads, in
order: the cross-key checks (config/checks.py), the sync mode's own rules (config/modes.py),
then the checks of what the config points at (config/preflight.py: all problems in one message). Nothing heavy
is imported: this runs before any model loads, also for `axolotl vllm-serve`."""

from __future__ import annotations

from functools import partial
from typing import Any

from pydantic import BaseModel, ValidationError, model_validator

from grpo_plugin.config.checks import ATROPOS_DATASET_MARKER, check_cross_keys
from grpo_plugin.config.errors import error_lines, problems_message
from grpo_plugin.config.lookups import has_settings, settings_of
from grpo_plugin.config.modes import MODES
from grpo_plugin.config.preflight import config_problems
from grpo_plugin.config.schema import GRPOSettings


class GRPOPluginArgs(BaseModel):
    """Mixed into axolotl's config model by `GRPOPlugin.get_input_args()`."""

    grpo: GRPOSettings | None = None

    @model_validator(mode="before")
    @classmethod
    def _grpo_cross_checks(cls, data: Any) -> Any:
        if isinstance(data, dict):
            problems = every_problem(data)
            if problems:
                raise ValueError(problems_message(problems))
        return data


def every_problem(data: dict) -> list[str]:
    """Every problem the plugin finds in the config, in one pass: the `grpo:` block's schema, the cross-key checks,
    the sync mode's rules (each of those stops at its first problem) and every check of what the config points at."""
    problems, checks = [], [check_cross_keys]
    try:
        settings = settings_of(data)
    except (TypeError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        if not isinstance(exc, ValidationError):
            return [f"grpo: must be a block of keys (see docs/config.md) ({exc})"]
        problems += error_lines(exc, prefix="grpo.")
    else:  # the chosen mode's rules, on the block just validated (config/modes.py)
        if has_settings(data):
            checks.append(partial(MODES[settings.sync].check, settings=settings))
    for check in checks:
        try:
            check(data)
        except ValueError as exc:
            problems.append(str(exc))
    return problems + config_problems(data, atropos_marker=ATROPOS_DATASET_MARKER)
