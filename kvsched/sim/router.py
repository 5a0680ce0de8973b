"""The router: which data-parallel rank serves an arriving request.

- ``vllm``: vLLM 0.33.0's DP load balancer (the front end's
  ``DPLBAsyncMPClient.get_core_engine_for_request``, one API server). Per
  rank it keeps the last ``[waiting, running, kv_cache_usage]`` the
  coordinator published (every ``stats_interval`` seconds) and its own exact
  count of the requests it sent there that have not finished. A request goes
  to the rank with the lowest :func:`vllm_score`; the scan starts at a
  rotating index (one further per request), and the first lowest score in
  scan order wins, so ties rotate instead of always going to rank 0. Between
  two stats messages the front end counts each request it routes as one
  more waiting on its rank; a new message replaces those counts.
- ``round-robin``: ranks in turn.
- ``least-loaded``: the lowest :func:`vllm_score` on exact, current counts;
  ties to the lowest rank.

A router reads the ranks; it changes nothing in them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvsched.errors import UserInputError

ROUTERS = ("vllm", "round-robin", "least-loaded")


def vllm_score(waiting: float, running: float, kv_cache_usage: float, in_flight: int) -> float:
    """vLLM 0.33.0's DP load score of one engine (one front end).

    The larger of the stats' ``waiting + running`` and the front end's own
    in-flight count, plus a waiting penalty that grows with KV cache pressure:
    ``waiting × 6 × (usage - 0.5)`` above half usage (a queue on a KV-bound
    engine drains slowly), nothing below it."""
    score = max(float(in_flight), waiting + running)
    if waiting:
        score += waiting * 6.0 * max(0.0, kv_cache_usage - 0.5)
    return score


class Routable(Protocol):
    """What a router reads of a rank."""

    def load_stats(self) -> tuple[int, int, float]:
        """What the engine publishes: (waiting, running, KV cache usage)."""
        ...

    def num_unfinished(self) -> int:
        """Requests sent to it that have not finished (the front end's
        in-flight count)."""
        ...


@dataclass(slots=True)
class Router:
    kind: str
    size: int
    stats_interval: float = 0.1
    next_rank: int = 0       # round-robin's next rank, vllm's scan start (eng_start_index)
    published_at: float = -math.inf
    # vllm: per rank [waiting, running, kv_cache_usage] as the front end sees
    # them (the last stats message plus its own sends since).
    counts: list[list[float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind not in ROUTERS:
            raise UserInputError(f"router={self.kind!r}: use one of {', '.join(ROUTERS)}")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise UserInputError(f"data_parallel_size={self.size!r}: must be a positive integer")
        if not self.stats_interval > 0:
            raise UserInputError(f"dp_stats_interval={self.stats_interval!r}: must be > 0 seconds")

    def choose(self, ranks: Sequence[Routable], now: float) -> int:
        if self.size == 1:
            return 0
        if self.kind == "round-robin":
            rank = self.next_rank
            self.next_rank = (rank + 1) % self.size
            return rank
        if self.kind == "least-loaded":
            scores = []
            for r in ranks:
                waiting, running, usage = r.load_stats()
                scores.append(vllm_score(waiting, running, usage, waiting + running))
            return scores.index(min(scores))
        if now - self.published_at >= self.stats_interval:
            # A new stats message from the coordinator.
            self.counts = [[float(x) for x in r.load_stats()] for r in ranks]
            self.published_at = now
        n = self.size
        best: float = math.inf
        rank = 0
        for i in range(n):
            idx = (self.next_rank + i) % n
            seen = self.counts[idx]
            score = vllm_score(seen[0], seen[1], seen[2], ranks[idx].num_unfinished())
            if score < best:  # strict: the first lowest in scan order wins
                best = score
                rank = idx
        self.counts[rank][0] += 1  # one more waiting request, as far as the front end knows
        self.next_rank = (self.next_rank + 1) % n
        return rank
