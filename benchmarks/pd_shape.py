"""Prefill/decode disaggregation's known shape (issue 22's acceptance).

Llama-3.1-70B on H100 SXM, TP4 per instance, a prefill-heavy workload
(random prompts of 8,000 tokens, 256-token outputs, Poisson arrivals):
colocated serving on 8 GPUs (two TP4 engine cores, vLLM's DP load balancer)
against 1P1D on the same 8 GPUs, at several request rates. Expected, as
DistServe and Splitwise report it: the decode instance's TPOT lower and
steadier (no prefill chunk in its steps), TTFT that pays a KV read, and a
rate past which the single prefill instance queues.

    PYTHONPATH=. python benchmarks/pd_shape.py [--rates 0.5 1 1.5] [--num-prompts 300]
"""

from __future__ import annotations

import argparse

from kvsched.sim.flags import parse_spec
from kvsched.sim.run import run

COMMON = ("--model", "meta-llama/Llama-3.1-70B", "--hardware", "h100-sxm", "-tp", "4",
          "--dataset-name", "random", "--random-input-len", "8000", "--random-output-len", "256",
          "--random-range-ratio", "0.2", "--seed", "1")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.0, 1.5, 2.0])
    p.add_argument("--num-prompts", type=int, default=300)
    args = p.parse_args()
    print("| rate (req/s) | deployment | mean TTFT (ms) | p99 TTFT (ms) | mean TPOT (ms) | p99 TPOT (ms) | "
          "KV read mean / p99 (ms) | TTFT split: prefill leg / hop / wait + read / first step (ms) | "
          "output tok/s per GPU |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for rate in args.rates:
        flags = (*COMMON, "--num-prompts", str(args.num_prompts), "--request-rate", str(rate))
        for name, extra in (("colocated DP2 x TP4", ("-dp", "2")),
                            ("1P1D, TP4 each", ("--disaggregation", "1P1D"))):
            m = run(parse_spec([*flags, *extra])).metrics
            kv = m.get("kv_transfer")
            split = m.get("ttft_split_ms")
            read = f"{kv['mean_ms']:.1f} / {kv['p99_ms']:.1f}" if kv else "-"
            parts = (" / ".join(f"{split[k]:.0f}" for k in ("prefill_leg_ms", "hop_ms", "kv_wait_and_read_ms",
                                                          "decode_first_step_ms")) if split else "-")
            print(f"| {rate:g} | {name} | {m['mean_ttft_ms']:.0f} | {m['p99_ttft_ms']:.0f} | "
                  f"{m['mean_tpot_ms']:.1f} | {m['p99_tpot_ms']:.1f} | {read} | {parts} | "
                  f"{m['output_throughput_per_gpu']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
