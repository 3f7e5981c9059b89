#!/usr/bin/env bash
# Set everything up on a fresh machine and run the CPU demo:
#   a tiny local Qwen2-style model learns, with GRPO through axolotl, to answer with digits; generation runs on
#   a real vLLM server that `axolotl train` starts itself, and the trained LoRA adapter is hot-swapped into it
#   after every step and verified.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/install.sh
# shellcheck disable=SC1091
source "${GRPO_VENV:-$ROOT/.venv}/bin/activate"
export AXOLOTL_DO_NOT_TRACK=1 WANDB_MODE=disabled HF_HUB_OFFLINE=1

if [ ! -f demo/tiny-qwen2/model.safetensors ] || [ ! -f demo/data/digits.jsonl ]; then
  echo "[demo] building the tiny model, tokenizer and task data in ./demo (local, deterministic)"
  python -m grpo_plugin.tiny --out demo
fi
OUT=outputs/quickstart_lora_sync
echo "[demo] axolotl train configs/quickstart_lora_sync.yaml  (server log: $OUT/vllm_server.log)"
axolotl train configs/quickstart_lora_sync.yaml "$@"
python -m grpo_plugin.metrics "$OUT"
