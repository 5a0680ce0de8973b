"""Data-parallel deployments: N engine cores, each with its own scheduler and
KV cache, behind one router.

- **Lockstep** (an MoE model with expert parallelism): the ranks share their
  experts, so every rank runs every step: a step lasts as long as the slowest
  rank, the experts see the tokens of all ranks, and a rank with nothing to do
  runs a one-token dummy batch that still pays the collectives.
- **Independent replicas** (dense models): each rank steps on its own clock;
  they meet only at the router.

Routers: ``vllm`` (the lowest ``4 × waiting + running``, from load stats
published every ``stats_interval`` seconds; between updates the front end
counts each request it routes as one more waiting on its rank),
``round-robin``, and ``least-loaded`` (the same score on exact, current
counts). Ties go to the lowest rank. ``--max-concurrency`` is global, as
``vllm bench serve`` holds requests before the router.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kvsched.core.policies import AdmissionPolicy, DPPrefillCadence, DPRankStates
from kvsched.perf.step_time import BatchShape
from kvsched.sim.simulator import MIN_STRETCH, SimConfig, SimResult, Simulator, stretch_times
from kvsched.sim.workload import Workload, WorkloadRequest

ROUTERS = ("vllm", "round-robin", "least-loaded")


@dataclass(frozen=True, slots=True)
class DPOptions:
    size: int
    lockstep: bool = False
    router: str = "vllm"
    stats_interval: float = 0.1

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"data_parallel_size={self.size!r}: must be a positive integer")
        if self.router not in ROUTERS:
            raise ValueError(f"router={self.router!r}: use one of {', '.join(ROUTERS)}")
        if not self.stats_interval > 0:
            raise ValueError(f"dp_stats_interval={self.stats_interval!r}: must be > 0 seconds")


@dataclass(slots=True)
class Router:
    kind: str
    size: int
    stats_interval: float
    next_rank: int = 0
    published_at: float = -math.inf
    scores: list[int] = field(default_factory=list)

    def choose(self, ranks: list[Simulator], now: float) -> int:
        if self.kind == "round-robin":
            rank = self.next_rank
            self.next_rank = (rank + 1) % self.size
            return rank
        if self.kind == "least-loaded":
            scores = [_score(r) for r in ranks]
            return scores.index(min(scores))
        if now - self.published_at >= self.stats_interval:
            # A new stats message from the engines.
            self.scores = [_score(r) for r in ranks]
            self.published_at = now
        rank = self.scores.index(min(self.scores))
        self.scores[rank] += 4  # one more waiting request, as far as the front end knows
        return rank


def _score(sim: Simulator) -> int:
    return 4 * len(sim.sched.waiting) + len(sim.sched.running)


@dataclass(slots=True)
class DPResult:
    ranks: list[SimResult]
    routed: list[int]  # requests sent to each rank

    def combined(self) -> SimResult:
        """All ranks' requests and samples together; the step log and KV
        figures are rank 0's (per-rank ones are in ``ranks``)."""
        first = self.ranks[0]
        out = SimResult(
            workload=first.workload, records=[r for res in self.ranks for r in res.records],
            failed=[f for res in self.ranks for f in res.failed], itls=type(first.itls)(),
            token_times=type(first.token_times)(), steps=first.steps,
            num_gpu_blocks=first.num_gpu_blocks,
            num_preemptions=sum(r.num_preemptions for r in self.ranks),
            prefix_cache_queries=sum(r.prefix_cache_queries for r in self.ranks),
            prefix_cache_hits=sum(r.prefix_cache_hits for r in self.ranks),
            num_fast_forwarded_steps=sum(r.num_fast_forwarded_steps for r in self.ranks),
            wall_seconds=max(r.wall_seconds for r in self.ranks))
        for res in self.ranks:
            out.itls.merge(res.itls)
            out.token_times.merge(res.token_times)
        return out


class DPSimulator:
    def __init__(self, config: SimConfig, workload: Workload, options: DPOptions,
                 policies: list[AdmissionPolicy | None] | None = None,
                 shared: DPRankStates | None = None) -> None:
        if policies is not None and len(policies) != options.size:
            raise ValueError(f"{len(policies)} admission policies for {options.size} ranks")
        self.options = options
        self.workload = workload
        # What the ranks share; the lockstep loop advances its step counter.
        self.shared = shared if shared is not None else DPRankStates(options.size)
        interval = config.prefill_schedule_interval
        if options.lockstep and interval > 1 and not any(policies or ()):
            # vLLM's DP engine core drives the cadence from the shared counter;
            # the ranks' local cadence is off.
            policies = [DPPrefillCadence(self.shared, interval) for _ in range(options.size)]
            interval = 1
        # Ranks are driven from here; lockstep ranks fast-forward together
        # (below), independent replicas step one by one (each with its own
        # local cadence, as vLLM's dense DP ranks).
        rank_config = SimConfig(config.scheduler_config, config.cache_config, config.step_model,
                                config.eos_probability, config.seed, fast_forward=False,
                                prefill_schedule_interval=interval)
        self.fast_forward = (config.fast_forward and options.lockstep
                             and not any(policies or ())
                             and config.prefill_schedule_interval <= 1)
        # Each rank is a Simulator driven from here (its own run() is unused).
        self.ranks = [Simulator(rank_config, workload,
                                admission_policy=policies[i] if policies else None)
                      for i in range(options.size)]
        for i, rank in enumerate(self.ranks):
            rank.rng.seed(config.seed + i)
        self.router = Router(options.router, options.size, options.stats_interval)
        self.routed = [0] * options.size
        # Called after every step, e.g. to publish load for a balance policy.
        self.after_step: list[Callable[[DPSimulator], None]] = []

    def run(self) -> DPResult:
        wall0 = time.perf_counter()
        if self.options.lockstep:
            self._run_lockstep()
        else:
            self._run_independent()
        wall = time.perf_counter() - wall0
        return DPResult([r.result(wall) for r in self.ranks], self.routed)

    # -- clients and routing -----------------------------------------------------
    def _send(self, spec: WorkloadRequest, send_time: float, now: float) -> bool:
        rank = self.router.choose(self.ranks, now)
        sim = self.ranks[rank]
        if not sim.sched.has_unfinished_requests() and sim.now < now:
            sim.now = now  # an idle rank wakes up when work arrives
        if sim.send(spec, send_time):
            self.routed[rank] += 1
            return True
        return False

    def _run_lockstep(self) -> None:
        reqs = self.workload.requests
        n = len(reqs)
        max_conc = self.workload.max_concurrency
        queue: deque[WorkloadRequest] = deque()
        i = inflight = 0
        slot_free_since = 0.0
        now = 0.0
        dummy = BatchShape.decode(1, 1)
        can_ff = False
        while True:
            while i < n and reqs[i].arrival_time <= now:
                queue.append(reqs[i])
                i += 1
                can_ff = False
            while queue and (max_conc is None or inflight < max_conc):
                spec = queue.popleft()
                can_ff = False
                if self._send(spec, max(spec.arrival_time, slot_free_since), now):
                    inflight += 1
            if not any(r.sched.has_unfinished_requests() for r in self.ranks):
                self.shared.step_counter = 0  # the wave of work ended
                if i >= n and not queue:
                    return
                now = max(now, reqs[i].arrival_time)
                for r in self.ranks:
                    r.now = now
                continue
            if can_ff and self.fast_forward:
                end = self._fast_forward(reqs[i].arrival_time if i < n else math.inf)
                if end is not None:
                    now = end
                    continue
            plans = [r.plan_step() for r in self.ranks]
            global_tokens = sum(p.shape.num_tokens for p in plans if p is not None)
            dt = max(r.step_model.step_time(p.shape if p is not None else dummy, global_tokens)
                     for r, p in zip(self.ranks, plans))
            can_ff = True
            for r, p in zip(self.ranks, plans):
                if p is None:
                    r.now += dt
                    can_ff = can_ff and not r.sched.waiting
                else:
                    finished, pure_decode = r.complete_step(p, dt)
                    if finished:
                        inflight -= len(finished)
                        slot_free_since = r.now
                    # As on one engine: nothing waits, or admission stays held.
                    can_ff = can_ff and (not r.sched.waiting or (pure_decode and not finished))
            now += dt
            self.shared.step_counter += 1
            for hook in self.after_step:
                hook(self)

    def _fast_forward(self, next_arrival: float) -> float | None:
        """Advance all lockstep ranks over a pure-decode stretch; the new time,
        or None if there is none of useful length. Each step lasts as long as
        the slowest rank (idle ranks run the dummy batch), as when stepping."""
        busy = [r for r in self.ranks if r.sched.running]
        limits = [r.stretch_limit() for r in busy]
        limit = min(lim for lim, _ in limits)
        if limit < MIN_STRETCH:
            return None
        sizes = [len(r.sched.running) for r in busy]
        global_tokens = sum(sizes)
        idle = [r for r in self.ranks if not r.sched.running]
        dummy = [r.step_model.decode_step_time(1, 1, global_tokens) for r in idle]
        def step_time(j: int) -> float:
            return max([r.step_model.decode_step_time(b, kv + j * b, global_tokens)
                        for r, b, (_, kv) in zip(busy, sizes, limits)] + dummy)

        durations, ends = stretch_times(self.ranks[0].now, limit, next_arrival, step_time)
        if len(durations) < MIN_STRETCH:
            return None
        self.shared.step_counter += len(durations)
        for r in busy:
            r.apply_stretch(durations, ends)
        for r in idle:
            r.now = ends[-1]
        return ends[-1]

    def _run_independent(self) -> None:
        reqs = self.workload.requests
        n = len(reqs)
        max_conc = self.workload.max_concurrency
        queue: deque[WorkloadRequest] = deque()
        i = inflight = 0
        slot_free_since = 0.0
        while True:
            busy = [r for r in self.ranks if r.sched.has_unfinished_requests()]
            next_step = min((r.now for r in busy), default=math.inf)
            # Requests become sendable at their arrival, or when a slot frees.
            next_send = reqs[i].arrival_time if i < n else math.inf
            if queue and (max_conc is None or inflight < max_conc):
                next_send = min(next_send, slot_free_since)
            if next_send <= next_step and next_send < math.inf:
                while i < n and reqs[i].arrival_time <= next_send:
                    queue.append(reqs[i])
                    i += 1
                while queue and (max_conc is None or inflight < max_conc):
                    spec = queue.popleft()
                    t = max(spec.arrival_time, slot_free_since)
                    if self._send(spec, t, t):
                        inflight += 1
                continue
            if not busy:
                return
            sim = min(busy, key=lambda r: r.now)
            finished, _ = sim._step()
            if finished:
                inflight -= len(finished)
                slot_free_since = sim.now
            for hook in self.after_step:
                hook(self)
