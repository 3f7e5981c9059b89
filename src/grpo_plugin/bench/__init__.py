"""The benchmarks: one module each (lora, restart, ipc, atropos), shared helpers in common.py, the command line in
__main__.py (`python -m grpo_plugin.bench <name>`). Importing this package imports nothing else."""
