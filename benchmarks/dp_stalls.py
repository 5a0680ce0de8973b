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

from kvsched.commands.compare import PRESETS
from kvsched.sim.dp import DPSimulator
from kvsched.sim.flags import parse_spec
from kvsched.sim.run import build_dp_simulator, prepare, sim_config


def main(argv: list[str]) -> int:
    # The stall count reads every step: no fast-forward, every step kept.
    spec = parse_spec(PRESETS["balance-seed"][0] + argv).with_options(fast_forward=False, keep_step_log=True)
    prepared = prepare(spec)
    deployment = prepared.deployment
    config = sim_config(deployment, prepared.spec)
    sim = build_dp_simulator(deployment, prepared.spec.deployment.group, config, prepared.accepted)
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
