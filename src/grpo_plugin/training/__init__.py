"""What the trainer does beside the host's training loop: forward.py (the loss's forward, each row at its own
sampling temperature; fp32 models without axolotl's autocast), checkpoints.py (which checkpoint a run resumes
from, and the save made when a run must stop)."""
