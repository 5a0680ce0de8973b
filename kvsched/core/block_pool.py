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
from itertools import islice

NULL_BLOCK = 0
# Keys from here up name the blocks of private requests by position
# (KVCacheManager._private_keys); hash() values are below 2**63 in magnitude.
PRIVATE_KEY_BASE = 1 << 64


class BlockPool:
    __slots__ = ("num_gpu_blocks", "enable_caching", "ref_cnt", "hash_of_block",
                 "free_queue", "cached", "dup_cached")

    def __init__(self, num_gpu_blocks: int, enable_caching: bool) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.ref_cnt: list[int] = [0] * num_gpu_blocks
        # block -> its hash, for cached blocks only: a dict so whole prompts
        # are registered and looked up with C-level bulk operations.
        self.hash_of_block: dict[int, int] = {}
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
        blocks = list(islice(free_queue, num_blocks))
        for b in blocks:
            del free_queue[b]
        ref_cnt = self.ref_cnt
        hash_of_block = self.hash_of_block
        if hash_of_block and not hash_of_block.keys().isdisjoint(blocks):
            cached = self.cached
            pop_hash = hash_of_block.pop
            for b in blocks:
                h = pop_hash(b, None)
                if h is not None:
                    if self.dup_cached:
                        self._evict(b, h)
                    else:  # no duplicate hashes anywhere: the map entry is this block
                        del cached[h]
                ref_cnt[b] = 1
        else:
            for b in blocks:
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
        first). Blocks reaching zero go back to the free queue: cached ones to
        the back (in the given order), the others to the front (the first
        given ends up first)."""
        ref_cnt = self.ref_cnt
        hashed = self.hash_of_block
        free_queue = self.free_queue
        evict_first: list[int] = []
        # Request tables never hold the null block (one full-attention group).
        # With caching off no block carries a hash, so all go to the front.
        for b in ordered_blocks:
            n = ref_cnt[b] - 1
            ref_cnt[b] = n
            if n == 0:
                if b in hashed:
                    free_queue[b] = None
                else:
                    evict_first.append(b)
        if evict_first:
            move = free_queue.move_to_end
            for b in reversed(evict_first):
                free_queue[b] = None
                move(b, last=False)

    def free_table(self, blocks: list[int], num_hashed: int) -> None:
        """``free_blocks(reversed(blocks))`` for a request's block table whose
        cached blocks are exactly its first ``num_hashed`` (the KV cache
        manager's invariant): those go to the back, the rest to the front,
        by position instead of by a lookup per block."""
        ref_cnt = self.ref_cnt
        evict_first: list[int] = []
        for b in reversed(blocks[num_hashed:]):
            n = ref_cnt[b] - 1
            ref_cnt[b] = n
            if not n:
                evict_first.append(b)
        free_queue = self.free_queue
        for b in reversed(blocks[:num_hashed]):
            n = ref_cnt[b] - 1
            ref_cnt[b] = n
            if not n:
                free_queue[b] = None
        if evict_first:
            move = free_queue.move_to_end
            for b in reversed(evict_first):
                free_queue[b] = None
                move(b, last=False)

    # -- prefix cache ---------------------------------------------------------
    def get_cached_block(self, block_hash: int) -> int | None:
        return self.cached.get(block_hash)

    @property
    def block_hash(self) -> list[int | None]:
        """Each block's hash (None if not cached), indexed by block id."""
        return [self.hash_of_block.get(b) for b in range(self.num_gpu_blocks)]

    def cache_block(self, block: int, block_hash: int) -> None:
        """Register one full block under its chained hash."""
        self.cache_blocks([block], [block_hash])

    def cache_blocks(self, blocks: list[int], hashes: Sequence[int]) -> None:
        """Register full blocks under their chained hashes, in order."""
        cached = self.cached
        if len(blocks) == 1:  # a decode filling its block: the usual single insert
            b, h = blocks[0], hashes[0]
            self.hash_of_block[b] = h
            if h in cached:
                self.dup_cached.setdefault(h, []).append(b)
            else:
                cached[h] = b
            return
        if cached.keys().isdisjoint(hashes):
            # The common case, in bulk: no hash is cached yet (and a request's
            # chained hashes differ from each other).
            self._insert_new(blocks, hashes)
            return
        for b, h in zip(blocks, hashes):
            self.hash_of_block[b] = h
            if h in cached:
                self.dup_cached.setdefault(h, []).append(b)
            else:
                cached[h] = b

    def cache_new_blocks(self, blocks: list[int], hashes: Sequence[int]) -> None:
        """``cache_blocks`` for hashes known to be new and distinct (the caller
        checked): two C-level bulk inserts. Blocks under private keys are
        left out: the KV cache manager registers those (with cache_blocks)
        only when their owner is preempted (see KVCacheManager.cache_full_blocks)."""
        if hashes and max(hashes) >= PRIVATE_KEY_BASE:
            if min(hashes) >= PRIVATE_KEY_BASE:
                return
            public = [(b, h) for b, h in zip(blocks, hashes) if h < PRIVATE_KEY_BASE]
            blocks = [b for b, _ in public]
            hashes = [h for _, h in public]
        self._insert_new(blocks, hashes)

    def _insert_new(self, blocks: list[int], hashes: Sequence[int]) -> None:
        self.cached.update(zip(hashes, blocks))
        self.hash_of_block.update(zip(blocks, hashes))

    def _evict(self, block: int, h: int) -> None:
        """Drop ``block`` (whose hash ``h`` was just popped) from the map."""
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
        self.hash_of_block.clear()
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
        hash_of_block = self.hash_of_block
        for h, b in self.cached.items():
            assert hash_of_block.get(b) == h, f"cached block {b} lost its hash"
            seen += 1
            for d in self.dup_cached.get(h, ()):
                assert hash_of_block.get(d) == h, f"duplicate block {d} lost its hash"
                seen += 1
        assert set(self.dup_cached) <= set(self.cached), "duplicates without a primary"
        assert NULL_BLOCK not in hash_of_block, "the null block is never cached"
        hashed = len(hash_of_block)
        assert hashed == seen, f"{hashed} blocks carry a hash but {seen} are in the map"
        if not self.enable_caching:
            assert seen == 0, "blocks cached with prefix caching off"
