"""What a run reports: recorder.py (each optimizer step's record, told by the trainer as things happen),
metrics.py (the files: `grpo_metrics.jsonl`, the summary, the plot), reward_log.py (the logged reward as TRL
weights it). `python -m grpo_plugin.reporting <output_dir>` prints a finished run's summary."""
