# Sourced by install.sh, demo.sh and test.sh: which stack, and which environment folder holds it.
#   GRPO_STACK=current (default: Python 3.12, axolotl 0.21) | legacy (Python 3.11, axolotl 0.19)
#   GRPO_VENV=DIR overrides the folder (default .venv for current, .venv-legacy for legacy)
GRPO_STACK="${GRPO_STACK:-current}"
case "$GRPO_STACK" in
  current) VENV="${GRPO_VENV:-$ROOT/.venv}" ;;
  legacy) VENV="${GRPO_VENV:-$ROOT/.venv-legacy}" ;;
  *) echo "GRPO_STACK must be 'current' or 'legacy', not '$GRPO_STACK'" >&2; exit 2 ;;
esac
export GRPO_STACK
