"""BlockPool: the null block, the free queue's order, prefix-cache hashes.

Expected orders are derived from the rules: the queue starts in id order;
get_new_blocks pops from the front; freed blocks without a hash (or with
caching off) go to the front, the first given being reused first; freed
hashed blocks go to the back, in the given order.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.core.block_pool import NULL_BLOCK, PRIVATE_KEY_BASE, BlockPool

H1, H2, H3 = 111, 222, 333


def _pool(num_gpu_blocks: int, caching: bool = True) -> BlockPool:
    pool = BlockPool(num_gpu_blocks, caching)
    pool.check_invariants()
    return pool


def _queue(pool: BlockPool) -> list[int]:
    return list(pool.free_queue)


def test_null_block_is_never_free() -> None:
    pool = _pool(6)
    assert NULL_BLOCK == 0
    assert pool.get_num_free_blocks() == 5
    assert NULL_BLOCK not in _queue(pool)
    taken = pool.get_new_blocks(5)
    pool.check_invariants()
    assert NULL_BLOCK not in taken
    assert pool.get_num_free_blocks() == 0
    # Freeing the null block (padding in a block table) is a no-op.
    pool.free_blocks([NULL_BLOCK])
    pool.check_invariants()
    assert pool.get_num_free_blocks() == 0
    pool.free_blocks(taken)
    pool.check_invariants()
    assert pool.get_num_free_blocks() == 5
    assert NULL_BLOCK not in _queue(pool)


def test_get_new_blocks_takes_from_the_front_in_id_order() -> None:
    pool = _pool(8)
    assert pool.get_new_blocks(3) == [1, 2, 3]
    pool.check_invariants()
    assert pool.get_new_blocks(2) == [4, 5]
    pool.check_invariants()
    assert [pool.ref_cnt[b] for b in range(1, 8)] == [1, 1, 1, 1, 1, 0, 0]
    assert _queue(pool) == [6, 7]


def test_get_new_blocks_refuses_more_than_free_and_changes_nothing() -> None:
    pool = _pool(4)
    pool.get_new_blocks(1)
    with pytest.raises(ValueError):
        pool.get_new_blocks(3)
    pool.check_invariants()
    assert _queue(pool) == [2, 3]


def test_unhashed_blocks_are_freed_to_the_front_first_given_first_reused() -> None:
    pool = _pool(8)
    pool.get_new_blocks(5)  # 1..5 in use, queue [6, 7]
    pool.free_blocks([3, 1])
    pool.check_invariants()
    assert _queue(pool) == [3, 1, 6, 7]
    pool.free_blocks([5])
    pool.check_invariants()
    assert _queue(pool) == [5, 3, 1, 6, 7]
    assert pool.get_new_blocks(3) == [5, 3, 1]
    pool.check_invariants()


def test_hashed_blocks_are_freed_to_the_back_with_caching_on() -> None:
    pool = _pool(8)
    pool.get_new_blocks(5)  # 1..5 in use, queue [6, 7]
    pool.cache_block(2, H2)
    pool.cache_block(4, H1)
    pool.check_invariants()
    # Given order 4, 3, 2: unhashed 3 to the front; hashed 4 then 2 to the back.
    pool.free_blocks([4, 3, 2])
    pool.check_invariants()
    assert _queue(pool) == [3, 6, 7, 4, 2]
    # Still cached while free: a later request could hit them.
    assert pool.get_cached_block(H1) == 4
    assert pool.get_cached_block(H2) == 2
    assert pool.get_new_blocks(5) == [3, 6, 7, 4, 2]
    pool.check_invariants()


def test_with_caching_off_freed_blocks_all_go_to_the_front() -> None:
    pool = _pool(8, caching=False)
    pool.get_new_blocks(7)
    pool.free_blocks([6])
    pool.check_invariants()
    pool.free_blocks([2, 7, 4])
    pool.check_invariants()
    assert _queue(pool) == [2, 7, 4, 6]
    pool.free_blocks([1])
    pool.check_invariants()
    assert _queue(pool) == [1, 2, 7, 4, 6]


def test_touch_pulls_a_free_block_out_of_the_middle_and_takes_a_reference() -> None:
    pool = _pool(6)  # queue [1, 2, 3, 4, 5]
    pool.touch([3])
    pool.check_invariants()
    assert pool.ref_cnt[3] == 1
    assert _queue(pool) == [1, 2, 4, 5]
    # Touching a block in use only bumps its count.
    pool.touch([3])
    pool.check_invariants()
    assert pool.ref_cnt[3] == 2
    assert _queue(pool) == [1, 2, 4, 5]
    assert pool.get_new_blocks(4) == [1, 2, 4, 5]
    pool.check_invariants()
    pool.free_blocks([3])
    pool.check_invariants()
    assert pool.ref_cnt[3] == 1
    assert pool.get_num_free_blocks() == 0
    pool.free_blocks([3])
    pool.check_invariants()
    assert pool.ref_cnt[3] == 0
    assert _queue(pool) == [3]


def test_touching_a_free_cached_block_keeps_its_hash() -> None:
    pool = _pool(6)
    pool.get_new_blocks(2)
    pool.cache_block(1, H1)
    pool.free_blocks([2, 1])  # queue [2, 3, 4, 5, 1]
    pool.check_invariants()
    assert _queue(pool) == [2, 3, 4, 5, 1]
    pool.touch([pool.get_cached_block(H1)])  # type: ignore[list-item]
    pool.check_invariants()
    assert _queue(pool) == [2, 3, 4, 5]
    assert pool.ref_cnt[1] == 1
    assert pool.get_cached_block(H1) == 1


def test_reusing_a_cached_block_evicts_its_hash() -> None:
    pool = _pool(4)
    pool.get_new_blocks(3)
    pool.cache_block(1, H1)
    pool.cache_block(2, H2)
    pool.free_blocks([3, 2, 1])  # 3 to the front; 2 then 1 to the back
    pool.check_invariants()
    assert _queue(pool) == [3, 2, 1]
    assert pool.get_new_blocks(2) == [3, 2]
    pool.check_invariants()
    assert pool.get_cached_block(H2) is None
    assert pool.block_hash[2] is None
    assert pool.get_cached_block(H1) == 1  # not reused yet: still cached


def test_duplicate_hashes_return_the_earliest_live_block() -> None:
    pool = _pool(5)
    pool.get_new_blocks(4)
    for block in (2, 1, 3):  # inserted in this order under one hash
        pool.cache_block(block, H3)
        pool.check_invariants()
    assert pool.get_cached_block(H3) == 2
    # Evict 2 (the primary): the next inserted, 1, takes over.
    pool.free_blocks([4])
    pool.free_blocks([2])
    pool.check_invariants()
    assert _queue(pool) == [4, 2]
    assert pool.get_new_blocks(2) == [4, 2]
    pool.check_invariants()
    assert pool.get_cached_block(H3) == 1
    # Evict 3 (a duplicate): 1 stays the answer.
    pool.free_blocks([3])
    assert pool.get_new_blocks(1) == [3]
    pool.check_invariants()
    assert pool.get_cached_block(H3) == 1
    # Evict 1: nothing left under the hash.
    pool.free_blocks([1])
    assert pool.get_new_blocks(1) == [1]
    pool.check_invariants()
    assert pool.get_cached_block(H3) is None


def test_reset_prefix_cache_needs_every_block_free() -> None:
    pool = _pool(5)
    pool.get_new_blocks(3)
    pool.cache_block(1, H1)
    pool.cache_block(2, H2)
    pool.free_blocks([2, 1])  # block 3 still in use
    pool.check_invariants()
    assert pool.reset_prefix_cache() is False
    pool.check_invariants()
    assert pool.get_cached_block(H1) == 1
    assert pool.get_cached_block(H2) == 2
    pool.free_blocks([3])
    assert pool.reset_prefix_cache() is True
    pool.check_invariants()
    assert pool.get_cached_block(H1) is None
    assert pool.get_cached_block(H2) is None
    assert all(h is None for h in pool.block_hash)
    assert pool.get_num_free_blocks() == 4


def test_usage_counts_blocks_in_use_out_of_the_usable_ones() -> None:
    pool = _pool(5)
    assert pool.get_usage() == 0.0
    pool.get_new_blocks(1)
    assert pool.get_usage() == pytest.approx(0.25)
    pool.get_new_blocks(3)
    assert pool.get_usage() == pytest.approx(1.0)
    pool.check_invariants()


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(1, 12), st.data())
def test_free_table_is_free_blocks_by_position(num_blocks: int, data: st.DataObject) -> None:
    # Two pools in the same state: a table whose first num_hashed blocks are
    # cached, some blocks shared with another table (ref_cnt 2).
    pools = [_pool(40), _pool(40)]
    num_hashed = data.draw(st.integers(0, num_blocks))
    shared = data.draw(st.integers(0, num_blocks))
    warm = data.draw(st.integers(0, 5))
    tables = [pool.get_new_blocks(warm + num_blocks)[warm:] for pool in pools]
    for pool, table in zip(pools, tables):
        pool.cache_blocks(table[:num_hashed], [1000 + i for i in range(num_hashed)])
        pool.touch(table[:shared])
    pools[0].free_blocks(reversed(tables[0]))
    pools[1].free_table(tables[1], num_hashed)
    assert list(pools[0].free_queue) == list(pools[1].free_queue)
    assert pools[0].ref_cnt == pools[1].ref_cnt
    pools[1].check_invariants()


def test_cache_new_blocks_leaves_private_keys_out() -> None:
    pool = _pool(10)
    blocks = pool.get_new_blocks(3)
    pool.cache_new_blocks(blocks, [H1, PRIVATE_KEY_BASE + 5, H2])
    assert pool.cached == {H1: blocks[0], H2: blocks[2]}
    pool.cache_blocks([blocks[1]], [PRIVATE_KEY_BASE + 5])  # the preemption path registers them
    assert pool.get_cached_block(PRIVATE_KEY_BASE + 5) == blocks[1]
    pool.check_invariants()


class _ListQueue:
    """The free queue as vLLM describes it, in the plainest form: one list,
    popped at the front, prepended to, appended to, removed from."""

    def __init__(self, num_gpu_blocks: int) -> None:
        self.queue = list(range(1, num_gpu_blocks))
        self.ref_cnt = [0] * num_gpu_blocks
        self.hashed: set[int] = set()

    def get(self, n: int) -> list[int]:
        blocks = self.queue[:n]
        del self.queue[:n]
        for b in blocks:
            self.ref_cnt[b] = 1
            self.hashed.discard(b)
        return blocks

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref_cnt[b] == 0:
                self.queue.remove(b)
            self.ref_cnt[b] += 1

    def free(self, ordered: list[int]) -> None:
        to_front = []
        for b in ordered:
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                if b in self.hashed:
                    self.queue.append(b)
                else:
                    to_front.append(b)
        self.queue[:0] = to_front


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.integers(2, 40), st.lists(st.tuples(st.integers(0, 2), st.integers(0, 10 ** 6)),
                                    min_size=1, max_size=300))
def test_free_queue_matches_a_plain_list(num_gpu_blocks: int, ops: list[tuple[int, int]]) -> None:
    # Random allocation, prefix hits (touch), caching and freeing, checked
    # after every operation against _ListQueue: the two-list queue with stale
    # entries and compaction must give the same blocks in the same order.
    pool = BlockPool(num_gpu_blocks, True)
    ref = _ListQueue(num_gpu_blocks)
    tables: list[tuple[list[int], int]] = []  # (blocks, how many lead blocks are hashed)
    next_hash = 1
    for kind, x in ops:
        if kind == 0:  # a new table: a prefix hit on cached blocks, then new blocks
            hits = [b for b in sorted(pool.hash_of_block)][: x % 4]
            num_new = x % 7
            if num_new + sum(1 for b in hits if pool.ref_cnt[b] == 0) > pool.get_num_free_blocks():
                continue
            pool.touch(hits)
            ref.touch(hits)
            new = pool.get_new_blocks(num_new)
            assert new == ref.get(num_new)
            tables.append((hits + new, len(hits)))
        elif kind == 1 and tables:  # cache the next blocks of a table
            blocks, num_hashed = tables[x % len(tables)]
            count = min(x % 3, len(blocks) - num_hashed)
            fresh = blocks[num_hashed:num_hashed + count]
            pool.cache_blocks(fresh, list(range(next_hash, next_hash + count)))
            ref.hashed.update(fresh)
            next_hash += count
            tables[x % len(tables)] = (blocks, num_hashed + count)
        elif kind == 2 and tables:  # free a table, tail first
            blocks, num_hashed = tables.pop(x % len(tables))
            pool.free_table(blocks, num_hashed)
            ref.free(blocks[::-1])
        pool.check_invariants()
        assert pool.free_queue == ref.queue
        assert pool.ref_cnt == ref.ref_cnt
        assert set(pool.hash_of_block) == ref.hashed


def test_a_long_run_compacts_the_queue_and_keeps_its_order() -> None:
    # Enough churn to drop consumed entries many times (every ~1k taken).
    pool = BlockPool(50, True)
    ref = _ListQueue(50)
    held: list[tuple[list[int], int]] = []  # (table, hashed lead blocks)
    compactions = stale_seen = 0
    for i in range(3000):
        n = 1 + i % 5
        while pool.get_num_free_blocks() < n:
            blocks, num_hashed = held.pop(0)
            pool.free_table(blocks, num_hashed)
            ref.free(blocks[::-1])
        head = pool.head
        got = pool.get_new_blocks(n)
        compactions += pool.head < head
        assert got == ref.get(n)
        pool.cache_blocks(got[:-1], [10 ** 6 + i * 8 + j for j in range(n - 1)])
        ref.hashed.update(got[:-1])
        free_cached = sorted(b for b in pool.hash_of_block if pool.ref_cnt[b] == 0)
        if i % 3 == 0 and free_cached:  # a hit on a free cached block: out of the middle
            hit = free_cached[len(free_cached) // 2]
            pool.touch([hit])
            ref.touch([hit])
            held.append(([hit], 1))
        stale_seen += bool(pool.stale)
        held.append((got, n - 1))
    assert compactions >= 3
    assert stale_seen > 100, "hits seldom left stale entries behind"
    pool.check_invariants()
    assert pool.free_queue == ref.queue
    assert pool.ref_cnt == ref.ref_cnt
