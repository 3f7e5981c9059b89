"""The plugin's configuration: the `grpo:` schema (schema.py, pure pydantic), the sync modes' table (modes.py: what
each mode asks of the config and of the server), the cross-key checks that hold whatever the sync mode (checks.py),
preflight (preflight.py: everything checkable before the model loads, in one message) and the doorway code outside
config/ reads a config through (lookups.py: one run's views of it, views.py, read once per process).
The plugin's args (grpo_plugin/args.py, GRPOPluginArgs: what axolotl merges into its config model) run them in
order. Below them all: the server's settings (server.py), the sync directories (storage.py), facts several layers
read (runtime.py), every TRL/axolotl option's status (options.py), and importing what the config names by import
path (import_paths.py: preflight checks those paths; the agents and the Atropos producer import them while
training)."""
