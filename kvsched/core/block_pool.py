"""The pool of KV-cache blocks: reference counts, the LRU free queue, and the
prefix-cache map from block hash to block.

Blocks are plain ints (their ids) with per-block state in parallel lists: this
keeps allocation and freeing to a few list operations on the hot path. Block 0
is vLLM's null block: taken out of the pool at start and never freed.

Eviction order follows vLLM 0.33: the free queue starts in id order; freed
blocks without a hash go to the front (reused first, nothing to lose), freed
cached blocks go to the back (least recently used is evicted first). Callers
free a request's blocks tail-first so a prefix outlives its suffix.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

NULL_BLOCK = 0


class BlockPool:
    __slots__ = ("num_gpu_blocks", "enable_caching", "ref_cnt", "block_hash",
                 "free_queue", "cached", "dup_cached")

    def __init__(self, num_gpu_blocks: int, enable_caching: bool) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.ref_cnt: list[int] = [0] * num_gpu_blocks
        self.block_hash: list[int | None] = [None] * num_gpu_blocks
        # OrderedDict as an LRU list: O(1) pop from the front, append, prepend
        # (move_to_end(last=False)) and removal from the middle (touch).
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_gpu_blocks))
        # hash -> the block a lookup returns; later blocks with the same hash
        # (not de-duplicated, so block tables stay append-only) wait in
        # dup_cached in insertion order, as vLLM's per-hash dict does.
        self.cached: dict[int, int] = {}
        self.dup_cached: dict[int, list[int]] = {}

    # -- counting -------------------------------------------------------------
    def get_num_free_blocks(self) -> int:
        return len(self.free_queue)

    def get_usage(self) -> float:
        """Fraction of usable blocks (the null block excluded) that are in use."""
        usable = self.num_gpu_blocks - 1
        return 1.0 - len(self.free_queue) / usable

    # -- allocation -----------------------------------------------------------
    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` from the front of the free queue, evicting any
        prefix-cache entry they still carry."""
        free_queue = self.free_queue
        if num_blocks > len(free_queue):
            raise ValueError(f"cannot take {num_blocks} blocks: only {len(free_queue)} are free")
        popitem = free_queue.popitem
        blocks = [popitem(last=False)[0] for _ in range(num_blocks)]
        ref_cnt = self.ref_cnt
        block_hash = self.block_hash
        cached = self.cached
        for b in blocks:
            h = block_hash[b]
            if h is not None:
                if self.dup_cached:
                    self._evict(b)
                else:  # no duplicate hashes anywhere: the map entry is this block
                    block_hash[b] = None
                    del cached[h]
            ref_cnt[b] = 1
        return blocks

    def touch(self, blocks: Sequence[int]) -> None:
        """A prefix-cache hit: take a reference, pulling free blocks off the queue."""
        ref_cnt = self.ref_cnt
        free_queue = self.free_queue
        for b in blocks:
            if ref_cnt[b] == 0:
                del free_queue[b]
            ref_cnt[b] += 1

    def free_blocks(self, ordered_blocks: Iterable[int]) -> None:
        """Drop one reference from each block, in eviction order (first evicted
        first). Blocks reaching zero go back to the free queue."""
        ref_cnt = self.ref_cnt
        block_hash = self.block_hash
        caching = self.enable_caching
        evict_first: list[int] = []
        evict_last: list[int] = []
        # Request tables never hold the null block (one full-attention group).
        if caching:
            for b in ordered_blocks:
                n = ref_cnt[b] - 1
                ref_cnt[b] = n
                if n == 0:
                    (evict_first if block_hash[b] is None else evict_last).append(b)
        else:
            for b in ordered_blocks:
                n = ref_cnt[b] - 1
                ref_cnt[b] = n
                if n == 0:
                    evict_first.append(b)
        free_queue = self.free_queue
        if evict_first:
            move = free_queue.move_to_end
            for b in reversed(evict_first):
                free_queue[b] = None
                move(b, last=False)
        if evict_last:
            free_queue.update(dict.fromkeys(evict_last))

    # -- prefix cache ---------------------------------------------------------
    def get_cached_block(self, block_hash: int) -> int | None:
        return self.cached.get(block_hash)

    def cache_block(self, block: int, block_hash: int) -> None:
        """Register a full block under its chained hash."""
        self.block_hash[block] = block_hash
        if block_hash in self.cached:
            self.dup_cached.setdefault(block_hash, []).append(block)
        else:
            self.cached[block_hash] = block

    def _evict(self, block: int) -> None:
        h = self.block_hash[block]
        assert h is not None
        self.block_hash[block] = None
        dups = self.dup_cached.get(h)
        if self.cached.get(h) == block:
            if dups:
                self.cached[h] = dups.pop(0)
                if not dups:
                    del self.dup_cached[h]
            else:
                del self.cached[h]
        elif dups is not None:
            dups.remove(block)
            if not dups:
                del self.dup_cached[h]

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only possible when no block is in use."""
        if len(self.free_queue) != self.num_gpu_blocks - 1:
            return False
        self.cached.clear()
        self.dup_cached.clear()
        self.block_hash = [None] * self.num_gpu_blocks
        return True

    # -- checking -------------------------------------------------------------
    def check_invariants(self) -> None:
        n = self.num_gpu_blocks
        free = self.free_queue
        assert NULL_BLOCK not in free, "the null block is never free"
        assert len(free) <= n - 1
        for b in range(1, n):
            rc = self.ref_cnt[b]
            assert rc >= 0, f"block {b} has ref_cnt {rc}"
            assert (rc == 0) == (b in free), f"block {b}: ref_cnt {rc} but free={b in free}"
        seen = 0
        for h, b in self.cached.items():
            assert self.block_hash[b] == h, f"cached block {b} lost its hash"
            seen += 1
            for d in self.dup_cached.get(h, ()):
                assert self.block_hash[d] == h, f"duplicate block {d} lost its hash"
                seen += 1
        assert set(self.dup_cached) <= set(self.cached), "duplicates without a primary"
        hashed = sum(h is not None for h in self.block_hash)
        assert hashed == seen, f"{hashed} blocks carry a hash but {seen} are in the map"
        if not self.enable_caching:
            assert seen == 0, "blocks cached with prefix caching off"
