"""Advance a pure-decode stretch in one jump, exactly.

This module owns every rule of fast-forward: :func:`decode_stretch_plan`
decides how many steps a scheduler can advance with nothing changing but
decoding, and :func:`fast_forward_decode` takes them. Drivers (one engine, a
data-parallel group) only add their own limits: the next arrival and their
clients.

A stretch of ``k`` steps is allowed when all of these hold:

- no admission policy is installed (a policy may change its mind any step);
- no step is in flight (``Scheduler.step_in_flight``: its output is
  applied), and the scheduler's admission outcome is settled
  (``Scheduler.decode_stable``): nothing waits, or the last ``schedule()``
  was pure decode and admission stopped for a reason that cannot lift while requests only decode
  (``max_num_seqs``, the token budget, chunked prefill off, KV blocks: free
  blocks only shrink while decoding, and blocks filled in the stretch hold
  output tokens unique to their request, so they cannot become a prefix hit),
  and nothing was added, aborted or finished since;
- every running request is decoding (all but its last token computed) and
  has produced its first token: a chunked prefill that leaves exactly one
  prompt token looks like a decode to the scheduler, but the client still
  waits for its first token;
- all running requests fit the token budget;
- none stops before the stretch's last step (length cap, or a stop the
  caller's model will produce); in the last step requests may stop, and
  their stop checks and freeing then run as ``update_from_output``'s
  (``decode_stretch_plan``, ``Scheduler.fast_forward_decode_finishing``), so
  a finish costs no step of its own;
- the blocks the stretch needs fit the free pool, so nothing is preempted.

Under async scheduling (without drafts) a step is one iteration of vLLM's
engine loop: schedule the next batch, then apply the older one's tokens.
Between iterations one batch is in flight: the stretch starts there when
that batch is pure decode of exactly the running requests (each computed
one token ahead of its known tokens, one placeholder, one token in flight)
and ends there with the stretch's last batch in flight, a SchedulerOutput
``fast_forward_decode`` builds and puts in its place. A request's token
count and computed count both grow by one per iteration, blocks are taken
at the same positions as when stepping synchronously (one position ahead
of the known tokens), and a block enters the prefix cache one iteration
after the synchronous step would register it (its last token is known only
then). An async stretch never runs through a finish: the iteration in
which a request stops is stepped (a length stop changes which requests the
same iteration schedules).

Stepping one by one, step j visits the running requests in order: a request
that starts a new block takes one from the front of the free queue (evicting
whatever hash it carried), and a request that fills a block registers it in
the prefix cache. ``fast_forward_decode`` reproduces those effects without
the steps:

- blocks are taken from the free queue in (step, running index) order, which
  is the order stepping takes them;
- when none of the hashes the stretch registers is cached yet (the usual
  case), the blocks are taken in one pop and registered per request in one
  bulk insert: evictions (hashes already cached) and insertions (new hashes)
  then touch disjoint entries, so their interleaving cannot matter. Otherwise
  the events are replayed one by one in stepping order, so duplicate-hash
  bookkeeping comes out the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kvsched.errors import UserInputError
from kvsched.request import check_token_ids

if TYPE_CHECKING:
    from kvsched.core.scheduler import Scheduler
    from kvsched.request import Request


def _lead(sched: Scheduler) -> int:
    """How far a decoding request's computed tokens run ahead of its known
    ones between steps: 0 synchronously (no step in flight); 1 under async
    scheduling when exactly one batch is in flight and it is pure decode of
    exactly the running requests. -1 when no stretch can start."""
    if not sched.async_scheduling:
        return -1 if sched.step_in_flight or sched.num_spec_tokens else 0
    if sched.num_spec_tokens or sched.num_steps_in_flight != 1:
        return -1
    batch = sched.in_flight_outputs[0].num_scheduled_tokens
    n = len(sched.running)
    if len(batch) != n or sched.in_flight_outputs[0].total_num_scheduled_tokens != n or any(
            r.request_id not in batch for r in sched.running):
        return -1
    return 1


def first_new_block_steps(sched: Scheduler) -> list[int]:
    """Per running request, the first decode step (0-based) that needs a new
    block: step j computes position c + j, which starts a block when it is the
    first position past the request's blocks (then every block_size steps).
    The one place that arithmetic lives."""
    req_to_blocks = sched.kv_cache_manager.req_to_blocks
    bs = sched.block_size
    return [len(req_to_blocks[r.request_id]) * bs - r.num_computed_tokens for r in sched.running]


def _blocks_needed(firsts: Sequence[int], k: int, bs: int) -> int:
    """New blocks ``k`` decode steps take, given each request's first step."""
    return sum(-(-(k - f) // bs) for f in firsts if f < k)


def decode_stretch_plan(sched: Scheduler, steps_to_stop: Callable[[Request], int] | None = None,
                        through_finish: bool = True) -> tuple[int, int, bool]:
    """(steps, KV tokens before the stretch, whether the last step is one in
    which some request stops); 0 steps when any precondition of the module
    doc fails. ``steps_to_stop(request)``, if given, is the number of further
    steps after which the caller's model makes ``request`` stop (the step
    that samples its stop token counts), or a huge number if it never does.
    With ``through_finish`` the stretch may end
    with the step in which the first requests stop (their stop checks and
    freeing then run as in ``update_from_output``:
    ``Scheduler.fast_forward_decode_finishing``); else it stops before it."""
    running = sched.running
    if (sched.admission_policy is not None or not sched.decode_stable
            or not running or len(running) > sched.max_num_scheduled_tokens):
        return 0, 0, False
    lead = _lead(sched)
    if lead < 0:
        return 0, 0, False
    if lead:
        through_finish = False
    first_stop: float = math.inf  # the earliest step (0-based) in which a request stops
    kv_tokens = 0
    for r in running:
        length = r.num_tokens
        if r.num_computed_tokens != length - 1 + lead or not r.output_token_ids or (
                lead and (r.num_output_placeholders != 1 or r.num_in_flight_tokens != 1)):
            return 0, 0, False  # still prefilling, or its first token is still to come
        kv_tokens += length
        # Step j appends the token that makes the length length + j + 1:
        # the length cap stops it at j = stop_len - length - 1.
        stop = r.stop_len - length - 1
        if steps_to_stop is not None:
            stop = min(stop, steps_to_stop(r) - 1)
        if stop < first_stop:
            first_stop = stop
    k = int(first_stop) + 1 if through_finish else int(first_stop)
    if k < 1:
        return 0, 0, False
    finishes = through_finish
    bs = sched.block_size
    free = sched.kv_cache_manager.block_pool.get_num_free_blocks()
    # A request takes at most ceil(k / bs) blocks in k steps: with that many
    # free for all (the usual case) there is nothing to count.
    if len(running) * ((k - 1) // bs + 1) > free and _blocks_needed(
            firsts := first_new_block_steps(sched), k, bs) > free:
        finishes = False
        lo, hi = 0, k  # needed(lo) <= free < needed(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if _blocks_needed(firsts, mid, bs) <= free:
                lo = mid
            else:
                hi = mid
        k = lo
    return k, kv_tokens, finishes and k > 0


def fast_forward_decode(sched: Scheduler, k: int, tokens: Sequence[int],
                        last_tokens: Sequence[int] | None = None
                        ) -> tuple[list[int], list[tuple[Request, int]]]:
    """Advance every running request ``k`` decode steps: ``tokens[i]`` is what
    request i samples at each step, or, given ``last_tokens``, at each step
    but the last, which samples ``last_tokens[i]`` and may stop the request.
    Returns the free block count after each step (before any finishing) and
    the requests that stopped at the last step with the tokens they kept (for
    ``Scheduler._finish_stopped``); changes nothing if it raises."""
    running = sched.running
    lead = _lead(sched)
    if lead < 0:
        if sched.async_scheduling:
            raise UserInputError("fast_forward_decode: under async scheduling a stretch starts with "
                             "exactly one pure-decode batch of the running requests in flight "
                             "(and no drafts); step once first")
        raise UserInputError("fast_forward_decode: the last step's SchedulerOutput has not been applied; "
                         "call update_from_output first")
    if lead and last_tokens is not None:
        raise UserInputError("fast_forward_decode: an async stretch does not run through a finish; "
                         "step the iteration in which a request stops")
    if type(k) is not int:
        raise TypeError(f"fast_forward_decode: num_steps={k!r} must be an int")
    limit = sched.token_limit
    check_token_ids("fast_forward_decode: tokens", list(tokens), limit)
    if last_tokens is not None:
        check_token_ids("fast_forward_decode: last_tokens", list(last_tokens), limit)
    if k < 1 or not running or len(tokens) != len(running) or (
            last_tokens is not None and len(last_tokens) != len(running)):
        raise UserInputError(f"fast_forward_decode: need num_steps >= 1 and one token per running "
                         f"request (num_steps={k}, {len(tokens)} tokens, {len(running)} running)")
    if len(running) > sched.max_num_scheduled_tokens:
        raise UserInputError("fast_forward_decode: the running requests exceed the token budget")
    if sched.admission_policy is not None or not sched.decode_stable:
        raise UserInputError("fast_forward_decode: admission is not settled (an admission policy is "
                         "installed, or something was added, finished or admitted since the last "
                         "pure-decode step); step once first")
    kv = sched.kv_cache_manager
    bs = sched.block_size
    # Steps in which nothing may stop: all, or all but the last.
    quiet = k if last_tokens is None else k - 1
    # (step, running index) of every new block, in the order stepping takes them.
    allocs: list[tuple[int, int]] = []
    firsts = first_new_block_steps(sched)
    for idx, (request, token) in enumerate(zip(running, tokens)):
        length = request.num_tokens
        if request.num_computed_tokens != length - 1 + lead or not request.output_token_ids or (
                lead and (request.num_output_placeholders != 1 or request.num_in_flight_tokens != 1)):
            raise UserInputError(f"fast_forward_decode: {request.request_id} is not decoding")
        if length + quiet >= request.stop_len or (quiet and token in request.all_stop_ids):
            raise UserInputError(f"fast_forward_decode: {request.request_id} would stop in the stretch")
        first = firsts[idx]
        if first < k:  # most requests take no block in a stretch: no generator for them
            allocs.extend((step, idx) for step in range(first, k, bs))
    pool = kv.block_pool
    free = pool.get_num_free_blocks()
    if len(allocs) > free:
        raise UserInputError("fast_forward_decode: the stretch needs more blocks than are free")
    stopped: list[tuple[Request, int]] = []
    for idx, (request, token) in enumerate(zip(running, tokens)):
        if last_tokens is None:
            request.extend_output([token] * k)
        else:
            if quiet:
                request.extend_output([token] * quiet)
            last = last_tokens[idx]
            request.append_output(last)
            # The stop checks of update_from_output, for one sampled token.
            if last in request.all_stop_ids or request.num_tokens >= request.stop_len:
                stopped.append((request, sched.apply_stop_checks(request, [last])))
        request.num_computed_tokens += k
        request.is_prefill_chunk = False
    allocs.sort()
    if not kv.enable_caching or not _cache_in_bulk(sched, allocs, lead):
        _replay_events(sched, k, allocs, lead)
    if lead:
        _renew_in_flight(sched, allocs, k)
    # Free blocks after each step: only allocations change the count.
    per_step = [0] * k
    for step, _ in allocs:
        per_step[step] += 1
    free_after = []
    for taken in per_step:
        free -= taken
        free_after.append(free)
    return free_after, stopped


def _renew_in_flight(sched: Scheduler, allocs: list[tuple[int, int]], k: int) -> None:
    """Async: the stretch's last batch is in flight in place of the one
    before it: every running request for one token (what the last
    iteration's schedule() would have returned)."""
    from kvsched.core.output import CachedRequestData, SchedulerOutput

    old = sched.in_flight_outputs[0]
    running = sched.running
    req_ids = [r.request_id for r in running]
    new_block_ids: dict[str, list[int]] = {}
    req_to_blocks = sched.kv_cache_manager.req_to_blocks
    for step, idx in allocs:
        if step == k - 1:
            new_block_ids[req_ids[idx]] = [req_to_blocks[req_ids[idx]][-1]]
    output = SchedulerOutput(
        scheduled_new_reqs=[], scheduled_cached_reqs=CachedRequestData(req_ids, set(), new_block_ids),
        num_scheduled_tokens=dict.fromkeys(req_ids, 1), total_num_scheduled_tokens=len(req_ids),
        # The first iteration's schedule() reports the finishes before the
        # stretch: in this output only if it is that iteration's.
        preempted_req_ids=set(), finished_req_ids=sched.finished_req_ids if k == 1 else set(),
        admission_stop=old.admission_stop)
    output.num_spec_tokens_to_schedule = old.num_spec_tokens_to_schedule
    sched.in_flight_outputs[0] = output


def _cache_in_bulk(sched: Scheduler, allocs: list[tuple[int, int]], lead: int) -> bool:
    """The usual case, in bulk. Returns False (nothing done) if a hash the
    stretch registers is already cached, or registered twice."""
    kv = sched.kv_cache_manager
    bs = sched.block_size
    running = sched.running
    num_cached_block = kv.num_cached_block
    pending: list[tuple[Request, int, int]] = []
    private: list[tuple[Request, int, int]] = []
    new_hashes: list[int] = []
    for request in running:
        num_cached = num_cached_block.get(request.request_id, 0)
        # Blocks whose tokens are all known (async: computed runs one ahead).
        num_full = (request.num_computed_tokens - lead) // bs
        if num_full > num_cached:
            if request.private:
                # No entries to make (KVCacheManager.cache_full_blocks only
                # counts a private request's blocks): no keys to build.
                private.append((request, num_cached, num_full))
                continue
            new_hashes.extend(kv.block_hashes(request, num_full)[num_cached:num_full])
            pending.append((request, num_cached, num_full))
    pool = kv.block_pool
    if not pool.cached.keys().isdisjoint(new_hashes) or len(set(new_hashes)) != len(new_hashes):
        return False
    req_to_blocks = kv.req_to_blocks
    if allocs:
        for (_, idx), block in zip(allocs, pool.get_new_blocks(len(allocs))):
            req_to_blocks[running[idx].request_id].append(block)
    new_blocks: list[int] = []
    for request, num_cached, num_full in pending:
        new_blocks.extend(req_to_blocks[request.request_id][num_cached:num_full])
        num_cached_block[request.request_id] = num_full
    pool.cache_new_blocks(new_blocks, new_hashes)
    for request, num_cached, num_full in private:
        kv.cache_full_blocks(request, req_to_blocks[request.request_id], num_cached, num_full)
    return True


def _replay_events(sched: Scheduler, k: int, allocs: list[tuple[int, int]], lead: int) -> None:
    """Allocations and cache registrations one by one, in stepping order."""
    kv = sched.kv_cache_manager
    bs = sched.block_size
    running = sched.running
    caching = kv.enable_caching
    # (step, running index, 0 = allocate / 1 = cache): at one step a request
    # allocates before it caches, as allocate_slots does.
    events = [(step, idx, 0) for step, idx in allocs]
    if caching:
        for idx, request in enumerate(running):
            # Known tokens minus one before the stretch (the computed count
            # synchronously; async runs one ahead).
            c = request.num_computed_tokens - k - lead
            # Step j fills a block when (c + j + 1) % bs == 0; blocks left
            # uncached before the stretch are registered at its first step.
            first = (-(c + 1)) % bs
            if first and (c + 1) // bs > kv.num_cached_block.get(request.request_id, 0):
                events.append((0, idx, 1))
            events.extend((step, idx, 1) for step in range(first, k, bs))
    events.sort()
    pool = kv.block_pool
    for step, idx, kind in events:
        request = running[idx]
        blocks = kv.req_to_blocks[request.request_id]
        if kind == 0:
            blocks.extend(pool.get_new_blocks(1))
            continue
        num_full = (request.num_computed_tokens - k - lead + step + 1) // bs
        num_cached = kv.num_cached_block.get(request.request_id, 0)
        if num_full > num_cached:
            kv.cache_full_blocks(request, blocks, num_cached, num_full)
