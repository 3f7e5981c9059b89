"""The CPU demos' model and data, built locally and deterministically (no model hub): the tiny model and tokenizer
and the digit task (tiny.py), the tool-calling demos' warm-started model and tasks (tools.py).
`python -m grpo_plugin.demo --out demo [--tool-warm-start]` builds them."""
