"""A real vLLM run's iteration log explained by kvsched's own scheduler.

vLLM's ``--enable-logging-iteration-details`` logs every engine step's batch
as four counts (context and generation requests and tokens) and its time,
but not which requests the step ran. To price those steps, read the host
time off a run, or check kvsched's decisions against vLLM's, each logged step
must be tied to the requests it served. :func:`replay_iteration_log` does it
with kvsched's exact scheduler: it steps a rank set up as the server was,
giving it the requests in the order the client sent them, each one only when
a logged step cannot be explained without it. Everything else (chunking,
prefix-cache hits, preemption, ``--long-prefill-token-threshold``, the
sequence cap) is the scheduler's own decision, so the replay holds exactly
where vLLM decided as kvsched does, and stops at the first step it cannot
explain (``diverged_at`` says where and why).

Which requests arrive before a step is the one thing the log does not say.
The replay takes the fewest that make the step's counts come out as logged
(requests arrive in the order they were sent: the client sends them one
by one): a request that had reached the engine but was not scheduled in
that step waits behind all earlier ones either way, so admitting it later
changes no decision. Adding a request means scheduling the step again, and
a schedule cannot be undone, so the replay runs again from the start up to
that step with the arrivals found so far: the scheduler is deterministic,
and a run of a few thousand steps restarts a few dozen times.

A step's counts follow vLLM's own rule (``compute_iteration_details`` in
vllm/v1/utils.py): a request is a *context* request while it has produced no
output token (a new request, each chunk of its prompt), otherwise a
*generation* request, a preempted request recomputing its prompt included.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvsched.perf.step_time import BatchShape
from kvsched.profile.iteration_log import IterationLine
from kvsched.sim.rank import PlannedStep, Rank
from kvsched.sim.simulator import SimConfig
from kvsched.sim.workload import Workload

# A step's batch as vLLM's iteration log counts it.
Counts = tuple[int, int, int, int]


def iteration_counts(num_scheduled_tokens: Mapping[str, int], num_output_tokens: Mapping[str, int]) -> Counts:
    """``(context requests, context tokens, generation requests, generation
    tokens)`` of a scheduled step as vLLM logs it, from each scheduled
    request's tokens and its output tokens so far (before the step)."""
    cr = ct = gr = gt = 0
    for rid, n in num_scheduled_tokens.items():
        if num_output_tokens[rid] == 0:
            cr += 1
            ct += n
        else:
            gr += 1
            gt += n
    return cr, ct, gr, gt


def line_counts(line: IterationLine) -> Counts:
    return (line.context_requests, line.context_tokens, line.generation_requests, line.generation_tokens)


@dataclass(frozen=True, slots=True)
class ReplayedStep:
    """One logged step as kvsched's scheduler ran it."""

    shape: BatchShape
    # Request index (in send order) -> tokens scheduled.
    scheduled: dict[int, int]
    # The requests that received a token, and which output token (0-based) each got.
    sampled: list[int]
    token_index: list[int]


@dataclass(frozen=True, slots=True)
class IterationReplay:
    """The log tied to the requests (see the module)."""

    # Per request in send order: the first step it could be scheduled in
    # (it reached the engine before it); -1 if the replay stopped earlier.
    arrival_step: list[int]
    # The steps replayed, in log order (all of them unless it diverged).
    steps: list[ReplayedStep]
    # The first step the scheduler could not explain, and why (None: none).
    diverged_at: int | None
    reason: str
    # How many times the replay ran again from the start (cost).
    restarts: int

    @property
    def complete(self) -> bool:
        return self.diverged_at is None


# Requests sent close together may reach the engine in another order (the
# API server handles them concurrently): where no run of the next requests in
# send order explains a step, sequences of up to REORDER_DEPTH requests drawn
# from the next REORDER_WINDOW ones are tried too.
REORDER_WINDOW = 6
REORDER_DEPTH = 3
# Going back to an earlier choice runs the log again from the start: at most
# this many runs (a run of a thousand steps takes ~15 ms).
MAX_RESTARTS = 3000
# Tokens of one step reach their clients within a few milliseconds of each
# other; those of successive steps at least a step (~20 ms here) apart.
FIRST_TOKEN_SLACK_S = 0.010


class _Run:
    """One pass of the rank over the log with a fixed set of arrivals."""

    def __init__(self, config: SimConfig, workload: Workload) -> None:
        self.workload = workload
        self.rank: Rank = config.make_rank(workload)
        self.index = {r.request_id: i for i, r in enumerate(workload.requests)}
        self.clock = 0.0

    def admit(self, indices: Sequence[int]) -> None:
        """These requests (indices in send order) reach the engine, in this order."""
        requests = self.workload.requests
        for i in indices:
            spec = requests[i]
            if not self.rank.receive(spec, spec.arrival_time):
                raise ValueError(f"request {spec.request_id}: the replay's engine refused it: "
                                 f"{self.rank.failed[-1][1]}")

    def plan(self) -> tuple[PlannedStep | None, Counts]:
        sched = self.rank.sched
        plan = self.rank.plan()
        if plan is None:
            return None, (0, 0, 0, 0)
        requests = sched.requests
        outputs = {rid: len(requests[rid].output_token_ids) for rid in plan.output.num_scheduled_tokens}
        return plan, iteration_counts(plan.output.num_scheduled_tokens, outputs)

    def finish(self, plan: PlannedStep, elapsed_s: float) -> ReplayedStep:
        """``update_from_output`` for the planned step, and what it ran."""
        requests = self.rank.sched.requests
        num_sched = plan.output.num_scheduled_tokens
        scheduled = {self.index[rid]: n for rid, n in num_sched.items()}
        sampled: list[int] = []
        token_index: list[int] = []
        for rid, live in zip(num_sched, plan.lives):
            if live is not None:
                sampled.append(self.index[rid])
                token_index.append(len(requests[rid].output_token_ids))
        self.rank.complete(plan, self.clock, elapsed_s)
        self.clock += elapsed_s
        return ReplayedStep(plan.shape, scheduled, sampled, token_index)


class _Candidates:
    """The arrival sequences to try before a step, fewest first: runs of the
    pending requests in send order, then short reorderings of the next few;
    where they stop (a search resumes there when a later step sends it back).

    Each sequence is tried twice. First strictly: every request it adds
    must be scheduled in the step (one that waits could as well arrive
    later, and the fewest arrivals are wanted). Then, if nothing strict
    fits, leniently: a request waiting unscheduled still changes the step
    (vLLM 0.33 drops ``--long-prefill-token-threshold`` while a single
    request is in the engine)."""

    def __init__(self, pending: Sequence[int]) -> None:
        self.seqs = [tuple(pending[:n]) for n in range(1, len(pending) + 1)]
        self.num_runs = len(self.seqs)
        window = list(pending[:REORDER_WINDOW])
        for n in range(1, min(REORDER_DEPTH, len(window)) + 1):
            self.seqs += [seq for seq in itertools.permutations(window, n) if list(seq) != window[:n]]
        self.next = 0

    def take(self) -> tuple[tuple[int, ...], bool] | None:
        """The next sequence to try and whether it is a strict try."""
        n = len(self.seqs)
        if self.next == 2 * n:
            return None
        self.next += 1
        return self.seqs[(self.next - 1) % n], self.next <= n

    def skip_runs(self) -> None:
        """Longer runs in send order cannot help a strict try: the last one
        added was not scheduled, so every request after it waits too."""
        if self.next <= self.num_runs:
            self.next = self.num_runs


def replay_iteration_log(config: SimConfig, workload: Workload, log: Sequence[IterationLine],
                         first_token_times: Sequence[float] | None = None,
                         max_restarts: int = MAX_RESTARTS) -> IterationReplay:
    """Tie every step of ``log`` to ``workload``'s requests (in send order)
    by replaying them through kvsched's scheduler set up by ``config`` (see
    the module). ``config`` must be a plain engine: no drafts, no async
    scheduling, no KV connector (the CPU platform runs none of them).

    ``first_token_times`` (each request's first token as its client saw it,
    any clock) helps twice. The requests are first tried in the order their
    first tokens came, the order they most likely reached the engine in
    (prompts are served first come, first served), then in send order (a
    long-prefill threshold lets a later short prompt finish first). And it
    rules out arrivals that would give a step the logged counts with the
    wrong requests: one step's first tokens reach their clients together
    (within ``FIRST_TOKEN_SLACK_S``), never well before an earlier step's.
    Where a choice made earlier turns out wrong (a later step cannot be
    explained), the replay goes back to it and tries the next candidate, up
    to ``max_restarts`` runs from the start for each order tried. The
    result is the first complete replay, else the one that went furthest."""
    if (config.speculative is not None or config.offload is not None
            or config.scheduler_config.async_scheduling):
        raise ValueError("replay_iteration_log: a synchronous engine without drafts or KV offloading only "
                         "(what vLLM's CPU platform runs)")
    num_requests = len(workload.requests)
    sent = list(range(num_requests))
    tries: list[tuple[list[int], Sequence[float] | None]] = [(sent, None)]
    if first_token_times is not None:
        if len(first_token_times) != num_requests:
            raise ValueError(f"first_token_times: {len(first_token_times)} times for {num_requests} requests")
        times = first_token_times
        by_first = sorted(sent, key=lambda i: (times[i], i))
        tries = [(by_first, times), (sent, times), (sent, None)]
    best: IterationReplay | None = None
    restarts = 0
    for order, check in tries:
        rep = _replay(config, workload, log, order, check, max_restarts)
        restarts += rep.restarts
        if best is None or (rep.diverged_at or len(log)) > (best.diverged_at or len(log)):
            best = rep
        if rep.complete:
            break
    assert best is not None
    return dataclasses.replace(best, restarts=restarts)


def _replay(config: SimConfig, workload: Workload, log: Sequence[IterationLine], order: Sequence[int],
            first_token_times: Sequence[float] | None, max_restarts: int) -> IterationReplay:
    """One try of :func:`replay_iteration_log`: the requests taken in
    ``order`` (the first candidate runs follow it)."""
    num_requests = len(workload.requests)
    rank_of = {i: r for r, i in enumerate(order)}
    pending = list(order)
    # arrivals[k]: the requests admitted right before step k; choices[k]:
    # the candidates not yet tried there (None: no search was needed).
    arrivals: list[tuple[int, ...]] = []
    choices: list[_Candidates | None] = []
    # Per step: the latest client first-token time of the requests whose
    # first token came in it or earlier.
    latest_first: list[float] = []
    restarts = 0
    run = _Run(config, workload)
    steps: list[ReplayedStep] = []
    furthest, reason = 0, ""
    best: tuple[list[tuple[int, ...]], list[ReplayedStep]] = ([], [])
    resume: _Candidates | None = None
    k = 0
    while k < len(log):
        line = log[k]
        target = line_counts(line)
        before = latest_first[-1] if latest_first else -math.inf
        chosen: tuple[int, ...] | None = None
        first_counts: Counts = (0, 0, 0, 0)
        candidates = resume
        resume = None
        if candidates is None:
            plan, counts = run.plan()
            first_counts = counts
            if counts == target and _in_order(run, plan, first_token_times, before):
                chosen = ()
            else:
                candidates = _Candidates(pending)
        if chosen is None:
            assert candidates is not None
            while restarts < max_restarts and (tried := candidates.take()) is not None:
                seq, strict = tried
                restarts += 1
                run, steps = _rerun(config, workload, log, arrivals)
                run.admit(seq)
                plan, counts = run.plan()
                scheduled = plan.output.num_scheduled_tokens if plan is not None else {}
                requests = run.workload.requests
                if strict and any(requests[i].request_id not in scheduled for i in seq):
                    # A request that waits could as well arrive later: the
                    # fewest arrivals are tried, never these.
                    if len(seq) == 1 or requests[seq[-1]].request_id not in scheduled:
                        candidates.skip_runs()
                    continue
                if counts == target and _in_order(run, plan, first_token_times, before):
                    chosen = seq
                    break
        if chosen is None:
            if k >= furthest:
                furthest = k
                best = (list(arrivals), steps[:k])
                reason = (f"step {k} (vLLM's iteration {line.iteration}): logged {_show(target)}; kvsched "
                          f"schedules {_show(first_counts)} with {num_requests - len(pending)} of "
                          f"{num_requests} requests arrived, and no arrivals give the logged batch")
            # Back to the latest choice with candidates left.
            j = next((j for j in range(len(choices) - 1, -1, -1) if choices[j] is not None), None)
            if j is None or restarts >= max_restarts:
                if restarts >= max_restarts:
                    reason += f" (gave up after {restarts} runs from the start)"
                # The attempt that went furthest, up to where it stopped.
                return IterationReplay(_arrival_steps(num_requests, best[0]), best[1], furthest, reason,
                                       restarts)
            for seq in arrivals[j:]:
                pending.extend(seq)
            pending.sort(key=rank_of.__getitem__)
            resume = choices[j]
            del arrivals[j:], choices[j:], latest_first[j:]
            k = j
            continue
        assert plan is not None  # a logged step has tokens
        arrivals.append(chosen)
        choices.append(candidates if chosen else None)
        for i in chosen:
            pending.remove(i)
        newest = _first_token_latest(run, plan, first_token_times)
        latest_first.append(max(before, newest))
        steps.append(run.finish(plan, line.elapsed_ms / 1e3))
        k += 1
    return IterationReplay(_arrival_steps(num_requests, arrivals), steps, None, "", restarts)


def _first_tokens(run: _Run, plan: PlannedStep) -> list[int]:
    """The requests (send-order indices) whose first token the step samples."""
    requests = run.rank.sched.requests
    return [run.index[rid] for rid, live in zip(plan.output.num_scheduled_tokens, plan.lives)
            if live is not None and not requests[rid].output_token_ids]


def _in_order(run: _Run, plan: PlannedStep | None, times: Sequence[float] | None, before: float) -> bool:
    """No first token of this step reached its client well before one of an
    earlier step did, and this step's first tokens reached their clients
    together."""
    if times is None or plan is None:
        return True
    mine = [times[i] for i in _first_tokens(run, plan)]
    return not mine or (min(mine) >= before - FIRST_TOKEN_SLACK_S
                        and max(mine) - min(mine) <= FIRST_TOKEN_SLACK_S)


def _first_token_latest(run: _Run, plan: PlannedStep, times: Sequence[float] | None) -> float:
    if times is None:
        return -math.inf
    return max((times[i] for i in _first_tokens(run, plan)), default=-math.inf)


def _arrival_steps(num_requests: int, arrivals: Sequence[Sequence[int]]) -> list[int]:
    arrival_step = [-1] * num_requests
    for step, seq in enumerate(arrivals):
        for i in seq:
            arrival_step[i] = step
    return arrival_step


def _rerun(config: SimConfig, workload: Workload, log: Sequence[IterationLine],
           arrivals: Sequence[Sequence[int]]) -> tuple[_Run, list[ReplayedStep]]:
    """A fresh rank run through the first ``len(arrivals)`` logged steps with
    those arrivals (they reproduced the log before: they do again)."""
    run = _Run(config, workload)
    steps: list[ReplayedStep] = []
    for k, seq in enumerate(arrivals):
        run.admit(seq)
        plan, counts = run.plan()
        if plan is None or counts != line_counts(log[k]):
            raise AssertionError(f"step {k}: the replay is not deterministic "
                                 f"({counts} after {line_counts(log[k])})")
        steps.append(run.finish(plan, log[k].elapsed_ms / 1e3))
    return run, steps


def _show(c: Counts) -> str:
    return f"{c[0]} context requests / {c[1]} tokens, {c[2]} generation requests / {c[3]} tokens"
