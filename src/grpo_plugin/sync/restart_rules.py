"""`grpo.sync: restart`'s config rules (the mode itself: sync/restart.py). No torch here: it runs when the config
loads."""

from __future__ import annotations


def check(data: dict, settings) -> None:
    if data.get("adapter"):
        raise ValueError(
            f"grpo.sync: restart syncs full weights for full fine-tuning, but `adapter: {data.get('adapter')}` "
            "is set. Fix: use `grpo.sync: lora_sync` to train and hot-swap the adapter, or remove `adapter:`."
        )
