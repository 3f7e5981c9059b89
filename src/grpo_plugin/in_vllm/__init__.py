"""The code loaded into vLLM's own processes: the worker extension (worker_ext.py: restart's in-place reload,
ipc's manifest), the two vLLM general plugins (fork_engine.py: the engine forked; ipc_export.py: the weights shared
for `grpo.sync: ipc`), the /generate and policy-version routes (routes.py) and their ledger (ledger.py). Nothing
here imports the trainer's side. The command that starts the server is grpo_plugin/vllm_serve.py
(`axolotl vllm-serve`)."""
