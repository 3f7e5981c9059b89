"""A reward function that fails, to crash `axolotl train` mid-run (tests only)."""


def boom(prompts, completions, **kwargs):
    raise RuntimeError("injected reward failure")
