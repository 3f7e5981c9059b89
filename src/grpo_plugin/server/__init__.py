"""The vLLM server as the trainer sees it: its process (start, watch, stop: process.py), its HTTP API (client.py),
several servers behind one client (group.py, connect.py) and the servers `axolotl train` starts with
`grpo.managed_server` (managed.py). What runs inside vLLM's own processes is in in_vllm/; the command that starts a
server is vllm_serve.py (`axolotl vllm-serve`)."""
