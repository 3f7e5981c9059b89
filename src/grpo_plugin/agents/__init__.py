"""Tool-calling rollouts: TRL's `tools` and `environment_factory`, named under `grpo:` and run by the plugin as the
run's rollout function (the agent producer's path: one pinned weight version per rollout, every sync verified, tool
results never trained). chat_format.py: the model's chat format (prompts with tools, turns parsed, tool results
framed); tool_calls.py: running the calls; environments.py: environment instances and their reward; tool_loop.py:
the loop; attach.py: putting it on the trainer."""
