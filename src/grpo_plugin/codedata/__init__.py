"""Code datasets: HumanEval in the seed format (humaneval.py) and the dataset check run before training
(`python -m grpo_plugin.codedata.check FILE`, check.py)."""
