"""The plugin's configuration: the `grpo:` schema (schema.py, pure pydantic), the cross-key checks that hold whatever
the sync mode (checks.py; each mode's own rules sit beside the mode, sync/<mode>_rules.py), preflight
(preflight.py: everything checkable before the model loads, in one message) and runtime lookups (lookups.py).
The plugin's args (grpo_plugin/args.py, GRPOPluginArgs: what axolotl merges into its config model) run them in
order. Below them all: the server's settings (server.py), the sync directories (storage.py), facts several layers
read (runtime.py), every TRL/axolotl option's status (options.py)."""
