"""`grpo.sync: ipc` (work in progress): one shared copy of the weights between the vLLM server and the trainer."""
