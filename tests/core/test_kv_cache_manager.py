"""KVCacheManager: prefix hits, block sharing, eviction order, allocation failure.

Block size 4 throughout; a pool of ``n`` blocks has ``n - 1`` usable ones
(block 0 is the null block) handed out in id order.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvsched import CacheConfig, Request, SamplingParams
from kvsched.core.kv_cache_manager import KVCacheManager

BS = 4
BASE = list(range(1, 13))  # 12 tokens = 3 full blocks


def _kv(num_gpu_blocks: int, caching: bool = True, max_model_len: int = 1024) -> KVCacheManager:
    return KVCacheManager(CacheConfig(num_gpu_blocks=num_gpu_blocks, block_size=BS,
                                      enable_prefix_caching=caching), max_model_len)


def _req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, list(tokens), SamplingParams(max_tokens=8))


def _admit(kv: KVCacheManager, request: Request, num_new: int | None = None,
           full: bool = False) -> tuple[list[int], int, list[int] | None]:
    """What the scheduler does at admission: look up the hit, allocate, and
    advance num_computed_tokens if it worked."""
    hits, num_hit_tokens = kv.get_computed_blocks(request)
    if num_new is None:
        num_new = request.num_tokens - num_hit_tokens
    new_blocks = kv.allocate_slots(request, num_new, num_hit_tokens, hits,
                                   full_sequence_must_fit=full)
    if new_blocks is not None:
        request.num_computed_tokens = num_hit_tokens + num_new
    kv.check_invariants()
    return hits, num_hit_tokens, new_blocks


def _snapshot(kv: KVCacheManager) -> dict[str, Any]:
    pool = kv.block_pool
    return {
        "queue": list(pool.free_queue),
        "ref_cnt": list(pool.ref_cnt),
        "hashes": list(pool.block_hash),
        "cached": dict(pool.cached),
        "tables": {k: list(v) for k, v in kv.req_to_blocks.items()},
    }


@pytest.mark.parametrize("tokens, expected_blocks", [
    (BASE, [1, 2]),                        # 12 tokens: the last block holds the last token
    ([*BASE, 99], [1, 2, 3]),              # 13 tokens: all three full blocks can hit
    (BASE[:9], [1, 2]),
    (BASE[:8], [1]),                       # exactly 2 blocks: at most 1 hits
    (BASE[:5], [1]),
    (BASE[:4], []),                        # exactly 1 block: nothing
    ([*BASE[:6], 77, 78, 79], [1]),        # second block differs: whole blocks only
    ([55, *BASE[1:]], []),                 # first token differs: the chain breaks
])
def test_prefix_hit_is_whole_blocks_and_never_the_last_token(
        tokens: list[int], expected_blocks: list[int]) -> None:
    kv = _kv(16)
    a = _req("a", BASE)
    _admit(kv, a)
    assert kv.get_block_ids("a") == [1, 2, 3]
    before = _snapshot(kv)
    hits, num_tokens = kv.get_computed_blocks(_req("b", tokens))
    assert hits == expected_blocks
    assert num_tokens == BS * len(expected_blocks)
    assert _snapshot(kv) == before  # a lookup touches nothing
    kv.check_invariants()


def test_no_hits_with_prefix_caching_off() -> None:
    kv = _kv(16, caching=False)
    _admit(kv, _req("a", BASE))
    assert kv.get_computed_blocks(_req("b", [*BASE, 99])) == ([], 0)
    assert kv.block_pool.cached == {}
    kv.check_invariants()


def test_identical_prompts_admitted_back_to_back_share_blocks() -> None:
    kv = _kv(16)
    a, b = _req("a", BASE[:9]), _req("b", BASE[:9])
    _, hit_a, new_a = _admit(kv, a)
    assert (hit_a, new_a) == (0, [1, 2, 3])
    # a's two full blocks were cached at allocation, before any KV was computed.
    hits, hit_b, new_b = _admit(kv, b)
    assert (hits, hit_b, new_b) == ([1, 2], 8, [4])
    assert kv.get_block_ids("b") == [1, 2, 4]
    ref_cnt = kv.block_pool.ref_cnt
    assert [ref_cnt[b] for b in (1, 2, 3, 4)] == [2, 2, 1, 1]
    assert kv.block_pool.get_num_free_blocks() == 15 - 4


def test_a_partial_chunk_caches_only_the_blocks_it_fills() -> None:
    kv = _kv(16)
    _admit(kv, _req("a", BASE[:9]), num_new=5)  # tokens 0..4: block 1 full, block 2 not
    hits, hit_tokens, _ = _admit(kv, _req("b", BASE[:9]))
    assert (hits, hit_tokens) == ([1], 4)


def test_a_finished_requests_cached_blocks_are_reused_from_the_free_queue() -> None:
    kv = _kv(4)  # 3 usable blocks
    a = _req("a", BASE[:9])
    _admit(kv, a)
    kv.free(a)
    kv.check_invariants()
    # Tail first: unhashed 3 to the front, then hashed 2 and 1 to the back.
    assert list(kv.block_pool.free_queue) == [3, 2, 1]
    b = _req("b", BASE[:9])
    hits, hit_tokens, new_blocks = _admit(kv, b)
    # 1 new block + the 2 free hit blocks = all 3 free blocks: it just fits.
    assert (hits, hit_tokens, new_blocks) == ([1, 2], 8, [3])
    assert kv.get_block_ids("b") == [1, 2, 3]
    assert kv.block_pool.get_num_free_blocks() == 0


def test_free_hit_blocks_count_against_the_free_block_check() -> None:
    kv = _kv(5)  # 4 usable blocks
    a = _req("a", BASE[:9])
    _admit(kv, a)  # [1, 2, 3], queue [4]
    kv.free(a)  # queue [3, 4, 2, 1]
    _admit(kv, _req("c", [90] * 8))  # takes 3 and 4; queue [2, 1]
    assert list(kv.block_pool.free_queue) == [2, 1]
    before = _snapshot(kv)
    b = _req("b", BASE[:9])
    # b hits blocks 1 and 2 and needs 1 more: 2 free blocks look like enough,
    # but the hits leave the free queue when touched, so it needs 3.
    hits, hit_tokens, new_blocks = _admit(kv, b)
    assert (hits, hit_tokens) == ([1, 2], 8)
    assert new_blocks is None
    assert _snapshot(kv) == before
    assert "b" not in kv.req_to_blocks


def test_free_releases_blocks_tail_first() -> None:
    kv = _kv(4)  # 3 usable blocks
    a = _req("a", BASE)
    _admit(kv, a)  # 12 tokens: blocks 1, 2, 3, all full and cached
    kv.free(a)
    kv.check_invariants()
    assert list(kv.block_pool.free_queue) == [3, 2, 1]
    longer = [*BASE, 99]
    assert kv.get_computed_blocks(_req("probe", longer)) == ([1, 2, 3], 12)
    # One new block is needed: the tail block goes, the head survives.
    _, _, new_blocks = _admit(kv, _req("x", [90, 91, 92]))
    assert new_blocks == [3]
    assert kv.get_computed_blocks(_req("probe2", longer)) == ([1, 2], 8)


def test_allocate_slots_returns_none_and_changes_nothing_when_short() -> None:
    kv = _kv(4)  # 3 usable blocks
    a = _req("a", list(range(1, 9)))
    _admit(kv, a)  # 8 tokens: blocks 1, 2
    before = _snapshot(kv)
    b = _req("b", list(range(50, 58)))
    assert kv.allocate_slots(b, 8) is None  # needs 2, 1 free
    assert _snapshot(kv) == before
    assert "b" not in kv.req_to_blocks
    # A running request growing by 5 tokens (to 13) needs 2 more blocks: no.
    a.all_token_ids.extend([100] * 5)
    assert kv.allocate_slots(a, 5) is None
    assert _snapshot(kv) == before
    kv.check_invariants()
    # By 4 tokens (to 12) it needs 1: yes.
    assert kv.allocate_slots(a, 4) == [3]
    kv.check_invariants()


def test_full_sequence_must_fit_requires_room_for_the_whole_prompt() -> None:
    kv = _kv(4)  # 3 usable blocks
    _admit(kv, _req("x", [90, 91]))  # holds block 1; 2 free
    r = _req("r", list(range(1, 13)))  # 12 tokens = 3 blocks
    before = _snapshot(kv)
    assert kv.allocate_slots(r, 4, full_sequence_must_fit=True) is None
    assert _snapshot(kv) == before
    assert kv.allocate_slots(r, 4) == [2]  # a 4-token chunk alone fits
    kv.check_invariants()


def test_full_sequence_check_counts_prefix_hits_as_held() -> None:
    kv = _kv(5)  # 4 usable blocks
    _admit(kv, _req("a", BASE[:8]))  # blocks 1, 2 cached, held by a
    tokens = BASE[:8] + list(range(40, 48))  # 16 tokens = 4 blocks, first 2 hit
    # 2 free: the whole sequence needs 4 - 2 hit = 2 new blocks.
    hits, hit_tokens, new_blocks = _admit(kv, _req("r", tokens), num_new=4, full=True)
    assert (hits, hit_tokens, new_blocks) == ([1, 2], 8, [3])
    kv2 = _kv(5)
    _admit(kv2, _req("a", BASE[:8]))
    _admit(kv2, _req("x", [90]))  # 1 free left
    r2 = _req("r", tokens)
    hits, hit_tokens = kv2.get_computed_blocks(r2)
    assert kv2.allocate_slots(r2, 4, hit_tokens, hits, full_sequence_must_fit=True) is None
    assert kv2.allocate_slots(r2, 4, hit_tokens, hits) == [4]
    kv2.check_invariants()


def test_usage() -> None:
    kv = _kv(5)  # 4 usable blocks
    assert kv.usage == 0.0
    a = _req("a", BASE[:5])
    _admit(kv, a)
    assert kv.usage == pytest.approx(0.5)
    _admit(kv, _req("b", [70, 71, 72, 73, 74, 75]))
    assert kv.usage == pytest.approx(1.0)
    kv.free(a)
    kv.check_invariants()
    # A cached block in the free queue is free: it does not count as used.
    assert kv.usage == pytest.approx(0.5)


# A failed KV load under the fail policy: vLLM evicts its blocks from the
# prefix cache by id (evict_blocks), also where another table shares them.
A_PROMPT = list(range(1, 22))                        # 21 tokens: blocks 1-6, 1-5 full
C_PROMPT = [*A_PROMPT[:8], *range(100, 113)]         # shares a's first 2 blocks


@pytest.mark.parametrize("deferred", [False, True], ids=["free", "pop_then_free_popped"])
def test_a_table_sharing_evicted_blocks_keeps_its_later_blocks_cached(deferred: bool) -> None:
    kv = _kv(16)  # blocks 1-15
    a, c = _req("a", A_PROMPT), _req("c", C_PROMPT)
    _admit(kv, a)                                    # [1..6], 1-5 cached
    assert _admit(kv, c)[:2] == ([1, 2], 8)          # [1, 2, 7, 8, 9, 10], 7-9 cached
    # a's load into its second block failed: that block and those after it go.
    kv.evict_blocks({2, 3, 4, 5, 6}, {"a": a, "c": c})
    assert kv.holed == {"a", "c"}
    # vLLM leaves num_cached_block alone: c's blocks 7-9 stay cached after the hole.
    assert kv.num_cached_block == {"a": 5, "c": 5}
    assert [b for b in range(1, 11) if kv.block_pool.block_hash[b] is not None] == [1, 7, 8, 9]
    kv.check_invariants()
    assert kv.get_computed_blocks(_req("probe", C_PROMPT)) == ([1], 4)
    # c fills its sixth block: only that one is cached; block 2 never is again.
    c.num_computed_tokens = 21
    c.extend_output([7, 7, 7])
    assert kv.allocate_slots(c, 3) == []
    assert kv.num_cached_block["c"] == 6
    assert [b for b in range(1, 11) if kv.block_pool.block_hash[b] is not None] == [1, 7, 8, 9, 10]

    def release(request: Request) -> None:
        if deferred:
            kv.free_popped(*kv.pop_blocks_for_free(request))
        else:
            kv.free(request)

    release(a)  # tail first: 6, 5, 4, 3 lost their hash (front); c still holds 1, 2
    assert list(kv.block_pool.free_queue) == [6, 5, 4, 3, 11, 12, 13, 14, 15]
    release(c)  # each block by its own hash: the hole 2 to the front, the rest to the back
    assert list(kv.block_pool.free_queue) == [2, 6, 5, 4, 3, 11, 12, 13, 14, 15, 10, 9, 8, 7, 1]
    assert not kv.holed
    kv.check_invariants()


def test_a_private_requests_evicted_blocks_end_its_counted_run() -> None:
    """A private request's blocks carry no entry (only counted), and only its
    own failed load evicts them, from its first failed block on: its count
    ends there, so freeing puts those blocks to the front, the rest to the back."""
    kv = _kv(8)  # blocks 1-7
    p = Request("p", A_PROMPT, SamplingParams(max_tokens=8), private=True)
    assert kv.allocate_slots(p, 21) == [1, 2, 3, 4, 5, 6]
    assert kv.num_cached_block["p"] == 5
    kv.evict_blocks({3, 4, 5, 6}, {"p": p})
    assert kv.num_cached_block["p"] == 2 and not kv.holed
    kv.check_invariants(private_ids={"p"})
    kv.free(p)  # tail first: 6, 5, 4, 3 to the front (last freed first), 2 and 1 to the back
    assert list(kv.block_pool.free_queue) == [6, 5, 4, 3, 7, 2, 1]


def test_blocks_popped_for_a_deferred_free_are_freed_by_their_hash_after_an_eviction() -> None:
    """vLLM looks each deferred block's hash up when it finally frees it: a
    block evicted in between goes to the front, not where its position said."""
    kv = _kv(16)
    a, c = _req("a", A_PROMPT), _req("c", C_PROMPT)
    _admit(kv, a)                                    # [1..6], 1-5 cached
    _admit(kv, c)                                    # [1, 2, 7, 8, 9, 10], 7-9 cached
    blocks, num_cached = kv.pop_blocks_for_free(c)   # c finished; its free waits
    assert (blocks, num_cached) == ([1, 2, 7, 8, 9, 10], 5)
    assert kv.popped_after_eviction(blocks, num_cached, {6}) == 5   # none of its cached ones
    kv.evict_blocks({2, 3, 4, 5, 6}, {"a": a})
    num_cached = kv.popped_after_eviction(blocks, num_cached, {2, 3, 4, 5, 6})
    kv.free(a)  # 6, 5, 4, 3 to the front; 2 and 1 wait in c's deferred free
    assert list(kv.block_pool.free_queue) == [6, 5, 4, 3, 11, 12, 13, 14, 15]
    kv.free_popped(blocks, num_cached)  # 10 and the evicted 2 to the front, 9, 8, 7, 1 back
    assert list(kv.block_pool.free_queue) == [10, 2, 6, 5, 4, 3, 11, 12, 13, 14, 15, 9, 8, 7, 1]
    kv.check_invariants()


def test_cache_blocks_caches_only_blocks_of_known_tokens() -> None:
    """Computed tokens can run ahead of known ones (a recomputed KV load
    with drafts in flight): vLLM caches no block past the known tokens."""
    kv = _kv(16)
    r = _req("r", BASE[:9])                          # 9 known tokens: 2 full blocks
    assert kv.allocate_slots(r, 9) == [1, 2, 3]       # caches blocks 1 and 2
    kv.cache_blocks(r, 12)
    assert kv.num_cached_block["r"] == 2
    assert kv.block_pool.block_hash[3] is None
