"""Engine instances: what the event loop steps.

An instance owns its clock (``now``: when its next step can start), a
step-time model and one or more :class:`~kvsched.sim.rank.Rank`:

- :class:`EngineInstance` - one engine core (a single engine, or one replica
  of a dense data-parallel deployment);
- :class:`LockstepGroup` - the data-parallel ranks of an MoE model with
  expert parallelism. They share their experts, so every rank runs every
  step: a step lasts as long as the slowest rank, the experts see the tokens
  of all ranks, and a rank with nothing to do runs a one-token dummy batch
  that still pays the collectives. The group keeps vLLM's DP step counter
  and wave (``DPRankStates.end_step``): once no rank has work left the
  ranks go on running dummy batches until the next finish-sync step
  (every ``dp_sync_interval``-th) sees that, and only then stop; the
  counter then restarts for the next wave.

``advance(bound)`` runs one step, or a stretch of pure-decode steps in one
jump when the core allows it (:func:`kvsched.core.fast_forward.decode_stretch_plan`)
and no step of the stretch but the first starts at or after ``bound`` (the
next event from outside: an arrival, or another instance's possible finish).
Nothing outside an instance writes its clock; the loop only wakes an idle
instance when work arrives.

Async scheduling (the ranks' schedulers built with ``async_scheduling``)
runs vLLM's async engine loop (``EngineCore.step_with_batch_queue``, a
batch queue of 2): each ``advance`` is one iteration: schedule the next
batch if there are requests, and block on the oldest batch in flight once
the queue is full, or nothing was scheduled, and apply its output. Time: a
batch starts on the GPU when the one before it ends (or when it is
scheduled, if the GPU is idle) and lasts its step time (the CPU work of
scheduling the next batch overlaps it: ``StepTimeModel.step_time``); the
loop reaches its next iteration when the batch it blocks on ends. So batch
N+1 is scheduled as batch N starts, from the requests that arrived by then,
and batch N's tokens reach the clients when N ends.

Pipeline parallelism (the step model's ``pipeline``, kvsched.perf.pipeline)
runs the same loop with the engine's deeper queue (``batch_queue_size``: PP
batches, PP + 1 under async scheduling; synchronous scheduling too): a
batch enters the first stage when it is free and passes every stage in
order (``PipelineClock``), so several batches are on the GPUs at once; a
batch that decodes a request enters the first stage only once that
request's last token has left the last stage (async scheduling schedules it
before: vLLM's V2 runner hands the token from the last stage to the first);
its tokens reach the clients when it leaves the last stage, and the engine's
busy time counts its time on one stage. No stretches: the core takes none
with PP.

An async stretch starts where one batch of every running request is in
flight (decodes, or prefills that complete) and ``decode_stretch_plan``
allows k iterations: the batch in flight and the k-1 next ones are applied
(their tokens at their ends), and the k-th new batch is left in flight
(without the requests that stopped on length in the last iteration, and
then priced as stepping prices it). Iteration j > 0 happens when new batch
j-1 starts on the GPU; the stretch keeps the iterations that happen before
``bound``.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any

from kvsched.config import BATCH_QUEUE_SIZE, batch_queue_size, keeps_scheduling
from kvsched.core.policies import DPRankStates
from kvsched.errors import CannotServe, UserInputError
from kvsched.perf.pipeline import PipelineClock
from kvsched.perf.step_time import BatchShape, StepTimeModel
from kvsched.sim.rank import PlannedStep, Rank

# The shortest jump worth taking: a one-step stretch (usually the step in
# which a request finishes) already costs less than planning and completing
# the step (measured: -1 % instructions on 20k random requests at 20 req/s).
MIN_STRETCH = 1


def stretch_times(start: float, limit: int, bound: float,
                  step_times: Callable[[int, int], list[float]],
                  lag: int = 0) -> tuple[list[float], list[float]]:
    """Durations and end times of the steps of a decode stretch starting at
    ``start``, at most ``limit`` of them. Step j > ``lag`` is kept if step
    j - ``lag`` starts before ``bound``: with ``lag`` 0 no step but the first
    starts at or after it; with ``lag`` 1 (async: iteration j schedules step
    j when step j-1 starts) no iteration but the first happens at or after
    it. ``step_times(j, n)`` gives steps j .. j+n-1's durations. The ends
    are summed one after the other, as stepping sums them, so the floats
    are the same."""
    durations: list[float] = []
    ends: list[float] = []
    t = start
    # When the step ``lag`` before this chunk's first started (lag 1).
    prev = -math.inf
    # Stretches between arrivals are short (about 3 steps at 20 req/s on
    # an H100): price a few steps first, then 4x more each round.
    chunk = 4
    while len(durations) < limit:
        j = len(durations)
        more = step_times(j, min(chunk, limit - j))
        new_ends = list(accumulate(more, initial=t))[1:]
        # Step j + i starts at the previous end; step j + i is kept if step
        # j + i - lag started before bound (the very first always is).
        starts = [prev, t, *new_ends] if lag else [t, *new_ends]
        cut = bisect_left(starts, bound)
        if j == 0 and not cut:
            cut = 1
        durations.extend(more[:cut])
        ends.extend(new_ends[:cut])
        if cut < len(more):
            break
        prev = ends[-2] if len(ends) > 1 else start
        t = ends[-1]
        chunk *= 4
    return durations, ends


def async_stretch_times(first_start: float, limit: int, bound: float,
                        step_times: Callable[[int, int], list[float]]) -> tuple[list[float], list[float]]:
    """Durations and end times of the new batches of an async stretch, new
    batch 0 starting at ``first_start`` (when the batch in flight ends), at
    most ``limit``. Iteration j > 0 schedules new batch j when new batch
    j-1 starts: only iterations before ``bound`` are kept (stretch_times
    keeps batches that *start* before it, so one more)."""
    return stretch_times(first_start, limit, bound, step_times, lag=1)


def cannot_serve(ranks: Sequence[Rank], now: float, detail: str) -> CannotServe:
    """Why an instance cannot go on at ``now``: the vLLM 0.33 livelock one of
    its ranks' schedulers is in, named with its requests (vLLM would step
    for ever there), else ``detail``. The one owner of that message, for
    every stepping path (one engine, DP replicas, lockstep DP ranks)."""
    for i, rank in enumerate(ranks):
        lock = rank.sched.livelock()
        if lock is not None:
            where = f"DP rank {i}: " if len(ranks) > 1 else ""
            return CannotServe(f"{where}at t={now:.3f}s, {lock.message()}; the simulation stops there")
    return CannotServe(detail)


class _Jumps:
    """What both instance kinds share: when to try a stretch."""

    fast_forward: bool
    async_scheduling: bool
    _queue: deque[Any]

    def _stretch(self, bound: float) -> int | None:
        raise NotImplementedError

    def _async_stretch(self, bound: float) -> int | None:
        raise NotImplementedError

    def _jump(self, bound: float) -> int | None:
        """A stretch if fast-forward may and can take one: how many requests
        finished in it, or None. Whether a rank's state may start one is the
        core's rule alone (``kvsched.core.fast_forward.stretch_refusal``,
        through ``Rank.stretch_limit``)."""
        if not self.fast_forward:
            return None
        return self._async_stretch(bound) if self.async_scheduling else self._stretch(bound)


class EngineInstance(_Jumps):
    """One engine core on its own clock."""

    def __init__(self, rank: Rank, step_model: StepTimeModel, fast_forward: bool = True) -> None:
        self.ranks = [rank]
        self.rank = rank
        self.step_model = step_model
        self.async_scheduling = rank.async_scheduling
        sc = rank.sched.scheduler_config
        # vLLM's batch queue (async scheduling or PP); 1: one step at a time.
        self.batch_queue_size = batch_queue_size(sc.async_scheduling, sc.pipeline_parallel_size)
        pipeline = step_model.pipeline
        if (pipeline is None) != (sc.pipeline_parallel_size == 1) or (
                pipeline is not None and pipeline.pipeline_parallel_size != sc.pipeline_parallel_size):
            raise ValueError("the step model's pipeline and the scheduler's pipeline_parallel_size differ")
        if pipeline is not None and rank.kv_worker is not None:
            raise UserInputError(f"pipeline_parallel_size={sc.pipeline_parallel_size}: kvsched does not "
                                 "simulate pipeline parallelism with a KV connector (P/D "
                                 "disaggregation, KV offloading); use pipeline_parallel_size=1 there")
        self._pipeline = PipelineClock(pipeline) if pipeline is not None else None
        # Fast-forward covers plain decode, synchronous or async, with or
        # without a KV connector (no drafts; with a connector the core takes
        # only stretches that leave it idle, and the rank only while its
        # worker has nothing in flight).
        # LoRA steps carry per-step adapter work a stretch does not price: stepped.
        self.fast_forward = (fast_forward and rank.trace_steps is None and pipeline is None
                             and rank.lora is None
                             and (rank.plain or (rank.speculative is None and (
                                 rank.async_scheduling or rank.kv_worker is not None))))
        self.now = 0.0
        # Async: batches in flight, newest first: (plan, GPU start, duration);
        # None for the batch a stretch left in flight until it is needed
        # (the next stretch, if one follows, replaces it unseen).
        self._queue: deque[tuple[PlannedStep | None, float, float]] = deque()
        self._gpu_free = 0.0  # when the GPU finishes the last batch launched
        # PP: the batches in flight, newest first: (plan, start on the first
        # stage, time through the pipeline, time on one stage), None for a
        # batch that scheduled nothing; and the schedule() calls in a row
        # that scheduled nothing.
        self._pp_queue: deque[tuple[PlannedStep, float, float, float] | None] = deque()
        self._empty_schedules = 0
        # PP: when each request's last token in flight leaves the pipeline.
        self._sampled_at: dict[str, float] = {}
        # With a KV connector: waiting (clock set ahead) for the worker's next report.
        self.sleeping = False

    def busy(self) -> bool:
        return self.rank.busy() or bool(self._queue) or bool(self._pp_queue)

    def wake(self, t: float) -> bool:
        """Work arrives at ``t``: an idle engine starts its next step then.
        With a KV connector it first reports what its worker finished while
        it sat idle (vLLM's engine keeps stepping while a connector holds
        blocks: sent blocks are freed before the new work is scheduled).
        Returns True when an engine waiting for its worker's next report
        (see ``_advance_kv``) is woken earlier: its clock moved back to
        ``t``, so the loop must queue it at ``t``."""
        if self.sleeping and t < self.now:
            self.now = t
            self.sleeping = False
            return True
        if self.now < t and not self.busy():
            self.now = t
        rank = self.rank
        if rank.kv_worker is not None and not self.busy() and rank.sched.has_requests():
            rank.plan_kv(self.now, not self._queue)
        return False

    def advance(self, bound: float) -> int:
        """One step, or a stretch; returns how many requests finished (at
        ``self.now`` afterwards)."""
        rank = self.rank
        finished = self._jump(bound)
        if rank.kv_worker is not None:
            if finished is not None:
                self.sleeping = False
                return finished
            return self._advance_kv(bound)
        if finished is not None:
            return finished
        if self._pipeline is not None:
            return self._iterate_pipelined()
        if self.async_scheduling:
            return self._iterate()
        plan = rank.plan()
        if plan is None:
            raise cannot_serve(self.ranks, self.now, "no request could be scheduled at "
                               f"t={self.now:.3f}s with {len(rank.sched.waiting)} waiting; nothing would "
                               "ever progress")
        dt = self.step_model.step_time(plan.shape)
        start = self.now
        finished = rank.complete(plan, start, dt)
        self.now = start + dt
        return finished

    def _advance_kv(self, bound: float) -> int:
        """``advance`` with a KV connector: one step, or one iteration of the
        async loop, whose batch's connector metadata reaches the worker as it
        is scheduled. When nothing can be computed (requests wait for KV)
        and nothing is in flight, the engine reports what the worker has
        done and, if that changes nothing, waits until the worker's next
        report falls due, or until ``bound`` (anything from outside)."""
        rank = self.rank
        queue = self._queue
        now = self.now
        self.sleeping = False
        if queue and queue[-1][0] is None:
            # The batch a stretch left in flight: its plan, before the next
            # schedule() moves the counters it reads.
            _, start, dt = queue.pop()
            queue.append((rank.in_flight_plan(), start, dt))
        plan, reported = rank.plan_kv(now, not queue) if rank.sched.has_requests() else (None, False)
        if plan is not None:
            dt = self.step_model.step_time(plan.shape)
            if not self.async_scheduling:
                self.now = now + dt
                return rank.complete(plan, now, dt)
            start = now if now > self._gpu_free else self._gpu_free
            self._gpu_free = start + dt
            queue.appendleft((plan, start, dt))
            if keeps_scheduling(len(queue), BATCH_QUEUE_SIZE, plan.shape.num_tokens, rank.sched):
                return 0
        if queue:
            oldest, start, dt = queue.pop()
            assert oldest is not None
            if start + dt > now:
                self.now = start + dt
            return rank.complete(oldest, start, dt)
        if rank.sched.livelock() is not None:  # vLLM would step for ever: stop with its requests named
            raise cannot_serve(self.ranks, now, "")
        if not reported and rank.busy():
            # Nothing ran and nothing changed: wait for the worker's next
            # report (a read done). Anything from outside before then wakes
            # the engine early (wake).
            due = rank.kv_worker.next_due() if rank.kv_worker is not None else math.inf
            if due == math.inf:
                if bound == math.inf:
                    raise cannot_serve(self.ranks, now, f"no request could be scheduled at t={now:.3f}s with "
                                      f"{len(rank.sched.waiting)} waiting and no KV transfer in flight; "
                                      "nothing would ever progress")
                due = bound
            self.now = max(now, due)
            self.sleeping = True
        return 0

    def _iterate(self) -> int:
        """One iteration of vLLM's async engine loop (see the module doc);
        how many requests finished."""
        rank = self.rank
        queue = self._queue
        now = self.now
        if queue and queue[-1][0] is None:
            # Its plan, before the next schedule() moves the counters it reads.
            _, start, dt = queue.pop()
            queue.append((rank.in_flight_plan(), start, dt))
        if rank.sched.has_requests():
            plan = rank.plan()
            if plan is not None:
                dt = self.step_model.step_time(plan.shape)
                start = now if now > self._gpu_free else self._gpu_free
                self._gpu_free = start + dt
                queue.appendleft((plan, start, dt))
                if keeps_scheduling(len(queue), BATCH_QUEUE_SIZE, plan.shape.num_tokens, rank.sched):
                    return 0  # no blocking: schedule the next batch at once
            elif not queue:
                if rank.sched.has_unfinished_requests():
                    raise cannot_serve(self.ranks, now, f"no request could be scheduled at t={now:.3f}s with "
                                       f"{len(rank.sched.waiting)} waiting; nothing would ever progress")
                return 0
        if not queue:
            return 0
        oldest, start, dt = queue.pop()
        assert oldest is not None
        end = start + dt
        if end > now:
            self.now = end
        return rank.complete(oldest, start, dt)

    def _iterate_pipelined(self) -> int:
        """One iteration of vLLM's engine loop with PP (see the module doc):
        as ``_iterate``, but a batch with nothing scheduled (every request
        waits for its output, or for its decode stagger) takes a queue slot,
        as in vLLM, and costs no time."""
        rank = self.rank
        pipeline = self._pipeline
        queue = self._pp_queue
        assert pipeline is not None
        if rank.sched.has_requests():
            plan = rank.plan()
            if plan is None:
                queue.appendleft(None)
                self._empty_schedules += 1
                if self._empty_schedules > 2 * self.batch_queue_size and not any(queue):
                    # Nothing in flight and nothing schedulable for longer
                    # than the stagger lasts: it never will be.
                    raise CannotServe(f"no request could be scheduled at t={self.now:.3f}s with "
                                      f"{len(rank.sched.waiting)} waiting; nothing would ever progress")
            else:
                self._empty_schedules = 0
                dt = self.step_model.step_time(plan.shape)
                tokens = plan.shape.num_tokens
                # Async: a request's next decode is scheduled before its last
                # token is out (a placeholder); the batch cannot enter the
                # first stage before that token has left the last one.
                sampled_at = self._sampled_at
                ready = self.now
                ids = plan.output.num_scheduled_tokens
                if sampled_at:
                    for rid in ids:
                        t = sampled_at.get(rid)
                        if t is not None and t > ready:
                            ready = t
                start, end = pipeline.run(ready, dt, tokens)
                for rid, lv in zip(ids, plan.lives):
                    if lv is not None:
                        sampled_at[rid] = end
                queue.appendleft((plan, start, end - start, pipeline.stages.stage_times(dt, tokens)[0]))
            if keeps_scheduling(len(queue), self.batch_queue_size,
                                plan.shape.num_tokens if plan is not None else 0, rank.sched):
                return 0
        if not queue:
            return 0
        oldest = queue.pop()
        if oldest is None:
            return 0  # the empty batch's output: nothing
        plan, start, dt, busy = oldest
        end = start + dt
        if end > self.now:
            self.now = end
        sampled_at = self._sampled_at
        for rid, lv in zip(plan.output.num_scheduled_tokens, plan.lives):
            if lv is not None and sampled_at.get(rid) == end:
                del sampled_at[rid]  # no later batch of it is in flight
        return rank.complete(plan, start, dt, busy)

    def _async_stretch(self, bound: float) -> int | None:
        """Async: a stretch of iterations if one can be taken (see the
        module doc); how many requests finished in it (none: an async
        stretch stops before a finish), or None."""
        rank = self.rank
        limit, kv_tokens, finishes = rank.stretch_limit()
        if limit < MIN_STRETCH:
            return None
        in_flight, prev_start, prev_dt = self._queue[0]
        first_start = self._gpu_free  # the batch in flight ends: new batch 0 starts
        B = len(rank.sched.running)
        step_times = self.step_model.decode_step_times

        def new_batch_times(j: int, n: int) -> list[float]:
            # New batch j decodes every request with its context j + 1 ahead.
            return step_times(B, kv_tokens + (j + 1) * B, B, n)

        durations, ends = async_stretch_times(first_start, limit, bound, new_batch_times)
        k = len(durations)
        # Applied: the batch in flight and new batches 0 .. k-2.
        applied_durations = [prev_dt, *durations[:k - 1]]
        applied_ends = [first_start, *ends[:k - 1]]
        finishing = finishes and k == limit
        finished = rank.apply_stretch(prev_start, applied_durations, applied_ends, finishing, in_flight)
        # Iteration 0 schedules now, iteration j when new batch j-1 starts.
        rank.idle_kv_batches([self.now, *applied_ends[:k - 1]], applied_ends)
        if not rank.sched.step_in_flight:
            # Every request stopped on length: the last iteration scheduled nothing.
            self._queue.clear()
            self._gpu_free = applied_ends[-1]
        elif finishing:
            # The requests that stopped are not in the batch left in flight:
            # priced as stepping prices it.
            left = rank.in_flight_plan()
            dt = self.step_model.step_time(left.shape)
            self._queue[0] = (left, applied_ends[-1], dt)
            self._gpu_free = applied_ends[-1] + dt
        else:
            self._queue[0] = (None, applied_ends[-1], durations[-1])
            self._gpu_free = ends[-1]
        if applied_ends[-1] > self.now:
            self.now = applied_ends[-1]
        return finished

    def _stretch(self, bound: float) -> int | None:
        """A stretch if one of useful length can be taken: how many requests
        finished in it (None: no stretch)."""
        rank = self.rank
        limit, kv_tokens, finishes = rank.stretch_limit()
        if limit < MIN_STRETCH:
            return None
        B = len(rank.sched.running)
        step_times = self.step_model.decode_step_times
        durations, ends = stretch_times(self.now, limit, bound,
                                        lambda j, n: step_times(B, kv_tokens + j * B, B, n))
        if len(durations) < MIN_STRETCH:
            return None
        finished = rank.apply_stretch(self.now, durations, ends, finishes and len(durations) == limit)
        rank.idle_kv_batches([self.now, *ends[:-1]], ends)
        self.now = ends[-1]
        return finished


class LockstepGroup(_Jumps):
    """Data-parallel ranks that step together on one clock."""

    def __init__(self, ranks: list[Rank], step_model: StepTimeModel, shared: DPRankStates,
                 fast_forward: bool = True) -> None:
        if step_model.pipeline is not None:
            raise UserInputError(f"pipeline_parallel_size={step_model.pipeline.pipeline_parallel_size}: "
                                 "kvsched does not simulate pipeline parallelism for data-parallel ranks "
                                 "that step together (expert parallelism); use pipeline_parallel_size=1")
        self.ranks = ranks
        self.step_model = step_model
        self.shared = shared
        # Policies decide per step from shared state: no jumps with them;
        # nor with drafts.
        self.fast_forward = fast_forward and all(r.sched.admission_policy is None and r.speculative is None
                                                 and r.lora is None
                                                 for r in ranks)
        self.async_scheduling = any(r.async_scheduling for r in ranks)
        self.now = 0.0
        self._dummy = BatchShape.decode(1, 1)
        # vLLM's engines_running: the ranks step (dummy batches if need be)
        # until a finish-sync step finds every rank idle.
        self.engines_running = False
        # Async: the ranks' batches in flight, newest first. The ranks run
        # one collective forward pass per slot: (each rank's batch or None,
        # start, duration).
        self._queue: deque[tuple[list[PlannedStep | None], float, float]] = deque()
        self._gpu_free = 0.0

    def busy(self) -> bool:
        return self.engines_running or self._has_work() or bool(self._queue)

    def _has_work(self) -> bool:
        return any(r.busy() for r in self.ranks)

    def wake(self, t: float) -> bool:
        # Ranks still running dummy batches take new work at their next step.
        if self.now < t and not self.busy():
            self.now = t
        return False

    def advance(self, bound: float) -> int:
        self.engines_running = True
        finished = self._jump(bound)
        if finished is not None:
            return finished
        return self._iterate() if self.async_scheduling else self._step()

    def _iterate(self) -> int:
        """One iteration of every rank's async engine loop, in lockstep: the
        ranks' batches scheduled together run as one forward pass (as long
        as the slowest, idle ranks running a dummy batch), and the loop
        blocks on the oldest slot as EngineInstance._iterate does."""
        ranks = self.ranks
        queue = self._queue
        now = self.now
        scheduling = [r.sched.has_requests() for r in ranks]
        if any(scheduling):
            plans = [r.plan() if s else None for r, s in zip(ranks, scheduling)]
            global_tokens = sum(p.shape.num_tokens for p in plans if p is not None)
            if global_tokens:
                model = self.step_model
                dt = max(model.step_time(p.shape if p is not None else self._dummy, global_tokens)
                         for p in plans)
                start = now if now > self._gpu_free else self._gpu_free
                self._gpu_free = start + dt
                queue.appendleft((plans, start, dt))
                # Every rank's batch runs in one step: the engine waits for
                # no output while the queue has room (keeps_scheduling's rule
                # with tokens run).
                if len(queue) < BATCH_QUEUE_SIZE:
                    return 0
            elif not queue and self._has_work():
                raise cannot_serve(ranks, now, "no request could be scheduled on any DP rank at "
                                   f"t={now:.3f}s; nothing would ever progress")
        if queue:
            slot, start, dt = queue.pop()
            end = start + dt
            if end > now:
                self.now = end
            finished = 0
            for r, p in zip(ranks, slot):
                if p is not None:
                    finished += r.complete(p, start, dt)
        else:
            # Nothing in flight or to run: idle ranks waiting for the
            # finish-sync run a dummy batch.
            dt = self.step_model.step_time(self._dummy, len(ranks))
            start = now if now > self._gpu_free else self._gpu_free
            self.now = self._gpu_free = start + dt
            finished = 0
        self.engines_running = self.shared.end_step(self._has_work())
        return finished

    def _decode_times(self, busy: list[Rank], kv_tokens: list[int], ahead: int
                      ) -> Callable[[int, int], list[float]]:
        """Durations of the group's pure-decode steps j .. j+n-1 of a
        stretch: each as long as the slowest busy rank (its context
        ``ahead + j`` tokens past ``kv_tokens`` per request), or the dummy
        batch idle ranks run."""
        sizes = [len(r.sched.running) for r in busy]
        global_tokens = sum(sizes)
        model = self.step_model
        idle = len(busy) < len(self.ranks)
        dummy = model.decode_step_time(1, 1, global_tokens) if idle else 0.0

        def times(j: int, n: int) -> list[float]:
            per_rank = [model.decode_step_times(b, kv + (j + ahead) * b, b, n, global_tokens)
                        for b, kv in zip(sizes, kv_tokens)]
            return [max(*ts, dummy) if idle else max(ts) for ts in zip(*per_rank)]

        return times

    def _async_stretch(self, bound: float) -> int | None:
        """Async: every rank over a stretch of iterations, each batch as long
        as the slowest rank (idle ranks run the dummy batch), as
        EngineInstance._async_stretch does for one rank; None: no stretch."""
        busy = [r for r in self.ranks if r.sched.running]
        if not busy or any(r.sched.waiting or r.sched.async_kv_waiting
                           for r in self.ranks if not r.sched.running):
            return None
        # No stretch through a finish: the batch left in flight would be
        # priced against every rank's new batch (stepped instead).
        limits = [r.stretch_limit(through_finish=False) for r in busy]
        limit = min(lim for lim, _, _ in limits)
        if limit < MIN_STRETCH:
            return None
        # A rank with nothing running must have nothing in flight either (a
        # batch of requests that finished meanwhile still runs and is logged).
        if any(p is not None and not r.sched.running for r, p in zip(self.ranks, self._queue[0][0])):
            return None
        in_flight, prev_start, prev_dt = self._queue[0]
        first_start = self._gpu_free
        # New batch j decodes every request with its context j + 1 ahead.
        new_batch_times = self._decode_times(busy, [kv for _, kv, _ in limits], 1)

        durations, ends = async_stretch_times(first_start, limit, bound, new_batch_times)
        k = len(durations)
        applied_durations = [prev_dt, *durations[:k - 1]]
        applied_ends = [first_start, *ends[:k - 1]]
        finished = 0
        for r, p in zip(self.ranks, in_flight):
            if r.sched.running:
                finished += r.apply_stretch(prev_start, applied_durations, applied_ends, False, p)
        self._queue[0] = ([r.in_flight_plan() if r.sched.running else None for r in self.ranks],
                          applied_ends[-1], durations[-1])
        self._gpu_free = ends[-1]
        if applied_ends[-1] > self.now:
            self.now = applied_ends[-1]
        # One DP step per iteration, each with work left (none finishes).
        for _ in range(k):
            self.engines_running = self.shared.end_step(True)
        return finished

    def _step(self) -> int:
        plans = [r.plan() for r in self.ranks]
        global_tokens = sum(p.shape.num_tokens for p in plans if p is not None)
        model = self.step_model
        if global_tokens:
            dt = max(model.step_time(p.shape if p is not None else self._dummy, global_tokens)
                     for p in plans)
        elif self._has_work():
            raise cannot_serve(self.ranks, self.now, "no request could be scheduled on any DP rank at "
                               f"t={self.now:.3f}s; nothing would ever progress")
        else:
            # Every rank idle, waiting for the finish-sync: dummy batches only
            # (each rank's one token reaches the experts).
            dt = model.step_time(self._dummy, len(self.ranks))
        start = self.now
        finished = 0
        for r, p in zip(self.ranks, plans):
            if p is not None:
                finished += r.complete(p, start, dt)
        self.now = start + dt
        self.engines_running = self.shared.end_step(self._has_work())
        return finished

    def _stretch(self, bound: float) -> int | None:
        """All ranks over a pure-decode stretch, each step as long as the
        slowest rank (idle ranks run the dummy batch), as when stepping; how
        many requests finished in it (None: no stretch)."""
        busy = [r for r in self.ranks if r.sched.running]
        if not busy or any(r.sched.waiting or r.sched.async_kv_waiting
                           for r in self.ranks if not r.sched.running):
            return None
        limits = [r.stretch_limit() for r in busy]
        limit = min(lim for lim, _, _ in limits)
        if limit < MIN_STRETCH:
            return None
        step_times = self._decode_times(busy, [kv for _, kv, _ in limits], 0)

        durations, ends = stretch_times(self.now, limit, bound, step_times)
        n = len(durations)
        if n < MIN_STRETCH:
            return None
        finished = 0
        for r, (lim, _, finishes) in zip(busy, limits):
            # A rank whose requests stop in the stretch's last step finishes them.
            finished += r.apply_stretch(self.now, durations, ends, finishes and lim == n)
        # Requests run through every step but the last: no finish-sync ends
        # the wave before it.
        for _ in range(n - 1):
            self.shared.end_step(True)
        self.engines_running = self.shared.end_step(self._has_work())
        self.now = ends[-1]
        return finished
