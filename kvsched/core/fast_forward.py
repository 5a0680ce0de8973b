"""Advance a pure-decode stretch in one jump, exactly.

This module owns every rule of fast-forward: :func:`stretch_refusal` says
whether a scheduler's state may start a stretch at all (the one owner of
that rule: the simulator asks it, through :func:`decode_stretch_plan`),
:func:`decode_stretch_plan` how many steps it can advance with nothing
changing but decoding, and :func:`fast_forward_decode` /
:func:`fast_forward_decode_finishing` take them. Drivers (one engine, a
data-parallel group) only add their own limits: the next arrival and their
clients. The module sits above the scheduler: it changes the scheduler and
the KV cache only through their methods (``Scheduler.replace_in_flight``,
``take_finished_req_ids``, ``finish_stopped``;
``KVCacheManager.append_new_blocks``, ``cache_in_bulk``, ``cache_blocks``).

A stretch of ``k`` steps is allowed when all of these hold:

- no admission policy is installed (a policy may change its mind any step),
  and no drafts are scheduled (speculative decoding);
- no step is in flight (``Scheduler.step_in_flight``: its output is
  applied; async: exactly one, see below), and the scheduler's admission
  outcome is settled
  (``Scheduler.decode_stable``): nothing waits, or the last ``schedule()``
  was pure decode and admission stopped for a reason that cannot lift while requests only decode
  (``max_num_seqs``, the token budget, chunked prefill off, KV blocks: free
  blocks only shrink while decoding, and blocks filled in the stretch hold
  output tokens unique to their request, so they cannot become a prefix hit),
  and nothing was added, aborted or finished since;
- (synchronous) every running request is decoding (all but its last token computed) and
  has produced its first token: a chunked prefill that leaves exactly one
  prompt token looks like a decode to the scheduler, but the client still
  waits for its first token;
- all running requests fit the token budget;
- none stops before the stretch's last step (length cap, or a stop the
  caller's model will produce); in the last step requests may stop, and
  their stop checks and freeing then run as ``update_from_output``'s
  (``decode_stretch_plan``, ``fast_forward_decode_finishing``), so
  a finish costs no step of its own;
- the blocks the stretch needs fit the free pool, so nothing is preempted.

Under async scheduling (without drafts) a step is one iteration of vLLM's
engine loop: schedule the next batch, then apply the older one's tokens.
Between iterations one batch is in flight: the stretch starts there when
that batch is one step of exactly the running requests, each computed up to
its known tokens and sampling one token that is still a placeholder: a
decode (one token in flight), or the last chunk of a prefill, whose
first token the stretch's first iteration applies. It ends there with the
stretch's last batch in flight, a SchedulerOutput
``fast_forward_decode`` builds and puts in its place. A request's token
count and computed count both grow by one per iteration, blocks are taken
at the same positions as when stepping synchronously (one position ahead
of the known tokens), and a block enters the prefix cache one iteration
after the synchronous step would register it (its last token is known only
then). An async stretch may end with the iteration in which requests stop
if they all stop on length and nothing waits: that iteration's schedule()
leaves them out (the batch in flight reaches their length), so the batch
left in flight is the requests still running, or none. A stop token, which
the scheduler cannot foresee, is stepped, and so is a finish while
requests wait (the token that request leaves in the budget could admit
one).

With a KV connector (``Scheduler.connector``) a stretch is taken only
where each of its steps provably leaves the connector's path with nothing
to do (``_connector_refusal``, part of ``stretch_refusal``): nothing waits
holding blocks, no finish or load is unreported, no finished request's
blocks are held or freed late, and the connector itself says it is idle
(``KVConnectorBase.decode_stretch_refusal``: offloading with no job in
flight and every prompt chunk placed, since only prompt tokens are
stored; NIXL with no read or hand-off pending). The caller promises the
worker side reports nothing meanwhile (the simulator's rank checks its
worker has nothing in flight, and drives it through the stretch's idle
batches). With requests waiting, each step asks the connector about the
head of the queue: the stretch takes blocks only up to the first free
block of the head's local prefix hit (``_lookup_pop_limit``), so the
lookup repeats itself and the admission fails again. The stretch's
effect on the connector (keys of newly complete chunks, block tables) is
its ``advance_decode_stretch``; under a deferred-free fence (a consumer
under async scheduling) its batches are counted
(``Scheduler.count_fenced_batches``).

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

Hybrid KV caches (``cache.kv_groups``) of full-attention and sliding-window
groups are covered too (chunked local attention and Mamba are refused:
``HybridKVCacheManager.decode_stretch_refusal``). There a decode step's
``allocate_slots`` first frees, per window, the blocks that left it: an
uncached one goes to the front of the free queue and is the next block
taken, a cached one to the back, and either may lose or carry its hash
depending on when the scheduler-block-aligned cache registration reached
it. No bulk shortcut is taken: the stretch lists the calls of stepping that
are not no-ops (a window's free each time its skipped tokens cross a block,
each group's new block, each registration when the cacheable prefix grows
by a scheduler block; ``decode_stretch_events``) and makes them in stepping
order (``replay_decode_stretch``), which costs a few calls per request and
block instead of a schedule() per step. No allocation may fail (stepping
would preempt): beyond the blocks free at its start, the plan walks the
counts in stepping order, each request freeing what left its windows
before it asks for its new blocks (``_hybrid_walk``). Since the free count
may grow, and a waiting head's prefix hit may be freed or evicted, a
stretch with requests waiting that only the KV cache holds back ends
before either could let the head in (``_head_lookup``): it evicts no block
carrying a key of the head's lookup, frees no block of its hit, and ends
before its windows have freed more blocks than it took.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvsched.core.hybrid_kv_cache import HybridKVCacheManager
from kvsched.core.output import CachedRequestData, EngineCoreOutput, SchedulerOutput
from kvsched.core.scheduler import Scheduler
from kvsched.errors import UserInputError
from kvsched.request import Request, check_token_ids


def stretch_refusal(sched: Scheduler) -> str | None:
    """Why ``sched`` may not start a decode stretch now, or None if it may:
    the one place the rule of the module doc lives (its conditions on the
    admission outcome, the batch in flight and every running request's
    state; how far a stretch may go is ``decode_stretch_plan``'s). Callers
    that only plan test it for None; ``fast_forward_decode`` raises it."""
    running = sched.running
    kv = sched.kv_cache_manager
    if isinstance(kv, HybridKVCacheManager):
        # Full attention and sliding windows only (chunked local and Mamba step).
        why = kv.decode_stretch_refusal()
        if why is not None:
            return why
    if sched.num_spec_tokens:
        return "a stretch covers plain decode, not speculative decoding"
    if sched.pipeline_parallel_size > 1:
        return "a stretch covers one or two batches in flight, not a pipeline's PP batches"
    if not sched.async_scheduling:
        if sched.step_in_flight:
            return ("the last step's SchedulerOutput has not been applied; call "
                    "update_from_output first")
    elif sched.num_steps_in_flight != 1:
        return ("under async scheduling a stretch starts with exactly one batch in flight "
                "(and no drafts); step once first")
    if sched.admission_policy is not None or not sched.decode_stable:
        return ("admission is not settled (an admission policy is installed, or something was "
                "added, finished or admitted since the last pure-decode step); step once first")
    if not running:
        return "nothing is running"
    if len(running) > sched.max_num_scheduled_tokens:
        return "the running requests exceed the token budget"
    if sched.connector is not None:
        why = _connector_refusal(sched)
        if why is not None:
            return why
    if not sched.async_scheduling:
        for r in running:
            # Decoding, and its first token is out (module doc).
            if r.num_computed_tokens != r.num_tokens - 1 or not r.output_token_ids:
                return f"{r.request_id} is not decoding"
        return None
    # Async: the batch in flight holds exactly the running requests, each
    # computed up to its known tokens, sampling one token that is still a
    # placeholder: a decode, or the last chunk of a prefill (its first token).
    batch = sched.in_flight_outputs[0].num_scheduled_tokens
    if len(batch) != len(running):
        return "the batch in flight is not one step of exactly the running requests; step once first"
    # The batch lists the running requests in running order (the order
    # schedule() visits them, new ones last) unless requests were taken out
    # of running since: walk both together, and look ids up only then.
    in_order = True
    for r, (rid, n) in zip(running, batch.items()):
        if rid is not r.request_id and rid != r.request_id:
            in_order = False
            break
        if n != r.num_in_flight_tokens or (
                r.num_computed_tokens != r.num_tokens or r.num_output_placeholders != 1):
            return f"{r.request_id} is not decoding"
    if not in_order:
        for r in running:
            m = batch.get(r.request_id)
            if m is None or m != r.num_in_flight_tokens or (
                    r.num_computed_tokens != r.num_tokens or r.num_output_placeholders != 1):
                return f"{r.request_id} is not decoding"
    return None


def _kv_held_head(sched: Scheduler) -> Request | None:
    """The waiting head when only the KV cache may be holding it back (None
    when nothing waits, or ``max_num_seqs`` or a token budget used up by
    the decodes holds admission: decoding lifts neither)."""
    n = len(sched.running)
    if not sched.waiting or n >= sched.max_num_running_reqs or n >= sched.max_num_scheduled_tokens:
        return None
    return sched.waiting.peek_request()


def _head_lookup(kv: HybridKVCacheManager, head: Request) -> tuple[int, set[int]]:
    """(How many blocks a stretch may pop from the free queue, the blocks of
    the head's prefix hit) with hybrid groups while the KV cache holds the
    waiting head back.

    Each step's admission of the head must fail again as the last one did,
    at the free count of now (nothing was freed since). It fails when the
    blocks it needs exceed the free count, and that need depends only on
    the head's prefix hit and on which hit blocks are free. So the stretch
    keeps both: it pops no block carrying a key the head's lookup reads
    (the first such block's place in the free queue is the limit; blocks
    the stretch registers hold output tokens unique to their request, the
    module doc's premise, so no lookup key gains a block), frees no hit
    block from a window, and its windows never free more blocks than it
    took (``_net_free_limit``): the free count at an admission never
    exceeds the last failed one's."""
    hit, _ = kv.get_computed_blocks(head)
    keys = kv.lookup_keys(head)
    pool = kv.block_pool
    if keys:
        hash_of_block = pool.hash_of_block
        for position, block in enumerate(pool.free_queue):
            h = hash_of_block.get(block)
            if h is not None and h in keys:
                return position, set(hit)
    return 1 << 62, set(hit)


def _held_head_limit(kv: HybridKVCacheManager, running: list[Request], k: int, lead: int,
                     hit_blocks: set[int]) -> int:
    """``_net_free_limit`` over a horizon that grows while nothing cuts the
    stretch short (its cost grows with the horizon)."""
    horizon = min(k, 32)
    while True:
        limit = _net_free_limit(kv, running, horizon, lead, hit_blocks)
        if limit < horizon or horizon == k:
            return limit
        horizon = min(k, 4 * horizon)


def _net_free_limit(kv: HybridKVCacheManager, running: list[Request], k: int, lead: int,
                    hit_blocks: set[int]) -> int:
    """How many of ``k`` steps free no block of ``hit_blocks`` from a
    window and leave the free count, after each step, at most what it
    was before the first (blocks freed so far at most blocks taken). (It
    counts every request in every step: a stretch with requests waiting
    has no async length stops, whose last iteration would leave some out.)"""
    frees = kv.decode_window_frees(running, k, lead)
    if not frees:
        return k
    net = [0] * k  # per step: blocks freed minus blocks taken
    for step, _, block in frees:
        net[step] += 1
        if block in hit_blocks and step < k:
            k = step
    for firsts, bs in kv.decode_new_block_steps(running):
        for first in firsts:
            # (A while loop: see _advance.)
            j = first if first > 0 else 0
            while j < len(net):
                net[j] -= 1
                j += bs
    total = 0
    for j in range(k):
        total += net[j]
        if total > 0:
            return j
    return k


def _connector_refusal(sched: Scheduler) -> str | None:
    """``stretch_refusal``'s conditions with a KV connector: each step of
    the stretch must leave the connector's path with nothing to do. The
    connector is asked about waiting requests at every step, reads the
    finishes the next step reports, and frees held blocks when its worker
    reports: so nothing waits holding blocks, admission stops before the
    connector is asked (``Scheduler.decode_stable``), no finish is
    unreported, no finished request's blocks are held, no request is still
    a prefill the connector tracks, and no free is deferred (a consumer
    under async scheduling fences them by batch; the stretch counts its
    batches: ``Scheduler.count_fenced_batches``). The connector's own
    state is its ``decode_stretch_refusal``'s. The caller promises that the
    worker side reports nothing during the stretch (it has nothing in
    flight: the simulator's rank checks its worker)."""
    connector = sched.connector
    assert connector is not None
    if sched.kv_holding_waiting:
        return "with a KV connector, requests wait holding blocks (a load); step until they run"
    if sched.finished_req_ids or sched.finished_recving_kv_req_ids or sched.failed_recving_kv_req_ids:
        return "with a KV connector, finishes or loads are still to be reported; step once first"
    if len(sched.requests) != len(sched.running) + len(sched.waiting) or sched.has_inflight_prefills():
        return ("with a KV connector, a finished request's blocks are held or a prefill is tracked; "
                "step until they are released")
    if sched.deferred_frees:
        return "blocks of a finished request wait for a batch in flight (deferred free)"
    return connector.decode_stretch_refusal(sched.running)


def _lookup_pop_limit(sched: Scheduler) -> int:
    """With a KV connector and requests waiting: how many blocks a stretch
    may take from the free queue. Each step asks the connector about the
    waiting head (not yet computed) with its local prefix hit, and the
    connector's answer depends on where that hit ends (an offloaded hit
    starts there): the stretch must evict none of the hit's blocks, so that
    every step sees the lookup of the step before it (the connector's
    bookkeeping of it then repeats itself) and its admission, needing as
    many blocks as before from a pool that only shrinks, fails again. The
    hit's blocks in use by running requests cannot be evicted; the free
    ones are taken in free-queue order."""
    head = sched.waiting.peek_request()
    kv = sched.kv_cache_manager
    if head.num_computed_tokens or not kv.enable_caching:
        return 1 << 62
    hit_blocks, _ = kv.get_computed_blocks(head)
    pool = kv.block_pool
    ref_cnt = pool.ref_cnt
    free_hits = {b for b in hit_blocks if not ref_cnt[b]}
    if not free_hits:
        return 1 << 62
    for position, block in enumerate(pool.free_queue):
        if block in free_hits:
            return position
    raise AssertionError("a block with no reference is not in the free queue")


def _lead(sched: Scheduler) -> int:
    """How far a decoding request's computed tokens run ahead of its known
    ones between steps: 0 synchronously, 1 under async scheduling (one
    batch in flight)."""
    return 1 if sched.async_scheduling else 0


def first_new_block_step(num_blocks: int, request: Request, block_size: int) -> int:
    """The first decode step (0-based) in which ``request``, holding
    ``num_blocks`` blocks, needs a new block: step j computes position
    c + j, which starts a block when it is the first position past the
    request's blocks (then every block_size steps). The one place that
    arithmetic lives."""
    return num_blocks * block_size - request.num_computed_tokens


def first_new_block_steps(sched: Scheduler) -> list[int]:
    """``first_new_block_step`` of every running request, in order."""
    req_to_blocks = sched.kv_cache_manager.req_to_blocks
    bs = sched.block_size
    return [first_new_block_step(len(req_to_blocks[r.request_id]), r, bs) for r in sched.running]


def _blocks_needed(firsts: Sequence[int], k: int, bs: int) -> int:
    """New blocks ``k`` decode steps take, given each request's first step."""
    return sum(-(-(k - f) // bs) for f in firsts if f < k)


def _group_blocks_needed(per_group: list[tuple[list[int], int]], k: int) -> int:
    """``_blocks_needed`` summed over KV cache groups (first steps, block size)."""
    total = 0
    for firsts, bs in per_group:
        total += _blocks_needed(firsts, k, bs)
    return total


def _most_steps_taking(per_group: list[tuple[list[int], int]], k: int, blocks: int) -> int:
    """The most steps, up to ``k``, whose new blocks over every group number
    at most ``blocks`` (needed(k) > blocks: a binary search)."""
    lo, hi = 0, k  # needed(lo) <= blocks < needed(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _group_blocks_needed(per_group, mid) <= blocks:
            lo = mid
        else:
            hi = mid
    return lo


def _hybrid_walk(kv: HybridKVCacheManager, running: list[Request], k: int, free: int, lead: int) -> int:
    """How many of ``k`` decode steps take their blocks with none failing
    (a failure preempts), counting the blocks windows free: stepping's
    allocate_slots visits the running requests in order, each releasing
    what left its windows (a block shared with another request, a common
    prefix, returns to the pool only with its last reference), then
    checking that its new blocks over all groups fit the free count, then
    taking them. Under async scheduling a request is not scheduled in the
    iteration in which it reaches its length (it frees and takes nothing
    there)."""
    n = len(running)
    # Per (step, running index): the blocks it releases, the blocks it takes.
    releases: dict[int, list[int]] = {}
    takes: dict[int, int] = {}
    for step, idx, block in kv.decode_window_frees(running, k, lead):
        released = releases.get(step * n + idx)
        if released is None:
            releases[step * n + idx] = [block]
        else:
            released.append(block)
    for firsts, bs in kv.decode_new_block_steps(running):
        for idx, first in enumerate(firsts):
            j = first
            while j < k:
                takes[j * n + idx] = takes.get(j * n + idx, 0) + 1
                j += bs
    stops = [r.stop_len - r.num_tokens - 1 for r in running] if lead else []
    ref_cnt = kv.block_pool.ref_cnt
    # References left of the released blocks held before the stretch.
    left: dict[int, int] = {}
    keys = list(releases)
    keys.extend([key for key in takes if key not in releases])
    keys.sort()
    for key in keys:
        step = key // n
        idx = key - step * n
        if lead and step == stops[idx]:
            continue
        for block in releases.get(key, ()):
            if block < 0:  # taken in the stretch: this request's alone
                free += 1
                continue
            refs = left.get(block, ref_cnt[block]) - 1
            left[block] = refs
            if not refs:
                free += 1
        taken = takes.get(key, 0)
        if taken > free:
            return step
        free -= taken
    return k


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
    if stretch_refusal(sched) is not None:
        return 0, 0, False
    running = sched.running
    lead = _lead(sched)
    # The earliest step (0-based) in which a request stops: an int (every
    # request has a finite length cap, and the refusal above ensures one runs).
    first_stop = 1 << 62
    # Under async scheduling a stretch may end with the iteration in which
    # requests stop only if they all stop on length: the scheduler then
    # leaves them out of the batch it schedules in that same iteration (it
    # knows the batch in flight reaches their length), so that batch, left
    # in flight, is exactly the requests still running. A stop token it
    # cannot foresee, or a request waiting for the slot, is stepped.
    length_stops_only = True
    kv_tokens = 0
    for r in running:
        length = r.num_tokens
        kv_tokens += length
        # Step j appends the token that makes the length length + j + 1:
        # the length cap stops it at j = stop_len - length - 1.
        stop = length_stop = r.stop_len - length - 1
        if steps_to_stop is not None:
            stop = min(stop, steps_to_stop(r) - 1)
        if stop < first_stop:
            first_stop = stop
            length_stops_only = stop == length_stop
        elif stop == first_stop and stop != length_stop:
            length_stops_only = False
    if lead and (sched.waiting or not length_stops_only):
        through_finish = False
    k = first_stop + 1 if through_finish else first_stop
    if k < 1:
        return 0, 0, False
    finishes = through_finish
    bs = sched.block_size
    free = sched.kv_cache_manager.block_pool.get_num_free_blocks()
    if sched.connector is not None and sched.waiting:
        # The stretch may take blocks only up to the waiting head's hit.
        free = min(free, _lookup_pop_limit(sched))
    kv = sched.kv_cache_manager
    if isinstance(kv, HybridKVCacheManager):
        # Each limit below keeps a condition on every step up to it, so
        # they apply one after the other, the cheap ones first.
        per_group = kv.decode_new_block_steps(running)
        head = _kv_held_head(sched)
        hit_blocks: set[int] = set()
        if head is not None:
            pop_limit, hit_blocks = _head_lookup(kv, head)
            if pop_limit < free and _group_blocks_needed(per_group, k) > pop_limit:
                k = _most_steps_taking(per_group, k, pop_limit)
                finishes = False
        if _group_blocks_needed(per_group, k) > free:
            # Blocks freed from windows are taken again within the stretch:
            # walk them in stepping order, as far as the blocks free now
            # would last with none freed, and twice that (frees at most
            # match the windows' own allocations; a cap, not a rule).
            most = _most_steps_taking(per_group, k, free)
            horizon = min(k, 2 * most + 2 * max(bs for _, bs in per_group) + 1)
            walked = max(most, _hybrid_walk(kv, running, horizon, free, lead))
            if walked < k:
                k = walked
                finishes = False
        if head is not None and k > 0:
            limit = _held_head_limit(kv, running, k, lead, hit_blocks)
            if limit < k:
                k = limit
                finishes = False
        return k, kv_tokens, finishes and k > 0
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


def fast_forward_decode(sched: Scheduler, num_steps: int, tokens: Sequence[int], *,
                        planned: bool = False) -> list[int]:
    """Advance every running request of ``sched`` by ``num_steps`` decode
    steps at once, leaving exactly the state that many ``schedule()`` /
    ``update_from_output()`` rounds (async: engine-loop iterations) would;
    ``tokens[i]`` is what running request i samples at each. Returns the
    free block count after each step.

    ``planned``: the caller has just asked ``decode_stretch_plan`` about
    this very state (nothing changed since) and its tokens are ints it made
    itself (the simulator's), so the refusal and the token-type checks are
    not repeated; the stretch's own limits still are."""
    free_after, _ = _advance(sched, num_steps, tokens, planned=planned)
    # The first stretch step would have handed these to its output.
    sched.take_finished_req_ids()
    return free_after


def fast_forward_decode_finishing(sched: Scheduler, num_steps: int, tokens: Sequence[int],
                                  last_tokens: Sequence[int], *, planned: bool = False
                                  ) -> tuple[list[int], list[EngineCoreOutput]]:
    """``fast_forward_decode`` whose last step samples ``last_tokens`` (one
    per running request), after which the stop checks run as in
    ``update_from_output``: requests that stop there finish and are freed.
    Returns the free block count after each step and the finished
    requests' outputs."""
    free_after, stopped = _advance(sched, num_steps, tokens, last_tokens, planned=planned)
    sched.take_finished_req_ids()
    finished = sched.finish_stopped(stopped)
    free_after[-1] = sched.kv_cache_manager.block_pool.get_num_free_blocks()
    return free_after, finished


def _advance(sched: Scheduler, k: int, tokens: Sequence[int],
             last_tokens: Sequence[int] | None = None, planned: bool = False
             ) -> tuple[list[int], list[tuple[Request, int]]]:
    """Advance every running request ``k`` decode steps: ``tokens[i]`` is what
    request i samples at each step, or, given ``last_tokens``, at each step
    but the last, which samples ``last_tokens[i]`` and may stop the request
    (under async scheduling only on length: see ``decode_stretch_plan``).
    Returns the free block count after each step (before any finishing) and
    the requests that stopped at the last step with the tokens they kept (for
    ``Scheduler.finish_stopped``); changes nothing if it raises."""
    if not planned:
        why = stretch_refusal(sched)
        if why is not None:
            raise UserInputError(f"fast_forward_decode: {why}")
        limit = sched.token_limit
        check_token_ids("fast_forward_decode: tokens", list(tokens), limit)
        if last_tokens is not None:
            check_token_ids("fast_forward_decode: last_tokens", list(last_tokens), limit)
    running = sched.running
    lead = _lead(sched)
    # Lists, so the loops below index them directly (mypyc).
    tokens = tokens if type(tokens) is list else list(tokens)
    if last_tokens is not None and type(last_tokens) is not list:
        last_tokens = list(last_tokens)
    if type(k) is not int:
        raise TypeError(f"fast_forward_decode: num_steps={k!r} must be an int")
    if k < 1 or len(tokens) != len(running) or (
            last_tokens is not None and len(last_tokens) != len(running)):
        raise UserInputError(f"fast_forward_decode: need num_steps >= 1 and one token per running "
                         f"request (num_steps={k}, {len(tokens)} tokens, {len(running)} running)")
    kv = sched.kv_cache_manager
    bs = sched.block_size
    # Steps in which nothing may stop: all, or all but the last.
    quiet = k if last_tokens is None else k - 1
    # (step, running index) of every new block, in the order stepping takes them.
    allocs: list[tuple[int, int]] = []
    # Async: the running indexes of the requests that reach their length in
    # the last step; the last iteration schedules no token for them.
    length_stops: list[int] = []
    req_to_blocks = kv.req_to_blocks
    # Several KV cache groups: their blocks are counted and replayed apart.
    hybrid = kv if isinstance(kv, HybridKVCacheManager) else None
    for idx, request in enumerate(running):
        token = tokens[idx]
        length = request.num_tokens
        stop_ids = request.all_stop_ids
        # (An empty set is tested for first: with ignore_eos and no stop ids,
        # the usual benchmark request, that is the whole test.)
        if length + quiet >= request.stop_len or (quiet and stop_ids and token in stop_ids):
            raise UserInputError(f"fast_forward_decode: {request.request_id} would stop in the stretch")
        steps = k
        if lead and last_tokens is not None:
            if length + k >= request.stop_len:
                length_stops.append(idx)
                steps = k - 1
            elif stop_ids and last_tokens[idx] in stop_ids:
                raise UserInputError(
                    f"fast_forward_decode: {request.request_id} would stop on a stop token in the "
                    "last step; under async scheduling a stretch runs through length stops only "
                    "(step the iteration in which it stops)")
        if hybrid is not None:
            continue
        step = first_new_block_step(len(req_to_blocks[request.request_id]), request, bs)
        # Most requests take no block in a stretch. (A while loop: mypyc
        # compiles range() with a variable step as a Python object.)
        while step < steps:
            allocs.append((step, idx))
            step += bs
    if length_stops and sched.waiting:
        raise UserInputError(f"fast_forward_decode: {len(sched.waiting)} requests wait; under async "
                         "scheduling a stretch ends with requests stopping only when nothing waits")
    pool = kv.block_pool
    free = pool.get_num_free_blocks()
    events: list[tuple[int, int, int, int]] = []
    computed: list[int] = []
    processed: list[int] = []
    num_allocs = len(allocs)
    if hybrid is not None:
        pop_limit = 1 << 62
        head = None if planned else _kv_held_head(sched)
        if head is not None:
            pop_limit, hit_blocks = _head_lookup(hybrid, head)
            limit = _held_head_limit(hybrid, running, k, lead, hit_blocks)
            if limit < k:
                raise UserInputError(f"fast_forward_decode: requests wait and step {limit} could "
                                     "admit one (hybrid KV cache groups: windows free blocks)")
        # Read before the tokens are applied: tables and computed counts.
        events = hybrid.decode_stretch_events(running, k, lead, set(length_stops))
        num_allocs = 0
        for event in events:
            if event[2] == 1:
                num_allocs += 1
        computed = [r.num_computed_tokens for r in running]
        processed = [r.num_computed_tokens - r.num_in_flight_tokens for r in running]
        # Windows free blocks that later steps take again: walk the counts.
        if num_allocs > pop_limit or (num_allocs > free and _hybrid_walk(hybrid, running, k, free, lead) < k):
            raise UserInputError("fast_forward_decode: the stretch needs more blocks than are free")
    elif num_allocs > free:
        raise UserInputError("fast_forward_decode: the stretch needs more blocks than are free")
    stopped: list[tuple[Request, int]] = []
    # Per request, its blocks whose tokens are all known and computed after
    # the stretch (async: the token in flight is not known yet; a request
    # stopping on length below has one computed and none in flight less,
    # the same count).
    num_full: list[int] = []
    for idx, request in enumerate(running):
        token = tokens[idx]
        if last_tokens is None:
            request.append_repeated(token, k)
        else:
            last = last_tokens[idx]
            # The quiet steps' tokens, then the last step's.
            request.append_repeated(token, quiet)
            request.append_repeated(last, 1)
            # The stop checks of update_from_output, for one sampled token.
            stop_ids = request.all_stop_ids
            if request.num_tokens >= request.stop_len or (stop_ids and last in stop_ids):
                stopped.append((request, sched.apply_stop_checks(request, [last])))
        request.num_computed_tokens += k
        request.is_prefill_chunk = False
        if lead:
            # One token (the last batch's) in flight, still a placeholder.
            request.num_in_flight_tokens = 1
        num_full.append((request.num_computed_tokens - request.num_in_flight_tokens) // bs)
    for idx in length_stops:
        # Not scheduled in the last iteration: nothing in flight any more.
        request = running[idx]
        request.num_computed_tokens -= 1
        request.num_in_flight_tokens = 0
        request.num_output_placeholders = 0
    allocs.sort()
    hybrid_new_blocks: dict[str, list[int]] | None = None
    hybrid_free_after: list[int] = []
    if hybrid is not None:
        hybrid_free_after, hybrid_new_blocks = hybrid.replay_decode_stretch(
            running, computed, processed, k, lead, events)
    elif not kv.enable_caching or not kv.cache_in_bulk(
            running, num_full, [running[idx].request_id for _, idx in allocs]):
        # Known tokens minus one before the stretch, per request (each
        # request has k more now): the registrations count from it.
        known = [request.num_tokens - k - 1 for request in running]
        _replay_events(sched, k, allocs, known, length_stops)
    meta = None
    connector = sched.connector
    if connector is not None and sched.defer_block_free:
        # Every batch was processed; the last iteration scheduled one unless
        # every request stopped on length. A request stopping on length
        # was last scheduled one batch before the others.
        all_stop = len(length_stops) == len(running)
        seq = sched.count_fenced_batches(k - 1 if all_stop else k, k)
        for request in running:
            request.last_sched_seq = seq
        for idx in length_stops:
            running[idx].last_sched_seq = seq if all_stop else seq - 1
    if connector is not None:
        # Each step's build_connector_meta saw its batch's new blocks, in
        # order: per request, the blocks it took in the stretch.
        num_new = [0] * len(running)
        for _, idx in allocs:
            num_new[idx] += 1
        new_blocks = [req_to_blocks[r.request_id][len(req_to_blocks[r.request_id]) - n:] if n else []
                      for r, n in zip(running, num_new)]
        connector.advance_decode_stretch(running, new_blocks)
        meta = connector.idle_metadata()
    if lead:
        _renew_in_flight(sched, allocs, k, length_stops, meta, hybrid_new_blocks)
    if hybrid is not None:
        return hybrid_free_after, stopped
    # Free blocks after each step: only allocations change the count.
    per_step = [0] * k
    for step, _ in allocs:
        per_step[step] += 1
    free_after = []
    for taken in per_step:
        free -= taken
        free_after.append(free)
    return free_after, stopped


def _renew_in_flight(sched: Scheduler, allocs: list[tuple[int, int]], k: int,
                     length_stops: list[int], connector_meta: Any = None,
                     new_block_ids: dict[str, list[int]] | None = None) -> None:
    """Async: the stretch's last batch is in flight in place of the one
    before it: every running request but those stopping on length for one
    token (what the last iteration's schedule() would have returned), or
    nothing if they all stop. With a KV connector the batch carries the
    connector's (empty) metadata ``connector_meta`` and no loads. Hybrid
    groups pass the last step's new blocks per request (``new_block_ids``);
    otherwise they are read from ``allocs``."""
    old = sched.in_flight_outputs[0]
    running = sched.running
    if len(length_stops) == len(running):
        sched.replace_in_flight(None)
        return
    num_scheduled = _one_token_each(old.num_scheduled_tokens, running, length_stops)
    req_ids = list(num_scheduled)
    if new_block_ids is None:
        new_block_ids = {}
        req_to_blocks = sched.kv_cache_manager.req_to_blocks
        for step, idx in allocs:
            if step == k - 1:
                rid = running[idx].request_id
                new_block_ids[rid] = [req_to_blocks[rid][-1]]
    output = SchedulerOutput(
        scheduled_new_reqs=[], scheduled_cached_reqs=CachedRequestData(req_ids, set(), new_block_ids),
        num_scheduled_tokens=num_scheduled, total_num_scheduled_tokens=len(req_ids),
        # The first iteration's schedule() reports the finishes before the
        # stretch: in this output only if it is that iteration's.
        preempted_req_ids=set(), finished_req_ids=sched.finished_req_ids if k == 1 else set(),
        admission_stop=old.admission_stop)
    output.num_spec_tokens_to_schedule = old.num_spec_tokens_to_schedule
    if sched.connector is not None:
        output.kv_loads = {}
        output.kv_connector_metadata = connector_meta
    sched.replace_in_flight(output)


def _one_token_each(before: dict[str, int], running: list[Request],
                    left_out: list[int]) -> dict[str, int]:
    """The batch map of the running requests (but the running indexes
    ``left_out``) scheduling one token each, in running order. The batch
    before (``before``) held every running request: when it listed them in
    running order (as schedule() and stretches list them) its map is copied
    (one memory copy) and fixed where it differs, instead of built key by
    key."""
    fix: list[str] = []
    if len(before) != len(running):
        raise AssertionError("a stretch starts with exactly the running requests in flight")
    for r, (rid, n) in zip(running, before.items()):
        if rid is not r.request_id and rid != r.request_id:
            # Another order: build it in running order.
            out = dict.fromkeys([q.request_id for q in running], 1)
            break
        if n != 1:
            fix.append(rid)
    else:
        out = before.copy()
        for rid in fix:
            out[rid] = 1
    for idx in left_out:
        del out[running[idx].request_id]
    return out


def _replay_events(sched: Scheduler, k: int, allocs: list[tuple[int, int]], known: list[int],
                   length_stops: list[int]) -> None:
    """Allocations and cache registrations one by one, in stepping order
    (``known``: each request's known tokens minus one before the stretch)."""
    kv = sched.kv_cache_manager
    bs = sched.block_size
    running = sched.running
    caching = kv.enable_caching
    # (step, order, 0 = allocate / 1 = cache): at one step a request
    # allocates before it caches, as allocate_slots does, in running order.
    events = [(step, idx, 0) for step, idx in allocs]
    if caching:
        n = len(running)
        left_out = set(length_stops)
        for idx, request in enumerate(running):
            c = known[idx]
            # Step j fills a block when (c + j + 1) % bs == 0; blocks left
            # uncached before the stretch are registered at its first step.
            first = (-(c + 1)) % bs
            steps = list(range(first, k, bs))
            if first and (c + 1) // bs > kv.num_cached_block.get(request.request_id, 0):
                steps.insert(0, 0)
            # Not scheduled in the last iteration, a request stopping on
            # length registers then when its tokens are applied: after every
            # allocation of that iteration.
            last = n + idx if idx in left_out else idx
            events.extend((step, idx if step < k - 1 else last, 1) for step in steps)
    events.sort()
    n = len(running)
    for step, order, kind in events:
        request = running[order if order < n else order - n]
        if kind == 0:
            kv.append_new_blocks((request.request_id,))
        else:
            # Its first known + step + 1 tokens are known and computed.
            kv.cache_blocks(request, known[order if order < n else order - n] + step + 1)
