"""One engine core's scheduler and what its clients see of it.

A :class:`Rank` owns a :class:`~kvsched.core.scheduler.Scheduler`, the
simulated model's outputs (each request samples a token unique to it, or EOS
at a position drawn when it arrives), and the client-side record of every
request it serves: send, first token, every token time, finish. It has no
clock: the instance that drives it (:mod:`kvsched.sim.instance`) passes the
start and length of every step, so one clock can drive several ranks in
lockstep.

Plain scheduling (synchronous, no speculative decoding) takes the fast
paths below, unchanged. With async scheduling or speculative decoding a
step's outputs are made when it completes, not when it is planned: under
async scheduling the step before it may still be in flight then, and a
verification's accepted drafts are drawn from the acceptance model
(:mod:`kvsched.sim.speculative`). A request that receives several tokens in
one step (accepted drafts) receives them as one chunk, as vLLM streams
them: one inter-token gap, as ``vllm bench serve`` measures it.
"""

from __future__ import annotations

import json
import math
import random
from array import array
from dataclasses import dataclass, field
from typing import Any, TextIO, cast

from kvsched.config import CacheConfig, LoRAConfig, SchedulerConfig
from kvsched.core.fast_forward import decode_stretch_plan, fast_forward_decode, fast_forward_decode_finishing
from kvsched.core.kv_connector import KVConnectorBase
from kvsched.core.multi_connector import connector_of_type
from kvsched.core.nixl_connector import NixlConnector
from kvsched.core.offloading_connector import OffloadingConnector
from kvsched.core.output import (
    DraftTokenIds,
    KVConnectorOutput,
    ModelRunnerOutput,
    SchedulerOutput,
    SpecDecodingStats,
)
from kvsched.core.policies import AdmissionPolicy
from kvsched.core.scheduler import Scheduler
from kvsched.core.trace import step_record
from kvsched.perf.lora import LoraPricer, LoraStats
from kvsched.perf.step_time import BatchShape
from kvsched.perf.vision import EncoderPricer
from kvsched.request import Request, RequestStatus, SamplingParams
from kvsched.sim.kv_transfer import KVWorker
from kvsched.sim.metrics import (
    DEFAULT_PERCENTILE_METRICS,
    RecordTable,
    benchmark_duration,
    compute_metrics,
    sum_present,
)
from kvsched.sim.offload_transfer import OffloadStats, SimOffloadingConnector
from kvsched.sim.refusals import failure_reasons, timeout_error, too_long_error
from kvsched.sim.samples import SampleAccumulator
from kvsched.sim.speculative import SpecOptions, request_key, spec_metrics, uniform
from kvsched.sim.ttft_parts import NO_TIME, PhaseTable, kv_load_times
from kvsched.sim.workload import OUTPUT_TOKEN_BASE, WorkloadRequest

EOS_TOKEN = 0  # never used in workload prompts (see kvsched.sim.workload)
_NOTHING: list[int] = []  # a prefill chunk samples nothing (shared: never mutated)


@dataclass(slots=True)
class StepLog:
    """Per-step timeline, columnar (a one-hour run has ~10^5-10^6 steps)."""

    start: array[float] = field(default_factory=lambda: array("d"))
    duration: array[float] = field(default_factory=lambda: array("d"))
    num_reqs: array[int] = field(default_factory=lambda: array("q"))
    num_tokens: array[int] = field(default_factory=lambda: array("q"))
    prefill_tokens: array[int] = field(default_factory=lambda: array("q"))
    free_blocks: array[int] = field(default_factory=lambda: array("q"))
    num_running: array[int] = field(default_factory=lambda: array("q"))
    num_waiting: array[int] = field(default_factory=lambda: array("q"))

    def append(self, start: float, duration: float, num_reqs: int, num_tokens: int,
               prefill_tokens: int, free_blocks: int, num_running: int, num_waiting: int) -> None:
        self.start.append(start)
        self.duration.append(duration)
        self.num_reqs.append(num_reqs)
        self.num_tokens.append(num_tokens)
        self.prefill_tokens.append(prefill_tokens)
        self.free_blocks.append(free_blocks)
        self.num_running.append(num_running)
        self.num_waiting.append(num_waiting)

    def __len__(self) -> int:
        return len(self.start)

    def totals(self, usable_blocks: int) -> StepTotals:
        """The run's totals, summed from the log (for results built by hand)."""
        out = StepTotals(usable_blocks)
        for start, dt, reqs, tokens, prefill, free in zip(
                self.start, self.duration, self.num_reqs, self.num_tokens, self.prefill_tokens,
                self.free_blocks):
            out.add(start + dt, dt, reqs, tokens, prefill, free)
        return out


@dataclass(slots=True)
class StepTotals:
    """The engine figures of a run, summed step by step in stepping order (so
    a fast-forwarded stretch gives the same floats): memory stays constant
    however long the run, unlike the optional per-step :class:`StepLog`."""

    usable_blocks: int
    num_steps: int = 0
    busy: float = 0.0
    num_reqs: int = 0
    num_tokens: int = 0
    prefill_tokens: int = 0
    kv_usage_time: float = 0.0   # sum of KV usage x step duration
    min_free_blocks: int = -1    # -1: no step yet
    end: float = 0.0             # when the last step ended

    def add(self, end: float, dt: float, num_reqs: int, num_tokens: int, prefill_tokens: int,
            free_blocks: int) -> None:
        self.num_steps += 1
        self.busy += dt
        self.num_reqs += num_reqs
        self.num_tokens += num_tokens
        self.prefill_tokens += prefill_tokens
        self.kv_usage_time += (1.0 - free_blocks / self.usable_blocks) * dt
        if free_blocks < self.min_free_blocks or self.min_free_blocks < 0:
            self.min_free_blocks = free_blocks
        self.end = end

    def add_decode_stretch(self, ends: list[float], durations: list[float], batch: int,
                           free_after: list[int], first_tokens: int | None = None,
                           first_prefill_tokens: int = 0) -> None:
        """``len(durations)`` decode steps of ``batch`` requests, one token
        each; or the first step ``first_tokens`` tokens, ``first_prefill_tokens``
        of them prefill (async: the batch in flight finished a prefill)."""
        k = len(durations)
        self.num_steps += k
        self.num_reqs += batch * k
        self.num_tokens += batch * k if first_tokens is None else batch * (k - 1) + first_tokens
        self.prefill_tokens += first_prefill_tokens
        usable = self.usable_blocks
        busy = self.busy
        usage_time = self.kv_usage_time
        for dt, free in zip(durations, free_after):
            busy += dt
            usage_time += (1.0 - free / usable) * dt
        self.busy = busy
        self.kv_usage_time = usage_time
        low = min(free_after)
        if low < self.min_free_blocks or self.min_free_blocks < 0:
            self.min_free_blocks = low
        self.end = ends[-1]

    def engine_stats(self) -> dict[str, Any]:
        n = self.num_steps
        tokens = self.num_tokens
        prefill = self.prefill_tokens
        busy = self.busy
        min_free = self.min_free_blocks if n else self.usable_blocks
        return {
            "num_steps": n,
            "busy_seconds": busy,
            "mean_batch_size": self.num_reqs / n if n else 0.0,
            "mean_tokens_per_step": tokens / n if n else 0.0,
            "prefill_token_share": prefill / tokens if tokens else 0.0,
            "decode_token_share": 1.0 - prefill / tokens if tokens else 0.0,
            "mean_kv_cache_usage": self.kv_usage_time / busy if busy else 0.0,
            "max_kv_cache_usage": 1.0 - min_free / self.usable_blocks,
        }


@dataclass(slots=True)
class SimResult:
    workload: str
    records: RecordTable
    failed: list[tuple[str, str]]  # (request id, why it was refused)
    itls: SampleAccumulator
    token_times: SampleAccumulator
    totals: StepTotals
    # Every step, for timelines (None unless asked for: it grows with the run).
    steps: StepLog | None
    num_gpu_blocks: int
    num_preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_fast_forwarded_steps: int
    wall_seconds: float
    # Every rank's own result when this one combines data-parallel ranks
    # (their step logs and KV figures are per rank; ``steps`` is rank 0's).
    ranks: list[SimResult] = field(default_factory=list)
    # Speculative decoding's counters (None without it).
    spec_stats: SpecDecodingStats | None = None
    # KV offloading's CPU hits and traffic (None without it).
    kv_offload: OffloadStats | None = None
    # Each record's phases for the TTFT split (aligned with ``records``).
    phases: PhaseTable = field(default_factory=PhaseTable)
    # LoRA's adapter loads and GPU seconds (None without --enable-lora).
    lora: LoraStats | None = None
    # When the client gave up on its last request to time out (0: none
    # did): vllm bench serve's clock runs until every request is answered
    # or given up on.
    last_timeout: float = 0.0

    @property
    def duration(self) -> float:
        if not self.records:
            return 0.0
        return max(benchmark_duration(self.records), self.last_timeout)

    def metrics(self, percentiles: tuple[float, ...] = (50.0, 90.0, 99.0),
                goodput_slos: dict[str, float] | None = None,
                percentile_metrics: tuple[str, ...] = DEFAULT_PERCENTILE_METRICS) -> dict[str, Any]:
        """vllm bench serve's keys, plus the engine-side figures."""
        out: dict[str, Any] = {}
        if self.records:
            out.update(compute_metrics(self.records, self.itls, self.duration, percentiles,
                                       goodput_slos, failed=len(self.failed),
                                       token_times=self.token_times, percentile_metrics=percentile_metrics))
        else:
            out["completed"] = 0
            out["failed"] = len(self.failed)
        # Why they failed: refused (too long, too big for the cache) or timed out.
        out["failed_reasons"] = failure_reasons(self.failed)
        out.update(self.engine_stats())
        return out

    def engine_stats(self) -> dict[str, Any]:
        out = {**self.totals.engine_stats(),
               "num_preemptions": self.num_preemptions,
               "prefix_cache_hit_rate": (self.prefix_cache_hits / self.prefix_cache_queries
                                         if self.prefix_cache_queries else 0.0),
               "num_gpu_blocks": self.num_gpu_blocks,
               "fast_forwarded_steps": self.num_fast_forwarded_steps,
               "simulation_wall_seconds": self.wall_seconds}
        if self.spec_stats is not None:
            out.update(spec_metrics(self.spec_stats))
        if self.kv_offload is not None:
            out.update(self.kv_offload.metrics(self.prefix_cache_queries, self.prefix_cache_hits))
        if self.lora is not None:
            out["lora"] = self.lora.to_json()
        return out


def combine_results(ranks: list[SimResult]) -> SimResult:
    """All ranks' requests and samples together; the step log and KV figures
    are rank 0's (every rank's own result stays in ``ranks``)."""
    if len(ranks) == 1:
        return ranks[0]
    first = ranks[0]
    out = SimResult(
        workload=first.workload, records=RecordTable.concat([res.records for res in ranks]),
        failed=[f for res in ranks for f in res.failed], itls=SampleAccumulator(),
        token_times=SampleAccumulator(), totals=first.totals, steps=first.steps,
        num_gpu_blocks=first.num_gpu_blocks,
        num_preemptions=sum(r.num_preemptions for r in ranks),
        prefix_cache_queries=sum(r.prefix_cache_queries for r in ranks),
        prefix_cache_hits=sum(r.prefix_cache_hits for r in ranks),
        num_fast_forwarded_steps=sum(r.num_fast_forwarded_steps for r in ranks),
        wall_seconds=max(r.wall_seconds for r in ranks), ranks=list(ranks),
        spec_stats=sum_present(r.spec_stats for r in ranks),
        kv_offload=sum_present(r.kv_offload for r in ranks),
        phases=PhaseTable.concat([r.phases for r in ranks]),
        lora=sum_present(r.lora for r in ranks), last_timeout=max(r.last_timeout for r in ranks))
    for res in ranks:
        out.itls.merge(res.itls)
        out.token_times.merge(res.token_times)
    return out


# PlannedStep and _Live are made per step and per request: their own
# ``__init__`` compiles (kvsched.core.output's module doc says why).
@dataclass(slots=True, init=False)
class PlannedStep:
    """A scheduled step waiting for its duration (see Rank.plan)."""

    output: SchedulerOutput
    shape: BatchShape
    sampled_ids: list[list[int]]
    # The client-side view of each scheduled request (None: mid-prefill).
    lives: list[_Live | None]
    # Async or speculative (Rank.plain False): drafts scheduled per request
    # (aligned with lives), and the requests admitted in this step, whose
    # drafts are padding (never accepted). Outputs are made at completion.
    drafts: list[int] | None
    admitted: frozenset[str] | set[str]

    def __init__(self, output: SchedulerOutput, shape: BatchShape, sampled_ids: list[list[int]],
                 lives: list[_Live | None], drafts: list[int] | None = None,
                 admitted: frozenset[str] | set[str] = frozenset()) -> None:
        self.output = output
        self.shape = shape
        self.sampled_ids = sampled_ids
        self.lives = lives
        self.drafts = drafts
        self.admitted = admitted


@dataclass(slots=True)
class _Pooled:
    """What one request added to its rank's ITL and token-time pools, kept
    while a client timeout may still fail it: vllm bench serve pools the
    ITLs and token times of successful requests only, so a request that
    times out takes its own back out (``Rank.result``)."""

    gaps: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)


@dataclass(slots=True, init=False)
class _Live:
    """Client-side view of one request in flight."""

    spec: WorkloadRequest
    send_time: float
    token: int            # the token this request samples (unique to it)
    eos_index: int        # output position of its EOS, or -1
    sample: list[int]     # [token], one list reused every step
    first_token_time: float
    last_token_time: float
    num_tokens: int
    token_times: list[float] | None  # only when detail is kept
    # Speculative decoding: the request's stream of acceptance draws, and
    # how many of its verifications drew from it.
    spec_key: int
    num_verifications: int
    # The TTFT split's times: when it reached this engine, and when the
    # step computing its first prompt tokens started (-1: not yet).
    reached: float
    started: float
    # With a client timeout: when the client gives up on it (inf: never),
    # and the ITLs and token times it added to the pools (None without a
    # timeout, and for a prefill leg). With a timeout ``token_times`` is a
    # list too: the pooled samples are noted under its check, so a run
    # without either pays nothing more per token.
    deadline: float
    pooled: _Pooled | None

    def __init__(self, spec: WorkloadRequest, send_time: float, token: int, eos_index: int,
                 token_times: list[float] | None = None, reached: float = 0.0) -> None:
        self.spec = spec
        self.send_time = send_time
        self.deadline = math.inf
        self.pooled = None
        self.reached = reached
        self.started = -1.0
        self.token = token
        self.eos_index = eos_index
        self.sample = [token]
        self.first_token_time = -1.0
        self.last_token_time = -1.0
        self.num_tokens = 0
        self.token_times = token_times
        self.spec_key = 0
        self.num_verifications = 0

    def token_at(self, num_outputs: int) -> int:
        """What the simulated model samples as output number ``num_outputs``
        (0-based): EOS at its drawn position, else the request's own token."""
        return EOS_TOKEN if num_outputs == self.eos_index else self.token

    def steps_to_eos(self, num_outputs: int) -> int:
        """Further steps until (and with) the one that samples EOS."""
        return self.eos_index - num_outputs + 1 if self.eos_index >= num_outputs else 1 << 62


class Rank:
    """A scheduler, its simulated model outputs and its clients' records."""

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, *,
                 workload_name: str, eos_probability: float = 0.0, seed: int = 0,
                 admission_policy: AdmissionPolicy | None = None,
                 trace_steps: TextIO | None = None, keep_token_times: bool = False,
                 keep_step_log: bool = True, speculative: SpecOptions | None = None,
                 kv_connector: KVConnectorBase | None = None, kv_worker: KVWorker | None = None,
                 hands_off: bool = False, lora: LoraPricer | None = None,
                 request_timeout: float | None = None, encoder: EncoderPricer | None = None) -> None:
        # No model runs: skip the runner's copies of prompts and block tables,
        # but for the offloading connector, which reads the batch's block
        # tables (new and resumed requests') to build its store jobs.
        self.sched = Scheduler(scheduler_config, cache_config, admission_policy=admission_policy,
                               runner_inputs=connector_of_type(kv_connector, OffloadingConnector) is not None,
                               speculative_config=speculative.core_config() if speculative else None,
                               kv_connector=kv_connector,
                               lora_config=LoRAConfig(lora.cost.max_loras) if lora is not None else None,
                               mm_max_tokens_per_item=encoder.max_tokens_per_item()
                               if encoder is not None else None)
        # LoRA: the adapter caches and the GPU seconds each step adds
        # (kvsched.perf.lora); None: off.
        self.lora = lora
        # The vision encoder's pricer (None: a text-only model): requests
        # then carry their images, the scheduler keeps vLLM's encoder budget
        # and cache, and a step prices the encoder inputs it scheduled.
        self.encoder = encoder
        # A KV connector's scheduler side (in the scheduler) and its worker
        # side in simulated time (kvsched.sim.kv_transfer); both or neither.
        if (kv_connector is None) != (kv_worker is None):
            raise ValueError("a rank takes a KV connector and its worker together")
        self.kv_connector = kv_connector
        self.kv_worker = kv_worker
        # A prefill instance of a disaggregated deployment: every request it
        # finishes is handed to a decode instance (the proxy reads handoffs).
        self.hands_off = hands_off
        self.handoffs: list[tuple[WorkloadRequest, float, float]] = []
        self.speculative = speculative
        self.seed = seed
        # vLLM's async engine loop (kvsched.sim.instance drives it).
        self.async_scheduling = scheduler_config.async_scheduling
        # Neither async scheduling nor drafts nor a KV connector nor PP's
        # batches in flight: the fast paths.
        self.plain = (speculative is None and not self.async_scheduling and kv_connector is None
                      and self.sched.max_steps_in_flight == 1)
        self.spec_stats = SpecDecodingStats(speculative.num_speculative_tokens) if speculative else None
        # Synchronous speculative decoding: the drafts proposed after each
        # step (the scheduler reads only how many).
        self._drafts = ([OUTPUT_TOKEN_BASE] * speculative.num_speculative_tokens
                        if speculative is not None and not self.async_scheduling else None)
        self.num_gpu_blocks = cache_config.num_gpu_blocks
        self.workload_name = workload_name
        self.eos_probability = eos_probability
        self.rng = random.Random(seed)
        self.trace_steps = trace_steps
        # Per-request token times cost memory per token: only on request.
        self.keep_token_times = keep_token_times
        self.live: dict[str, _Live] = {}
        self.records = RecordTable()
        self.failed: list[tuple[str, str]] = []
        self.phases = PhaseTable()
        # Where the worker keeps each request's KV load (the TTFT split's).
        self._kv_loads = kv_load_times(kv_worker)
        self.itls = SampleAccumulator()
        self.token_times = SampleAccumulator()
        self.totals = StepTotals(cache_config.num_gpu_blocks - 1)
        self.steps = StepLog() if keep_step_log else None
        self.num_ff_steps = 0
        # The client's timeout (kvsched.sim.client; None: none). With one,
        # the ids of requests finished since the event loop last looked (it
        # tells the client which), the pooled samples of requests that timed
        # out (taken out of the pools in ``result``), and when the client
        # gave up on the last of them.
        self.request_timeout = request_timeout
        self.finished_ids: list[str] = []
        self._dropped_itls = SampleAccumulator()
        self._dropped_token_times = SampleAccumulator()
        self.last_timeout = 0.0
        # Output tokens start above every prompt token (kvsched.sim.workload
        # keeps those below OUTPUT_TOKEN_BASE): never in a prompt.
        self._next_token = OUTPUT_TOKEN_BASE
        self._params: dict[int, SamplingParams] = {}  # by _sampling_params' key
        # Async: the plan of the batch the last stretch left in flight.
        self._stretch_plan: PlannedStep | None = None
        # The running requests and their client views at the last stretch
        # (_running_lives).
        self._aligned: tuple[list[Request], list[_Live | None]] = ([], [])

    # -- requests in -----------------------------------------------------------
    def receive(self, spec: WorkloadRequest, send_time: float, reached: float | None = None) -> bool:
        """A request sent at ``send_time`` (reaching the engine at ``reached``,
        after the API server: None, at once); False if the server or the engine
        refuses it (recorded in ``failed``). Prompt + output > max_model_len is
        refused as vLLM's API server refuses it (HTTP 400 to vllm bench
        serve), not cut short as the engine alone would: the simulator never
        silently caps an output length."""
        return self.receive_leg(spec, send_time, send_time, spec.output_len, None, reached)

    def receive_leg(self, spec: WorkloadRequest, send_time: float, arrival_time: float, max_tokens: int,
                    kv_transfer_params: dict[str, Any] | None, reached: float | None = None) -> bool:
        """``receive`` for one leg of a disaggregated request: the client
        sent it at ``send_time`` (its latencies count from then), it reaches
        this engine at ``arrival_time`` asking for ``max_tokens`` tokens
        (a prefill leg: 1), with the proxy's ``kv_transfer_params``.
        ``reached``: when it reached the engine, for the TTFT split, if not
        ``arrival_time`` (a colocated request keeps its send as its arrival)."""
        if spec.num_prompt_tokens + max_tokens > self.sched.max_model_len:
            self.failed.append((spec.request_id, too_long_error(spec, self.sched.max_model_len)))
            return False
        eos_index = -1
        p = self.eos_probability
        if p > 0.0 and max_tokens == spec.output_len:
            # Geometric draw of the EOS position, truncated by max_tokens.
            u = self.rng.random()
            pos = int(math.log1p(-u) / math.log1p(-p))
            if pos < spec.output_len - 1:
                eos_index = pos
        params = self._sampling_params(max_tokens, eos_index >= 0)
        request = spec.to_request(params, arrival_time, with_mm=self.encoder is not None)
        if kv_transfer_params is not None:
            nixl = connector_of_type(self.kv_connector, NixlConnector)
            if nixl is None:
                raise ValueError(f"request {spec.request_id}: kv_transfer_params need a NixlConnector rank")
            nixl.set_kv_transfer_params(spec.request_id, kv_transfer_params)
        try:
            self.sched.add_request(request)
        except ValueError as e:
            self.failed.append((spec.request_id, str(e)))
            return False
        timeout = self.request_timeout
        live = self.live[spec.request_id] = _Live(spec, send_time, self._next_token, eos_index,
                                                  [] if self.keep_token_times or timeout is not None
                                                  else None,
                                                  arrival_time if reached is None else reached)
        if timeout is not None:
            live.deadline = send_time + timeout
            if not self.hands_off:  # a prefill leg's token is not the client's
                live.pooled = _Pooled()
        if self.speculative is not None:
            live.spec_key = request_key(self.seed, spec.request_id)
        self._next_token += 1
        return True

    def _sampling_params(self, max_tokens: int, samples_eos: bool) -> SamplingParams:
        """The (immutable) parameters of a request: made once per kind, as
        checking them costs as much as the rest of receiving a request."""
        key = max_tokens if samples_eos else -max_tokens
        params = self._params.get(key)
        if params is None:
            params = self._params[key] = (
                SamplingParams(max_tokens=max_tokens, eos_token_id=EOS_TOKEN) if samples_eos
                else SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        return params

    def busy(self) -> bool:
        return self.sched.has_unfinished_requests()

    def load_stats(self) -> tuple[int, int, float]:
        """What the engine publishes for vLLM's DP load balancer: waiting and
        running requests, and KV cache usage. Waiting is vLLM's
        ``get_request_counts``: with a KV connector it counts the requests
        holding blocks while they wait and those queued for an asynchronous
        load too (EngineCore publishes those counts)."""
        sched = self.sched
        running, waiting = sched.get_request_counts()
        return waiting, running, sched.kv_cache_manager.usage

    def num_unfinished(self) -> int:
        """Requests received and not finished (the front end's in-flight count)."""
        return len(self.live)

    # -- one step ----------------------------------------------------------------
    def plan(self) -> PlannedStep | None:
        """``schedule()`` and the batch it makes (None if nothing runs)."""
        sched = self.sched
        out = sched.schedule()
        num_sched = out.num_scheduled_tokens
        if not num_sched:
            return None
        if not self.plain:
            return self._plan_general(out)
        shape, lives, _ = self._batch(out)
        # The runner's output is known now (synchronous, no drafts).
        requests = sched.requests
        eos = self.eos_probability > 0.0
        sampled_ids: list[list[int]] = []
        for rid, lv in zip(num_sched, lives):
            if lv is None:
                sampled_ids.append(_NOTHING)
            elif eos and lv.token_at(len(requests[rid].output_token_ids)) == EOS_TOKEN:
                sampled_ids.append([EOS_TOKEN])
            else:
                sampled_ids.append(lv.sample)
        return PlannedStep(out, shape, sampled_ids, lives)

    def plan_kv(self, now: float, idle: bool) -> tuple[PlannedStep | None, bool]:
        """``plan`` with a KV connector: the batch's connector metadata goes
        to the worker as it is scheduled at ``now`` (its reads start). An
        empty batch (requests waiting for KV, nothing to compute) runs no
        model; when nothing is in flight (``idle``) the worker's report due
        by ``now`` is processed at once, as vLLM's engine loop, stepping
        with nothing to compute, does. Returns the batch (None if empty)
        and whether a report was processed."""
        sched = self.sched
        worker = self.kv_worker
        assert worker is not None
        out = sched.schedule()
        worker.start(out.kv_connector_metadata, now)
        if out.num_scheduled_tokens:
            return self._plan_general(out), False
        if idle:
            report = worker.report(now)
            if report is not None:
                result = sched.update_from_output(out, ModelRunnerOutput([], [], None, report))
                for o in result.finished:
                    self._finish(o.request_id, now)
                return None, True
        return None, False

    def _kv_report(self, end: float) -> KVConnectorOutput | None:
        """The KV worker's report with a batch that ends at ``end`` (None
        without a connector)."""
        worker = self.kv_worker
        return None if worker is None else worker.report(end)

    def _batch(self, out: SchedulerOutput) -> tuple[BatchShape, list[_Live | None], list[int]]:
        """The step's batch: its shape for the step-time model (a request
        verifying d drafts is a decode of 1 + d query tokens: BatchShape's
        spec fields), each scheduled request's client view (None: it samples
        nothing, mid-prefill) and its drafts."""
        num_sched = out.num_scheduled_tokens
        requests = self.sched.requests
        live = self.live
        spec = out.scheduled_spec_decode_tokens
        chunks = out.prefill_chunk_req_ids
        decodes = decode_kv = prefill = prefill_kv = pairs = sampled = spec_tokens = spec_keys = 0
        lives: list[_Live | None] = []
        drafts: list[int] = []
        for rid, n_new in num_sched.items():
            c = requests[rid].num_computed_tokens - n_new
            d = len(spec[rid]) if spec and rid in spec else 0
            if d:
                decodes += 1
                decode_kv += c + n_new
                spec_tokens += d
                q = n_new - 1  # queries beyond the first
                spec_keys += q * c + q * (q + 1) // 2
            elif n_new == 1:
                decodes += 1
                decode_kv += c + 1
            else:
                prefill += n_new
                prefill_kv += c + n_new
                pairs += n_new * c + n_new * (n_new + 1) // 2
            drafts.append(d)
            if rid in chunks:
                lives.append(None)
            else:
                sampled += 1
                lives.append(live[rid])
        shape = BatchShape(out.total_num_scheduled_tokens, len(num_sched), sampled, decodes,
                           decode_kv, prefill, prefill_kv, pairs, spec_tokens, spec_keys)
        if self.lora is not None:
            shape.lora_gpu_s = self._lora_seconds(num_sched)
        if self.encoder is not None and out.scheduled_encoder_inputs:
            shape.encoder_gpu_s = self._encoder_seconds(out.scheduled_encoder_inputs)
        return shape, lives, drafts

    def _encoder_seconds(self, encoder_inputs: dict[str, list[int]]) -> float:
        """GPU seconds the vision encoder adds to a batch: the items the
        scheduler scheduled for encoding (vLLM's
        ``scheduled_encoder_inputs``, by index into the request's items)."""
        assert self.encoder is not None
        live = self.live
        patches: list[int] = []
        for rid, indices in encoder_inputs.items():
            items = live[rid].spec.mm_items
            patches += [items[i].num_patches for i in indices]
        return self.encoder.seconds(patches)

    def _lora_seconds(self, num_sched: dict[str, int]) -> float:
        """GPU seconds LoRA adds to a batch: its adapters' loads and kernels
        over the tokens of requests with an adapter (in batch order, as the
        worker activates them)."""
        assert self.lora is not None
        requests = self.sched.requests
        tokens: dict[int, int] = {}
        for rid, n_new in num_sched.items():
            lid = requests[rid].lora_id
            if lid:
                tokens[lid] = tokens.get(lid, 0) + n_new
        return self.lora.step_seconds(tokens)

    def _plan_general(self, out: SchedulerOutput) -> PlannedStep:
        """``plan`` with async scheduling or drafts: the outputs wait for
        completion (the runner's tokens depend on what is known then)."""
        shape, lives, drafts = self._batch(out)
        admitted: frozenset[str] | set[str] = frozenset()
        if out.scheduled_spec_decode_tokens:
            admitted = {n.req_id for n in out.scheduled_new_reqs}
            admitted |= out.scheduled_cached_reqs.resumed_req_ids
        return PlannedStep(out, shape, [], lives, drafts, admitted)

    def _accepted(self, lv: _Live, num_drafts: int) -> int:
        """Drafts accepted of a verification of ``num_drafts`` (the request's
        next draw)."""
        assert self.speculative is not None
        n = lv.num_verifications
        lv.num_verifications = n + 1
        return self.speculative.acceptance.accepted(uniform(lv.spec_key, n), num_drafts)

    def complete(self, plan: PlannedStep, start: float, dt: float, busy: float | None = None) -> int:
        """``update_from_output()`` for a step of ``dt`` seconds from ``start``,
        and the client-side bookkeeping. Returns how many requests finished.
        ``busy``: the engine's busy time the step counts when it is not
        ``dt`` (pipeline parallelism: a batch's time on one stage, while it
        takes all the stages' times to come out)."""
        if plan.output.scheduled_new_reqs:
            self._note_started(plan.output, start)
        if plan.drafts is not None:
            if self.speculative is None:
                return self._complete_async(plan, start, dt, busy)
            return self._complete_general(plan, start, dt, busy)
        sched = self.sched
        out, shape, sampled_ids = plan.output, plan.shape, plan.sampled_ids
        num_sched = out.num_scheduled_tokens
        now = start + dt
        runner_output = ModelRunnerOutput(list(num_sched), sampled_ids)
        result = sched.update_from_output(out, runner_output)
        self._deliver(plan.lives, None, start, dt, now)
        for o in result.finished:
            self._finish(o.request_id, now)
        self._log_step(out, shape, result.finished, start, dt)
        return len(result.finished)

    def _note_started(self, out: SchedulerOutput, start: float) -> None:
        """The requests whose first prompt tokens a step starting at
        ``start`` computes (a request is new to the runner once, resumed
        after a preemption)."""
        live = self.live
        for new in out.scheduled_new_reqs:
            lv = live.get(new.req_id)
            if lv is not None and lv.started < 0.0:
                lv.started = start

    def _deliver(self, lives: list[_Live | None], counts: list[int] | None, start: float,
                 dt: float, now: float, rest_durations: list[float] | None = None,
                 rest_ends: list[float] | None = None) -> int:
        """Tokens reaching their clients at the end of a step (``now``, which
        is ``start`` + ``dt`` as the caller summed it): ``lives[i]`` gets one
        chunk of ``counts[i]`` tokens (one each without ``counts``; None:
        nothing), one gap in the ITLs as ``vllm bench serve`` measures them
        (the step time when the request's previous chunk came at the step's
        start). The one owner of that rule: stepping calls it per step, a
        decode stretch for its first step, with its later steps as
        ``rest_durations`` / ``rest_ends`` (one token each, a step time
        apart). Returns the tokens delivered in the step."""
        itls = self.itls
        same_gap = 0
        delivered = 0
        k = 1
        later_ends = rest_ends or []
        later_gaps = rest_durations or []
        n_rest = len(later_ends)
        rest_end = later_ends[-1] if n_rest else 0.0
        for i, lv in enumerate(lives):
            if lv is None:
                continue
            if counts is not None:
                k = counts[i]
            delivered += k
            lv.num_tokens += k
            # A chunk reaches the client: its first token, a gap counted as
            # one step time (previous chunk at this step's start), or an ITL.
            # Inlined in this loop: as a method called per request, a
            # simulated request cost 4 % more instructions
            # (bench_instructions.py --sizes 500 1000, 1,764,959 vs 1,696,152).
            last = lv.last_token_time
            if lv.first_token_time < 0.0:
                lv.first_token_time = now
            elif last == start:
                same_gap += 1
            else:
                itls.add(now - last)
            lv.last_token_time = now
            if lv.token_times is not None:
                lv.token_times.append(now)
                pooled = lv.pooled
                if pooled is not None:
                    # The same samples as pooled above: its gap (none for its first chunk)
                    # and a time per token.
                    if lv.num_tokens != k:
                        pooled.gaps.append(dt if last == start else now - last)
                    pooled.times.extend([now] * k)
            if n_rest:
                # A decode stretch's steps 1..k-1: one token each, one step
                # time after the one before (added to the pools in bulk).
                lv.last_token_time = rest_end
                lv.num_tokens += n_rest
                if lv.token_times is not None:
                    lv.token_times.extend(later_ends)
                    if pooled is not None:
                        pooled.gaps.extend(later_gaps)
                        pooled.times.extend(later_ends)
        if same_gap:
            itls.add(dt, same_gap)
        if delivered:
            self.token_times.add(now, delivered)
        return delivered

    def _log_step(self, out: SchedulerOutput, shape: BatchShape, finished: list[Any],
                  start: float, dt: float, busy: float | None = None) -> None:
        sched = self.sched
        num_reqs = len(out.num_scheduled_tokens)
        now = start + dt
        free = sched.kv_cache_manager.block_pool.get_num_free_blocks()
        self.totals.add(now, dt if busy is None else busy, num_reqs, shape.num_tokens,
                        shape.prefill_tokens, free)
        if self.steps is not None:
            self.steps.append(start, dt, num_reqs, shape.num_tokens, shape.prefill_tokens, free,
                              len(sched.running), len(sched.waiting))
        if self.trace_steps is not None:
            record = step_record(self.totals.num_steps - 1, out,
                                 [[o.request_id, o.finish_reason or ""] for o in finished], sched)
            record["start"] = start
            record["duration"] = dt
            if out.scheduled_spec_decode_tokens:
                spec = out.scheduled_spec_decode_tokens
                record["spec"] = [[rid, len(spec[rid])] for rid in out.num_scheduled_tokens if rid in spec]
            self.trace_steps.write(json.dumps(record, separators=(",", ":")) + "\n")

    def _complete_async(self, plan: PlannedStep, start: float, dt: float, busy: float | None = None) -> int:
        """``_complete_general`` without drafts (async scheduling's usual
        case): a request that samples gets its one token, unless it
        finished since this step was scheduled (its token is dropped)."""
        sched = self.sched
        out = plan.output
        ids = list(out.num_scheduled_tokens)
        requests = sched.requests
        eos = self.eos_probability > 0.0
        entries: list[list[int]] = []
        # Per scheduled request, whose client may get a token (None: none)
        # and the request's output count before the step.
        watched: list[_Live | None] = []
        reqs: list[Request | None] = []
        before: list[int] = []
        for rid, lv in zip(ids, plan.lives):
            r = None if lv is None else requests.get(rid)
            if lv is None or r is None:
                # Mid-prefill, or finished on the step before: its token is dropped.
                entries.append(_NOTHING if lv is None else lv.sample)
                watched.append(None)
                reqs.append(None)
                before.append(0)
                continue
            n = len(r.output_token_ids)
            entries.append([EOS_TOKEN] if eos and n == lv.eos_index else lv.sample)
            watched.append(lv)
            reqs.append(r)
            before.append(n)
        result = sched.update_from_output(out, ModelRunnerOutput(ids, entries, None,
                                                                 self._kv_report(start + dt)))
        for i, r in enumerate(reqs):
            # The scheduler dropped the token of a request it no longer runs.
            if r is not None and len(r.output_token_ids) == before[i]:
                watched[i] = None
        now = start + dt
        self._deliver(watched, None, start, dt, now)
        for o in result.finished:
            self._finish(o.request_id, now)
        self._log_step(out, plan.shape, result.finished, start, dt, busy)
        return len(result.finished)

    def _complete_general(self, plan: PlannedStep, start: float, dt: float,
                          busy: float | None = None) -> int:
        """``complete`` with async scheduling or drafts: each request that
        samples gets its token and, verifying drafts (not the padding of
        the step that admitted it), the accepted ones; under async
        scheduling a request that finished since this step was scheduled
        gets nothing (the engine drops its tokens: wasted work). A request
        receives what the scheduler appended: 1 + accepted tokens, fewer if
        it stops among them."""
        sched = self.sched
        out = plan.output
        ids = list(out.num_scheduled_tokens)
        now = start + dt
        requests = sched.requests
        drafts = plan.drafts
        assert drafts is not None
        admitted = plan.admitted
        eos = self.eos_probability > 0.0
        entries: list[list[int]] = []
        watched: list[tuple[_Live, Request, int]] = []
        for rid, lv, d in zip(ids, plan.lives, drafts):
            if lv is None:
                entries.append(_NOTHING)
                continue
            r = requests.get(rid)
            if r is None:
                # Finished on the step before (async): its tokens are dropped.
                entries.append(lv.sample)
                continue
            n = len(r.output_token_ids)
            a = self._accepted(lv, d) if d and rid not in admitted else 0
            if not a and not (eos and lv.token_at(n) == EOS_TOKEN):
                entries.append(lv.sample)
            else:
                entries.append([lv.token_at(n + j) for j in range(1 + a)])
            watched.append((lv, r, n))
        result = sched.update_from_output(out, ModelRunnerOutput(ids, entries, None,
                                                                 self._kv_report(now)))
        if result.spec_decoding_stats is not None:
            assert self.spec_stats is not None
            self.spec_stats.merge(result.spec_decoding_stats)
        got: list[_Live | None] = []
        counts: list[int] = []
        for lv, r, n in watched:
            if len(r.output_token_ids) > n:
                got.append(lv)
                counts.append(len(r.output_token_ids) - n)
        self._deliver(got, counts, start, dt, now)
        for o in result.finished:
            self._finish(o.request_id, now)
        if self._drafts is not None:
            # Synchronous drafting: K drafts for every request that sampled
            # and still runs (vLLM's update_draft_token_ids after the step).
            k_drafts = self._drafts
            sched.update_draft_token_ids(DraftTokenIds(
                ids, [[] if lv is None else k_drafts for lv in plan.lives]))
        self._log_step(out, plan.shape, result.finished, start, dt, busy)
        return len(result.finished)

    def _finish(self, rid: str, now: float) -> None:
        lv = self.live.pop(rid)
        spec = lv.spec
        if self.hands_off:
            self.handoffs.append((spec, lv.send_time, now))
        elif lv.pooled is not None:  # a client timeout is set
            self.finished_ids.append(rid)
            if now > lv.deadline:
                # Finished in a step that ran past the deadline: the client
                # had given up (vLLM's abort came too late to matter).
                self._timed_out(rid, lv.deadline, lv.pooled)
                return
        self.records.append(rid, lv.send_time, lv.first_token_time, now, spec.num_prompt_tokens,
                            lv.num_tokens, spec.arrival_time,
                            lv.token_times if self.keep_token_times else None)
        load_start = load_end = NO_TIME
        for loads in self._kv_loads:
            load = loads.get(rid)
            # Its load before its first step (not one after a preemption).
            if load is not None and load[1] <= lv.started:
                load_start, load_end = load
                break
        self.phases.append(rid, lv.reached, lv.started, load_start, load_end)

    # -- client timeouts ---------------------------------------------------------
    def abort(self, rid: str, t: float) -> bool:
        """The client gave up on ``rid`` at ``t`` (its deadline): the engine
        aborts it through the scheduler's abort path, wherever it is
        (waiting, running, preempted, loading KV), as vLLM's server does
        when a client disconnects; it counts as failed. False: not here."""
        lv = self.live.pop(rid, None)
        if lv is None:
            return False
        self.sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
        self._timed_out(rid, t, lv.pooled)
        return True

    def record_timeout(self, rid: str, t: float) -> None:
        """A request the client gave up on at ``t`` while no engine held it
        (on its way to one, or between prefill and decode): failed."""
        self._timed_out(rid, t, None)

    def _timed_out(self, rid: str, deadline: float, pooled: _Pooled | None) -> None:
        assert self.request_timeout is not None
        self.failed.append((rid, timeout_error(self.request_timeout)))
        if deadline > self.last_timeout:
            self.last_timeout = deadline
        if pooled is not None:
            # Its ITLs and token times leave the pools: vLLM's bench counts successes only.
            if pooled.gaps:
                self._dropped_itls.add_repeated(pooled.gaps, 1)
            if pooled.times:
                self._dropped_token_times.add_repeated(pooled.times, 1)

    # -- a stretch of decode steps ------------------------------------------------
    def stretch_limit(self, through_finish: bool = True) -> tuple[int, int, bool]:
        """(most decode steps the scheduler can take with nothing changing
        but, possibly, requests stopping in the last one; the running
        requests' KV tokens; whether they do): the core's rule, plus where
        this rank's simulated model samples EOS."""
        live = self.live
        worker = self.kv_worker
        if worker is not None and worker.next_due() != math.inf:
            # Its report would change the scheduler mid-stretch.
            return 0, 0, False

        def steps_to_eos(r: Request) -> int:
            return live[r.request_id].steps_to_eos(len(r.output_token_ids))

        return decode_stretch_plan(self.sched, steps_to_eos if self.eos_probability > 0 else None,
                                   through_finish)

    def apply_stretch(self, start: float, durations: list[float], ends: list[float],
                      finishing: bool = False, in_flight: PlannedStep | None = None) -> int:
        """Advance every running request ``len(durations)`` decode steps of the
        given durations (ending at ``ends``), with all the bookkeeping stepping
        would do; with ``finishing`` the last step is the one ``stretch_limit``
        said requests stop in. Async: ``in_flight`` is the batch in flight,
        the stretch's first step (it may finish prefills: their requests'
        first tokens). Returns how many finished."""
        sched = self.sched
        running = sched.running
        B = len(running)
        k = len(durations)
        # Step 0 reaches the clients as a stepped step would (each request's
        # gap from its own previous token, none before its first): the
        # delivery rule's one owner. The clients are read by nothing in the
        # core's advance, so they may be told before it.
        # The client views in running order: the plan of the batch an async
        # stretch leaves in flight is made from them (in_flight_plan).
        lives = self._running_lives()
        end = ends[-1]
        rest_ends = ends[1:]
        rest_durations = durations[1:]
        if self._deliver(lives, None, start, durations[0], ends[0], rest_durations, rest_ends) != B:
            missing = next(r for r, lv in zip(running, lives) if lv is None)
            raise AssertionError(f"{missing.request_id} runs without a client")
        # What each request samples (and, with ``finishing``, what it samples
        # in the last step: EOS where its model says so).
        clients = cast("list[_Live]", lives)  # every one delivered to, checked above
        tokens = [lv.token for lv in clients]
        last = ([lv.token_at(len(r.output_token_ids) + k - 1) for r, lv in zip(running, clients)]
                if finishing else [])
        finished: list[str] = []
        # planned: stretch_limit just asked the core about this state, and
        # the tokens are the simulator's own ints.
        if finishing:
            before = running[:]  # finishing may take requests out of running in place
            free_after, outputs = fast_forward_decode_finishing(sched, k, tokens, last, planned=True)
            finished = [o.request_id for o in outputs]
            if outputs:
                lives = [lv for r, lv in zip(before, lives) if not r.is_finished()]
        else:
            free_after = fast_forward_decode(sched, k, tokens, planned=True)
        if sched.async_scheduling and sched.step_in_flight:
            self._stretch_plan = self._decode_plan(sched.in_flight_outputs[0], sched.running, lives)
        self.num_ff_steps += k
        # Steps 1..k-1: every request's gap is the step time. Added per stretch
        # (the accumulators' statistics do not depend on how adds are grouped).
        self.itls.add_repeated(rest_durations, B)
        self.token_times.add_repeated(rest_ends, B)
        first_tokens, first_prefill = B, 0
        if in_flight is not None:
            first_tokens, first_prefill = in_flight.shape.num_tokens, in_flight.shape.prefill_tokens
            if in_flight.output.scheduled_new_reqs:
                self._note_started(in_flight.output, start)
        self.totals.add_decode_stretch(ends, durations, B, free_after, first_tokens, first_prefill)
        log = self.steps
        if log is not None:
            log.start.append(start)
            log.start.extend(ends[:-1])
            log.duration.extend(durations)
            for column, value in ((log.num_reqs, B), (log.num_tokens, B), (log.prefill_tokens, 0),
                                  (log.num_waiting, len(sched.waiting))):
                column.extend(array("q", (value,)) * k)
            log.num_tokens[-k] = first_tokens
            log.prefill_tokens[-k] = first_prefill
            # As stepping logs it: running after the step's finishes.
            log.num_running.extend(array("q", (B,)) * (k - 1))
            log.num_running.append(len(sched.running))
            log.free_blocks.extend(free_after)
        for rid in finished:
            self._finish(rid, end)
        return len(finished)

    def idle_kv_batches(self, scheduled: list[float], processed: list[float]) -> None:
        """With a KV connector, the worker's side of a stretch's batches:
        batch j was scheduled at ``scheduled[j]`` with the connector's idle
        metadata and processed at ``processed[j]``, when the worker (nothing
        in flight: ``stretch_limit``) reports nothing."""
        worker = self.kv_worker
        connector = self.kv_connector
        if worker is None or connector is None:
            return
        meta = connector.idle_metadata()
        for t_sched, t_done in zip(scheduled, processed):
            worker.start(meta, t_sched)
            if worker.report(t_done) is not None:
                raise AssertionError("a KV worker with nothing in flight reported during a decode stretch")

    def _running_lives(self) -> list[_Live | None]:
        """Every running request's client view, in running order. ``running``
        changes by removals, which keep its order, and by requests appended
        at its end, so the last call's list is walked along with it and only
        the requests not found there are looked up by id (all of them, from
        the first one out of order: slower, never wrong)."""
        running = self.sched.running
        old_reqs, old_lives = self._aligned
        n = len(old_reqs)
        live = self.live
        out: list[_Live | None] = []
        j = 0
        for r in running:
            while j < n and old_reqs[j] is not r:
                j += 1
            if j < n:
                out.append(old_lives[j])
                j += 1
            else:
                out.append(live[r.request_id])
        self._aligned = (running[:], out)
        return out

    def in_flight_plan(self) -> PlannedStep:
        """Async: the plan of the batch an async stretch left in flight
        (``Scheduler.in_flight_outputs[0]``), as ``plan`` would have made
        it: every running request decoding one token. The stretch made it
        (``apply_stretch``: the batch is the running requests, in order)."""
        out = self.sched.in_flight_outputs[0]
        plan = self._stretch_plan
        if plan is None or plan.output is not out:
            raise AssertionError("in_flight_plan: the batch in flight was not left by a stretch")
        return plan

    @staticmethod
    def _decode_plan(out: SchedulerOutput, requests: list[Request], lives: list[_Live | None]) -> PlannedStep:
        """The plan of ``out``, a batch of ``requests`` decoding one token each
        (``lives``: their client views, in the same order)."""
        n = len(requests)
        kv = 0
        for r in requests:
            kv += r.num_computed_tokens
        return PlannedStep(out, BatchShape(n, n, n, n, kv, 0, 0, 0), [], lives, [0] * n)

    def result(self, wall_seconds: float) -> SimResult:
        stats = self.sched.kv_cache_manager.prefix_cache_stats
        # The CPU tier's hits and traffic (its own connector, or a MultiConnector's child).
        offload = connector_of_type(self.kv_connector, SimOffloadingConnector)
        return SimResult(
            workload=self.workload_name, records=self.records, failed=self.failed,
            itls=self.itls.without(self._dropped_itls),
            token_times=self.token_times.without(self._dropped_token_times), totals=self.totals,
            steps=self.steps,
            num_gpu_blocks=self.num_gpu_blocks,
            num_preemptions=self.sched.num_preemptions,
            prefix_cache_queries=stats.queries + stats.preempted_queries,
            prefix_cache_hits=stats.hits + stats.preempted_hits,
            num_fast_forwarded_steps=self.num_ff_steps, wall_seconds=wall_seconds,
            spec_stats=self.spec_stats,
            kv_offload=offload.stats if offload is not None else None, phases=self.phases,
            lora=self.lora.stats if self.lora is not None else None, last_timeout=self.last_timeout)
