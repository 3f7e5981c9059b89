"""`python -m grpo_plugin.reporting <output_dir>`: the summary of a run's `grpo_metrics.jsonl` (default: .)."""

import sys

from grpo_plugin.reporting.metrics import report

print(report(sys.argv[1] if len(sys.argv) > 1 else "."))
