"""`grpo.sync: lora_sync`'s config rules (the mode itself: sync/lora.py). No torch here: it runs when the config
loads."""

from __future__ import annotations


def check(data: dict, settings) -> None:
    if data.get("adapter") not in ("lora", "qlora"):
        raise ValueError(
            "grpo.sync: lora_sync trains a LoRA adapter and hot-swaps it into vLLM, but `adapter:` is "
            f"{data.get('adapter')!r}. Fix: add `adapter: lora` (with lora_r, lora_alpha, "
            "lora_target_modules), or choose another grpo.sync mode."
        )
