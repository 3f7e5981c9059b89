"""Where the two supported hosts differ, in one place (the rest of the plugin calls these, never a version `if`).

- The version guard: an axolotl / TRL pair outside the supported stacks (stacks.py) is refused with the installed
  and supported versions, from the plugin's `register()`, before any model loads.
- `_get_per_token_logps_and_entropies`: axolotl 0.19 returns (logps, entropies), axolotl >= 0.20 returns
  (logps, entropies, aux_loss) and passes `compute_aux_loss`. The trainer works on the triple and hands the host
  the shape it expects.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
from dataclasses import dataclass

from grpo_plugin.compat.stacks import STACKS, Stack, stack_for


class UnsupportedHostError(RuntimeError):
    pass


def installed_version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def check_host_versions(axolotl: str | None = None, trl: str | None = None) -> Stack:
    """The supported stack the installed (or given) axolotl and TRL belong to; a clear error otherwise."""
    axolotl = axolotl or installed_version("axolotl")
    trl = trl or installed_version("trl")
    found = stack_for(axolotl, trl) if axolotl and trl else None
    if found is None:
        supported = "; ".join(f"{s.name}: axolotl {s.axolotl} with trl {s.trl} (Python {s.python})"
                              for s in STACKS.values())
        raise UnsupportedHostError(
            f"grpo_plugin does not support axolotl {axolotl or '(not installed)'} with trl {trl or '(not installed)'}."
            f" Supported stacks — {supported}. Install one with `GRPO_STACK=current|legacy scripts/install.sh`, "
            "or pin axolotl's own trl (`pip install trl==<the version axolotl pins>`)."
        )
    return found


@dataclass(frozen=True)
class Host:
    """What differs between the supported axolotl releases, as data."""

    stack: str
    logps_returns_aux: bool  # axolotl's _get_per_token_logps_and_entropies returns (logps, entropies, aux_loss)

    def logps_result(self, logps, entropies, aux_loss=None, *, evaluating: bool = False) -> tuple:
        """What the caller unpacks from `_get_per_token_logps_and_entropies`: the host's scoring and loss (2 values
        on axolotl 0.19), or TRL's own evaluation path generating and scoring (`evaluating`: 3, TRL 1.9 too)."""
        return (logps, entropies, aux_loss) if self.logps_returns_aux or evaluating else (logps, entropies)

    @staticmethod
    def split_logps(result: tuple) -> tuple:
        """(logps, entropies, aux_loss) from either host's return value."""
        return (*result, None) if len(result) == 2 else tuple(result)


HOSTS = {"current": Host("current", logps_returns_aux=True), "legacy": Host("legacy", logps_returns_aux=False)}


@functools.cache
def host() -> Host:
    return HOSTS[check_host_versions().name]
