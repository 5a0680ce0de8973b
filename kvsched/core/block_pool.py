"""The pool of KV-cache blocks: reference counts, the LRU free queue, and the
prefix-cache map from block hash to block.

Blocks are plain ints (their ids) with per-block state in parallel lists: this
keeps allocation and freeing to a few list operations on the hot path. Block 0
is vLLM's null block: taken out of the pool at start and never freed.

Eviction order follows vLLM 0.33: the free queue starts in id order; freed
blocks without a hash go to the front (reused first, nothing to lose), freed
cached blocks go to the back (least recently used is evicted first). Callers
free a request's blocks tail-first so a prefix outlives its suffix.

The free queue is held in two plain lists, so taking and returning a whole
prompt's blocks are slice operations rather than a linked-list walk per block
(an OrderedDict walk was a fifth of the simulator's time, mostly cache misses):

- ``front``: a stack of blocks without a hash, its top (the list's end) first
  in the queue. Only blocks without a hash are ever put there, and a free
  block gains no hash, so no block here is taken out of the middle.
- ``back[head:]``: the rest of the queue in order. A prefix-cache hit takes
  a block out of the middle (``touch``); its entry stays in the list and is
  counted in ``stale`` and skipped when reached. A block's stale entries
  always precede its live one (entries are only appended), so a count per
  block says which entries to skip.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvsched.errors import UserInputError

NULL_BLOCK = 0
# Keys from here up name the blocks of private requests by position
# (KVCacheManager._private_keys); hash() values are below 2**63 in magnitude.
PRIVATE_KEY_BASE = 1 << 64


class BlockPool:
    __slots__ = ("num_gpu_blocks", "enable_caching", "ref_cnt", "hash_of_block",
                 "front", "back", "head", "stale", "num_free", "cached", "dup_cached")

    def __init__(self, num_gpu_blocks: int, enable_caching: bool) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.ref_cnt: list[int] = [0] * num_gpu_blocks
        # block -> its hash, for cached blocks only: a dict so whole prompts
        # are registered and looked up with C-level bulk operations.
        self.hash_of_block: dict[int, int] = {}
        # The free queue (module doc): all blocks but the null one, in id order.
        self.front: list[int] = list(range(num_gpu_blocks - 1, 0, -1))
        self.back: list[int] = []
        self.head = 0
        self.stale: dict[int, int] = {}
        self.num_free = num_gpu_blocks - 1
        # hash -> the block a lookup returns; later blocks with the same hash
        # (not de-duplicated, so block tables stay append-only) wait in
        # dup_cached in insertion order, as vLLM's per-hash dict does.
        self.cached: dict[int, int] = {}
        self.dup_cached: dict[int, list[int]] = {}

    # -- counting -------------------------------------------------------------
    def get_num_free_blocks(self) -> int:
        return self.num_free

    def get_usage(self) -> float:
        """Fraction of usable blocks (the null block excluded) that are in use."""
        usable = self.num_gpu_blocks - 1
        return 1.0 - self.num_free / usable

    @property
    def free_queue(self) -> list[int]:
        """The free blocks in eviction order (first evicted first)."""
        stale = dict(self.stale)
        live: list[int] = []
        for b in self.back[self.head:]:
            c = stale.get(b)
            if c:
                stale[b] = c - 1
            else:
                live.append(b)
        return self.front[::-1] + live

    # -- allocation -----------------------------------------------------------
    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` from the front of the free queue, evicting any
        prefix-cache entry they still carry."""
        if num_blocks > self.num_free:
            raise UserInputError(f"cannot take {num_blocks} blocks: only {self.num_free} are free")
        self.num_free -= num_blocks
        front = self.front
        if num_blocks <= len(front):
            if not num_blocks:
                return []
            blocks = front[:-num_blocks - 1:-1]
            del front[-num_blocks:]
        else:
            blocks = front[::-1]
            front.clear()
            self._take_back(blocks, num_blocks - len(blocks))
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

    def _take_back(self, blocks: list[int], num: int) -> None:
        """Move the first ``num`` live entries of ``back`` onto ``blocks``."""
        back, head, stale = self.back, self.head, self.stale
        end = head + num
        taken = back[head:end]
        # A block's stale entries precede its live one, so a slice naming no
        # block with stale entries holds none.
        if not stale or stale.keys().isdisjoint(taken):
            blocks += taken
            head = end
        else:
            while num:
                b = back[head]
                head += 1
                c = stale.get(b)
                if c:
                    if c == 1:
                        del stale[b]
                    else:
                        stale[b] = c - 1
                    continue
                blocks.append(b)
                num -= 1
        # Drop the consumed prefix now and then (amortised O(1) per entry).
        if head > 1024 and head * 2 > len(back):
            del back[:head]
            head = 0
        self.head = head

    def touch(self, blocks: Sequence[int]) -> None:
        """A prefix-cache hit: take a reference, pulling free blocks off the queue."""
        ref_cnt = self.ref_cnt
        stale = self.stale
        for b in blocks:
            if ref_cnt[b] == 0:
                self.num_free -= 1
                # Hits are cached blocks, whose entries are in ``back``; a
                # block without a hash may be at the front (a search, but
                # the scheduler never touches one).
                if b in self.hash_of_block or b not in self.front:
                    stale[b] = stale.get(b, 0) + 1
                else:
                    self.front.remove(b)
            ref_cnt[b] += 1

    def free_blocks(self, ordered_blocks: Iterable[int]) -> None:
        """Drop one reference from each block, in eviction order (first evicted
        first). Blocks reaching zero go back to the free queue: cached ones to
        the back (in the given order), the others to the front (the first
        given ends up first)."""
        ref_cnt = self.ref_cnt
        hashed = self.hash_of_block
        back = self.back
        evict_first: list[int] = []
        freed = 0
        # Request tables never hold the null block (one full-attention group).
        # With caching off no block carries a hash, so all go to the front.
        for b in ordered_blocks:
            n = ref_cnt[b] - 1
            ref_cnt[b] = n
            if n == 0:
                freed += 1
                if b in hashed:
                    back.append(b)
                else:
                    evict_first.append(b)
        if evict_first:
            evict_first.reverse()
            self.front += evict_first
        self.num_free += freed

    def free_table(self, blocks: list[int], num_hashed: int) -> None:
        """``free_blocks(reversed(blocks))`` for a request's block table whose
        cached blocks are exactly its first ``num_hashed`` (the KV cache
        manager's invariant): those go to the back, the rest to the front,
        by position instead of by a lookup per block."""
        ref_cnt = self.ref_cnt
        size = len(blocks)
        # The references first, counting the blocks they free; then the
        # blocks move in one slice when all of them are freed (the usual
        # case: nothing shared), which spares boxing each block id again
        # (mypyc holds them unboxed).
        tail_freed = 0
        for i in range(num_hashed, size):
            b = blocks[i]
            n = ref_cnt[b] - 1
            ref_cnt[b] = n
            if not n:
                tail_freed += 1
        head_freed = 0
        for i in range(num_hashed):
            b = blocks[i]
            n = ref_cnt[b] - 1
            ref_cnt[b] = n
            if not n:
                head_freed += 1
        # The uncached tail to the front, pushed in table order (the last on
        # top); the cached head to the back, last block first.
        if tail_freed == size - num_hashed:
            self.front += blocks[num_hashed:]
        elif tail_freed:
            self.front += [b for b in blocks[num_hashed:] if not ref_cnt[b]]
        if head_freed == num_hashed:
            self.back += blocks[num_hashed - 1::-1] if num_hashed else []
        elif head_freed:
            self.back += [b for b in blocks[num_hashed - 1::-1] if not ref_cnt[b]]
        self.num_free += tail_freed + head_freed

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

    def uncache_blocks(self, blocks: Iterable[int]) -> None:
        """Forget the hashes of held blocks (vLLM's evict_blocks; in any
        order: a hash's remaining blocks keep their order)."""
        for b in blocks:
            h = self.hash_of_block.pop(b, None)
            if h is not None:
                self._evict(b, h)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only possible when no block is in use."""
        if self.num_free != self.num_gpu_blocks - 1:
            return False
        self.cached.clear()
        self.dup_cached.clear()
        self.hash_of_block.clear()
        return True

    # -- checking -------------------------------------------------------------
    def check_invariants(self) -> None:
        n = self.num_gpu_blocks
        queue = self.free_queue
        free = set(queue)
        assert len(free) == len(queue) == self.num_free, "a block is queued twice or miscounted"
        assert NULL_BLOCK not in free, "the null block is never free"
        assert len(free) <= n - 1
        assert all(v > 0 for v in self.stale.values()), "a zero stale count"
        assert self.hash_of_block.keys().isdisjoint(self.front), "a block with a hash at the front"
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
