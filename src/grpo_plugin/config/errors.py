"""What a user sees of a config's problems: one block, without a Python traceback.

axolotl's `load_cfg` validates the config with pydantic and lets the ValidationError propagate: uncaught, Python
prints ~60 lines of frames around the few that matter. The plugin (registered before validation) installs a
`sys.excepthook` that prints such an error as one block — every problem found, each naming its key — and leaves
the process's exit status at 1. Any other exception keeps the hook that was there before."""

from __future__ import annotations

import sys

from pydantic import ValidationError

HEADER = "grpo_plugin found {n} problem(s) in the config (nothing was loaded):"
_HEADER_START = HEADER.split("{n}")[0]


def problems_message(problems: list[str]) -> str:
    """The message of the ValueError the plugin's config check raises: the header, then one item per problem."""
    return HEADER.format(n=len(problems)) + "\n" + "\n".join(f"  - {indent(p)}" for p in problems)


def indent(text: str) -> str:
    return text.replace("\n", "\n    ")


def error_lines(exc, prefix: str = "") -> list[str]:
    """Each error of a pydantic ValidationError as `<prefix><key>: <message>` (pydantic's "Value error, " dropped)."""
    lines = []
    for error in exc.errors():
        msg = str(error.get("msg", "")).removeprefix("Value error, ")
        loc = ".".join(str(x) for x in error.get("loc") or ())
        lines.append(f"{prefix}{loc}: {msg}" if loc else msg)
    return lines


def block(exc: BaseException) -> str | None:
    """The block for axolotl's config ValidationError; None for any other exception."""
    if not isinstance(exc, ValidationError) or not str(exc.title).startswith("Axolotl"):
        return None
    items = []
    for line in error_lines(exc):
        head, _, rest = line.partition("\n")
        if head.startswith(_HEADER_START) and rest:  # the plugin's own: already one item per problem
            items.append(rest)
        else:
            items.append(f"  - {indent(line)}")
    return ("[grpo_plugin] the config cannot be used; nothing was loaded. Fix these and run the command again:\n"
            + "\n".join(items))


def install_excepthook(rank: int = 0) -> None:
    """From now on a config ValidationError that nothing catches is printed as `block` (by global rank 0 only:
    every rank fails the same way) instead of a traceback. Idempotent."""
    previous = sys.excepthook
    if getattr(previous, "_grpo_config_errors", False):
        return

    def hook(exc_type, exc, tb):
        text = block(exc)
        if text is None:
            previous(exc_type, exc, tb)
        elif rank == 0:
            print(text, file=sys.stderr, flush=True)

    hook._grpo_config_errors = True  # type: ignore[attr-defined]
    sys.excepthook = hook
