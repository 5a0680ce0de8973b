"""Per-request KV block tables on top of the block pool, with prefix caching.

Semantics follow vLLM 0.33's KVCacheManager for one full-attention group:
a prefix hit covers whole cached blocks and never the last token of the
sequence (its logits are needed); a block is cached as soon as it is allocated
full, so identical prompts admitted in one step share blocks; cached blocks
are evicted only when a new block is needed.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice

from kvsched.config import CacheConfig
from kvsched.core.block_pool import PRIVATE_KEY_BASE, BlockPool
from kvsched.request import MultiModalFeature, Request, TokenRuns

try:  # mypy's helper: only the compiled build (setup.py) reads its flags
    from mypy_extensions import mypyc_attr
except ImportError:
    from kvsched.core.no_mypyc import mypyc_attr

# Seed of the hash chain: the "parent" of a request's first block.
_ROOT_HASH = hash("kvsched-prefix-root")
_NO_BLOCKS: list[int] = []
# Private requests' keys (see KVCacheManager._private_keys): 2**40 blocks per
# request, far beyond any max_model_len.
_PRIVATE_KEY_SPAN = 1 << 40
# ``num_cached`` of a popped table with holes (KVCacheManager.holed): freeing
# it looks each block's hash up instead of splitting the table by position.
_HOLED = -1


@dataclass(slots=True)
class PrefixCacheStats:
    """Token counts at admission, split as vLLM splits them: first admissions
    versus re-admissions after a preemption."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0


# The hybrid manager (kvsched.core.hybrid_kv_cache, interpreted) subclasses
# it: the compiled build must allow that.
@mypyc_attr(allow_interpreted_subclasses=True)
class KVCacheManager:
    __slots__ = ("block_size", "max_model_len", "enable_caching", "block_pool",
                 "req_to_blocks", "num_cached_block", "prefix_cache_stats", "num_private",
                 "holed")

    def __init__(self, cache_config: CacheConfig, max_model_len: int) -> None:
        self.block_size = cache_config.block_size
        self.max_model_len = max_model_len
        self.enable_caching = cache_config.enable_prefix_caching
        self.block_pool = BlockPool(cache_config.num_gpu_blocks, self.enable_caching)
        self.req_to_blocks: dict[str, list[int]] = {}
        # Number of leading blocks of a request already registered in the
        # prefix cache (only tracked while prefix caching is on).
        self.num_cached_block: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()
        self.num_private = 0  # private requests given keys so far
        # Requests among whose first num_cached_block blocks some lost their
        # hash: a failed KV load's blocks, evicted by id (evict_blocks), that
        # the table shares. Empty unless a connector fails a load under the
        # fail policy; only free() treats these tables apart.
        self.holed: set[str] = set()

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def min_blocks_to_hold(self, num_tokens: int) -> int:
        """The fewest blocks a request must hold at once to reach
        ``num_tokens`` tokens of KV (a request needing more than the pool
        could never run)."""
        return -(-num_tokens // self.block_size)

    # -- hashing --------------------------------------------------------------
    def block_hashes(self, request: Request, num_blocks: int) -> Sequence[int]:
        """The request's prefix-cache keys: chained hashes of its full blocks,
        extended to ``num_blocks`` blocks. Hashes are computed lazily: tokens
        only ever get appended, so a hash once computed stays valid. A
        private request gets its keys by position instead (_private_keys)."""
        hashes = request.block_hashes
        start = len(hashes)
        if start >= num_blocks:
            return hashes
        if request.private:
            hashes = request.block_hashes = self._private_keys()
            return hashes
        if not start:
            hashes = request.block_hashes = []
        assert isinstance(hashes, list)
        bs = self.block_size
        tokens = request.all_token_ids
        # vLLM hashes the LoRA adapter into every block: requests with
        # different adapters (or an adapter and the base model) share nothing.
        parent = hashes[-1] if start else (
            hash((_ROOT_HASH, "lora", request.lora_id)) if request.lora_id else _ROOT_HASH)
        if request.mm_features:
            return _extend_mm_hashes(hashes, parent, tokens, request.mm_features, start, num_blocks, bs)
        # Chain over each block's content hash. Runs of identical blocks
        # (a long run of one token) reuse the content hash of the last.
        append = hashes.append
        if type(tokens) is TokenRuns:
            # A block inside one run comes as its token: hash the tuple it
            # stands for (the same value as hashing the expanded block).
            last: int | list[int] | None = None
            content = 0
            for block in tokens.block_contents(start, num_blocks - start, bs):
                if block != last:
                    last = block
                    content = hash((block,) * bs if isinstance(block, int) else tuple(block))
                parent = hash((parent, content))
                append(parent)
            return hashes
        last_block: list[int] | None = None
        content = 0
        for i in range(start * bs, num_blocks * bs, bs):
            block_tokens = tokens[i:i + bs]
            if block_tokens != last_block:
                last_block = block_tokens
                content = hash(tuple(block_tokens))
            parent = hash((parent, content))
            append(parent)
        return hashes

    def _private_keys(self) -> range:
        """Prefix-cache keys for a private request's blocks: block ``i`` is
        ``base + i``, ``base`` unique to the request in this manager.

        Why this is the same cache: a private request's chained hashes differ
        from every other request's (its first block is nobody else's and the
        chain carries it) and from each other (different chain lengths), as
        the cache already assumes of distinct contents. These keys do too:
        disjoint ranges per request, and all at or above 2**64 while hash()
        values are below 2**63 in magnitude. Equal key <=> equal hash for
        every pair of blocks, so every lookup, insertion and eviction goes
        exactly as with the hashes, minus the hashing."""
        base = PRIVATE_KEY_BASE + self.num_private * _PRIVATE_KEY_SPAN
        self.num_private += 1
        return range(base, base + _PRIVATE_KEY_SPAN)

    # -- admission --------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Longest run of cached full blocks from the start of the sequence,
        leaving at least the last token to compute. Touches nothing."""
        if not self.enable_caching:
            return _NO_BLOCKS, 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        if max_blocks == 0:
            return _NO_BLOCKS, 0
        cached = self.block_pool.cached
        hits: list[int] = []
        for h in islice(self.block_hashes(request, max_blocks), max_blocks):
            block = cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        if not self.enable_caching:
            return
        stats = self.prefix_cache_stats
        if request.num_preemptions > 0:
            stats.preempted_requests += 1
            stats.preempted_queries += request.num_tokens
            stats.preempted_hits += num_hits
        else:
            stats.requests += 1
            stats.queries += request.num_tokens
            stats.hits += num_hits

    def num_blocks_needed(self, request: Request, num_new_tokens: int,
                          new_computed_blocks: list[int] = _NO_BLOCKS,
                          full_sequence: bool = False) -> int:
        """Free blocks ``allocate_slots`` would need (for explanations)."""
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        if full_sequence:
            num_tokens = min(request.num_tokens, self.max_model_len)
        else:
            num_tokens = min(num_computed + num_new_tokens, self.max_model_len)
        return self._num_blocks_to_allocate(request, num_tokens, new_computed_blocks)

    def _num_blocks_to_allocate(self, request: Request, num_tokens: int,
                                new_computed_blocks: list[int]) -> int:
        blocks = self.req_to_blocks.get(request.request_id, _NO_BLOCKS)
        have = len(blocks) + len(new_computed_blocks)
        need = -(-num_tokens // self.block_size) - have
        if need < 0:
            need = 0
        if new_computed_blocks:
            # Hit blocks sitting in the free queue leave it when touched.
            ref_cnt = self.block_pool.ref_cnt
            need += sum(1 for b in new_computed_blocks if ref_cnt[b] == 0)
        return need

    # -- allocation -----------------------------------------------------------
    def allocate_slots(self, request: Request, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: list[int] = _NO_BLOCKS,
                       full_sequence_must_fit: bool = False,
                       num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False,
                       reserved_blocks: int = 0) -> list[int] | None:
        """Give ``request`` KV slots for ``num_new_tokens`` more tokens, after
        adopting ``new_computed_blocks`` (a prefix hit). Returns the newly
        allocated block ids, or None (changing nothing) if the pool is short.

        ``full_sequence_must_fit`` (vLLM's scheduler_reserve_full_isl) also
        requires room for the whole current sequence, not just this chunk.
        ``num_lookahead_tokens``: slots past the new tokens for a drafter's
        own positions (speculative decoding with a drafter model). Only
        known tokens are cached: drafts and async placeholders are not.
        KV connector: ``num_external_computed_tokens`` past the hit are
        loaded by the connector (fresh blocks, counted as computed);
        ``delay_cache_blocks`` leaves the new blocks out of the prefix cache
        (an asynchronous load fills them later); ``reserved_blocks`` of the
        free ones must stay free for other in-flight prefills.
        """
        bs = self.block_size
        max_model_len = self.max_model_len
        rid = request.request_id
        blocks = self.req_to_blocks.get(rid)
        num_blocks = len(blocks) if blocks is not None else 0
        num_computed = request.num_computed_tokens + num_new_computed_tokens + num_external_computed_tokens
        if num_computed > max_model_len:
            num_computed = max_model_len
        pool = self.block_pool
        num_free = pool.num_free

        if new_computed_blocks:
            have = num_blocks + len(new_computed_blocks)
            ref_cnt = pool.ref_cnt
            num_evictable = sum(1 for b in new_computed_blocks if ref_cnt[b] == 0)
        else:
            have = num_blocks
            num_evictable = 0

        if full_sequence_must_fit:
            full = request.num_tokens
            if full > max_model_len:
                full = max_model_len
            need = -(-full // bs) - have
            if (need if need > 0 else 0) + num_evictable > num_free:
                return None

        num_tokens = num_computed + num_new_tokens + num_lookahead_tokens
        if num_tokens > max_model_len:
            num_tokens = max_model_len
        need = -(-num_tokens // bs) - have
        if need < 0:
            need = 0
        if need + num_evictable > num_free - reserved_blocks:
            return None

        if blocks is None:
            blocks = self.req_to_blocks[rid] = []
        if new_computed_blocks:
            pool.touch(new_computed_blocks)
            blocks.extend(new_computed_blocks)
            self.num_cached_block[rid] = len(blocks)
        new_blocks = pool.get_new_blocks(need) if need else _NO_BLOCKS
        if new_blocks:
            blocks.extend(new_blocks)

        if self.enable_caching and not delay_cache_blocks:
            num_full = num_computed + num_new_tokens
            total = request.num_tokens
            if num_full > total:
                num_full = total
            num_full //= bs
            num_cached = self.num_cached_block.get(rid, 0)
            if num_full > num_cached:
                self.cache_full_blocks(request, blocks, num_cached, num_full)
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Register the full blocks among the first ``num_tokens`` tokens
        (all known) in the prefix cache: after a step whose drafts or
        placeholders kept ``allocate_slots`` from caching them."""
        if not self.enable_caching:
            return
        rid = request.request_id
        # Only known tokens' blocks have a hash (vLLM caps at the request's
        # block hashes): computed tokens can run ahead of the known ones, as
        # after a KV load recomputed while drafts were in flight.
        if num_tokens > request.num_tokens:
            num_tokens = request.num_tokens
        num_full = num_tokens // self.block_size
        num_cached = self.num_cached_block.get(rid, 0)
        if num_full > num_cached:
            self.cache_full_blocks(request, self.req_to_blocks[rid], num_cached, num_full)

    def cache_full_blocks(self, request: Request, blocks: list[int],
                          num_cached: int, num_full: int) -> None:
        """Register blocks ``num_cached .. num_full - 1`` of ``request`` in the prefix cache.

        A private request's blocks are only counted here: no other request
        can ever look them up, and the request itself only when it is
        re-admitted after a preemption, so ``free`` registers them then.
        Until then an entry would change nothing: a held block is not in the
        free queue (no eviction), and ``free`` puts the counted blocks at the
        back of the queue whether they carry an entry or not."""
        if not request.private:
            hashes = self.block_hashes(request, num_full)
            self.block_pool.cache_blocks(blocks[num_cached:num_full], hashes[num_cached:num_full])
        self.num_cached_block[request.request_id] = num_full

    def append_new_blocks(self, request_ids: Sequence[str]) -> None:
        """Take ``len(request_ids)`` blocks from the front of the free queue,
        in order, and append the i-th to the table of ``request_ids[i]``
        (a decode stretch's allocations, in stepping order; the caller
        checked they fit)."""
        if not request_ids:
            return
        req_to_blocks = self.req_to_blocks
        for rid, block in zip(request_ids, self.block_pool.get_new_blocks(len(request_ids))):
            req_to_blocks[rid].append(block)

    def cache_in_bulk(self, requests: Sequence[Request], num_full: Sequence[int],
                      new_block_owners: Sequence[str]) -> bool:
        """A decode stretch's allocations (``append_new_blocks(new_block_owners)``)
        and registrations (``requests[i]``'s first ``num_full[i]`` blocks)
        in one go: valid when none of the hashes registered is cached yet
        and none repeats, for evictions and insertions then touch disjoint
        entries and their order cannot matter. Returns False, having done
        nothing, otherwise (the caller replays them one by one)."""
        num_cached_block = self.num_cached_block
        pending: list[tuple[Request, int, int]] = []
        private: list[tuple[Request, int, int]] = []
        new_hashes: list[int] = []
        for request, full in zip(requests, num_full):
            num_cached = num_cached_block.get(request.request_id, 0)
            if full > num_cached:
                if request.private:
                    # No entries to make (cache_full_blocks only counts a
                    # private request's blocks): no keys to build.
                    private.append((request, num_cached, full))
                    continue
                new_hashes.extend(self.block_hashes(request, full)[num_cached:full])
                pending.append((request, num_cached, full))
        pool = self.block_pool
        if not pool.cached.keys().isdisjoint(new_hashes) or len(set(new_hashes)) != len(new_hashes):
            return False
        self.append_new_blocks(new_block_owners)
        req_to_blocks = self.req_to_blocks
        new_blocks: list[int] = []
        for request, num_cached, full in pending:
            new_blocks.extend(req_to_blocks[request.request_id][num_cached:full])
            num_cached_block[request.request_id] = full
        pool.cache_new_blocks(new_blocks, new_hashes)
        for request, num_cached, full in private:
            self.cache_full_blocks(request, req_to_blocks[request.request_id], num_cached, full)
        return True

    def free(self, request: Request) -> None:
        """Release a request's blocks, tail first, so its prefix is evicted
        last. Its first ``num_cached_block`` blocks are exactly its cached
        ones (registered, or counted for a private request), unless some
        lost their hash (``holed``)."""
        rid = request.request_id
        blocks = self.req_to_blocks.pop(rid, None)
        num_cached = self.num_cached_block.pop(rid, 0)
        if self.holed and rid in self.holed:
            self.holed.discard(rid)
            self.free_popped(blocks or [], _HOLED)
            return
        if blocks:
            if request.private and num_cached and not request.is_finished():
                # Preempted: re-admitted, it looks its blocks up (see cache_full_blocks).
                self._register_private(request, blocks, num_cached)
            self.block_pool.free_table(blocks, num_cached)

    def _register_private(self, request: Request, blocks: list[int], num_cached: int) -> None:
        """Register the counted blocks of a private request that have no
        entry yet, in block order (as registering each when it filled would
        have: an older entry under the same key, from before an earlier
        preemption, stays first)."""
        keys = self.block_hashes(request, num_cached)
        hash_of_block = self.block_pool.hash_of_block
        todo = [i for i in range(num_cached) if blocks[i] not in hash_of_block]
        if todo:
            self.block_pool.cache_blocks([blocks[i] for i in todo], [keys[i] for i in todo])

    def pop_blocks_for_free(self, request: Request) -> tuple[list[int], int]:
        """Take a request's blocks (and how many lead its table cached) out of
        its table without freeing them: a consumer KV connector under async
        scheduling returns them to the pool (``free_popped``) only once the
        batches that may still write them are processed."""
        rid = request.request_id
        blocks = self.req_to_blocks.pop(rid, None) or []
        num_cached = self.num_cached_block.pop(rid, 0)
        if self.holed and rid in self.holed:
            self.holed.discard(rid)
            num_cached = _HOLED
        return blocks, num_cached

    def free_popped(self, blocks: list[int], num_cached: int) -> None:
        """Free blocks taken by ``pop_blocks_for_free``, tail first. A table
        with holes goes block by block, each to the queue's back if it still
        has its hash, else to the front (as vLLM's free_blocks decides)."""
        if not blocks:
            return
        if num_cached == _HOLED:
            self.block_pool.free_blocks(reversed(blocks))
        else:
            self.block_pool.free_table(blocks, num_cached)

    def popped_after_eviction(self, blocks: list[int], num_cached: int, block_ids: set[int]) -> int:
        """The ``num_cached`` to free blocks popped by ``pop_blocks_for_free``
        with, once ``block_ids`` were evicted before they went back: vLLM
        looks each block's hash up when it frees them, so a counted block
        that lost its hash makes the table holed. (A private request's
        blocks are only ever evicted while it runs, before they are popped.)"""
        if num_cached > 0 and not block_ids.isdisjoint(blocks[:num_cached]):
            return _HOLED
        return num_cached

    def evict_blocks(self, block_ids: set[int], requests: Mapping[str, Request]) -> None:
        """Drop blocks from the prefix cache by id (vLLM's evict_blocks: a KV
        load into them failed under the ``fail`` policy); their holders keep
        them. As in vLLM no table's ``num_cached_block`` changes, so a table
        sharing them (a local prefix hit) keeps its later blocks cached and
        never caches these again: it is ``holed`` until freed. A private
        request's blocks are nobody else's and only its own failure evicts
        them, its tail from its first failed block: its count is cut there
        (free() puts its counted blocks at the back, entry or not)."""
        self.block_pool.uncache_blocks(block_ids)
        num_cached_block = self.num_cached_block
        for rid, blocks in self.req_to_blocks.items():
            num_cached = num_cached_block.get(rid, 0)
            first = next((i for i in range(num_cached) if blocks[i] in block_ids), None)
            if first is None:
                continue
            if requests[rid].private:
                assert block_ids.issuperset(blocks[first:num_cached]), f"{rid}: evicted mid-table"
                num_cached_block[rid] = first
            else:
                self.holed.add(rid)

    def get_block_ids(self, request_id: str) -> list[int]:
        return list(self.req_to_blocks.get(request_id, _NO_BLOCKS))

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    def check_invariants(self, live_request_ids: set[str] | None = None,
                         private_ids: Container[str] = ()) -> None:
        pool = self.block_pool
        pool.check_invariants()
        owners = [0] * pool.num_gpu_blocks
        for rid, blocks in self.req_to_blocks.items():
            assert len(set(blocks)) == len(blocks), f"{rid} holds a block twice"
            for b in blocks:
                owners[b] += 1
            if live_request_ids is not None:
                assert rid in live_request_ids, f"blocks held by unknown request {rid}"
        for b in range(1, pool.num_gpu_blocks):
            assert owners[b] == pool.ref_cnt[b], (
                f"block {b}: ref_cnt {pool.ref_cnt[b]} but {owners[b]} tables hold it")
        for rid, n in self.num_cached_block.items():
            assert n <= len(self.req_to_blocks.get(rid, ())), f"{rid} caches more blocks than it holds"
        # free() relies on it: a table's cached blocks are its first
        # num_cached_block (a private request's may lack their entry; a
        # holed one's lost some).
        hashed = pool.hash_of_block
        assert self.holed <= self.req_to_blocks.keys(), "a freed request is still holed"
        for rid, blocks in self.req_to_blocks.items():
            n = self.num_cached_block.get(rid, 0)
            assert not any(b in hashed for b in blocks[n:]), f"{rid} has a cached block past {n}"
            assert rid in private_ids or rid in self.holed or all(b in hashed for b in blocks[:n]), (
                f"{rid}: one of its first {n} blocks is not cached")
        in_use = sum(1 for b in range(1, pool.num_gpu_blocks) if pool.ref_cnt[b] > 0)
        assert in_use + pool.get_num_free_blocks() == pool.num_gpu_blocks - 1, "blocks lost"


def mm_block_keys(features: Sequence[MultiModalFeature], start: int,
                  end: int) -> tuple[tuple[str, str, int], ...]:
    """The multimodal part of the prefix-cache key of the block of positions
    [start, end): each item whose placeholder range overlaps the block, by
    its identifier and its offset relative to the block start (vLLM's
    _gen_mm_extra_hash_keys). So equal tokens with different images, or the
    same image at another place in the block, never share a block."""
    return tuple(("mm", f.identifier, f.offset - start) for f in features
                 if f.offset < end and start < f.offset + f.length)


def _extend_mm_hashes(hashes: list[int], parent: int, tokens: Sequence[int],
                      features: Sequence[MultiModalFeature], start: int, num_blocks: int,
                      bs: int) -> list[int]:
    """block_hashes for a prompt with multimodal items: a block an item
    overlaps mixes mm_block_keys into its content; the others hash as text."""
    for b in range(start, num_blocks):
        lo = b * bs
        keys = mm_block_keys(features, lo, lo + bs)
        block = tuple(tokens[lo:lo + bs])
        parent = hash((parent, hash((block, keys)) if keys else hash(block)))
        hashes.append(parent)
    return hashes
