"""KV copies and GPU memory bandwidth (issue 22): the figures of
docs/simulator.md's "KV copies and GPU memory bandwidth".

Two short runs, the set-ups of ``benchmarks/pd_shape.py`` (Llama-3.1-70B,
H100 SXM, TP4, 8,000-token prompts, 1P1D against colocated DP2) and
``benchmarks/offload_mooncake.py`` (Llama-3.1-8B, one H100 SXM, the Mooncake
trace with a GPU cache too small for its reuse, 256 GiB of CPU offloading),
printing the latency figures a change in copy pricing would move and, per
run, how much GPU memory time the KV copies took on the GPUs that ran
steps beside them: copy bytes per GPU / ``mem_bw`` over those GPUs' busy
seconds. That ratio bounds what charging the copies' memory traffic to the
steps could add to them (every step memory bound and every copy running
beside a step); kvsched does not charge it (the module docstrings of
kvsched/sim/kv_transfer.py and offload_transfer.py say why).

    PYTHONPATH=. python benchmarks/kv_copy_hbm.py [--pd-prompts 100] [--pd-rate 1] \\
        [--mooncake-prompts 200]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvsched.perf.hardware import get_hardware
from kvsched.sim.flags import parse_spec
from kvsched.sim.run import run

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
PD = ("--model", "meta-llama/Llama-3.1-70B", "--hardware", "h100-sxm", "-tp", "4",
      "--dataset-name", "random", "--random-input-len", "8000", "--random-output-len", "256",
      "--random-range-ratio", "0.2", "--seed", "1")


def _row(name: str, m: dict[str, Any], copy_note: str) -> str:
    return (f"| {name} | {m['mean_ttft_ms']:.1f} | {m['p99_ttft_ms']:.1f} | {m['mean_tpot_ms']:.2f} | "
            f"{m['p99_tpot_ms']:.2f} | {copy_note} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pd-prompts", type=int, default=100)
    p.add_argument("--pd-rate", type=float, default=1.0)
    p.add_argument("--mooncake-prompts", type=int, default=200)
    p.add_argument("--trace", default=str(TRACE))
    args = p.parse_args()
    mem_bw = get_hardware("h100-sxm").mem_bw
    print("| run | mean TTFT (ms) | p99 TTFT (ms) | mean TPOT (ms) | p99 TPOT (ms) | copies |")
    print("| --- | --- | --- | --- | --- | --- |")
    flags = [*PD, "--num-prompts", str(args.pd_prompts), "--request-rate", repr(args.pd_rate)]
    m = run(parse_spec([*flags, "-dp", "2"])).metrics
    print(_row("pd_shape: colocated DP2 x TP4", m, "-"), flush=True)
    m = run(parse_spec([*flags, "--disaggregation", "1P1D"])).metrics
    kv, decode = m["kv_transfer"], m["role_utilisation"]["decode"]
    # Every decode rank receives its share; 4 GPUs of the one decode instance.
    hbm_s = kv["bytes"] / 4 / mem_bw
    busy_s = decode["busy_fraction"] * m["duration"]
    print(_row("pd_shape: 1P1D, TP4 each", m,
               f"read mean / p99 {kv['mean_ms']:.2f} / {kv['p99_ms']:.2f} ms; {kv['bytes'] / 1e9:.1f} GB; "
               f"copy HBM time / decode busy {hbm_s / busy_s:.3%}"), flush=True)
    common = ["--model", "meta-llama/Llama-3.1-8B", "--hardware", "h100-sxm", "--dataset-name", "mooncake",
              "--dataset-path", args.trace, "--num-prompts", str(args.mooncake_prompts),
              "--num-gpu-blocks-override", "8192", "--max-model-len", "32768", "--time-scale", "2"]
    for size in (0, 256):
        extra = ["--kv-offloading-size", str(size)] if size else []
        m = run(parse_spec([*common, *extra])).metrics
        off = m.get("kv_offload")
        note = "-"
        if off:
            moved = off["store_bytes"] + off["load_bytes"]
            load = (f"load mean / p99 {off['mean_load_ms']:.2f} / {off['p99_load_ms']:.2f} ms; "
                    if "mean_load_ms" in off else "")
            note = (f"{load}{moved / 1e9:.1f} GB stored + loaded; copy HBM time / busy "
                    f"{moved / mem_bw / m['busy_seconds']:.3%}")
        print(_row(f"offload_mooncake: {size} GiB", m, note), flush=True)


if __name__ == "__main__":
    main()
