"""Memory of waiting requests: ``--num-prompts`` random requests (1024 in /
128 out, vLLM's random dataset defaults) all arriving at t=0 on
Llama-3.1-8B / H100, the worst case for memory (every request waits at
once). Builds the workload, lets the simulator send every request (the peak:
nothing has finished yet), runs a few seconds of steps, and prints the peak
RSS and the bytes per request.

    python benchmarks/bench_memory.py                      # 1,000,000 requests
    python benchmarks/bench_memory.py --num-prompts 100000
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import sys
import time

from kvsched.sim.cluster import Cluster
from kvsched.sim.run import prepare, serve, sim_config
from kvsched.sim.spec import RunSpec, WorkloadSpec


class _Stop(Exception):
    pass


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=1_000_000)
    ap.add_argument("--run-seconds", type=float, default=3.0, help="wall seconds of steps after the sends")
    args = ap.parse_args()
    n = args.num_prompts
    base = peak_rss_bytes()
    t0 = time.perf_counter()
    # vLLM's random dataset defaults (1024 in / 128 out), all at t=0, through kvsched's one runner.
    prepared = prepare(RunSpec(workload=WorkloadSpec(num_prompts=n)))
    after_workload = peak_rss_bytes()
    first_call: list[float] = []
    last: list[Cluster] = []

    def progress(done: int, total: int, now: float) -> None:
        # Called every 0.5 s of wall time once stepping runs (all sends are done).
        if not first_call:
            first_call.append(time.perf_counter())
        elif time.perf_counter() - first_call[0] > args.run_seconds:
            raise _Stop

    def keep(cluster: Cluster) -> None:
        if not last:
            last.append(cluster)

    d = prepared.deployment
    with contextlib.suppress(_Stop):
        serve(d, prepared.spec.deployment.group, prepared.accepted, sim_config(d, prepared.spec),
              progress=progress, after_step=keep)
    peak = peak_rss_bytes()
    sched = last[0].ranks[0].sched
    print(f"{n:,} requests at t=0: workload {(after_workload - base) / n:,.0f} B/request, "
          f"peak RSS {peak / 2**30:.2f} GiB = {(peak - base) / n:,.0f} B/request above the "
          f"{base / 2**20:.0f} MiB start ({len(sched.waiting):,} waiting, "
          f"{len(sched.running)} running after {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
