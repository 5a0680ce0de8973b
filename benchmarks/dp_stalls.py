"""Count lockstep steps by how many data-parallel ranks carry a prefill.

    python benchmarks/dp_stalls.py none
    python benchmarks/dp_stalls.py balance:full-minus-one --random-range-ratio 0.1

The first argument is the admission policy (``none``, ``balance:full``,
``balance:full-minus-one`` or ``adp``); the rest are ``kvsched simulate``
flags on top of the ``balance-seed`` preset. Runs without fast-forward so
every step is seen. docs/balance.md's step table comes from this script.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

from kvsched.core.policies import AdpBalance, BalanceGate, DPRankStates
from kvsched.sim.command import build_deployment, build_workload, engine_options, sim_config
from kvsched.sim.compare import PRESETS, _variant_parser
from kvsched.sim.dp import DPOptions, DPSimulator


def main(argv: list[str]) -> int:
    kind, extra = argv[0], argv[1:]
    args = _variant_parser().parse_args(PRESETS["balance-seed"][0] + extra)
    args.no_fast_forward = True
    deployment = build_deployment(engine_options(args))
    dp = deployment.parallel.data_parallel_size
    shared = DPRankStates(dp)
    policies: list[Any] = [None] * dp
    if kind.startswith("balance:"):
        policies = [BalanceGate(shared, r, kind.split(":", 1)[1]) for r in range(dp)]
    elif kind == "adp":
        policies = [AdpBalance(shared, r, args.adp_timeout_iters, args.adp_batching_wait_iters)
                    for r in range(dp)]
    elif kind != "none":
        raise SystemExit(f"policy {kind!r}: use none, balance:full, balance:full-minus-one or adp")
    sim = DPSimulator(sim_config(deployment, args), build_workload(args),
                      DPOptions(dp, lockstep=True, router=args.dp_routing,
                                stats_interval=args.dp_stats_interval), policies)
    seen = [0] * dp
    steps: Counter[int] = Counter()
    seconds: Counter[int] = Counter()
    running: list[int] = []

    def count(d: DPSimulator) -> None:
        shared.publish_all([r.sched for r in d.ranks])
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
    print(f"{kind} {' '.join(extra)}: mean TTFT {m['mean_ttft_ms']:.0f} ms, mean TPOT "
          f"{m['mean_tpot_ms']:.2f} ms, {m['duration']:.1f} s, {m['output_throughput']:.1f} output tok/s")
    for k in sorted(steps):
        print(f"  {k} ranks prefilling: {steps[k]:6d} steps, {seconds[k]:7.1f} s, "
              f"{1000 * seconds[k] / steps[k]:.1f} ms each")
    print(f"  mean requests running (all ranks): {sum(running) / len(running):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
