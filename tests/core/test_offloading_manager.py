"""The CPU offloading manager's LRU and ARC policies (vLLM 0.33's
CPUOffloadingManager). Expected values are worked out by hand in the
comments: keys are small ints, a request's RequestAccess maps each key to
the token count its chunk ends at (16 tokens a chunk)."""

from __future__ import annotations

import pytest

from kvsched.core.offloading_manager import (
    ARCPolicy,
    CPUOffloadingManager,
    LookupResult,
    LRUPolicy,
    RequestAccess,
)
from kvsched.errors import UserInputError

HIT, MISS, PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.HIT_PENDING


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
