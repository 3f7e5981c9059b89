"""grpo_plugin."""
