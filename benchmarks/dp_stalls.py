"""Count lockstep steps by how many data-parallel ranks carry a prefill.

    python benchmarks/dp_stalls.py
    python benchmarks/dp_stalls.py --admission-policy balance --random-range-ratio 0.1

Arguments are ``kvsched simulate`` flags on top of the ``balance-seed``
preset. Runs without fast-forward so every step is seen. docs/balance.md's
step table comes from this script.
"""

from __future__ import annotations

import sys
from collections import Counter

from kvsched.sim.command import (
    build_deployment,
    build_dp_simulator,
    build_workload,
    engine_options,
    resolve_workload_args,
    sim_config,
)
from kvsched.sim.compare import PRESETS, variant_parser
from kvsched.sim.dp import DPSimulator


def main(argv: list[str]) -> int:
    args = resolve_workload_args(variant_parser().parse_args(PRESETS["balance-seed"][0] + argv))
    args.no_fast_forward = True
    deployment = build_deployment(engine_options(args))
    config = sim_config(deployment, args)
    config.keep_step_log = True  # the stall count reads every step
    sim = build_dp_simulator(deployment, config, build_workload(args), args)
    seen = [0] * len(sim.ranks)
    steps: Counter[int] = Counter()
    seconds: Counter[int] = Counter()
    running: list[int] = []

    def count(d: DPSimulator) -> None:
        prefilling, dt = 0, None
        for i, r in enumerate(d.ranks):
            if len(r.steps) > seen[i]:  # this rank ran a real batch (not the dummy)
                seen[i] = len(r.steps)
                dt = r.steps.duration[-1]
                prefilling += r.steps.prefill_tokens[-1] > 0
        if dt is not None:
            steps[prefilling] += 1
            seconds[prefilling] += dt
            running.append(sum(len(r.sched.running) for r in d.ranks))

    sim.after_step.append(count)
    m = sim.run().combined().metrics((99.0,), None)
    print(f"{' '.join(argv) or 'baseline'}: mean TTFT {m['mean_ttft_ms']:.0f} ms, mean TPOT "
          f"{m['mean_tpot_ms']:.2f} ms, {m['duration']:.1f} s, {m['output_throughput']:.1f} output tok/s")
    for k in sorted(steps):
        print(f"  {k} ranks prefilling: {steps[k]:6d} steps, {seconds[k]:7.1f} s, "
              f"{1000 * seconds[k] / steps[k]:.1f} ms each")
    print(f"  mean requests running (all ranks): {sum(running) / len(running):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
