"""vLLM's hybrid KV cache: one block pool shared by several KV cache groups
(full attention, sliding window, chunked local attention, Mamba state), one
per-group manager each, and the coordinator that reconciles their prefix hits.

The rules are vLLM 0.34's (identical in 0.33): ``KVCacheCoordinator`` and its
Unitary / Hybrid / NoPrefixCache variants, the ``SingleTypeKVCacheManager``
classes, and ``KVCacheManager.allocate_slots``'s order of work (free what left
the attention window, count, touch the hit, allocate, cache). Block ids are
plain ints as in ``kvsched.core.block_pool``; a table entry ``NULL_BLOCK``
stands for a block vLLM replaced by its null block (skipped tokens).

``make_kv_cache_manager`` is the one place that picks this manager or the
single full-attention ``KVCacheManager`` (the fast path every model without
``cache.kv_groups`` takes, untouched).
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass

from kvsched.config import CacheConfig, KVCacheGroup
from kvsched.core.block_pool import NULL_BLOCK, BlockPool
from kvsched.core.kv_cache_manager import KVCacheManager, PrefixCacheStats
from kvsched.errors import UserInputError
from kvsched.request import Request

# The default "no hit" argument (never mutated).
_NO_BLOCKS: list[int] = []
_FULL = "full_attention"
_SWA = "sliding_window"
_CHUNKED = "chunked_local_attention"
_MAMBA = "mamba"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True, frozen=True)
class BlockSizes:
    """vLLM's resolve_kv_cache_block_sizes for a list of groups: the
    scheduler's granularity (the LCM of the group block sizes) and the
    prefix-cache hash granularity (the GCD of the cacheable groups' sizes,
    or the scheduler's when nothing hashes finer)."""

    scheduler_block_size: int
    hash_block_size: int


def resolve_block_sizes(cache_config: CacheConfig) -> BlockSizes:
    """The one owner of vLLM's block-size resolution for kvsched
    (``kv_cache_utils.resolve_kv_cache_block_sizes``; no DCP, no
    prefix_match_unit override). One group: its block size for both."""
    groups = cache_config.kv_groups
    if len(groups) <= 1:
        bs = groups[0].block_size if groups else cache_config.block_size
        return BlockSizes(bs, bs)
    sizes = [g.block_size for g in groups]
    scheduler = math.lcm(*sizes)
    if not cache_config.enable_prefix_caching:
        return BlockSizes(scheduler, scheduler)
    # A Mamba group outside "align" mode cannot be hashed finer than the
    # scheduler's block: vLLM backs off to the scheduler block size.
    if any(g.kind == _MAMBA and mamba_cache_mode(cache_config) != "align" for g in groups):
        return BlockSizes(scheduler, scheduler)
    return BlockSizes(scheduler, math.gcd(*sizes))


def mamba_cache_mode(cache_config: CacheConfig) -> str:
    """vLLM's resolved --mamba-cache-mode (MambaModelConfig): prefix caching
    turns "none" into "align", no prefix caching forces "none"."""
    if not cache_config.enable_prefix_caching:
        return "none"
    return "align"


def needs_mamba_block_aligned_split(cache_config: CacheConfig) -> bool:
    """vLLM's Scheduler.need_mamba_block_aligned_split: a Mamba group in
    "align" mode (prefix caching on) cuts prefill chunks at block boundaries."""
    return any(g.kind == _MAMBA for g in cache_config.kv_groups) and mamba_cache_mode(cache_config) == "align"


def mamba_checkpoint_alignment(cache_config: CacheConfig) -> int | None:
    """What vLLM's scheduler reads to let a final prefill chunk run past the
    last cacheable boundary (``mamba_prefill_checkpoint_alignment`` when
    ``mamba_has_prefill_checkpoint_blocks``): the first Mamba group's
    ``prefill_checkpoint_alignment`` when every Mamba group keeps a prefill
    checkpoint block, else None (no internal checkpoint)."""
    mamba = [g for g in cache_config.kv_groups if g.kind == _MAMBA]
    if not mamba or any(g.num_prefill_checkpoint_blocks <= 0 for g in mamba):
        return None
    return mamba[0].prefill_checkpoint_alignment


def mamba_checkpoint_position(num_tokens: int, block_size: int) -> int:
    """vLLM's get_mamba_prefill_checkpoint_position (no EAGLE, no lookahead
    hashes): the last ``block_size`` boundary before the last token, which
    a hit always recomputes."""
    return max((num_tokens - 1) // block_size * block_size, 0)


def mamba_checkpoint_valid(query_start: int, query_end: int, position: int, block_size: int,
                           alignment: int | None) -> bool:
    """vLLM's is_mamba_prefill_checkpoint_valid with the hash block equal to
    the Mamba block (kvsched's align mode): the backend can export the state
    at ``position`` from inside the chunk [query_start, query_end) into a
    column past the one it reads its initial state from."""
    if alignment is None:
        return False
    initial_state_col = (query_start - 1) // block_size
    checkpoint_col = _cdiv(query_end, block_size) - 2
    return (query_start % block_size == 0 and checkpoint_col > initial_state_col
            and query_start + block_size <= position and query_start < position < query_end
            and (position - query_start) % alignment == 0)


def mamba_block_aligned_split(request: Request, num_new_tokens: int, num_new_computed_tokens: int,
                              block_size: int, max_prefill_tokens: int, junction: int,
                              checkpoint_alignment: int | None = None) -> int:
    """vLLM's Scheduler._mamba_block_aligned_split (no EAGLE, no finer hashes):
    a prefill chunk ends on a block boundary (the state is written at chunk
    ends) and never runs past the last cacheable boundary or the
    shared-prefix junction. ``max_prefill_tokens`` is the token budget
    capped by the long-prefill threshold; ``junction`` the request's
    shared-prefix boundary; ``checkpoint_alignment`` what
    :func:`mamba_checkpoint_alignment` gives (None: no prefill checkpoint
    blocks): a chunk reaching the end of the prefill whose backend exports
    the last boundary's state internally is not stopped there."""
    start = request.num_computed_tokens + num_new_computed_tokens
    # Replaying output tokens after a preemption is prefill too.
    prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
    if start >= prefill_end:
        return num_new_tokens
    # The last boundary whose state can be cached: the last token is recomputed.
    last_cache_position = mamba_checkpoint_position(request.num_tokens, block_size)
    end = start + num_new_tokens
    internal_checkpoint = (
        checkpoint_alignment is not None and end >= prefill_end
        and mamba_checkpoint_valid(start, end, mamba_checkpoint_position(prefill_end, block_size),
                                   block_size, checkpoint_alignment))
    if internal_checkpoint:
        # The backend writes that state mid-chunk: no need to stop there.
        last_cache_position = 0
    if end < prefill_end:
        aligned_end = end // block_size * block_size
        # A block wider than any chunk advances mid-block until the next boundary.
        if aligned_end > start or block_size <= max_prefill_tokens:
            end = aligned_end
    next_block_boundary = (start // block_size + 1) * block_size
    junction_stop = start + (junction - start) // block_size * block_size
    stops = (next_block_boundary if start % block_size and not internal_checkpoint else 0,
             last_cache_position, junction_stop if start < junction < end else 0)
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)


def is_hybrid(cache_config: CacheConfig) -> bool:
    """True when vLLM's KV cache is not the single full-attention group of
    ``block_size`` that ``KVCacheManager`` models."""
    groups = cache_config.kv_groups
    return bool(groups) and not (len(groups) == 1 and groups[0].kind == _FULL
                                 and groups[0].block_size == cache_config.block_size)


def check_hybrid_config(cache_config: CacheConfig) -> None:
    """Refuse the hybrid layouts kvsched does not model yet, naming the key
    and the fix (never a silent approximation)."""
    groups = cache_config.kv_groups
    retention = cache_config.prefix_cache_retention_interval
    sparse = any(g.kind in (_SWA, _MAMBA) for g in groups)
    if retention is not None and retention != 0 and not sparse:
        raise UserInputError(
            f"cache.prefix_cache_retention_interval={retention}: it only applies to sliding-window "
            "and Mamba groups and this cache has none (vLLM refuses it); set it to 0 or drop it")
    if not groups:
        return
    scheduler_block = resolve_block_sizes(cache_config).scheduler_block_size
    if sparse and retention is not None and retention % scheduler_block:
        raise UserInputError(
            f"cache.prefix_cache_retention_interval={retention}: must be a multiple of the "
            f"scheduler block size {scheduler_block} (vLLM's rule); round it to one")
    if cache_config.block_size != resolve_block_sizes(cache_config).scheduler_block_size:
        raise UserInputError(
            f"cache.block_size={cache_config.block_size}: with cache.kv_groups it is vLLM's "
            "scheduler block size, the least common multiple of the groups' block sizes "
            f"({resolve_block_sizes(cache_config).scheduler_block_size}); set it to that")
    sizes = resolve_block_sizes(cache_config)
    if cache_config.hash_block_size is not None and cache_config.hash_block_size != sizes.hash_block_size:
        raise UserInputError(
            f"cache.hash_block_size={cache_config.hash_block_size}: vLLM hashes these groups every "
            f"{sizes.hash_block_size} tokens (the GCD of their block sizes; prefix_match_unit "
            f"overrides are not modelled); drop it or set it to {sizes.hash_block_size}")
    mode = mamba_cache_mode(cache_config)
    if cache_config.mamba_cache_mode is not None and cache_config.mamba_cache_mode != mode:
        raise UserInputError(
            f"cache.mamba_cache_mode={cache_config.mamba_cache_mode!r}: vLLM resolves it to {mode!r} "
            f"with enable_prefix_caching={cache_config.enable_prefix_caching} (prefix caching "
            "needs 'align', none forces 'none'); drop it or set it to that")
    for g in groups:
        if g.kind == _MAMBA and mode == "align" and any(o.block_size != g.block_size for o in groups):
            raise UserInputError(
                "cache.kv_groups: a mamba group with prefix caching on (mamba_cache_mode 'align') "
                "beside groups of other block sizes (vLLM's finer prefix hits inside a Mamba block) "
                "is not modelled yet; give every group the mamba group's block_size")
        if g.kind == _CHUNKED and cache_config.enable_prefix_caching and len(groups) > 1 \
                and g.block_size != sizes.scheduler_block_size:
            raise UserInputError(
                f"cache.kv_groups: a chunked_local_attention group of block_size {g.block_size} "
                f"beside groups of other block sizes (scheduler block {sizes.scheduler_block_size}): "
                "vLLM refuses it (different block sizes are not compatible with chunked local "
                "attention); give every group the same block_size")


class _GroupManager:
    """One KV cache group's block tables (vLLM's SingleTypeKVCacheManager):
    the base rules, which full attention uses as they are."""

    __slots__ = ("group_id", "spec", "block_size", "pool", "caching", "tables", "num_cached_block",
                 "admission_cap", "alignment_tokens", "hash_scale")

    def __init__(self, group_id: int, spec: KVCacheGroup, pool: BlockPool, caching: bool,
                 admission_cap: int | None, alignment_tokens: int, hash_block_size: int) -> None:
        self.group_id = group_id
        self.spec = spec
        self.block_size = spec.block_size
        self.pool = pool
        self.caching = caching
        self.tables: dict[str, list[int]] = {}
        # Leading blocks of a table already registered in the prefix cache
        # (or skipped as null). Its presence marks a request vLLM treats as
        # running: a request gets an entry when it adopts a hit or caches a
        # block, and never sees a new hit after that.
        self.num_cached_block: dict[str, int] = {}
        # Sliding window / chunked local: vLLM's per-request admission cap
        # (max_admission_blocks_per_request), applied by the full-sequence gate.
        self.admission_cap = admission_cap
        # Token multiple a prefix hit must land on (vLLM's
        # cache_hit_alignment_tokens: the scheduler block size).
        self.alignment_tokens = alignment_tokens
        # Hash blocks per block of this group: its i-th block's key is the
        # chained hash that ends with it.
        self.hash_scale = spec.block_size // hash_block_size

    # -- rules a kind overrides ------------------------------------------------
    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens attention no longer reads (their blocks are freed)."""
        return 0

    def find_longest_cache_hit(self, keys: list[list[int]], gids: list[int], max_length: int,
                               alignment: int) -> tuple[list[list[int]], int]:
        """Full attention: the cached run from the first block, rounded down
        to ``alignment`` tokens. ``keys[i]`` is block ``i``'s key per group of
        the bucket ``gids``; a block hits when every group has it."""
        bs = self.block_size
        found: list[list[int]] = [[] for _ in gids]
        cached = self.pool.cached
        for i in range(min(max_length // bs, len(keys))):
            hit = [cached.get(k) for k in keys[i]]
            if any(b is None for b in hit):
                break
            for lst, b in zip(found, hit):
                assert b is not None
                lst.append(b)
        hit_length = len(found[0]) * bs
        hit_length -= hit_length % alignment
        n = _cdiv(hit_length, bs)
        for lst in found:
            del lst[n:]
        return found, hit_length

    def reachable_mask(self, start: int, end: int, retention: int | None,
                       boundaries: Sequence[int]) -> list[bool] | None:
        """Which of blocks ``start .. end - 1`` enter the prefix cache (None:
        all); only sparse kinds leave some out."""
        return None

    # -- the shared rules ----------------------------------------------------------
    def num_blocks_to_allocate(self, rid: str, num_tokens: int, hit: list[int],
                               total_computed: int, apply_cap: bool, num_tokens_main: int,
                               prefill_end: int = 0, record: bool = False) -> int:
        """Blocks this group would take (``num_tokens_main``: the tokens
        without a drafter's lookahead slots; ``prefill_end`` and ``record``:
        vLLM's prefill_end and "this count precedes the allocation", both
        read by Mamba's prefill checkpoint only)."""
        required = _cdiv(num_tokens, self.block_size)
        if apply_cap and self.admission_cap is not None and required > self.admission_cap:
            required = self.admission_cap
        held = len(self.tables.get(rid, ()))
        if rid in self.num_cached_block:
            return max(required - held, 0)
        skipped = self.num_skipped_tokens(total_computed) // self.block_size
        need = max(required - max(skipped, len(hit) + held), 0)
        # Hit blocks waiting in the free queue leave it when adopted, unless
        # they fall in the skipped range (they are never adopted then).
        ref_cnt = self.pool.ref_cnt
        first = max(0, skipped - held)
        evictable = sum(1 for b in hit[first:] if b != NULL_BLOCK and ref_cnt[b] == 0)
        return need + evictable

    def add_hit(self, rid: str, hit: list[int], num_computed: int) -> None:
        """Adopt a prefix hit (a first allocation): skipped blocks become null."""
        table = self.tables.setdefault(rid, [])
        assert not table
        skipped = self.num_skipped_tokens(num_computed) // self.block_size
        adopt = hit[skipped:] if skipped > 0 else hit
        if self.caching:
            self.pool.touch([b for b in adopt if b != NULL_BLOCK])
        table.extend([NULL_BLOCK] * skipped)
        table.extend(adopt)
        self.num_cached_block[rid] = len(table)

    def allocate_new_blocks(self, rid: str, num_tokens: int, num_tokens_main: int) -> list[int]:
        table = self.tables.setdefault(rid, [])
        need = _cdiv(num_tokens, self.block_size) - len(table)
        if need <= 0:
            return []
        new = self.pool.get_new_blocks(need)
        table.extend(new)
        return new

    def remove_skipped_blocks(self, rid: str, num_computed: int) -> None:
        """Free the blocks attention no longer reads, last first, stopping at
        the first block already null (everything before it is too)."""
        skipped = self.num_skipped_tokens(num_computed)
        if skipped <= 0:
            return
        table = self.tables.get(rid)
        if table is None:
            return
        last = min(skipped // self.block_size, len(table))
        freed: list[int] = []
        for i in range(last - 1, -1, -1):
            if table[i] == NULL_BLOCK:
                break
            freed.append(table[i])
            table[i] = NULL_BLOCK
        if freed:
            self.pool.free_blocks(freed)

    def new_step_starts(self) -> None:
        """A schedule() begins (only Mamba keeps per-step state)."""

    def cache_blocks(self, request: Request, num_tokens: int, hashes: Sequence[int],
                     retention: int | None, boundaries: Sequence[int], junction: int = 0) -> None:
        """Register the full blocks among the first ``num_tokens`` (``hashes``:
        the request's chained hashes at the hash block size, all it has;
        ``boundaries`` where a later request may resume, ``junction`` the
        request's shared-prefix boundary among them, 0 if none)."""
        rid = request.request_id
        num_cached = self.num_cached_block.get(rid, 0)
        scale = self.hash_scale
        num_full = min(num_tokens, len(hashes) // scale * self.block_size) // self.block_size
        if num_cached >= num_full:
            return
        table = self.tables[rid]
        mask = self.reachable_mask(num_cached, num_full, retention, boundaries)
        blocks: list[int] = []
        keys: list[int] = []
        gid = self.group_id
        for i in range(num_cached, num_full):
            b = table[i]
            if b == NULL_BLOCK or (mask is not None and not mask[i - num_cached]):
                continue
            blocks.append(b)
            keys.append(hash((hashes[(i + 1) * scale - 1], gid)))
        if blocks:
            self.pool.cache_blocks(blocks, keys)
        self.num_cached_block[rid] = num_full

    def pop(self, rid: str) -> list[int]:
        """A request's blocks, its bookkeeping dropped (nulls left out)."""
        table = self.tables.pop(rid, [])
        self.num_cached_block.pop(rid, None)
        return [b for b in table if b != NULL_BLOCK]


class _SlidingWindowManager(_GroupManager):
    __slots__ = ("window",)

    def __init__(self, group_id: int, spec: KVCacheGroup, pool: BlockPool, caching: bool,
                 admission_cap: int | None, alignment_tokens: int, hash_block_size: int) -> None:
        super().__init__(group_id, spec, pool, caching, admission_cap, alignment_tokens, hash_block_size)
        assert spec.sliding_window is not None
        self.window = spec.sliding_window

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - self.window + 1)

    def _contiguous_blocks(self) -> int:
        # Blocks a hit needs to cover the window of the next token.
        return _cdiv(self.window - 1, self.block_size)

    def find_longest_cache_hit(self, keys: list[list[int]], gids: list[int], max_length: int,
                               alignment: int) -> tuple[list[list[int]], int]:
        """Right to left: the last run of ``_contiguous_blocks`` cached blocks
        (earlier blocks null); failing that, the cached run from block 0."""
        bs = self.block_size
        need = self._contiguous_blocks()
        max_blocks = min(max_length // bs, len(keys))
        found: list[list[int]] = [[NULL_BLOCK] * max_blocks for _ in gids]
        cached = self.pool.cached
        run = 0
        matched = False
        for i in range(max_blocks - 1, -1, -1):
            hit = [cached.get(k) for k in keys[i]]
            if all(b is not None for b in hit):
                if run == 0 and bs != alignment and ((i + 1) * bs) % alignment:
                    continue
                for lst, b in zip(found, hit):
                    assert b is not None
                    lst[i] = b
                run += 1
                if run >= need:
                    for lst in found:
                        del lst[i + run:]
                    matched = True
                    break
            else:
                run = 0
        if not matched:
            for lst in found:
                del lst[run:]
            while bs != alignment and (len(found[0]) * bs) % alignment:
                for lst in found:
                    lst.pop()
        return found, len(found[0]) * bs

    def reachable_mask(self, start: int, end: int, retention: int | None,
                       boundaries: Sequence[int]) -> list[bool] | None:
        """vLLM's SlidingWindowManager.reachable_block_mask: keep only blocks
        a later hit can use, the window-long tail before each boundary a hit
        may land on (every aligned boundary when dense, ``retention``-sized
        segments otherwise, and the replay and shared-prefix boundaries)."""
        bs = self.block_size
        alignment = self.alignment_tokens
        if alignment % bs:
            return None
        need = self._contiguous_blocks()
        mask = [False] * (end - start)
        segment = alignment if retention is None else (retention or None)
        if segment is not None:
            per_segment = segment // bs
            if need >= per_segment:
                return None
            for i in range(start, end):
                if i % per_segment >= per_segment - need:
                    mask[i - start] = True
        if retention is not None:
            for boundary in boundaries:
                edge = boundary // alignment * alignment // bs
                for j in range(max(start, edge - need), min(end, edge)):
                    mask[j - start] = True
        return mask


class _ChunkedLocalManager(_GroupManager):
    __slots__ = ("chunk",)

    def __init__(self, group_id: int, spec: KVCacheGroup, pool: BlockPool, caching: bool,
                 admission_cap: int | None, alignment_tokens: int, hash_block_size: int) -> None:
        super().__init__(group_id, spec, pool, caching, admission_cap, alignment_tokens, hash_block_size)
        assert spec.attention_chunk_size is not None
        self.chunk = spec.attention_chunk_size

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens // self.chunk * self.chunk

    def find_longest_cache_hit(self, keys: list[list[int]], gids: list[int], max_length: int,
                               alignment: int) -> tuple[list[list[int]], int]:
        """Blocks before the chunk holding position ``max_length`` count as
        hits (null); from that chunk's start, the cached run."""
        bs = self.block_size
        start = max_length // self.chunk * self.chunk // bs if max_length > 0 else 0
        found: list[list[int]] = [[NULL_BLOCK] * start for _ in gids]
        cached = self.pool.cached
        for i in range(start, min(max_length // bs, len(keys))):
            hit = [cached.get(k) for k in keys[i]]
            if any(b is None for b in hit):
                break
            for lst, b in zip(found, hit):
                assert b is not None
                lst.append(b)
        return found, len(found[0]) * bs


class _MambaManager(_GroupManager):
    """Mamba state (vLLM's MambaManager). Mode "none" (no prefix caching): only
    the state after the last computed token is kept. Mode "align" (prefix
    caching): a state block per scheduler block boundary a chunk ends on,
    the earlier ones nulled as the state moves on; the cached states are
    the hits, the last one found from the right."""

    __slots__ = ("align", "last_state_block_idx", "num_retired_blocks", "allocated",
                 "cached_this_step", "has_checkpoint_blocks", "checkpoint_alignment", "checkpoints")

    def __init__(self, group_id: int, spec: KVCacheGroup, pool: BlockPool, caching: bool,
                 admission_cap: int | None, alignment_tokens: int, hash_block_size: int) -> None:
        super().__init__(group_id, spec, pool, caching, admission_cap, alignment_tokens, hash_block_size)
        # vLLM requires "align" for prefix caching and forces "none" without.
        self.align = caching
        # Per request: the table index of the state written two steps ago
        # (freed once the next state is computed), how many leading blocks
        # are retired, whether it allocated already.
        self.last_state_block_idx: dict[str, int] = {}
        self.num_retired_blocks: dict[str, int] = {}
        self.allocated: set[str] = set()
        # Keys registered this step: a hit on one is not computed yet.
        self.cached_this_step: set[int] = set()
        # vLLM's prefill checkpoint (align mode only): a chunk may also write
        # the state of its last boundary before its end into a block of its
        # own; per request, (that position, the table index it goes to) for
        # the allocation the last count prepared (vLLM's _checkpoints).
        self.has_checkpoint_blocks = self.align and spec.num_prefill_checkpoint_blocks > 0
        self.checkpoint_alignment = spec.prefill_checkpoint_alignment
        self.checkpoints: dict[str, tuple[int, int]] = {}

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens - 1

    def new_step_starts(self) -> None:
        self.cached_this_step.clear()

    def num_blocks_to_allocate(self, rid: str, num_tokens: int, hit: list[int],
                               total_computed: int, apply_cap: bool, num_tokens_main: int,
                               prefill_end: int = 0, record: bool = False) -> int:
        if hit and self.pool.hash_of_block.get(hit[-1]) in self.cached_this_step:
            # A state another request caches this very step is written only
            # when the step runs: vLLM makes the admission fail this step.
            return self.pool.num_gpu_blocks + 1
        if not self.align:
            return super().num_blocks_to_allocate(rid, num_tokens, hit, total_computed, apply_cap,
                                                  num_tokens_main)
        # Lookahead slots are not Mamba's; one new state block per step at most,
        # two when the chunk also exports a checkpoint (vLLM's count may go
        # negative when the table is ahead: kept as is).
        need = _cdiv(num_tokens_main, self.block_size) - len(hit) - len(self.tables.get(rid, ()))
        position = 0
        if self.has_checkpoint_blocks:
            position = mamba_checkpoint_position(num_tokens_main, self.alignment_tokens)
            if not self._needs_checkpoint(rid, total_computed, num_tokens_main, position, prefill_end):
                position = 0
            if record:
                # The allocation and caching that follow read it.
                if position:
                    self.checkpoints[rid] = (position, _cdiv(num_tokens_main, self.block_size) - 2)
                else:
                    self.checkpoints.pop(rid, None)
        if need > 0:
            need = min(need, 1 + (position > 0))
        ref_cnt = self.pool.ref_cnt
        return need + sum(1 for b in hit if b != NULL_BLOCK and ref_cnt[b] == 0)

    def _needs_checkpoint(self, rid: str, query_start: int, query_end: int, position: int,
                          prefill_end: int) -> bool:
        """vLLM's _needs_internal_checkpoint: the chunk [query_start,
        query_end) reaches ``prefill_end`` (0: every chunk does), the backend
        can export ``position``'s state inside it, and the table has no
        state at that position's index yet."""
        idx = _cdiv(query_end, self.block_size) - 2
        table = self.tables.get(rid, ())
        return (query_end >= prefill_end
                and mamba_checkpoint_valid(query_start, query_end, position, self.block_size,
                                           self.checkpoint_alignment)
                and idx >= 0 and (idx >= len(table) or table[idx] == NULL_BLOCK))

    def allocate_new_blocks(self, rid: str, num_tokens: int, num_tokens_main: int) -> list[int]:
        if not self.align:
            return super().allocate_new_blocks(rid, num_tokens, num_tokens_main)
        table = self.tables.setdefault(rid, [])
        required = _cdiv(num_tokens_main, self.block_size)
        checkpoint = int(rid in self.checkpoints)
        if required <= len(table) and not checkpoint:
            self.allocated.add(rid)
            return []
        held = len(table)
        if held > 0:
            # The state the new block continues from (a hit's, or the last step's).
            self.last_state_block_idx[rid] = held - 1
        if held < required - 1:
            # Null up to the running state's block, leaving the checkpoint's
            # slot just before it for a real block.
            table.extend([NULL_BLOCK] * (required - 1 - checkpoint - held))
        new = self.pool.get_new_blocks(max(required - len(table), 0))
        table.extend(new)
        self.allocated.add(rid)
        return new

    def remove_skipped_blocks(self, rid: str, num_computed: int) -> None:
        if not self.align:
            super().remove_skipped_blocks(rid, num_computed)
            return
        table = self.tables.get(rid, [])
        skipped = num_computed - 1
        if skipped > 0:
            # Retire every state before the last computed token's, skipping
            # the null gaps prefill leaves, never twice over the same range.
            first = self.num_retired_blocks.get(rid, 0)
            last = min(skipped // self.block_size, len(table))
            if first < last:
                freed: list[int] = []
                for i in range(last - 1, first - 1, -1):
                    if table[i] != NULL_BLOCK:
                        freed.append(table[i])
                        table[i] = NULL_BLOCK
                if freed:
                    self.pool.free_blocks(freed)
                self.num_retired_blocks[rid] = last
        # The state two steps back is dead once the next one is computed.
        idx = self.last_state_block_idx.get(rid)
        if idx is not None and idx < _cdiv(num_computed, self.block_size) - 1 and table[idx] != NULL_BLOCK:
            self.pool.free_blocks([table[idx]])
            table[idx] = NULL_BLOCK

    def find_longest_cache_hit(self, keys: list[list[int]], gids: list[int], max_length: int,
                               alignment: int) -> tuple[list[list[int]], int]:
        """The rightmost cached state on an aligned boundary (nulls before it)."""
        bs = self.block_size
        cached = self.pool.cached
        for i in range(min(max_length // bs, len(keys)) - 1, -1, -1):
            hit = [cached.get(k) for k in keys[i]]
            if any(b is None for b in hit):
                continue
            if bs != alignment and ((i + 1) * bs) % alignment:
                continue
            return [[NULL_BLOCK] * i + [b] for b in hit if b is not None], (i + 1) * bs
        return [[] for _ in gids], 0

    def reachable_mask(self, start: int, end: int, retention: int | None,
                       boundaries: Sequence[int]) -> list[bool] | None:
        """vLLM's MambaManager.reachable_block_mask: a hit needs the one state
        block ending on its boundary; dense keeps all, sparse keeps one per
        ``retention`` tokens and those of the replay and junction boundaries."""
        if retention is None:
            return None
        bs = self.block_size
        mask = [False] * (end - start)
        if retention:
            per_segment = retention // bs
            if per_segment <= 1:
                return None
            first = (start + per_segment) // per_segment * per_segment - 1
            for i in range(first - start, len(mask), per_segment):
                mask[i] = True
        alignment = self.alignment_tokens
        for boundary in boundaries:
            block = boundary // alignment * alignment // bs - 1
            if start <= block < end:
                mask[block - start] = True
        return mask

    def cache_blocks(self, request: Request, num_tokens: int, hashes: Sequence[int],
                     retention: int | None, boundaries: Sequence[int], junction: int = 0) -> None:
        rid = request.request_id
        before = self.num_cached_block.get(rid, 0)
        super().cache_blocks(request, num_tokens, hashes, retention, boundaries, junction)
        after = self.num_cached_block.get(rid, 0)
        if self.align:
            # vLLM's _cache_partial_tail_block, before it marks this step's keys.
            self._cache_tail(request, num_tokens, hashes, retention, junction)
        hash_of_block = self.pool.hash_of_block
        table = self.tables.get(rid, [])
        for i in range(before, after):
            key = hash_of_block.get(table[i])
            if key is not None:
                self.cached_this_step.add(key)

    def _cache_tail(self, request: Request, num_tokens: int, hashes: Sequence[int],
                    retention: int | None, junction: int) -> None:
        """Key the state block a later request resumes from at its exact
        boundary: the prefill checkpoint's block when this step exports one
        (dropped from the cache when no request can reach it), else the
        prompt's last boundary when this chunk ends there. With one block
        size for every group that block's full-block key is the boundary's
        key, so this re-keys only what the sparse mask left out."""
        rid = request.request_id
        bs = self.block_size
        table = self.tables.get(rid, [])
        prompt_boundary = mamba_checkpoint_position(request.num_prompt_tokens, self.alignment_tokens)
        checkpoint = self.checkpoints.get(rid)
        if checkpoint is not None:
            position, idx = checkpoint
            assert 0 <= idx < len(table)
            block = table[idx]
            mask = self.reachable_mask(position // bs - 1, position // bs, retention, ())
            if position != prompt_boundary and not (mask is None or mask[0]) and position != junction:
                # A transient state: the running state overwrites the slot.
                self.pool.uncache_blocks([block])
                return
        else:
            if num_tokens <= 0 or num_tokens % bs or num_tokens != prompt_boundary:
                return
            position, idx = num_tokens, num_tokens // bs - 1
            if idx >= len(table):
                return
            block = table[idx]
        if block == NULL_BLOCK:
            return
        key = hash((hashes[position // bs - 1], self.group_id))
        if self.pool.hash_of_block.get(block) == key:
            return
        # Its contents are the state at ``position`` now: any other key goes.
        self.pool.uncache_blocks([block])
        self.pool.cache_block(block, key)
        self.cached_this_step.add(key)

    def pop(self, rid: str) -> list[int]:
        self.allocated.discard(rid)
        self.last_state_block_idx.pop(rid, None)
        self.checkpoints.pop(rid, None)
        self.num_retired_blocks.pop(rid, None)
        return super().pop(rid)


_MANAGERS: dict[str, type[_GroupManager]] = {
    _FULL: _GroupManager, _SWA: _SlidingWindowManager, _CHUNKED: _ChunkedLocalManager,
    _MAMBA: _MambaManager,
}


def admission_cap(group: KVCacheGroup, max_in_flight_tokens: int, max_model_len: int) -> int | None:
    """vLLM's max_admission_blocks_per_request for a group that recycles
    blocks (sliding window, chunked local); None for the others."""
    if group.kind == _SWA:
        assert group.sliding_window is not None
        # +1: the window need not start at a block boundary.
        return _cdiv(min(group.sliding_window - 1 + max_in_flight_tokens, max_model_len),
                     group.block_size) + 1
    if group.kind == _CHUNKED:
        assert group.attention_chunk_size is not None
        return _cdiv(min(group.attention_chunk_size + max_in_flight_tokens, max_model_len),
                     group.block_size)
    return None


def _spec_key(group: KVCacheGroup) -> tuple[str, int, int | None, int | None]:
    """What makes two groups' specs equal for vLLM (its layer count does not)."""
    return group.kind, group.block_size, group.sliding_window, group.attention_chunk_size


@dataclass(slots=True)
class _Bucket:
    """Groups whose specs are equal, looked up together (vLLM's SpecGroup)."""

    kind: str
    gids: list[int]


class HybridHit(list[int]):
    """A prefix hit over several groups: the list holds the hit's real
    (non-null) blocks, so it reads as a flat hit where the scheduler only
    passes it on; ``per_group`` holds each group's blocks (nulls included)
    and ``shared_prefix_boundary`` vLLM's junction of the lookup."""

    __slots__ = ("per_group", "shared_prefix_boundary", "num_tokens")

    def __init__(self, per_group: list[list[int]], shared_prefix_boundary: int,
                 num_tokens: int = 0) -> None:
        super().__init__(b for blocks in per_group for b in blocks if b != NULL_BLOCK)
        # Empty when no group has a block (vLLM then adopts nothing; the
        # boundary of the lookup still counts).
        self.per_group = per_group if any(per_group) else []
        self.shared_prefix_boundary = shared_prefix_boundary
        self.num_tokens = num_tokens


class HybridBlocks(list[int]):
    """Block ids of several groups: the list holds them flat, in group order
    (the form traces and the scheduler compare), and ``per_group`` holds what
    each group's table gained (nulls included: a Mamba group pads with them),
    the form a model runner pages with."""

    __slots__ = ("per_group",)

    def __init__(self, flat: Iterable[int], per_group: list[list[int]]) -> None:
        super().__init__(flat)
        self.per_group = per_group


class HybridKVCacheManager(KVCacheManager):
    """vLLM's KVCacheManager over several KV cache groups sharing one pool.

    ``block_size`` is the hash block size (the granularity of the request's
    ``block_hashes``); ``req_to_blocks`` maps a request to its first group's
    table, so "holds blocks" reads as with one group. The scheduler calls
    ``allocate_slots`` for every scheduled request (no fast path)."""

    __slots__ = ("groups", "managers", "buckets", "scheduler_block_size", "retention",
                 "shared_prefix_boundary", "_simple_hybrid", "_unitary")

    def __init__(self, cache_config: CacheConfig, max_model_len: int, max_in_flight_tokens: int) -> None:
        check_hybrid_config(cache_config)
        sizes = resolve_block_sizes(cache_config)
        self.block_size = sizes.hash_block_size
        self.scheduler_block_size = sizes.scheduler_block_size
        self.max_model_len = max_model_len
        self.enable_caching = cache_config.enable_prefix_caching
        self.block_pool = BlockPool(cache_config.num_gpu_blocks, self.enable_caching)
        self.req_to_blocks = {}
        self.num_cached_block = {}
        self.prefix_cache_stats = PrefixCacheStats()
        self.num_private = 0
        self.holed = set()
        self.groups = cache_config.kv_groups
        self.retention = cache_config.prefix_cache_retention_interval
        self._unitary = len(self.groups) == 1
        # One group: hits land on its own block size; several: on the
        # scheduler block size (vLLM pushes it to every manager).
        alignment = self.scheduler_block_size
        self.managers: list[_GroupManager] = [
            _MANAGERS[g.kind](i, g, self.block_pool, self.enable_caching,
                              admission_cap(g, max_in_flight_tokens, max_model_len),
                              alignment, sizes.hash_block_size)
            for i, g in enumerate(self.groups)]
        buckets: list[_Bucket] = []
        for i, g in enumerate(self.groups):
            for bucket in buckets:
                if _spec_key(self.groups[bucket.gids[0]]) == _spec_key(g):
                    bucket.gids.append(i)
                    break
            else:
                buckets.append(_Bucket(g.kind, [i]))
        # Full attention first: its left-to-right scan bounds the others.
        buckets.sort(key=lambda b: b.kind != _FULL)
        self.buckets = buckets
        self._simple_hybrid = len(buckets) == 2 and buckets[0].kind == _FULL
        self.shared_prefix_boundary: dict[str, int] = {}

    def min_blocks_to_hold(self, num_tokens: int) -> int:
        """Full attention holds every block; a window or a Mamba state frees
        blocks as it goes, so at least one each (a lower bound: a request
        is refused only when vLLM could certainly never run it)."""
        return sum(_cdiv(num_tokens, m.block_size) if m.spec.kind == _FULL else 1
                   for m in self.managers)

    # -- keys -------------------------------------------------------------------
    def _group_keys(self, request: Request, gids: list[int], num_blocks: int) -> list[list[int]]:
        """Per block of these groups' size, each group's prefix-cache key:
        the chained hash ending with the block, tagged with the group (vLLM
        keys its cache by hash and group id)."""
        scale = self.managers[gids[0]].hash_scale
        hashes = self.block_hashes(request, num_blocks * scale)
        return [[hash((hashes[(i + 1) * scale - 1], g)) for g in gids] for i in range(num_blocks)]

    # -- admission --------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        if not self.enable_caching:
            return _EMPTY_HIT, 0
        max_length = request.num_tokens - 1
        if self._unitary:
            manager = self.managers[0]
            keys = self._group_keys(request, [0], max_length // manager.block_size)
            found, hit_length = manager.find_longest_cache_hit(keys, [0], max_length, manager.block_size)
            return self._hit(found, 0, hit_length), hit_length
        return self._find_longest_cache_hit(request, max_length)

    def _hit(self, per_group: list[list[int]], boundary: int, num_tokens: int) -> HybridHit:
        if not boundary and not any(per_group):
            return _EMPTY_HIT
        return HybridHit(per_group, boundary, num_tokens)

    def _find_longest_cache_hit(self, request: Request, max_length: int) -> tuple[list[int], int]:
        """vLLM's HybridKVCacheCoordinator.find_longest_cache_hit: shrink a
        candidate length until every bucket accepts it."""
        n = len(self.groups)
        hit_length = max_length
        longest = 0
        blocks_by_group: list[list[int] | None] = [None] * n
        length_by_group = [0] * n
        alignment = self.scheduler_block_size
        while True:
            curr = hit_length
            for bucket in self.buckets:
                first = bucket.gids[0]
                if bucket.kind == _FULL and blocks_by_group[first] is not None:
                    # Downward-closed: looked up once, then only trimmed.
                    curr = min(curr, length_by_group[first])
                    continue
                manager = self.managers[first]
                keys = self._group_keys(request, bucket.gids, curr // manager.block_size)
                found, new_length = manager.find_longest_cache_hit(keys, bucket.gids, curr, alignment)
                curr = new_length
                for gid, blocks in zip(bucket.gids, found):
                    blocks_by_group[gid] = blocks
                    length_by_group[gid] = new_length
                longest = max(longest, curr)
            if curr >= hit_length:
                break
            hit_length = curr
            if self._simple_hybrid:
                break
        for bucket in self.buckets:
            if bucket.kind != _FULL:
                continue
            keep = _cdiv(hit_length, self.managers[bucket.gids[0]].block_size)
            for gid in bucket.gids:
                kept = blocks_by_group[gid]
                if kept is not None:
                    del kept[keep:]
        uncached = longest - hit_length
        per_group = [b if b is not None else [] for b in blocks_by_group]
        return self._hit(per_group, hit_length + uncached if uncached else 0, hit_length), hit_length

    def num_blocks_needed(self, request: Request, num_new_tokens: int,
                          new_computed_blocks: list[int] = _NO_BLOCKS,
                          full_sequence: bool = False) -> int:
        hit = new_computed_blocks if isinstance(new_computed_blocks, HybridHit) else _EMPTY_HIT
        total = min(request.num_computed_tokens + hit.num_tokens, self.max_model_len)
        if full_sequence:
            num_tokens = min(request.num_tokens, self.max_model_len)
        else:
            num_tokens = min(total + num_new_tokens, self.max_model_len)
        return self._count(rid=request.request_id, num_tokens=num_tokens, hit=hit, total_computed=total,
                           apply_cap=full_sequence, num_tokens_main=num_tokens,
                           prefill_end=self._prefill_end(request), record=False)

    def _prefill_end(self, request: Request) -> int:
        """vLLM's prefill_end as its coordinator passes it on: where the
        prefill ends (past the prompt for a resumed request replaying its
        output) under retention 0, where Mamba reserves a prefill checkpoint
        only for the chunk reaching it; 0 otherwise (every chunk may)."""
        if self.retention != 0:
            return 0
        return max(request.num_prompt_tokens, request.num_tokens - 1)

    def _count(self, *, rid: str, num_tokens: int, hit: HybridHit, total_computed: int,
               apply_cap: bool, num_tokens_main: int, prefill_end: int, record: bool) -> int:
        per_group = hit.per_group
        return sum(m.num_blocks_to_allocate(rid, num_tokens, per_group[i] if per_group else [],
                                            total_computed, apply_cap, num_tokens_main, prefill_end, record)
                   for i, m in enumerate(self.managers))

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: list[int] = _NO_BLOCKS,
                       full_sequence_must_fit: bool = False,
                       num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False,
                       reserved_blocks: int = 0) -> list[int] | None:
        """vLLM's allocate_slots over the groups; returns the new block ids of
        every group, in group order (None, changing nothing but the blocks
        freed for leaving the window, when the pool is short)."""
        rid = request.request_id
        hit = new_computed_blocks if isinstance(new_computed_blocks, HybridHit) else _EMPTY_HIT
        num_local = request.num_computed_tokens + num_new_computed_tokens
        total = min(num_local + num_external_computed_tokens, self.max_model_len)
        pool = self.block_pool
        if rid not in self.req_to_blocks and not any(rid in m.num_cached_block for m in self.managers):
            # A lookup just made for this admission (vLLM sets it on the request).
            self.shared_prefix_boundary[rid] = hit.shared_prefix_boundary
        prefill_end = self._prefill_end(request)
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            if self._count(rid=rid, num_tokens=full, hit=hit, total_computed=total, apply_cap=True,
                           num_tokens_main=full, prefill_end=prefill_end, record=False) > pool.num_free:
                return None
        num_main = total + num_new_tokens
        num_slots = min(num_main + num_lookahead_tokens, self.max_model_len)
        processed = max(0, total - request.num_in_flight_tokens)
        for m in self.managers:
            m.remove_skipped_blocks(rid, processed)
        # This count prepares the allocation: Mamba records its checkpoint.
        if self._count(rid=rid, num_tokens=num_slots, hit=hit,
                       total_computed=num_local + num_external_computed_tokens, apply_cap=False,
                       num_tokens_main=num_main, prefill_end=prefill_end, record=True) \
                > pool.num_free - reserved_blocks:
            return None
        # vLLM adopts a hit only for a request no group tracks yet.
        if hit.per_group and not any(rid in m.num_cached_block for m in self.managers):
            for i, m in enumerate(self.managers):
                m.add_hit(rid, hit.per_group[i], num_local)
        flat: list[int] = []
        gained: list[list[int]] = []
        for m in self.managers:
            held = len(m.tables.get(rid, ()))
            flat += m.allocate_new_blocks(rid, num_slots, num_main)
            gained.append(m.tables[rid][held:])
        new_blocks = HybridBlocks(flat, gained)
        self.req_to_blocks[rid] = self.managers[0].tables[rid]
        if not delay_cache_blocks:
            self.cache_blocks(request, min(total + num_new_tokens, request.num_tokens))
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """vLLM's coordinator cache_blocks: the cacheable prefix (rounded down
        to the scheduler block with several groups) enters each group's cache."""
        if not self.enable_caching:
            return
        if not self._unitary:
            num_tokens -= num_tokens % self.scheduler_block_size
        rid = request.request_id
        # Where a later request may resume: the last prompt token's block
        # (a resend recomputes it), and the junction of this request's lookup.
        boundaries = [request.num_prompt_tokens - 1]
        junction = self.shared_prefix_boundary.get(rid, 0)
        if junction:
            boundaries.append(junction)
        hashes = self.block_hashes(request, request.num_tokens // self.block_size)
        for m in self.managers:
            m.cache_blocks(request, num_tokens, hashes, self.retention, boundaries, junction)

    def cache_full_blocks(self, request: Request, blocks: list[int],
                          num_cached: int, num_full: int) -> None:
        raise AssertionError("the hybrid KV cache caches through cache_blocks")

    def free(self, request: Request) -> None:
        """Each group's blocks back to the pool, group by group, each tail first."""
        rid = request.request_id
        self.req_to_blocks.pop(rid, None)
        self.shared_prefix_boundary.pop(rid, None)
        for m in self.managers:
            blocks = m.pop(rid)
            if blocks:
                blocks.reverse()
                self.block_pool.free_blocks(blocks)

    def pop_blocks_for_free(self, request: Request) -> tuple[list[int], int]:
        raise AssertionError("KV connectors are refused with cache.kv_groups")

    def evict_blocks(self, block_ids: set[int], requests: Mapping[str, Request]) -> None:
        raise AssertionError("KV connectors are refused with cache.kv_groups")

    def append_new_blocks(self, request_ids: Sequence[str]) -> None:
        raise AssertionError("a hybrid decode stretch goes through replay_decode_stretch")

    def cache_in_bulk(self, requests: Sequence[Request], num_full: Sequence[int],
                      new_block_owners: Sequence[str]) -> bool:
        raise AssertionError("a hybrid decode stretch goes through replay_decode_stretch")

    # -- decode stretches (kvsched.core.fast_forward) ---------------------------
    def decode_stretch_refusal(self) -> str | None:
        """Why a decode stretch may not cover these groups, or None: full
        attention and sliding windows only. A chunked local group frees a
        whole chunk's blocks at each chunk boundary and a Mamba group moves
        its state to a new block (with per-step checkpoint bookkeeping):
        neither is part of the stretch's event model nor of its fuzzer."""
        for g in self.groups:
            if g.kind == _CHUNKED:
                return ("a stretch covers full-attention and sliding-window KV cache groups, not "
                        "chunked local attention (it frees a chunk's blocks at chunk boundaries)")
            if g.kind == _MAMBA:
                return ("a stretch covers full-attention and sliding-window KV cache groups, not "
                        "Mamba state (its blocks and checkpoints move every step)")
        return None

    def decode_new_block_steps(self, requests: Sequence[Request]) -> list[tuple[list[int], int]]:
        """Per group, (each request's first decode step that takes a block
        in it, the group's block size): step j computes position c + j,
        which needs a new block when it is past the group's table (nulls
        count: a window nulls entries, never shortens the table)."""
        out: list[tuple[list[int], int]] = []
        for m in self.managers:
            bs = m.block_size
            tables = m.tables
            out.append(([len(tables.get(r.request_id, ())) * bs - r.num_computed_tokens for r in requests],
                        bs))
        return out

    def lookup_keys(self, request: Request) -> set[int]:
        """Every prefix-cache key a lookup of ``request`` may read (each
        group's keys of its full blocks before its last token): while no
        block carrying one is evicted or registered, the lookup's hit is
        the same (none without prefix caching: no lookup)."""
        keys: set[int] = set()
        if not self.enable_caching:
            return keys
        max_length = request.num_tokens - 1
        for bucket in self.buckets:
            num_blocks = max_length // self.managers[bucket.gids[0]].block_size
            for per_gid in self._group_keys(request, bucket.gids, num_blocks):
                keys.update(per_gid)
        return keys

    def decode_window_frees(self, requests: Sequence[Request], k: int,
                            lead: int) -> list[tuple[int, int, int]]:
        """The blocks ``k`` decode steps of ``requests`` free from their
        windows, as (step, running index, block), -1 for a block the
        stretch itself takes (``decode_stretch_events``' rules: the first
        step frees the run of blocks that left the window, and so may the
        second under async scheduling; then a block each time the skipped
        tokens cross a block boundary)."""
        out: list[tuple[int, int, int]] = []
        append = out.append
        for m in self.managers:
            if not isinstance(m, _SlidingWindowManager):
                continue
            bs = m.block_size
            window = m.window
            tables = m.tables
            for idx, request in enumerate(requests):
                table = tables.get(request.request_id)
                if table is None:
                    continue
                held = len(table)
                c = request.num_computed_tokens
                # Step 0 (and, async, step 1: the batch in flight may be a
                # prefill's last chunk, processed only then): free the run
                # of blocks below the window, down to the first null.
                prev = -1  # everything at or below it is null
                for j in ((0, 1) if lead and k > 1 else (0,)):
                    processed = c - request.num_in_flight_tokens if j == 0 else c
                    last = (processed - window + 1) // bs
                    i = last - 1
                    while i > prev and table[i] != NULL_BLOCK:
                        append((j, idx, table[i]))
                        i -= 1
                    if last - 1 > prev:
                        prev = last - 1
                # Later steps: one block per boundary the skipped tokens cross.
                start = 2 if lead else 1
                skipped = c + start - lead - window + 1
                j = start + (-skipped) % bs
                if c + j - lead - window + 1 <= 0:
                    j += (-(c + j - lead - window + 1)) // bs * bs + bs
                i = (c + j - lead - window + 1) // bs - 1
                while j < k:
                    if i > prev:
                        if i >= held:
                            append((j, idx, -1))
                        elif table[i] != NULL_BLOCK:
                            append((j, idx, table[i]))
                    j += bs
                    i += 1
        return out

    def decode_stretch_events(self, requests: Sequence[Request], k: int, lead: int,
                              length_stops: Container[int]) -> list[tuple[int, int, int, int]]:
        """The calls ``k`` decode steps of ``requests`` make on these groups
        that are not no-ops, as (step, order, phase, group) in stepping
        order (sort them): per step, per request in running order,
        ``allocate_slots`` frees what left each window (phase 0), takes new
        blocks group by group (1), and caches (2). Read before the
        stretch's tokens are applied. ``lead`` is 1 under async scheduling
        (one token in flight: the window is counted from the processed
        tokens, the cache from the known ones); the requests at the
        running indexes ``length_stops`` are not scheduled in the last
        step (async: they reach their length), and register their blocks
        when that step's output is applied, after every allocation of the
        step (order ``n + index``)."""
        n = len(requests)
        events: list[tuple[int, int, int, int]] = []
        sbs = self.scheduler_block_size
        caching = self.enable_caching
        for idx, request in enumerate(requests):
            rid = request.request_id
            c = request.num_computed_tokens
            steps = k - 1 if idx in length_stops else k
            for g, m in enumerate(self.managers):
                bs = m.block_size
                # Blocks: as first_new_block_step, per group.
                j = len(m.tables.get(rid, ())) * bs - c
                while j < steps:
                    events.append((j, idx, 1, g))
                    j += bs
                if isinstance(m, _SlidingWindowManager) and steps > 0:
                    # remove_skipped_blocks frees block i - 1 when the skipped
                    # tokens (processed - window + 1) reach i * bs; between
                    # those steps it stops at the null entry it left. The
                    # first step may free several (after a prefill).
                    events.append((0, idx, 0, g))
                    if lead and steps > 1:
                        # Async: the batch in flight may be a prefill's last
                        # chunk, whose tokens count as processed only from
                        # the second step on (the window may jump there).
                        events.append((1, idx, 0, g))
                    skipped = c - lead - m.window + 1
                    j = (-skipped) % bs or bs
                    if skipped + j <= 0:
                        j += (-(skipped + j)) // bs * bs + bs
                    while j < steps:
                        events.append((j, idx, 0, g))
                        j += bs
            if caching and steps > 0:
                # The cacheable prefix grows by a scheduler block at a
                # time; the first step registers whatever is pending.
                events.append((0, idx, 2, 0))
                j = (-(c + 1 - lead)) % sbs or sbs
                while j < steps:
                    events.append((j, idx, 2, 0))
                    j += sbs
            if caching and steps < k:
                events.append((k - 1, n + idx, 2, 0))
        return events

    def replay_decode_stretch(self, requests: Sequence[Request], computed: Sequence[int],
                              processed: Sequence[int], k: int, lead: int,
                              events: list[tuple[int, int, int, int]]
                              ) -> tuple[list[int], dict[str, list[int]]]:
        """Make the calls ``decode_stretch_events`` listed, in stepping order,
        after the stretch's tokens are applied (``computed``: each request's
        computed tokens before it; block hashes are a function of the tokens
        before them, so knowing later ones changes no key). Returns the free
        block count after each step and the new blocks of the last step per
        request (as allocate_slots returns them). ``processed``: each
        request's processed tokens at the first step (its computed ones but
        those in flight); later steps process ``computed + step - lead``."""
        events.sort()
        n = len(requests)
        managers = self.managers
        pool = self.block_pool
        free_after: list[int] = []
        last: dict[str, list[list[int]]] = {}
        for step, order, phase, g in events:
            while len(free_after) < step:
                free_after.append(pool.num_free)
            idx = order if order < n else order - n
            request = requests[idx]
            rid = request.request_id
            c = computed[idx] + step
            if phase == 0:
                managers[g].remove_skipped_blocks(rid, c - lead if step else processed[idx])
            elif phase == 1:
                new = managers[g].allocate_new_blocks(rid, c + 1, c + 1)
                if step == k - 1:
                    gained = last.get(rid)
                    if gained is None:
                        gained = last[rid] = [[] for _ in managers]
                    gained[g] += new
            else:
                self.cache_blocks(request, c + 1 - lead)
        while len(free_after) < k:
            free_after.append(pool.num_free)
        new_blocks: dict[str, list[int]] = {
            rid: HybridBlocks((b for blocks in gained for b in blocks), gained)
            for rid, gained in last.items()}
        return free_after, new_blocks

    def new_step_starts(self) -> None:
        for m in self.managers:
            m.new_step_starts()

    def waits_for_same_step_state(self, hit: list[int]) -> bool:
        """True when ``hit`` ends on a Mamba state cached in this very step
        (vLLM then refuses the admission until the next step)."""
        if not isinstance(hit, HybridHit) or not hit.per_group:
            return False
        return any(isinstance(m, _MambaManager) and blocks
                   and self.block_pool.hash_of_block.get(blocks[-1]) in m.cached_this_step
                   for m, blocks in zip(self.managers, hit.per_group))

    def junction(self, request: Request, hit: list[int]) -> int:
        """The shared-prefix boundary vLLM keeps on ``request``: this lookup's
        (``hit``) for a request being admitted, else its admission's."""
        if isinstance(hit, HybridHit) and request.request_id not in self.req_to_blocks:
            return hit.shared_prefix_boundary
        return self.shared_prefix_boundary.get(request.request_id, 0)

    def get_block_ids(self, request_id: str) -> list[int]:
        """Every group's table, in group order (null entries included)."""
        tables = [list(m.tables.get(request_id, ())) for m in self.managers]
        return HybridBlocks((b for t in tables for b in t), tables)

    def group_block_counts(self, request_id: str) -> list[list[int]]:
        """Per group, [table length, real (non-null) blocks]: the trace's view."""
        out: list[list[int]] = []
        for m in self.managers:
            table = m.tables.get(request_id, ())
            out.append([len(table), sum(1 for b in table if b != NULL_BLOCK)])
        return out

    def check_invariants(self, live_request_ids: set[str] | None = None,
                         private_ids: Container[str] = ()) -> None:
        pool = self.block_pool
        pool.check_invariants()
        owners = [0] * pool.num_gpu_blocks
        for m in self.managers:
            for rid, table in m.tables.items():
                real = [b for b in table if b != NULL_BLOCK]
                assert len(set(real)) == len(real), f"{rid} holds a block twice in group {m.group_id}"
                for b in real:
                    owners[b] += 1
                if live_request_ids is not None:
                    assert rid in live_request_ids, f"blocks held by unknown request {rid}"
                assert m.num_cached_block.get(rid, 0) <= len(table), (
                    f"{rid} caches more blocks than it holds in group {m.group_id}")
                assert rid in self.req_to_blocks, f"{rid} holds blocks but is not listed"
        for b in range(1, pool.num_gpu_blocks):
            assert owners[b] == pool.ref_cnt[b], (
                f"block {b}: ref_cnt {pool.ref_cnt[b]} but {owners[b]} tables hold it")
        in_use = sum(1 for b in range(1, pool.num_gpu_blocks) if pool.ref_cnt[b] > 0)
        assert in_use + pool.get_num_free_blocks() == pool.num_gpu_blocks - 1, "blocks lost"


_EMPTY_HIT = HybridHit([], 0)


def make_kv_cache_manager(cache_config: CacheConfig, max_model_len: int,
                          max_in_flight_tokens: int) -> KVCacheManager:
    """The one place that picks the KV cache manager: the single
    full-attention group's fast KVCacheManager unless ``cache.kv_groups``
    describes another layout."""
    if is_hybrid(cache_config):
        return HybridKVCacheManager(cache_config, max_model_len, max_in_flight_tokens)
    check_hybrid_config(cache_config)
    return KVCacheManager(cache_config, max_model_len)
