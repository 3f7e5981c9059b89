"""The code loaded into vLLM's own processes: the worker extension (worker_ext.py: restart's in-place reload,
ipc's manifest), the engine fork (fork_engine.py, a vLLM general plugin), the /generate and policy-version routes
(routes.py) and their ledger (ledger.py). Nothing here imports the trainer's side; ipc's own vLLM plugin is
ipc/vllm_plugin.py. The command that starts the server is grpo_plugin/serve.py (`axolotl vllm-serve`)."""
