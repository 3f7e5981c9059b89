"""The benchmarks: one module each, shared helpers in common.py, the command line in __main__.py
(`python -m grpo_plugin.bench <name>`, which imports only the chosen benchmark). Importing this package imports
nothing else. Each module imports the standard library and light modules at its top; heavy or optional packages
(torch, transformers, peft, deepspeed, axolotl, the atropos extra) are imported inside the functions that use them,
each with a comment saying why: importing a benchmark stays light, and a run loads only its own benchmark's
dependencies."""
