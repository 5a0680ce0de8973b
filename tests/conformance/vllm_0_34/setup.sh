#!/usr/bin/env bash
# Build the CPU-only reference environment that runs a vLLM release's v1 Scheduler
# (0.34.0 by default; the 0.33.0 one is ../../../../shared/reference/setup.sh, same approach).
#   bash tests/conformance/vllm_0_34/setup.sh [VENV_DIR [VLLM_VERSION [REQUIREMENTS]]]
#       defaults: $HOME/.cache/kvsched-reference/venv-0.34, 0.34.0, requirements.txt beside this file
#   bash tests/conformance/vllm_0_34/setup.sh ~/.cache/kvsched-reference/venv-0.35 0.35.0 \
#       tests/conformance/vllm_0_35/requirements.txt       # a later release (new_release.py venv does this)
# Afterwards:  VENV_DIR/bin/python tests/conformance/vllm_0_34/oracle.py SCENARIO.json TRACE.jsonl
# vLLM pins torch and the CUDA stack; only the pure-Python scheduler is used here, so
# the machine's CPU torch (KVSCHED_REFERENCE_TORCH, default 2.13.0) is installed instead
# and every package goes in with --no-deps (the pinned list in REQUIREMENTS is what the
# import path needs: 0.34's has the same pins as the 0.33 list, see the comment there).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${1:-${HOME}/.cache/kvsched-reference/venv-0.34}
version=${2:-0.34.0}
requirements=${3:-$here/requirements.txt}
torch_version=${KVSCHED_REFERENCE_TORCH:-2.13.0}
if [ ! -f "$requirements" ]; then
  echo "error: requirements file $requirements not found (copy the previous release's and check it" \
       "against vllm $version's Requires-Dist)" >&2
  exit 2
fi
check="import vllm, torch; assert vllm.__version__ == '$version', vllm.__version__"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" 2>/dev/null; then
  echo "reference environment already present: $venv"; exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
log=$(mktemp)
# pip's complaints about the deliberately skipped dependencies are noise; any other
# failure (no wheel of that vLLM on the index) stops here with pip's own words.
if ! "$venv/bin/pip" install -q --no-deps "vllm==$version" "torch==$torch_version" -r "$requirements" >"$log" 2>&1; then
  grep -v -i "dependency conflicts\|requires\|incompatible" "$log" >&2 || true
  rm -f "$log"
  echo "error: could not install vllm==$version with torch==$torch_version into $venv" >&2
  exit 3
fi
grep -v -i "dependency conflicts\|requires\|incompatible" "$log" || true
rm -f "$log"
"$venv/bin/python" -c "$check; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "reference environment ready: $venv"
