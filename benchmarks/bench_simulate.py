"""Simulator speed: the whole Azure LLM inference 2023 conversation trace
(19,366 requests, one hour) on Llama-3.1-8B on one H100, vLLM serve defaults.

    python benchmarks/bench_simulate.py               # fast-forward on (the default)
    python benchmarks/bench_simulate.py --compare     # also step by step, and check equality

Prints wall seconds (trace loading included) and simulated requests per wall second.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from kvsched.sim.deployment import EngineOptions, build_deployment
from kvsched.sim.simulator import SimConfig, Simulator
from kvsched.sim.workload import load_azure

TRACE = Path(os.environ.get("KVSCHED_TRACES") or next(
    (p for p in (Path(__file__).resolve().parents[2] / "shared" / "traces", Path("/work/shared/traces"))
     if p.is_dir()), Path("../shared/traces")))


def run(fast_forward: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    workload = load_azure(TRACE / "azure_llm_2023_conv.csv")
    deployment = build_deployment(EngineOptions(model="Llama-3.1-8B", hardware="h100-sxm"))
    config = SimConfig(deployment.scheduler_config, deployment.cache_config,
                       deployment.step_model, fast_forward=fast_forward,
                       keep_step_log=False)
    result = Simulator(config, workload).run()
    wall = time.perf_counter() - t0
    metrics = result.metrics()
    n = len(workload.requests)
    return {"fast_forward": fast_forward, "requests": n, "wall_seconds": wall,
            "requests_per_wall_second": n / wall, "metrics": metrics}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", action="store_true", help="also run without fast-forward")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    runs = [run(True)] + ([run(False)] if args.compare else [])
    for r in runs:
        m = r["metrics"]
        print(f"fast_forward={'on ' if r['fast_forward'] else 'off'} {r['requests']} requests in "
              f"{r['wall_seconds']:.1f} s wall = {r['requests_per_wall_second']:,.0f} simulated req/s  "
              f"(steps {m['num_steps']:,}, fast-forwarded {m['fast_forwarded_steps']:,}; "
              f"simulated {m['duration']:,.0f} s, output {m['output_throughput']:,.0f} tok/s, "
              f"mean TTFT {m['mean_ttft_ms']:.1f} ms, mean TPOT {m['mean_tpot_ms']:.2f} ms)", flush=True)
    if len(runs) == 2:
        a, b = (dict(r["metrics"]) for r in runs)
        for key in ("simulation_wall_seconds", "fast_forwarded_steps"):
            a.pop(key)
            b.pop(key)
        same = a == b
        print(f"identical metrics with and without fast-forward: {same}; "
              f"speed-up {runs[1]['wall_seconds'] / runs[0]['wall_seconds']:.1f}x")
        if not same:
            return 1
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
