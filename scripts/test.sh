#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: unit, integration (real vLLM-CPU server), e2e (axolotl).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/install.sh
export AXOLOTL_DO_NOT_TRACK=1 WANDB_MODE=disabled HF_HUB_OFFLINE=1
exec "${GRPO_VENV:-$ROOT/.venv}/bin/python" -m pytest tests "$@"
