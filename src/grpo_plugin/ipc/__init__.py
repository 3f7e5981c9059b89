"""`grpo.sync: ipc`: one shared copy of the weights between the vLLM server and the trainer (CPU; see docs/modes.md)."""
