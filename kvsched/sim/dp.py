"""Data-parallel deployments: N engine cores, each with its own scheduler and
KV cache, behind one router (:mod:`kvsched.sim.router`).

- **Lockstep** (an MoE model with expert parallelism): the ranks form one
  :class:`~kvsched.sim.instance.LockstepGroup` on one clock.
- **Independent replicas** (dense models): one
  :class:`~kvsched.sim.instance.EngineInstance` per rank, each on its own
  clock; they meet only at the router. Each fast-forwards on its own.

``--max-concurrency`` is global, as ``vllm bench serve`` holds requests before
the router.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvsched.config import MAX_STEP_COUNT
from kvsched.core.policies import AdmissionPolicy, DPPrefillCadence, DPRankStates
from kvsched.errors import UserInputError
from kvsched.fields import is_int, is_number
from kvsched.jsonfile import show
from kvsched.sim.client import Client
from kvsched.sim.cluster import Cluster, Progress
from kvsched.sim.instance import EngineInstance, LockstepGroup
from kvsched.sim.rank import Rank, SimResult, combine_results
from kvsched.sim.router import ROUTERS, Router
from kvsched.sim.simulator import SimConfig
from kvsched.sim.workload import MAX_ARRIVAL_TIME, Workload

__all__ = ["ROUTERS", "DPOptions", "DPResult", "DPSimulator", "Router"]

# vLLM's defaults: the DP coordinator publishes load stats every 100 ms, and
# lockstep ranks all-reduce their unfinished state every 16 steps
# (--dp-sync-interval).
DEFAULT_DP_STATS_INTERVAL = 0.1
DEFAULT_DP_SYNC_INTERVAL = 16
# Bounds: the stats interval within the simulator's time span, the sync
# interval at most a million steps (over a quarter of an hour of engine time).


def check_dp_intervals(stats_interval: object, sync_interval: object) -> None:
    """The one check of the DP intervals, for flags, run specs and
    :class:`DPOptions` alike."""
    if (not is_number(stats_interval)
            or not 0 < stats_interval <= MAX_ARRIVAL_TIME):
        raise UserInputError(f"--dp-stats-interval={show(stats_interval)}: must be a number of seconds "
                             f"in (0, {MAX_ARRIVAL_TIME:g}] (the simulator's time span); vLLM's is "
                             f"{DEFAULT_DP_STATS_INTERVAL}")
    if (not is_int(sync_interval)
            or not 1 <= sync_interval <= MAX_STEP_COUNT):
        raise UserInputError(f"--dp-sync-interval={show(sync_interval)}: must be an integer in "
                             f"[1, {MAX_STEP_COUNT:,}] (steps between the lockstep ranks' "
                             f"all-reduces; vLLM's is {DEFAULT_DP_SYNC_INTERVAL})")


@dataclass(frozen=True, slots=True)
class DPOptions:
    size: int
    lockstep: bool = False
    router: str = "vllm"
    stats_interval: float = DEFAULT_DP_STATS_INTERVAL
    # vLLM's --dp-sync-interval: steps between the lockstep ranks' finish-syncs.
    sync_interval: int = DEFAULT_DP_SYNC_INTERVAL

    def __post_init__(self) -> None:
        if not is_int(self.size) or self.size < 1:
            raise UserInputError(f"data_parallel_size={self.size!r}: must be a positive integer")
        if self.router not in ROUTERS:
            raise UserInputError(f"router={self.router!r}: use one of {', '.join(ROUTERS)}")
        check_dp_intervals(self.stats_interval, self.sync_interval)


@dataclass(slots=True)
class DPResult:
    ranks: list[SimResult]
    routed: list[int]  # requests sent to each rank

    def combined(self) -> SimResult:
        """All ranks' requests and samples together; the step log and KV
        figures are rank 0's (per-rank ones are in ``ranks``)."""
        return combine_results(self.ranks)


class DPSimulator:
    def __init__(self, config: SimConfig, workload: Workload, options: DPOptions,
                 policies: list[AdmissionPolicy | None] | None = None,
                 shared: DPRankStates | None = None, progress: Progress | None = None) -> None:
        if policies is not None and len(policies) != options.size:
            raise UserInputError(f"{len(policies)} admission policies for {options.size} ranks")
        if options.lockstep and config.offload is not None:
            raise UserInputError("--kv-offloading-size with --enable-expert-parallel on an MoE model: its "
                                 "lockstep data-parallel ranks are not simulated with a KV connector yet; "
                                 "drop one of them")
        self.options = options
        self.workload = workload
        # What the ranks share; the lockstep group advances its step counter.
        if shared is None:
            shared = DPRankStates(options.size, options.sync_interval)
        elif shared.dp_sync_interval != options.sync_interval:
            raise UserInputError(f"shared states sync every {shared.dp_sync_interval} steps, "
                             f"the options say {options.sync_interval}")
        self.shared = shared
        interval = config.prefill_schedule_interval
        if options.lockstep and interval > 1 and not any(policies or ()):
            # vLLM's DP engine core drives the cadence from the shared counter;
            # the ranks' local cadence is off.
            policies = [DPPrefillCadence(self.shared, interval) for _ in range(options.size)]
        # Dense replicas keep their own local cadence, as vLLM's dense DP ranks.
        self.ranks: list[Rank] = [
            config.make_rank(workload, seed=config.seed + i,
                             admission_policy=policies[i] if policies else None)
            for i in range(options.size)]
        instances: list[EngineInstance | LockstepGroup]
        if options.lockstep:
            instances = [LockstepGroup(self.ranks, config.step_model, self.shared, config.fast_forward)]
        else:
            instances = [EngineInstance(r, config.step_model, config.fast_forward) for r in self.ranks]
        self.instances = instances
        router = Router(options.router, options.size, options.stats_interval)
        self.cluster = Cluster(instances, Client(workload), router, progress=progress,
                               arrival=config.step_model.host)
        # Called after every step, e.g. to publish load for a balance policy.
        self.after_step: list[Callable[[DPSimulator], None]] = []
        self.cluster.after_step.append(self._after_step)

    def _after_step(self, _: Cluster) -> None:
        for hook in self.after_step:
            hook(self)

    def run(self) -> DPResult:
        return DPResult(self.cluster.run(), self.cluster.routed)
