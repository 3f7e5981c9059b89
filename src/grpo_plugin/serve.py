"""The former name of the module `axolotl vllm-serve` runs: the same `main` as grpo_plugin/vllm_serve.py.

Kept because configs written before the rename name it (`vllm.serve_module: grpo_plugin.serve`), and README.md and
docs/config.md say it still works (tests/unit/test_args.py checks it)."""

from grpo_plugin.vllm_serve import main

__all__ = ["main"]
