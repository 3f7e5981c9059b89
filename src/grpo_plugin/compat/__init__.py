"""The supported host stacks (stacks.py: one table for the installer, the version guard and the plan tests) and
what differs between them (host.py)."""
