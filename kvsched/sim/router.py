"""The router: which data-parallel rank serves an arriving request.

- ``vllm``: vLLM's DP load balancer. It sends a request to the rank with the
  lowest ``4 × waiting + running`` from the load stats the engines publish
  every ``stats_interval`` seconds; between two updates the front end counts
  each request it routes as one more waiting on its rank. Ties go to the
  lowest rank.
- ``round-robin``: ranks in turn.
- ``least-loaded``: the same score on exact, current counts.

A router reads the ranks' schedulers; it changes nothing in them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence, Sized
from dataclasses import dataclass, field
from typing import Protocol

ROUTERS = ("vllm", "round-robin", "least-loaded")


class _Queues(Protocol):
    @property
    def waiting(self) -> Sized: ...

    @property
    def running(self) -> Sized: ...


def load_score(sched: _Queues) -> int:
    """vLLM's DP load score: waiting requests weigh four times running ones."""
    return 4 * len(sched.waiting) + len(sched.running)


class Routable(Protocol):
    """What a router reads of a rank: its load score."""

    def load(self) -> int: ...


@dataclass(slots=True)
class Router:
    kind: str
    size: int
    stats_interval: float = 0.1
    next_rank: int = 0
    published_at: float = -math.inf
    scores: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind not in ROUTERS:
            raise ValueError(f"router={self.kind!r}: use one of {', '.join(ROUTERS)}")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"data_parallel_size={self.size!r}: must be a positive integer")
        if not self.stats_interval > 0:
            raise ValueError(f"dp_stats_interval={self.stats_interval!r}: must be > 0 seconds")

    def choose(self, ranks: Sequence[Routable], now: float) -> int:
        if self.size == 1:
            return 0
        if self.kind == "round-robin":
            rank = self.next_rank
            self.next_rank = (rank + 1) % self.size
            return rank
        if self.kind == "least-loaded":
            scores = [r.load() for r in ranks]
            return scores.index(min(scores))
        if now - self.published_at >= self.stats_interval:
            # A new stats message from the engines.
            self.scores = [r.load() for r in ranks]
            self.published_at = now
        rank = self.scores.index(min(self.scores))
        self.scores[rank] += 4  # one more waiting request, as far as the front end knows
        return rank
