"""How fast this machine's core is right now, and how it varies: the
testbed-noise probe of issue 21 (results/README.md, "Where the noise comes
from").

A fixed FP32 matmul (512x512 by 512x1536, one thread) runs back to back on
one core for ``--seconds``; the script prints the median time of a call in
every second (so phases of a slower host show), then the p10/p50/p90/p99.
``--idle`` instead times the first call after idling 0-1000 ms against the
calls right after it (a core that idled runs its first work slower).

    python benchmarks/real_vllm/host_speed.py [--core 0] [--seconds 60] [--idle]

Run it with nothing else on the machine, or it measures the other jobs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def steady(seconds: float) -> None:
    a, b = torch.randn(512, 512), torch.randn(512, 1536)
    rows: list[tuple[float, float]] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        t = time.perf_counter()
        torch.mm(a, b)
        rows.append((t - t0, 1e3 * (time.perf_counter() - t)))
    per_second: dict[int, list[float]] = {}
    for t, ms in rows:
        per_second.setdefault(int(t), []).append(ms)
    print("median ms per call, second by second:")
    print(" ".join(f"{statistics.median(v):.1f}" for _, v in sorted(per_second.items())))
    ms = sorted(m for _, m in rows)
    n = len(ms)
    print(f"{n} calls: p10 {ms[n // 10]:.2f} p50 {ms[n // 2]:.2f} p90 {ms[9 * n // 10]:.2f} "
          f"p99 {ms[99 * n // 100]:.2f} ms")


def after_idle() -> None:
    a, b = torch.randn(512, 512), torch.randn(512, 1536)
    for _ in range(300):
        torch.mm(a, b)
    for idle in (0.0, 0.001, 0.01, 0.05, 0.2, 1.0):
        first: list[float] = []
        rest: list[float] = []
        for _ in range(8):
            time.sleep(idle)
            for k in range(5):
                t = time.perf_counter()
                torch.mm(a, b)
                (first if k == 0 else rest).append(1e3 * (time.perf_counter() - t))
        print(f"after {1e3 * idle:6.0f} ms idle: first call {statistics.median(first):.2f} ms, "
              f"the next ones {statistics.median(rest):.2f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--core", type=int, default=0)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--idle", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    os.sched_setaffinity(0, {args.core})
    if args.idle:
        after_idle()
    else:
        steady(args.seconds)


if __name__ == "__main__":
    main()
