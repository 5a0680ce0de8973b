"""KV offloading to CPU on the Mooncake trace (issue 22's acceptance).

Mooncake's conversation trace (requests that share prompt prefixes, by its
hash_ids) on Llama-3.1-8B, one H100 SXM, with a GPU KV cache made too small
for the trace's reuse (--num-gpu-blocks-override), without offloading and
with vLLM's --kv-offloading-size at a few sizes. Expected: the CPU tier
finds prefixes the GPU cache evicted, so the total prefix-hit rate rises
and TTFT falls, as far as the host link (PCIe Gen5 x16) keeps up.

    PYTHONPATH=. python benchmarks/offload_mooncake.py [--num-prompts 1000] [--gpu-blocks 8192] \\
        [--time-scale 2] [--sizes 0 64 256]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kvsched.sim.flags import parse_spec
from kvsched.sim.run import run

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--gpu-blocks", type=int, default=8192, help="GPU KV blocks of 16 tokens (default 8192)")
    p.add_argument("--sizes", type=float, nargs="+", default=[0.0, 64.0, 256.0],
                   help="--kv-offloading-size values in GiB (0: off)")
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--time-scale", type=float, default=2.0,
                   help="stretch the trace's arrivals (2: half its rate; one H100 cannot keep up with "
                        "the whole rate of 14k-token prompts)")
    args = p.parse_args()
    common = ["--model", "meta-llama/Llama-3.1-8B", "--hardware", "h100-sxm",
              "--dataset-name", "mooncake", "--dataset-path", args.trace,
              "--num-prompts", str(args.num_prompts),
              "--num-gpu-blocks-override", str(args.gpu_blocks), "--max-model-len", str(args.max_model_len),
              "--time-scale", repr(args.time_scale)]
    print("| offloading (GiB) | CPU blocks | hit rate GPU / CPU / total | mean TTFT (ms) | p99 TTFT (ms) | "
          "mean TPOT (ms) | loads / stores | mean / p99 load (ms) | stored / loaded (GB) | sim wall (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for size in args.sizes:
        extra = ["--kv-offloading-size", repr(size)] if size > 0 else []
        wall = time.perf_counter()
        m = run(parse_spec([*common, *extra])).metrics
        wall = time.perf_counter() - wall
        off = m.get("kv_offload")
        tiers = m.get("prefix_cache_hit_rate_by_tier") or {"gpu": m["prefix_cache_hit_rate"], "cpu": 0.0,
                                                           "total": m["prefix_cache_hit_rate"]}
        rates = f"{tiers['gpu']:.1%} / {tiers['cpu']:.1%} / {tiers['total']:.1%}"
        if off:
            blocks = str(off["num_cpu_blocks"])
            jobs = f"{off['loads']} / {off['stores']}"
            load = (f"{off['mean_load_ms']:.2f} / {off['p99_load_ms']:.2f}" if "mean_load_ms" in off else "-")
            traffic = f"{off['store_bytes'] / 1e9:.1f} / {off['load_bytes'] / 1e9:.1f}"
        else:
            blocks = jobs = load = traffic = "-"
        print(f"| {size:g} | {blocks} | {rates} | {m['mean_ttft_ms']:.0f} | {m['p99_ttft_ms']:.0f} | "
              f"{m['mean_tpot_ms']:.1f} | {jobs} | {load} | {traffic} | {wall:.1f} |", flush=True)


if __name__ == "__main__":
    main()
