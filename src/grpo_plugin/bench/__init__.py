"""The benchmarks: one module each (lora, restart, ipc, atropos), shared helpers in common.py, the command line in
__main__.py (`python -m grpo_plugin.bench <name>`). Importing this package imports nothing else, and each
benchmark imports what it uses inside its functions: a run loads only its own benchmark's dependencies (torch,
vLLM clients, the sandbox), not every benchmark's."""
