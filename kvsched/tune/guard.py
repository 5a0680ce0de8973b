"""Stop a simulation once its finished requests prove the SLO missed.

A tuner simulates many deployments that miss the SLO; most of them miss it
long before the last request finishes. :class:`SloGuard` runs after every
step (``Cluster.after_step``), reads the requests finished since its last
look, and raises :class:`SloMissed` as soon as the SLO statistic is bound to
exceed its target whatever the unfinished requests do:

- a percentile p (numpy's linear interpolation over the N values the
  metrics will have) is above the target once v values are, with
  v >= N - floor((N - 1) p / 100): the interpolated point then lies at or
  above a value over the target. The bound grows with N, so the workload's
  request count (at least the final N) keeps it safe;
- a mean of non-negative values is at least (sum so far) / N.

The definitions are kvsched.sim.metrics' own (``request_latencies``: TTFT
and E2EL from the send, TPOT from the first token, over requests with more
than one output token). A deployment the guard
stops misses the SLO in the full simulation too (tests/tune/test_guard.py
checks it on random runs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kvsched.sim.metrics import request_latencies


class SloMissed(Exception):
    """The simulation was stopped: its SLO cannot be met any more."""


class SloGuard:
    def __init__(self, targets_ms: Sequence[tuple[str, float]], percentile: str, max_requests: int) -> None:
        self.targets = [(name, target / 1000.0) for name, target in targets_ms]
        self.mean = percentile == "mean"
        self.n = max(max_requests, 1)
        q = 0.0 if self.mean else float(percentile) / 100.0
        # Values above target that decide a percentile.
        self.needed = self.n - math.floor((self.n - 1) * q)
        self.over = {name: 0 for name, _ in self.targets}
        self.sums = {name: 0.0 for name, _ in self.targets}
        self.seen: dict[int, int] = {}

    def __call__(self, cluster: Any) -> None:
        for i, rank in enumerate(cluster.ranks):
            rec = rank.records
            n = len(rec.send_time)
            start = self.seen.get(i, 0)
            if n == start:
                continue
            self.seen[i] = n
            for j in range(start, n):
                first, end, per_token = request_latencies(rec.send_time[j], rec.first_token_time[j],
                                                          rec.finish_time[j], rec.num_output_tokens[j])
                values = {"ttft": first, "e2el": end}
                if per_token is not None:
                    values["tpot"] = per_token
                for name, target in self.targets:
                    v = values.get(name)
                    if v is None:
                        continue
                    self.sums[name] += v
                    if v > target:
                        self.over[name] += 1
        for name, target in self.targets:
            if self.mean:
                if self.sums[name] / self.n > target:
                    raise SloMissed(f"mean {name} is already above {target * 1000:g} ms")
            elif self.over[name] >= self.needed:
                raise SloMissed(f"{self.over[name]} requests already have {name} above "
                                f"{target * 1000:g} ms, enough to put the percentile above it")
