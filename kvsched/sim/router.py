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
- ``prefix-aware``: llm-d's precise prefix-cache scorer with its load
  scorers (llm-d-inference-scheduler's ``precise-prefix-cache-scorer``,
  ``queue-scorer``, ``kv-cache-utilization-scorer``, ``max-score-picker``;
  docs/simulator.md, "Prefix-aware routing", has the sources). Each rank
  scores :data:`PREFIX_WEIGHT` × its prefix score + :data:`QUEUE_WEIGHT` ×
  its queue score + :data:`KV_WEIGHT` × (1 - KV cache usage), all on exact,
  current state (llm-d reads KV events and scraped metrics a little late);
  see :func:`prefix_aware_scores`. The highest total wins; ties go to the
  first in a scan that starts one rank further each request (llm-d shuffles
  before picking: a rotation is the deterministic spread).

A router reads the ranks; it changes nothing in them (the prefix scorer
hashes a throwaway copy of the prompt and only looks blocks up).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast

from kvsched.core.kv_cache_manager import KVCacheManager
from kvsched.core.scheduler import Scheduler
from kvsched.errors import UserInputError
from kvsched.fields import is_int
from kvsched.request import SamplingParams
from kvsched.sim.workload import WorkloadRequest

ROUTERS = ("vllm", "round-robin", "least-loaded", "prefix-aware")

# llm-d's documented weights for precise prefix-cache routing (the
# precise-prefix-cache-aware guide's scheduling profile): the prefix match
# counts most, the two load scorers equally.
PREFIX_WEIGHT = 3.0
QUEUE_WEIGHT = 2.0
KV_WEIGHT = 2.0
# A throwaway request's parameters (only its prompt is hashed).
_PROBE_PARAMS = SamplingParams(max_tokens=1, ignore_eos=True)


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


class PrefixRoutable(Routable, Protocol):
    """What the prefix-aware router also reads: the rank's scheduler, for
    its prefix cache."""

    @property
    def sched(self) -> Scheduler: ...


def prompt_block_keys(spec: WorkloadRequest, manager: KVCacheManager) -> Sequence[int]:
    """The prefix-cache keys of the prompt's full blocks, as ``manager``
    would key them (llm-d's token processor keys every full block of the
    prompt). Empty for a prompt that can share nothing (a private request's
    keys are unique to it, and handing them out would change the manager)."""
    probe = spec.to_request(_PROBE_PARAMS, 0.0)
    num_blocks = spec.num_prompt_tokens // manager.block_size
    if probe.private or not manager.enable_caching or num_blocks == 0:
        return ()
    # The hashes land on the probe, never on the manager or its pool.
    return manager.block_hashes(probe, num_blocks)[:num_blocks]


def cached_prefix_blocks(manager: KVCacheManager, keys: Sequence[int]) -> int:
    """How many of ``keys``, from the first, the manager's cache holds (llm-d's
    longest-prefix match over the pod's blocks); a lookup only."""
    cached = manager.block_pool.cached
    n = 0
    for key in keys:
        if key not in cached:
            break
        n += 1
    return n


def prefix_aware_scores(matched: Sequence[int], waiting: Sequence[int],
                        usage: Sequence[float]) -> list[float]:
    """Each rank's total as llm-d's scheduling profile sums it.

    - prefix (precise-prefix-cache-scorer): the ranks with at least one
      matched block are min-max normalised among themselves (all equal: 1),
      ranks with none score 0;
    - queue (queue-scorer): ``(max - waiting) / (max - min)`` over all ranks,
      1 when all queues are equal;
    - KV (kv-cache-utilization-scorer): ``1 - usage``."""
    hits = [m for m in matched if m > 0]
    lo_hit, hi_hit = (min(hits), max(hits)) if hits else (0, 0)
    lo_q, hi_q = min(waiting), max(waiting)
    out = []
    for m, w, u in zip(matched, waiting, usage, strict=True):
        prefix = 0.0 if m <= 0 else 1.0 if hi_hit == lo_hit else (m - lo_hit) / (hi_hit - lo_hit)
        queue = 1.0 if hi_q == lo_q else (hi_q - w) / (hi_q - lo_q)
        out.append(PREFIX_WEIGHT * prefix + QUEUE_WEIGHT * queue + KV_WEIGHT * (1.0 - u))
    return out


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
        if not is_int(self.size) or self.size < 1:
            raise UserInputError(f"data_parallel_size={self.size!r}: must be a positive integer")
        if not self.stats_interval > 0:
            raise UserInputError(f"dp_stats_interval={self.stats_interval!r}: must be > 0 seconds")

    def choose(self, ranks: Sequence[Routable], now: float, spec: WorkloadRequest | None = None) -> int:
        """The rank (index into ``ranks``) that gets ``spec``, arriving at
        ``now``; only ``prefix-aware`` reads the request (and needs it)."""
        if self.size == 1:
            return 0
        if self.kind == "prefix-aware":
            if spec is None:
                raise ValueError("the prefix-aware router needs the request it routes")
            return self._choose_prefix_aware(cast(Sequence[PrefixRoutable], ranks), spec)
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

    def _choose_prefix_aware(self, ranks: Sequence[PrefixRoutable], spec: WorkloadRequest) -> int:
        keys_by_block_size: dict[int, Sequence[int]] = {}
        matched: list[int] = []
        waiting: list[int] = []
        usage: list[float] = []
        for r in ranks:
            manager = r.sched.kv_cache_manager
            keys = keys_by_block_size.get(manager.block_size)
            if keys is None:
                keys = keys_by_block_size[manager.block_size] = prompt_block_keys(spec, manager)
            matched.append(cached_prefix_blocks(manager, keys) if manager.enable_caching else 0)
            w, _, u = r.load_stats()
            waiting.append(w)
            usage.append(u)
        scores = prefix_aware_scores(matched, waiting, usage)
        n = self.size
        rank = self.next_rank
        for i in range(1, n):  # strict: the first highest in scan order wins
            idx = (self.next_rank + i) % n
            if scores[idx] > scores[rank]:
                rank = idx
        self.next_rank = (self.next_rank + 1) % n
        return rank
