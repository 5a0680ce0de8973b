"""Admission policies: the hook the scheduler consults before admitting each
waiting request (``AdmissionPolicy``), and the ready-made policies.

A policy returns None to let the request in, or a short reason that stops
admission for the rest of the step (the reason shows up in ``--explain``).
Running requests are never affected. A policy reads the scheduler through
:class:`kvsched.core.view.SchedulerView` (what it may read; it writes
nothing there). A new policy is a few lines::

    class MaxRunning:
        def __init__(self, limit: int) -> None:
            self.limit = limit

        def hold_reason(self, scheduler: SchedulerView, request: Request) -> str | None:
            if len(scheduler.running) >= self.limit:
                return f"{len(scheduler.running)} running, limit {self.limit}"
            return None

A policy may also implement any of these optional methods; the scheduler
looks them up once, at construction, and calls only those present:

- ``begin_step(scheduler) -> None`` at the start of every ``schedule()``;
- ``defer_prefill_chunks(scheduler) -> bool``: True makes this step's
  running phase skip running requests whose last scheduling left them
  mid-prefill (vLLM's ``defer_prefills``); decodes still run;
- ``end_step(scheduler, output) -> None`` once the ``SchedulerOutput`` is
  built (before the model runs), to update the policy's own state.

Ready-made policies:

- ``PrefillCadence``: vLLM 0.33.0's ``--prefill-schedule-interval K`` for an
  engine without DP coordination, exactly (checked against vLLM's scheduler
  by tests/conformance/test_cadence.py).
- ``DPPrefillCadence``: the same interval on lockstep (MoE) DP ranks, where
  vLLM's DP engine core throttles from a step counter all ranks share.
- ``BalanceGate``: seed 001's balance scheduling for data-parallel ranks.
- ``AdpBalance``: TensorRT-LLM's attention-DP balance, as read from its docs.

The DP policies read a ``DPRankStates`` the DP driver keeps up to date; they
never write it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, Protocol, get_args

from kvsched.core.view import SchedulerView
from kvsched.errors import UserInputError
from kvsched.fields import is_int

if TYPE_CHECKING:
    from kvsched.core.output import SchedulerOutput
    from kvsched.request import Request


class AdmissionPolicy(Protocol):
    def hold_reason(self, scheduler: SchedulerView, request: Request) -> str | None:
        """None admits ``request``; a reason stops admission for this step."""
        ...


class PrefillCadence:
    """vLLM's local prefill cadence (``prefill_schedule_interval``).

    Executed steps are those that scheduled at least one token. A step
    *defers prefills* when all of these hold at its start:

    - fewer than ``interval`` executed steps would separate it from the last
      executed step that carried prefill (``num_executed_steps + 1 -
      last_prefill_step < interval``; the first step is never gated);
    - the last step that admitted (did not defer and did not preempt) left
      no request waiting; otherwise the engine is *capacity bound* and the
      cadence is off until such a step drains the queue;
    - some running request is decoding (its last scheduling was not a
      prefill chunk).

    On a deferring step running requests left mid-prefill by their last
    scheduling are skipped, and admission stops at the first waiting request
    with more than one token to compute after its prefix-cache hit. A step
    carried prefill if it scheduled a running request that was mid-prefill or
    admitted one with more than one token to compute.
    """

    def __init__(self, interval: int) -> None:
        if not is_int(interval) or interval < 1:
            raise UserInputError(f"prefill_schedule_interval={interval!r}: must be an integer >= 1")
        self.interval = interval
        self.capacity_bound = False
        # A full interval back, so the first step is never gated.
        self.last_prefill_step = -interval
        self.num_executed_steps = 0
        self.deferring = False
        self._mid_prefill: list[Request] = []

    def begin_step(self, scheduler: SchedulerView) -> None:
        running = scheduler.running
        self.deferring = (
            self.interval > 1
            and not self.capacity_bound
            and self.num_executed_steps + 1 - self.last_prefill_step < self.interval
            and any(not r.is_prefill_chunk for r in running))
        # Deferring steps schedule no mid-prefill request, so only the others
        # need to know which ones were mid-prefill.
        self._mid_prefill = [] if self.deferring else [r for r in running if r.is_prefill_chunk]

    def defer_prefill_chunks(self, scheduler: SchedulerView) -> bool:
        return self.deferring

    def hold_reason(self, scheduler: SchedulerView, request: Request) -> str | None:
        if not self.deferring:
            return None
        _, num_computed = scheduler.kv_cache_manager.get_computed_blocks(request)
        if num_computed < request.num_tokens - 1:
            return self._why()
        return None

    def _why(self) -> str:
        since = self.num_executed_steps + 1 - self.last_prefill_step
        return f"prefill cadence: step {since} of {self.interval} since the last prefill; decodes run alone"

    def end_step(self, scheduler: SchedulerView, output: SchedulerOutput) -> None:
        if not self.deferring and not output.preempted_req_ids:
            self.capacity_bound = len(scheduler.waiting) > 0
        if output.total_num_scheduled_tokens > 0:
            self.num_executed_steps += 1
        if self.interval > 1 and (self._prefill_scheduled(output)
                                  or self._prefill_admitted(scheduler, output)):
            self.last_prefill_step = self.num_executed_steps

    def _prefill_scheduled(self, output: SchedulerOutput) -> bool:
        if not self._mid_prefill:
            return False
        scheduled = output.num_scheduled_tokens
        given_back = output.unscheduled_req_ids or ()
        return any(r.request_id in scheduled or r.request_id in given_back
                   for r in self._mid_prefill)

    @staticmethod
    def _prefill_admitted(scheduler: SchedulerView, output: SchedulerOutput) -> bool:
        requests = scheduler.requests
        for new in output.scheduled_new_reqs:
            if new.num_computed_tokens < requests[new.req_id].num_tokens - 1:
                return True
        cached = output.scheduled_cached_reqs
        for rid in cached.resumed_req_ids:
            if cached.num_computed_tokens[rid] < requests[rid].num_tokens - 1:
                return True
        return False


class DPPrefillCadence(PrefillCadence):
    """vLLM 0.33.0's prefill cadence on a lockstep (MoE) DP rank.

    vLLM's DP engine core throttles prefills on every step whose shared step
    counter is not a multiple of the interval (the counter counts lockstep
    steps, dummy batches included, and restarts at 0 with each wave of work),
    so all ranks prefill on the same steps. The scheduler then defers exactly
    as the local cadence does (in-progress and new prefills wait while some
    running request decodes), with the same capacity-bound escape; the local
    since-last-prefill rule is off on DP ranks.
    """

    def __init__(self, shared: DPRankStates, interval: int) -> None:
        super().__init__(interval)
        self.shared = shared

    def begin_step(self, scheduler: SchedulerView) -> None:
        running = scheduler.running
        self.deferring = (
            self.interval > 1
            and self.shared.step_counter % self.interval != 0
            and not self.capacity_bound
            and any(not r.is_prefill_chunk for r in running))
        self._mid_prefill = [] if self.deferring else [r for r in running if r.is_prefill_chunk]

    def _why(self) -> str:
        return (f"prefill cadence: DP step {self.shared.step_counter} is not a multiple of "
                f"{self.interval}; decodes run alone")


class DPRankStates:
    """What data-parallel ranks share with each other: per rank, the number
    of running and of waiting requests (the DP driver calls ``publish``, the
    all-gather), and the lockstep step counter and wave of vLLM's DP engine
    core (the driver calls ``end_step`` after every lockstep step). Policies
    only read them."""

    def __init__(self, size: int, dp_sync_interval: int = 16) -> None:
        if size < 1:
            raise UserInputError(f"data parallel size {size}: must be >= 1")
        if not is_int(dp_sync_interval) \
                or dp_sync_interval < 1:
            raise UserInputError(f"dp_sync_interval={dp_sync_interval!r}: must be an integer >= 1")
        self.running = [0] * size
        self.waiting = [0] * size
        self.dp_sync_interval = dp_sync_interval
        self.step_counter = 0
        self.current_wave = 0

    def end_step(self, unfinished: bool) -> bool:
        """After a lockstep step (real or dummy batches): count it, and tell
        whether the ranks keep stepping (vLLM's ``engines_running``).
        ``unfinished`` says whether any rank still has unfinished requests.

        vLLM's DP engine core (``DPEngineCoreProc._has_global_unfinished_reqs``)
        only learns that every rank is idle from an all-reduce it runs on the
        first step of a wave and on every ``dp_sync_interval``-th step; until
        then idle ranks keep running dummy batches. When the all-reduce finds
        nothing left anywhere the wave ends: the counter restarts at 0, so the
        next wave's first step is cadence-aligned."""
        self.step_counter += 1
        counter = self.step_counter
        if counter != 1 and counter % self.dp_sync_interval:
            return True
        if unfinished:
            return True
        self.step_counter = 0
        self.current_wave += 1
        return False

    @property
    def size(self) -> int:
        return len(self.running)

    def publish(self, rank: int, num_running: int, num_waiting: int = 0) -> None:
        self.running[rank] = num_running
        self.waiting[rank] = num_waiting

    def publish_all(self, schedulers: Sequence[SchedulerView]) -> None:
        for rank, s in enumerate(schedulers):
            self.publish(rank, len(s.running), len(s.waiting))


# Seed 001 calls the shared running counts a queue; this is the same object.
DPRunningCounts = DPRankStates

BalanceThreshold = Literal["full", "full-minus-one"]


class BalanceGate:
    """Seed 001's balance scheduling on DP rank ``rank``.

    After every step each rank shares its number of running requests (the
    seed's all-gather; the driver calls ``shared.publish`` after the step).
    In the next step the rank admits no waiting request while the largest of
    those counts has reached the threshold: ``"full"`` means count >=
    max_num_seqs (vllm-ascend as shipped), ``"full-minus-one"`` count >=
    max_num_seqs - 1 (the seed). Like the seed's check, it applies after the
    token budget and max_num_seqs checks, before each admission.
    """

    def __init__(self, shared: DPRankStates, rank: int,
                 threshold: BalanceThreshold = "full-minus-one") -> None:
        if threshold not in get_args(BalanceThreshold):
            raise UserInputError(f"balance threshold {threshold!r}: must be 'full' or 'full-minus-one'")
        if not 0 <= rank < shared.size:
            raise UserInputError(f"rank {rank}: must be in [0, {shared.size})")
        self.shared = shared
        self.rank = rank
        self.threshold = threshold

    def hold_reason(self, scheduler: SchedulerView, request: Request) -> str | None:
        limit = scheduler.max_num_running_reqs
        if self.threshold == "full-minus-one":
            limit -= 1
        counts = self.shared.running
        largest = max(counts)
        if largest >= limit:
            return (f"balance: DP rank {counts.index(largest)} runs {largest} requests "
                    f"(threshold {limit})")
        return None


class AdpBalance:
    """TensorRT-LLM's attention-DP balance on DP rank ``rank``, as we read
    its documentation (tech blog 10, "ADP Balance"); the exact code was not
    available, so where the text is open we chose and say so.

    Once per step, from every rank's state (TensorRT-LLM all-gathers it inside
    the step, so the driver publishes right before the ranks schedule):

    - If every rank has a prefill to run (a waiting request) and a free slot
      (running < max_num_seqs), prefills may go: the timeout counter resets.
      With ``batching_wait_iters`` > 0 and decode work on every rank, the
      ranks first wait up to that many further steps so that more prefills
      gather into one batch, then admit (and the batching counter resets).
    - Otherwise new prefills are held and the timeout counter grows; when it
      reaches ``timeout_iters``, or when some rank has no decode work (holding
      would only idle it), prefills go anyway and the counter resets.

    Our choices: "has a prefill to run" is "has a waiting request"; only new
    admissions are held (a prefill already chunking continues, as the running
    phase is not touched); every rank computes the same decision from the
    same shared state, so each rank's policy keeps its own counters.
    """

    def __init__(self, shared: DPRankStates, rank: int, timeout_iters: int = 50,
                 batching_wait_iters: int = 0) -> None:
        if timeout_iters < 0 or batching_wait_iters < 0:
            raise UserInputError("timeout_iters and batching_wait_iters must be >= 0")
        if not 0 <= rank < shared.size:
            raise UserInputError(f"rank {rank}: must be in [0, {shared.size})")
        self.shared = shared
        self.rank = rank
        self.timeout_iters = timeout_iters
        self.batching_wait_iters = batching_wait_iters
        self.waiting_iters = 0
        self.batching_iters = 0
        self.hold: str | None = None

    def begin_step(self, scheduler: SchedulerView) -> None:
        running = self.shared.running
        waiting = self.shared.waiting
        max_seqs = scheduler.max_num_running_reqs
        all_have_prefill = all(w > 0 for w in waiting) and all(r < max_seqs for r in running)
        all_have_decode = all(r > 0 for r in running)
        self.hold = None
        if all_have_prefill:
            self.waiting_iters = 0
            if all_have_decode and self.batching_wait_iters:
                if self.batching_iters < self.batching_wait_iters:
                    self.batching_iters += 1
                    self.hold = (f"adp balance: batching prefills, wait {self.batching_iters} "
                                 f"of {self.batching_wait_iters}")
                else:
                    self.batching_iters = 0
            return
        self.waiting_iters += 1
        if self.waiting_iters >= self.timeout_iters or not all_have_decode:
            self.waiting_iters = 0
            return
        idle = [rank for rank, w in enumerate(waiting) if w == 0 or running[rank] >= max_seqs]
        self.hold = (f"adp balance: DP rank {idle[0]} has no prefill to run "
                     f"(wait {self.waiting_iters} of {self.timeout_iters})")

    def hold_reason(self, scheduler: SchedulerView, request: Request) -> str | None:
        return self.hold
