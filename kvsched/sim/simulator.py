"""The serving simulator: kvsched's exact scheduler in virtual time.

Each engine step is ``schedule()`` -> step time from the performance model ->
``update_from_output()`` with the workload's output lengths (as ``ignore_eos``
does), or EOS at a position drawn per request when ``eos_probability`` > 0.
With async scheduling the steps follow vLLM's async engine loop (two batches
in flight, :mod:`kvsched.sim.instance`); with speculative decoding each
verification accepts drafts drawn from an acceptance model
(:mod:`kvsched.sim.speculative`).

:class:`Simulator` is one engine: a cluster of one instance
(:mod:`kvsched.sim.cluster`), driven by the workload's client. Stretches of
pure decode are advanced in one jump (:mod:`kvsched.core.fast_forward` owns
when that is allowed), with the same block allocations, step times, token
times and metrics as stepping one by one (checked by a differential fuzzer,
tests/sim/test_fast_forward_fuzz.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TextIO

from kvsched.config import CacheConfig, SchedulerConfig
from kvsched.core.policies import AdmissionPolicy, PrefillCadence
from kvsched.core.scheduler import Scheduler
from kvsched.errors import UserInputError
from kvsched.perf.lora import LoraCost, LoraPricer
from kvsched.perf.step_time import StepTimeModel
from kvsched.perf.vision import EncoderPricer
from kvsched.progress import draw_progress
from kvsched.sim.client import Client
from kvsched.sim.cluster import Cluster, Progress
from kvsched.sim.instance import MIN_STRETCH, EngineInstance, stretch_times
from kvsched.sim.offload_transfer import (
    OffloadConfig,
    OffloadStats,
    OffloadTimedWorker,
    SimOffloadingConnector,
)
from kvsched.sim.rank import EOS_TOKEN, PlannedStep, Rank, SimResult, StepLog
from kvsched.sim.speculative import SpecOptions
from kvsched.sim.workload import Workload

__all__ = ["EOS_TOKEN", "MIN_STRETCH", "PlannedStep", "SimConfig", "SimResult", "Simulator",
           "StepLog", "stderr_progress", "stretch_times"]


@dataclass(slots=True)
class SimConfig:
    scheduler_config: SchedulerConfig
    cache_config: CacheConfig
    step_model: StepTimeModel
    eos_probability: float = 0.0
    seed: int = 0
    fast_forward: bool = True
    # vLLM's --prefill-schedule-interval (1 = off), as a core admission policy.
    prefill_schedule_interval: int = 1
    # Keep every request's token times (RequestRecord.token_times / itls).
    keep_token_times: bool = False
    # Keep every step for timelines (SimResult.steps; the HTML report plots
    # it). Off, memory does not grow with the number of steps.
    keep_step_log: bool = True
    # Speculative decoding (None: off). Async scheduling is
    # scheduler_config.async_scheduling.
    speculative: SpecOptions | None = None
    # KV offloading to CPU memory (None: off): every rank gets vLLM's
    # OffloadingConnector and a timed worker (kvsched.sim.offload_transfer).
    offload: OffloadConfig | None = None
    # LoRA (None: off): every rank gets vLLM's max_loras cap and its own
    # adapter caches, its steps priced with kvsched.perf.lora.
    lora: LoraCost | None = None
    # The vision encoder's pricer (None: a text-only model): every rank
    # charges the images its steps encode.
    encoder: EncoderPricer | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.eos_probability < 1.0:
            raise UserInputError(f"eos_probability={self.eos_probability!r}: must be in [0, 1)")

    def make_rank(self, workload: Workload, *, seed: int | None = None,
                  admission_policy: AdmissionPolicy | None = None,
                  trace_steps: TextIO | None = None) -> Rank:
        """An engine core with these settings (its own local prefill cadence
        unless a policy is given)."""
        policy = admission_policy or (PrefillCadence(self.prefill_schedule_interval)
                                      if self.prefill_schedule_interval > 1 else None)
        connector = worker = None
        if self.offload is not None:
            stats = OffloadStats()
            cc = self.cache_config
            connector = SimOffloadingConnector(self.offload, cc.block_size, cc.enable_prefix_caching, stats,
                                               self.scheduler_config.vllm_version)
            worker = OffloadTimedWorker(self.offload, stats, self.scheduler_config.async_scheduling)
        rank = Rank(self.scheduler_config, self.cache_config, workload_name=workload.name,
                    eos_probability=self.eos_probability,
                    seed=self.seed if seed is None else seed, admission_policy=policy,
                    trace_steps=trace_steps, keep_token_times=self.keep_token_times,
                    keep_step_log=self.keep_step_log, speculative=self.speculative,
                    kv_connector=connector, kv_worker=worker,
                    lora=LoraPricer(self.lora) if self.lora is not None else None,
                    request_timeout=workload.request_timeout, encoder=self.encoder)
        if connector is not None:
            connector.bind_kv_cache_manager(rank.sched.kv_cache_manager)
        return rank


class Simulator:
    """One engine serving a workload."""

    def __init__(self, config: SimConfig, workload: Workload,
                 trace_steps: TextIO | None = None, progress: Progress | None = None,
                 admission_policy: AdmissionPolicy | None = None) -> None:
        self.config = config
        self.workload = workload
        self.rank = config.make_rank(workload, admission_policy=admission_policy,
                                     trace_steps=trace_steps)
        self.instance = EngineInstance(self.rank, config.step_model, config.fast_forward)
        self.cluster = Cluster([self.instance], Client(workload), progress=progress,
                               arrival=config.step_model.host)

    @property
    def sched(self) -> Scheduler:
        return self.rank.sched

    @property
    def now(self) -> float:
        return self.instance.now

    def run(self) -> SimResult:
        (result,) = self.cluster.run()
        return result


def stderr_progress(done: int, total: int, sim_time: float) -> None:
    draw_progress(done, total, f"t={sim_time:,.1f}s simulated")
