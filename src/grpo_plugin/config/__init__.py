"""The plugin's configuration: the `grpo:` schema (schema.py, pure pydantic), the cross-key checks (checks.py,
grouped per mode), preflight (preflight.py: everything checkable before the model loads, in one message; it holds
GRPOPluginArgs, what axolotl merges into its config model) and runtime lookups (lookups.py)."""
