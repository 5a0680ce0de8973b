#!/usr/bin/env bash
# Build the CPU-only reference environment that runs vLLM 0.34.0's v1 Scheduler
# (the 0.33.0 one is ../../../../shared/reference/setup.sh; same approach).
#   bash tests/conformance/vllm_0_34/setup.sh [VENV_DIR]
#       default VENV_DIR: $HOME/.cache/kvsched-reference/venv-0.34
# Afterwards:  VENV_DIR/bin/python tests/conformance/vllm_0_34/oracle.py SCENARIO.json TRACE.jsonl
# vLLM pins torch 2.14 and the CUDA stack; only the pure-Python scheduler is used here,
# so the machine's CPU torch 2.13.0 is installed instead and every package goes in
# with --no-deps (the pinned list in requirements.txt is what the import path needs:
# the same pins as the 0.33 list, see the comment there).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${1:-${HOME}/.cache/kvsched-reference/venv-0.34}
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import vllm, torch; assert vllm.__version__ == '0.34.0'" 2>/dev/null; then
  echo "reference environment already present: $venv"; exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q --no-deps vllm==0.34.0 torch==2.13.0 -r "$here/requirements.txt" 2>&1 \
  | grep -v -i "dependency conflicts\|requires\|incompatible" || true
"$venv/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "reference environment ready: $venv"
