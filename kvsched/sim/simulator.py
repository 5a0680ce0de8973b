"""The serving simulator: kvsched's exact scheduler in virtual time.

Each engine step is ``schedule()`` -> step time from the performance model ->
``update_from_output()`` with the workload's output lengths (as ``ignore_eos``
does), or EOS at a position drawn per request when ``eos_probability`` > 0.

**Fast-forward.** Between events nothing changes but decoding: every running
request takes one token per step, nobody finishes, nothing arrives, admission
stays blocked. Such stretches are advanced in one jump
(``Scheduler.fast_forward_decode``), with the same block allocations, step
times, token times and metrics as stepping one by one. A stretch starts when
every running request is decoding, nothing arrived since the last step, and
either nothing waits or the last step was itself pure decode (all running
requests scheduled for one token, no admission, preemption or finish), so the
admission outcome is known to repeat: a waiting request held by
``max_num_seqs``, the token budget or chunked prefill stays held (those do not
change), one held by KV blocks stays held (free blocks only shrink while
decoding; blocks filled during the stretch hold output tokens unique to their
request, so they cannot become a prefix hit for a waiting prompt). A stretch
ends before the first step in which a request would finish, a request would
arrive, or the free pool could not give a needed block (a preemption).
"""

from __future__ import annotations

import json
import math
import random
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from kvsched.config import CacheConfig, SchedulerConfig
from kvsched.core import explain
from kvsched.core.output import ModelRunnerOutput, SchedulerOutput
from kvsched.core.policies import PrefillCadence
from kvsched.core.policy import AdmissionPolicy
from kvsched.core.scheduler import Scheduler
from kvsched.core.trace import step_record
from kvsched.perf.step_time import BatchShape, StepTimeModel
from kvsched.progress import draw_progress
from kvsched.request import SamplingParams
from kvsched.sim.metrics import RequestRecord, SampleAccumulator, benchmark_duration, compute_metrics
from kvsched.sim.workload import Workload, WorkloadRequest

EOS_TOKEN = 0  # never used in workload prompts (see kvsched.sim.workload)
# Admission stop reasons that cannot lift during a pure-decode stretch.
_STABLE_STOPS = {None, explain.REASON_MAX_NUM_SEQS, explain.REASON_KV_BLOCKS,
                 explain.REASON_TOKEN_BUDGET, explain.REASON_CHUNKED_PREFILL_OFF}
MIN_STRETCH = 2


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

    def __post_init__(self) -> None:
        if not 0.0 <= self.eos_probability < 1.0:
            raise ValueError(f"eos_probability={self.eos_probability!r}: must be in [0, 1)")


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


@dataclass(slots=True)
class SimResult:
    workload: str
    records: list[RequestRecord]
    failed: list[tuple[str, str]]  # (request id, why it was refused)
    itls: SampleAccumulator
    token_times: SampleAccumulator
    steps: StepLog
    num_gpu_blocks: int
    num_preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_fast_forwarded_steps: int
    wall_seconds: float

    @property
    def duration(self) -> float:
        return benchmark_duration(self.records) if self.records else 0.0

    def metrics(self, percentiles: tuple[float, ...] = (50.0, 90.0, 99.0),
                goodput_slos: dict[str, float] | None = None) -> dict[str, Any]:
        """vllm bench serve's keys, plus the engine-side figures."""
        out: dict[str, Any] = {}
        if self.records:
            out.update(compute_metrics(self.records, self.itls, self.duration, percentiles,
                                       goodput_slos, failed=len(self.failed),
                                       token_times=self.token_times))
        else:
            out["completed"] = 0
            out["failed"] = len(self.failed)
        out.update(self.engine_stats())
        return out

    def engine_stats(self) -> dict[str, Any]:
        s = self.steps
        n = len(s)
        duration = np.frombuffer(s.duration, dtype=np.float64) if n else np.zeros(1)
        busy = float(duration.sum())
        tokens = sum(s.num_tokens)
        prefill = sum(s.prefill_tokens)
        usable = self.num_gpu_blocks - 1
        free = np.frombuffer(s.free_blocks, dtype=np.int64) if n else np.full(1, usable)
        usage = 1.0 - free / usable
        return {
            "num_steps": n,
            "busy_seconds": busy,
            "mean_batch_size": sum(s.num_reqs) / n if n else 0.0,
            "mean_tokens_per_step": tokens / n if n else 0.0,
            "prefill_token_share": prefill / tokens if tokens else 0.0,
            "decode_token_share": 1.0 - prefill / tokens if tokens else 0.0,
            "mean_kv_cache_usage": float(usage @ duration) / busy if busy else 0.0,
            "max_kv_cache_usage": float(usage.max()),
            "num_preemptions": self.num_preemptions,
            "prefix_cache_hit_rate": (self.prefix_cache_hits / self.prefix_cache_queries
                                      if self.prefix_cache_queries else 0.0),
            "num_gpu_blocks": self.num_gpu_blocks,
            "fast_forwarded_steps": self.num_fast_forwarded_steps,
            "simulation_wall_seconds": self.wall_seconds,
        }


@dataclass(slots=True)
class PlannedStep:
    """A scheduled step waiting for its duration (see Simulator.plan_step)."""

    output: SchedulerOutput
    shape: BatchShape
    sampled_ids: list[list[int]]


@dataclass(slots=True)
class _Live:
    """Client-side view of one request in flight."""

    spec: WorkloadRequest
    send_time: float
    token: int            # the token this request samples (unique to it)
    eos_index: int        # output position of its EOS, or -1
    first_token_time: float = -1.0
    last_token_time: float = -1.0
    num_tokens: int = 0


Progress = Callable[[int, int, float], None]


class Simulator:
    def __init__(self, config: SimConfig, workload: Workload,
                 trace_steps: TextIO | None = None, progress: Progress | None = None,
                 admission_policy: AdmissionPolicy | None = None) -> None:
        self.config = config
        self.workload = workload
        self.trace_steps = trace_steps
        self.progress = progress
        policy = admission_policy or (PrefillCadence(config.prefill_schedule_interval)
                                      if config.prefill_schedule_interval > 1 else None)
        self.sched = Scheduler(config.scheduler_config, config.cache_config, admission_policy=policy,
                               runner_inputs=False)
        self.step_model = config.step_model
        self.rng = random.Random(config.seed)
        self.live: dict[str, _Live] = {}
        self.records: list[RequestRecord] = []
        self.failed: list[tuple[str, str]] = []
        self.itls = SampleAccumulator()
        self.token_times = SampleAccumulator()
        self.steps = StepLog()
        self.num_ff_steps = 0
        self.now = 0.0
        self._next_token = 1  # output tokens are negative: never in a prompt

    # -- clients ---------------------------------------------------------------
    def send(self, spec: WorkloadRequest, send_time: float) -> bool:
        """A client sends ``spec`` at ``send_time``; False if the engine refuses it
        (recorded in ``failed``)."""
        params = SamplingParams(max_tokens=spec.output_len, ignore_eos=True)
        eos_index = -1
        p = self.config.eos_probability
        if p > 0.0:
            # Geometric draw of the EOS position, truncated by max_tokens.
            u = self.rng.random()
            pos = int(math.log1p(-u) / math.log1p(-p))
            if pos < spec.output_len - 1:
                eos_index = pos
                params = SamplingParams(max_tokens=spec.output_len, eos_token_id=EOS_TOKEN)
        request = spec.to_request(params, send_time)
        try:
            self.sched.add_request(request)
        except ValueError as e:
            self.failed.append((spec.request_id, str(e)))
            return False
        self.live[spec.request_id] = _Live(spec, send_time, -self._next_token, eos_index)
        self._next_token += 1
        return True

    # -- the loop --------------------------------------------------------------
    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        sched = self.sched
        reqs = self.workload.requests
        n = len(reqs)
        max_conc = self.workload.max_concurrency
        queue: deque[WorkloadRequest] = deque()
        inflight = 0
        slot_free_since = 0.0
        i = 0
        can_ff = False  # the last step was pure decode, and nothing arrived since
        # Fast-forward's argument that admission stays held assumes no policy.
        ff_enabled = (self.config.fast_forward and self.trace_steps is None
                      and sched.admission_policy is None)
        last_report = wall0
        while True:
            now = self.now
            arrived = False
            while i < n and reqs[i].arrival_time <= now:
                queue.append(reqs[i])
                i += 1
                arrived = True
            while queue and (max_conc is None or inflight < max_conc):
                spec = queue.popleft()
                if self.send(spec, max(spec.arrival_time, slot_free_since)):
                    inflight += 1
                    arrived = True
            if arrived:
                can_ff = False
            if not sched.has_unfinished_requests():
                if i >= n and not queue:
                    break
                self.now = max(now, reqs[i].arrival_time)  # idle until the next arrival
                continue
            if self.progress is not None and time.perf_counter() - last_report > 0.5:
                last_report = time.perf_counter()
                self.progress(len(self.records) + len(self.failed), n, now)
            if can_ff and ff_enabled:
                next_arrival = reqs[i].arrival_time if i < n else math.inf
                # Cheap test first: a stretch needs room for MIN_STRETCH steps.
                if (next_arrival - now > MIN_STRETCH * self.steps.duration[-1]
                        and self._fast_forward(next_arrival)):
                    continue
            finished, pure_decode = self._step()
            if finished:
                inflight -= len(finished)
                slot_free_since = self.now
            # With nothing waiting, admission cannot change anything; else the
            # step must have shown admission held for good (see module doc).
            can_ff = not sched.waiting or (pure_decode and not finished)
        if self.progress is not None:
            self.progress(len(self.records) + len(self.failed), n, self.now)
        return self.result(time.perf_counter() - wall0)

    def result(self, wall_seconds: float) -> SimResult:
        sched = self.sched
        stats = sched.kv_cache_manager.prefix_cache_stats
        return SimResult(
            workload=self.workload.name, records=self.records, failed=self.failed, itls=self.itls,
            token_times=self.token_times, steps=self.steps,
            num_gpu_blocks=self.config.cache_config.num_gpu_blocks,
            num_preemptions=sched.num_preemptions,
            prefix_cache_queries=stats.queries + stats.preempted_queries,
            prefix_cache_hits=stats.hits + stats.preempted_hits,
            num_fast_forwarded_steps=self.num_ff_steps,
            wall_seconds=wall_seconds)

    def _step(self) -> tuple[list[str], bool]:
        """One engine step. Returns the finished ids and whether the step was
        pure decode with admission held by a reason that cannot lift."""
        plan = self.plan_step()
        if plan is None:
            raise RuntimeError(f"no request could be scheduled at t={self.now:.3f}s with "
                               f"{len(self.sched.waiting)} waiting; nothing would ever progress")
        return self.complete_step(plan, self.step_model.step_time(plan.shape))

    def plan_step(self) -> PlannedStep | None:
        """``schedule()`` and the batch it makes (None if nothing runs). A
        data-parallel driver plans every rank, then completes each with the
        step time they share."""
        sched = self.sched
        out = sched.schedule()
        num_sched = out.num_scheduled_tokens
        if not num_sched:
            return None
        requests = sched.requests
        live = self.live
        decodes = decode_kv = prefill = prefill_kv = pairs = sampled = 0
        sampled_ids: list[list[int]] = []
        for rid, n_new in num_sched.items():
            r = requests[rid]
            c = r.num_computed_tokens - n_new
            if n_new == 1:
                decodes += 1
                decode_kv += c + 1
            else:
                prefill += n_new
                prefill_kv += c + n_new
                pairs += n_new * c + n_new * (n_new + 1) // 2
            if r.is_prefill_chunk:
                sampled_ids.append([])
            else:
                sampled += 1
                lv = live[rid]
                sampled_ids.append([EOS_TOKEN if len(r.output_token_ids) == lv.eos_index else lv.token])
        shape = BatchShape(out.total_num_scheduled_tokens, len(num_sched), sampled, decodes,
                           decode_kv, prefill, prefill_kv, pairs)
        return PlannedStep(out, shape, sampled_ids)

    def complete_step(self, plan: PlannedStep, dt: float) -> tuple[list[str], bool]:
        """``update_from_output()`` after a step of ``dt`` seconds, and the
        client-side bookkeeping (token times, finishes, the step log)."""
        sched = self.sched
        out, shape, sampled_ids = plan.output, plan.shape, plan.sampled_ids
        num_sched = out.num_scheduled_tokens
        live = self.live
        start = self.now
        now = start + dt
        self.now = now
        runner_output = ModelRunnerOutput(list(num_sched), sampled_ids)
        result = sched.update_from_output(out, runner_output)
        same_gap = 0
        itls = self.itls
        for rid, toks in zip(runner_output.req_ids, sampled_ids):
            if not toks:
                continue
            lv = live[rid]
            lv.num_tokens += 1
            if lv.first_token_time < 0.0:
                lv.first_token_time = now
            elif lv.last_token_time == start:
                same_gap += 1
            else:
                itls.add(now - lv.last_token_time)
            lv.last_token_time = now
        if same_gap:
            itls.add(dt, same_gap)
        if shape.num_sampled:
            self.token_times.add(now, shape.num_sampled)
        finished = []
        for o in result.finished:
            finished.append(o.request_id)
            self._finish(o.request_id, now)
        free = sched.kv_cache_manager.block_pool.get_num_free_blocks()
        self.steps.append(start, dt, len(num_sched), shape.num_tokens, shape.prefill_tokens, free,
                          len(sched.running), len(sched.waiting))
        if self.trace_steps is not None:
            record = step_record(len(self.steps) - 1, out,
                                 [[o.request_id, o.finish_reason or ""] for o in result.finished], sched)
            record["start"] = start
            record["duration"] = dt
            self.trace_steps.write(_json_line(record))
        pure_decode = (shape.prefill_tokens == 0 and shape.num_decodes == len(sched.running)
                       and not out.scheduled_new_reqs and not out.preempted_req_ids
                       and not out.scheduled_cached_reqs.resumed_req_ids
                       and out.admission_stop in _STABLE_STOPS)
        return finished, pure_decode

    def _finish(self, rid: str, now: float) -> None:
        lv = self.live.pop(rid)
        spec = lv.spec
        self.records.append(RequestRecord(
            request_id=rid, send_time=lv.send_time, first_token_time=lv.first_token_time,
            finish_time=now, num_prompt_tokens=spec.num_prompt_tokens,
            num_output_tokens=lv.num_tokens, arrival_time=spec.arrival_time))

    def _fast_forward(self, next_arrival: float) -> bool:
        """Jump over a pure-decode stretch; False if none of useful length."""
        limit, kv_tokens = self.stretch_limit()
        if limit < MIN_STRETCH:
            return False
        B = len(self.sched.running)
        step_time = self.step_model.decode_step_time
        durations, ends = stretch_times(self.now, limit, next_arrival,
                                        lambda j: step_time(B, kv_tokens + j * B))
        if len(durations) < MIN_STRETCH:
            return False
        self.apply_stretch(durations, ends)
        return True

    def stretch_limit(self) -> tuple[int, int]:
        """(most decode steps the running requests can take with nobody
        finishing and no preemption, their total KV tokens); 0 steps unless
        every running request is decoding within the token budget."""
        sched = self.sched
        running = sched.running
        if not running or sched.max_num_scheduled_tokens < len(running):
            return 0, 0
        live = self.live
        limit = math.inf
        kv_tokens = 0
        for r in running:
            length = len(r.all_token_ids)
            if r.num_computed_tokens != length - 1:
                return 0, 0  # still prefilling
            kv_tokens += length
            # Steps until it stops (inclusive), by length cap or by EOS.
            steps = r.stop_len - length
            eos = live[r.request_id].eos_index
            if eos >= 0:
                steps = min(steps, eos - len(r.output_token_ids) + 1)
            if steps - 1 < limit:
                limit = steps - 1
        if limit < MIN_STRETCH:
            return 0, 0
        return min(int(limit), self._blocks_limit(int(limit))), kv_tokens

    def apply_stretch(self, durations: list[float], ends: list[float]) -> None:
        """Advance every running request ``len(durations)`` decode steps of
        the given durations (ending at ``ends``), with all the bookkeeping
        stepping would do."""
        sched = self.sched
        running = sched.running
        B = len(running)
        k = len(durations)
        start = self.now
        lives = [self.live[r.request_id] for r in running]
        free_after = sched.fast_forward_decode(k, [lv.token for lv in lives])
        self.num_ff_steps += k
        itls = self.itls
        # Step 0: each request's gap from its own previous token.
        end0 = ends[0]
        same_gap = 0
        for lv in lives:
            if lv.last_token_time == start:
                same_gap += 1
            else:
                itls.add(end0 - lv.last_token_time)
        if same_gap:
            itls.add(durations[0], same_gap)
        # Steps 1..k-1: every request's gap is the step time. Added per stretch
        # (the accumulators' statistics do not depend on how adds are grouped).
        itls.add_repeated(durations[1:], B)
        self.token_times.add_repeated(ends, B)
        log = self.steps
        log.start.append(start)
        log.start.extend(ends[:-1])
        log.duration.extend(durations)
        for column, value in ((log.num_reqs, B), (log.num_tokens, B), (log.prefill_tokens, 0),
                              (log.num_running, B), (log.num_waiting, len(sched.waiting))):
            column.extend(array("q", (value,)) * k)
        log.free_blocks.extend(free_after)
        end = ends[-1]
        for lv in lives:
            lv.last_token_time = end
            lv.num_tokens += k
        self.now = end

    def _blocks_limit(self, limit: int) -> int:
        """Most steps whose new blocks all fit the free pool (no preemption)."""
        sched = self.sched
        kv = sched.kv_cache_manager
        bs = sched.block_size
        free = kv.block_pool.get_num_free_blocks()
        firsts = [len(kv.req_to_blocks[r.request_id]) * bs - r.num_computed_tokens for r in sched.running]

        def allocs(k: int) -> int:
            return sum(-(-(k - j) // bs) for j in firsts if j < k)

        if allocs(limit) <= free:
            return limit
        lo, hi = 0, limit  # allocs(lo) <= free < allocs(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if allocs(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo


def stretch_times(start: float, limit: int, next_arrival: float,
                  step_time: Callable[[int], float]) -> tuple[list[float], list[float]]:
    """Durations and end times of the steps of a decode stretch starting at
    ``start`` (``step_time(j)`` is step j's), at most ``limit`` of them, none
    starting at or after ``next_arrival`` but the first. The ends are summed
    as stepping sums them, so the floats are the same."""
    durations: list[float] = []
    ends: list[float] = []
    t = start
    for j in range(limit):
        if j and t >= next_arrival:
            break
        dt = step_time(j)
        durations.append(dt)
        t += dt
        ends.append(t)
    return durations, ends


def _json_line(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":")) + "\n"


def stderr_progress(done: int, total: int, sim_time: float) -> None:
    draw_progress(done, total, f"t={sim_time:,.1f}s simulated")
