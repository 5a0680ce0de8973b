"""The CPU offloading manager's LRU and ARC policies (vLLM 0.33's
CPUOffloadingManager). Expected values are worked out by hand in the
comments: keys are small ints, a request's RequestAccess maps each key to
the token count its chunk ends at (16 tokens a chunk)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from kvsched.core.offloading_manager import (
    ARCPolicy,
    CPUChunk,
    CPUOffloadingManager,
    LookupResult,
    LRUPolicy,
    RequestAccess,
)
from kvsched.errors import UserInputError

HIT, MISS, PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.HIT_PENDING
# CI replays the same examples; KVSCHED_FUZZ_SEED=N draws a fresh set.
FUZZ_SEED = os.environ.get("KVSCHED_FUZZ_SEED")


def access(*keys: int) -> RequestAccess:
    """A request whose chunks are ``keys``, head first."""
    return RequestAccess(positions={k: 16 * (i + 1) for i, k in enumerate(keys)})


def stored(m: CPUOffloadingManager, keys: list[int], a: RequestAccess) -> list[int]:
    """Store ``keys`` and complete the store; the slots used."""
    placed = m.prepare_store(keys, a)
    assert placed is not None
    m.complete_store(placed[0])
    return placed[1]


def test_lru_running_request_evicts_its_tail_first() -> None:
    m = CPUOffloadingManager(2, "lru")
    a = access(1, 2)
    # Fresh slots in order.
    assert m.prepare_store([1, 2], a) == ([1, 2], [0, 1])
    assert (m.lookup(1), m.lookup(3)) == (PENDING, MISS)
    m.complete_store([1, 2])
    assert m.lookup(1) is HIT
    # a still runs: its keys share one rank, the tail (key 2) ranked
    # oldest, so key 2 goes and its slot 1 is reused.
    assert m.prepare_store([3], access(3)) == ([3], [1])
    assert [m.lookup(k) for k in (1, 2, 3)] == [HIT, MISS, PENDING]
    assert m.num_used_chunks == 2


def test_lru_finish_commits_head_as_most_recent() -> None:
    m = CPUOffloadingManager(3, "lru")
    a, b = access(1, 2), access(3)
    stored(m, [1, 2], a)  # ranks: 1 -> (1, -16), 2 -> (1, -32)
    stored(m, [3], b)     # 3 -> (2, -16)
    m.on_request_finished(a)  # tail first: 2 -> 3, 1 -> 4
    # Two evictions: key 3 (rank 2), then key 2 (rank 3); key 1 stays.
    # (Without the commit keys 2 and 1 would go first.)
    assert m.prepare_store([4, 5], access(4, 5)) is not None
    assert [m.lookup(k) for k in (1, 2, 3)] == [HIT, MISS, MISS]


def test_lru_pinned_and_offered_chunks_are_not_evicted() -> None:
    m = CPUOffloadingManager(2, "lru")
    stored(m, [1, 2], access(1, 2))
    reader = access(1)
    assert m.prepare_load([1], reader) == [0]
    # Two new chunks need two evictions; key 1 is pinned: none happen.
    assert m.prepare_store([7, 8], access(7, 8)) is None
    assert [m.lookup(k) for k in (1, 2)] == [HIT, HIT]
    m.complete_load([1])
    # Key 2 is offered with key 9: only key 1 may go (slot 0).
    assert m.prepare_store([2, 9], access(2, 9)) == ([9], [0])
    assert [m.lookup(k) for k in (1, 2, 9)] == [MISS, HIT, PENDING]


def test_store_threshold_needs_repeated_offers() -> None:
    m = CPUOffloadingManager(4, "lru", store_threshold=2)
    assert m.prepare_store([7], access(7)) == ([], [])
    assert m.lookup(7) is MISS
    assert m.prepare_store([7], access(7)) == ([7], [0])


def test_arc_reuse_promotes_and_t1_evicts_first() -> None:
    m = CPUOffloadingManager(2, "arc")
    policy = m.policy
    assert isinstance(policy, ARCPolicy)
    a = access(1, 2)
    stored(m, [1, 2], a)
    # Stored only: both stay in T1, tail first moved to the MRU end, so
    # the head (key 1) is the most recent.
    m.on_request_finished(a)
    assert list(policy.t1) == [2, 1] and not policy.t2
    b = access(1)
    m.prepare_load([1], b)
    m.complete_load([1])
    m.on_request_finished(b)  # a reuse: key 1 moves to T2
    assert list(policy.t1) == [2] and list(policy.t2) == [1]
    # |T1| = 1 >= target 0: evict from T1 (key 2, remembered in B1).
    stored(m, [3], access(3))
    assert [m.lookup(k) for k in (1, 2, 3)] == [HIT, MISS, HIT]
    assert list(policy.b1) == [2] and list(policy.t1) == [3]


def test_arc_ghost_hits_move_the_target() -> None:
    m = CPUOffloadingManager(2, "arc")
    policy = m.policy
    assert isinstance(policy, ARCPolicy)
    # Set up as in the test above: T1 [3], T2 [1], B1 [2].
    a = access(1, 2)
    stored(m, [1, 2], a)
    m.on_request_finished(a)
    b = access(1)
    m.prepare_load([1], b)
    m.complete_load([1])
    m.on_request_finished(b)
    stored(m, [3], access(3))
    # Key 2 again, a B1 hit: target 0 + max(1, |B2|/|B1| = 0) = 1; |T1| = 1
    # >= 1 so T1 still gives key 3; key 2 leaves B1, key 3 enters it.
    stored(m, [2], access(2))
    assert policy.target_t1_size == 1.0
    assert list(policy.t1) == [2] and list(policy.t2) == [1] and list(policy.b1) == [3]
    # Key 3 again, a B1 hit: target 2; |T1| = 1 < 2, so T2 gives key 1.
    stored(m, [3], access(3))
    assert policy.target_t1_size == 2.0
    assert [m.lookup(k) for k in (1, 2, 3)] == [MISS, HIT, HIT]
    assert list(policy.b2) == [1] and not policy.b1
    # Key 1 again, a B2 hit: target 2 - max(1, |B1|/|B2| = 0) = 1; |T1| = 2
    # >= 1: T1's oldest (key 2) goes.
    stored(m, [1], access(1))
    assert policy.target_t1_size == 1.0
    assert list(policy.t1) == [3, 1] and list(policy.b1) == [2] and not policy.b2


def test_policies_by_name_and_bad_input() -> None:
    assert isinstance(CPUOffloadingManager(1, "lru").policy, LRUPolicy)
    assert isinstance(CPUOffloadingManager(1, "arc").policy, ARCPolicy)
    with pytest.raises(UserInputError, match="eviction_policy='fifo'"):
        CPUOffloadingManager(1, "fifo")
    with pytest.raises(UserInputError, match="num_cpu_blocks=0"):
        CPUOffloadingManager(0)


def test_lru_chunk_read_back_at_the_same_rank_is_evicted_once() -> None:
    m = CPUOffloadingManager(2, "lru")
    a = access(1, 2)
    stored(m, [1, 2], a)
    m.on_request_finished(a)  # 2 -> rank 2, 1 -> rank 3
    # A reader with no position for key 2 leaves its rank: key 2 is
    # evictable again at the rank it had (the heap holds it twice).
    reader = RequestAccess()
    m.prepare_load([2], reader)
    m.complete_load([2])
    # Two evictions: key 2 (rank 2) once, then key 1 (rank 3); their slots
    # 1 and 0 are freed in that order and reused last-freed first.
    assert m.prepare_store([3, 4], access(3, 4)) == ([3, 4], [0, 1])
    assert [m.lookup(k) for k in (1, 2, 3, 4)] == [MISS, MISS, PENDING, PENDING]
    assert m.num_used_chunks == 2


class _SortedLRU(LRUPolicy):
    """The LRU eviction as a plain sort of every evictable chunk by
    (rank, key): the definition the heap must reproduce."""

    def evict(self, n: int, protected: set[int]) -> list[tuple[int, CPUChunk]] | None:
        if n == 0:
            return []
        order = sorted((k for k in self.evictable if k not in protected), key=lambda k: (self.ranks[k], k))
        if len(order) < n:
            return None
        out = []
        for key in order[:n]:
            self.evictable.remove(key)
            del self.ranks[key]
            out.append((key, self.chunks.pop(key)))
        return out


# One operation on the manager: (kind, request index, keys drawn from a small
# pool so that keys come back after eviction and requests share them).
_OPS = st.lists(st.tuples(st.sampled_from(["store", "store", "store_async", "complete", "load", "unload",
                                           "finish"]),
                          st.integers(0, 5), st.lists(st.integers(0, 11), min_size=1, max_size=5)),
                max_size=80)


@settings(max_examples=300, deadline=None, derandomize=FUZZ_SEED is None, database=None)
@seed(int(FUZZ_SEED or 0))
@given(capacity=st.integers(1, 8), ops=_OPS)
def test_lru_heap_evicts_as_the_sort(capacity: int, ops: list[tuple[str, int, list[int]]]) -> None:
    """Random store/load/finish sequences: the heap-based LRU and the sort
    give the same answer at every call and the same cache afterwards."""
    heap_m = CPUOffloadingManager(capacity, "lru")
    sort_m = CPUOffloadingManager(capacity, "lru")
    sort_m.policy = _SortedLRU(capacity)
    # Per request: its access (the same positions for both managers), the
    # keys in flight (stored, not completed) and the keys it pins.
    accesses: list[tuple[RequestAccess, RequestAccess]] = []
    storing: list[list[int]] = []
    pinned: list[list[int]] = []
    for r in range(6):
        positions = {k: 16 * ((k * 7 + r) % 12 + 1) for k in range(12)}
        accesses.append((RequestAccess(positions=dict(positions)), RequestAccess(positions=dict(positions))))
        storing.append([])
        pinned.append([])
    for kind, r, keys in ops:
        keys = list(dict.fromkeys(keys))
        a_heap, a_sort = accesses[r]
        if a_heap.finished and kind in ("store", "store_async", "load"):
            continue
        if kind in ("store", "store_async"):
            got = heap_m.prepare_store(keys, a_heap)
            assert got == sort_m.prepare_store(keys, a_sort)
            if got is not None and kind == "store":
                heap_m.complete_store(got[0])
                sort_m.complete_store(got[0])
            elif got is not None:
                storing[r].extend(got[0])
        elif kind == "complete":
            heap_m.complete_store(storing[r])
            sort_m.complete_store(storing[r])
            storing[r].clear()
        elif kind == "load":
            ready = [k for k in keys if heap_m.lookup(k) is LookupResult.HIT]
            assert ready == [k for k in keys if sort_m.lookup(k) is LookupResult.HIT]
            if ready:
                assert heap_m.prepare_load(ready, a_heap) == sort_m.prepare_load(ready, a_sort)
                pinned[r].extend(ready)
        elif kind == "unload":
            heap_m.complete_load(pinned[r])
            sort_m.complete_load(pinned[r])
            pinned[r].clear()
        else:
            heap_m.on_request_finished(a_heap)
            sort_m.on_request_finished(a_sort)
        assert [heap_m.lookup(k) for k in range(12)] == [sort_m.lookup(k) for k in range(12)]
    assert heap_m.policy.ranks == sort_m.policy.ranks  # type: ignore[attr-defined]
    assert heap_m.num_used_chunks == sort_m.num_used_chunks


@pytest.mark.parametrize("once, stored_on_second_offer", [(False, True), (True, False)])
def test_store_threshold_counts_a_request_once_from_034(once: bool, stored_on_second_offer: bool) -> None:
    # Threshold 2. vLLM 0.33 counts every offer, so one request offering key 7
    # twice (no room the first time, or after a preemption) stores it; 0.34
    # counts each request once: the second offer of the same request does not.
    m = CPUOffloadingManager(4, "lru", store_threshold=2, count_once_per_request=once)
    a = access(7)
    assert m.prepare_store([7], a) == ([], [])
    assert m.prepare_store([7], a) == (([7], [0]) if stored_on_second_offer else ([], []))
    if not stored_on_second_offer:
        # Another request's offer is a second use: count 2, stored.
        assert m.prepare_store([7], access(7)) == ([7], [0])
    assert m.lookup(7) is PENDING


def test_failed_store_drops_its_chunks_and_frees_their_slots() -> None:
    m = CPUOffloadingManager(2, "lru")
    a = access(1, 2)
    assert m.prepare_store([1, 2], a) == ([1, 2], [0, 1])
    m.complete_store([1, 2], success=False)
    # Gone, not readable, slots free (freed in key order: slot 1 is reused first).
    assert [m.lookup(k) for k in (1, 2)] == [MISS, MISS]
    assert m.num_used_chunks == 0
    assert m.prepare_store([3], access(3)) == ([3], [1])
    # A chunk already readable is not touched by a failed report.
    m.complete_store([3])
    m.complete_store([3], success=False)
    assert m.lookup(3) is HIT
    # The request that offered the dropped keys finishes without them.
    m.on_request_finished(a)
    assert m.prepare_store([4], access(4)) == ([4], [0])


def test_arc_failed_store_leaves_the_ghost_lists() -> None:
    m = CPUOffloadingManager(1, "arc")
    policy = m.policy
    assert isinstance(policy, ARCPolicy)
    stored(m, [1], access(1))
    # Storing key 2 evicts key 1 from T1 into ghost list B1.
    assert m.prepare_store([2], access(2)) == ([2], [0])
    assert list(policy.b1) == [1] and list(policy.t1) == [2]
    m.complete_store([2], success=False)
    assert list(policy.t1) == [] and list(policy.b1) == [1]
    assert m.num_used_chunks == 0
