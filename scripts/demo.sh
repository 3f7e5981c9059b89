#!/usr/bin/env bash
# Set everything up on a fresh machine and run the CPU demo:
#   a tiny local Qwen2-style model learns, with GRPO through axolotl, to answer with digits; generation runs on
#   a real vLLM server that `axolotl train` starts itself, and the trained weights reach it after every step and
#   are verified.
#     ./scripts/demo.sh                 lora_sync: a LoRA adapter, hot-swapped into the server
#     ./scripts/demo.sh restart         restart: full fine-tuning, the server reloads the weights in place
#     ./scripts/demo.sh ipc             ipc: full fine-tuning, trainer and server share one copy of the weights
#     ./scripts/demo.sh qlora           lora_sync on a 4-bit (nf4) base: the server serves the trainer's own base
#     ./scripts/demo.sh atropos         an Atropos environment generates and scores the rollouts (run-api, env,
#                                       vLLM server and trainer started and stopped by grpo_plugin.atropos.launch)
#     ./scripts/demo.sh agent           a two-turn agent (trl.rollout_func): the model answers, the environment
#                                       replies, the model answers again; the reply's tokens are never trained
#     ./scripts/demo.sh tools           tool calling (grpo.tools): the model, taught the call format first, learns
#                                       to call lookup() and answer with its result; tool results never trained
# Further arguments go to `axolotl train`. GRPO_STACK=legacy runs it on the Python 3.11 / axolotl 0.19 stack.
set -euo pipefail
MODE=lora_sync
case "${1:-}" in
  lora_sync|restart|ipc|atropos|qlora|agent|tools) MODE="$1"; shift ;;
esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/stack.sh   # GRPO_STACK=current (default) | legacy, and its VENV
bash scripts/install.sh
# shellcheck disable=SC1091
source "$VENV/bin/activate"
export AXOLOTL_DO_NOT_TRACK=1 WANDB_MODE=disabled HF_HUB_OFFLINE=1

if [ ! -f demo/tiny-qwen2/model.safetensors ] || [ ! -f demo/data/digits.jsonl ]; then
  echo "[demo] building the tiny model, tokenizer and task data in ./demo (local, deterministic)"
  python -m grpo_plugin.demo --out demo
fi
OUT="outputs/quickstart_$MODE"
CONFIG="configs/quickstart_$MODE.yaml"
if [ "$MODE" = agent ]; then OUT=outputs/quickstart_rollout_func; CONFIG=configs/agents/quickstart_rollout_func.yaml; fi
if [ "$MODE" = tools ]; then
  CONFIG=configs/agents/quickstart_tools.yaml
  if [ ! -f demo/tiny-qwen2-tools/model.safetensors ] || [ ! -f demo/data/lookup.jsonl ]; then
    echo "[demo] teaching the tiny model the tool-call format (a short supervised run, ~1 min)"
    python -m grpo_plugin.demo --out demo --tool-warm-start
  fi
fi
if [ "$MODE" = atropos ]; then
  echo "[demo] python -m grpo_plugin.atropos.launch configs/quickstart_atropos.yaml  (logs: $OUT/atropos_logs/)"
  python -m grpo_plugin.atropos.launch configs/quickstart_atropos.yaml ${1:+--} "$@"
  python -m grpo_plugin.reporting "$OUT"  # (the trainer printed it into its log)
else
  echo "[demo] axolotl train $CONFIG  (server log: $OUT/vllm_server.log)"
  axolotl train "$CONFIG" "$@"  # prints the run summary at its end
fi
