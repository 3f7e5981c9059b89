"""The former name of the module `axolotl vllm-serve` runs (`vllm.serve_module: grpo_plugin.serve` in configs
written before it became grpo_plugin/vllm_serve.py): the same `main`."""

from grpo_plugin.vllm_serve import main

__all__ = ["main"]
