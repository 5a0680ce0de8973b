"""The hybrid KV cache manager (kvsched.core.hybrid_kv_cache) on small cases
whose outcome is computed by hand from vLLM's rules, with the scheduler's and
the manager's invariants checked after every step. (Its equality with vLLM
itself: tests/conformance/test_hybrid.py.)"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from sched_helpers import make_request, prompt, run_step

from kvsched import CacheConfig, Scheduler, SchedulerConfig
from kvsched.config import KVCacheGroup
from kvsched.core.block_pool import NULL_BLOCK
from kvsched.core.hybrid_kv_cache import (
    HybridKVCacheManager,
    admission_cap,
    mamba_block_aligned_split,
    mamba_checkpoint_alignment,
    resolve_block_sizes,
)

FULL = KVCacheGroup("full_attention", 4)


def swa(window: int, block_size: int = 4) -> KVCacheGroup:
    return KVCacheGroup("sliding_window", block_size, sliding_window=window)


def scheduler(groups: tuple[KVCacheGroup, ...], *, blocks: int = 64, caching: bool = True,
              budget: int = 64, block_size: int = 4, retention: int | None = 0,
              reserve_full_isl: bool = True, explain: bool = False) -> Scheduler:
    sc = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=8, max_model_len=256,
                         scheduler_reserve_full_isl=reserve_full_isl)
    cc = CacheConfig(num_gpu_blocks=blocks, block_size=block_size, enable_prefix_caching=caching,
                     kv_groups=groups, prefix_cache_retention_interval=retention)
    return Scheduler(sc, cc, explain_admission=explain)


def manager(sched: Scheduler) -> HybridKVCacheManager:
    kv = sched.kv_cache_manager
    assert isinstance(kv, HybridKVCacheManager)
    return kv


def test_block_sizes_resolve_as_vllm() -> None:
    # LCM for the scheduler, GCD for hashing (prefix caching on); one group: its own.
    groups = (KVCacheGroup("full_attention", 8), swa(9, 4))
    assert resolve_block_sizes(CacheConfig(num_gpu_blocks=9, block_size=8, kv_groups=groups)) \
        .scheduler_block_size == 8
    assert resolve_block_sizes(CacheConfig(num_gpu_blocks=9, block_size=8, kv_groups=groups)) \
        .hash_block_size == 4
    off = CacheConfig(num_gpu_blocks=9, block_size=8, kv_groups=groups, enable_prefix_caching=False)
    assert resolve_block_sizes(off).hash_block_size == 8


def test_admission_caps() -> None:
    # Sliding window: cdiv(min(W - 1 + F, M), bs) + 1; chunked: cdiv(min(C + F, M), bs).
    assert admission_cap(swa(8), 64, 512) == 18 + 1
    assert admission_cap(swa(8), 64, 40) == 10 + 1
    assert admission_cap(KVCacheGroup("chunked_local_attention", 4, attention_chunk_size=16),
                         64, 512) == 20
    assert admission_cap(FULL, 64, 512) is None


def test_window_frees_blocks_to_the_null_block() -> None:
    sched = scheduler((FULL, swa(8)), caching=False)
    sched.add_request(make_request("a", 20, max_tokens=4))
    run_step(sched)  # the whole prompt: 5 blocks in each group
    kv = manager(sched)
    assert [len(m.tables["a"]) for m in kv.managers] == [5, 5]
    run_step(sched)  # 20 computed: tokens 0..12 leave the window, blocks 0..2
    full, window = (m.tables["a"] for m in kv.managers)
    assert len(full) == 6 and NULL_BLOCK not in full
    assert window[:3] == [NULL_BLOCK] * 3 and NULL_BLOCK not in window[3:] and len(window) == 6
    # 12 blocks held of 63 usable.
    assert kv.block_pool.get_num_free_blocks() == 63 - 6 - 3


def test_window_hit_needs_the_run_of_the_window() -> None:
    """W=10, bs=4: a hit needs cdiv(9, 4) = 3 contiguous cached blocks; under
    retention 0 only the 3 blocks before the replay boundary (prompt - 1) are
    cached, so a repeat of the prompt hits exactly there."""
    sched = scheduler((swa(10),))
    tokens = prompt(26, 1)
    sched.add_request(make_request("a", tokens=tokens, max_tokens=1))
    while sched.has_requests():
        run_step(sched)
    kv = manager(sched)
    # Replay boundary 25 -> aligned 24 -> blocks 3, 4, 5 cached, nothing else.
    assert len(kv.block_pool.cached) == 3
    sched.add_request(make_request("b", tokens=tokens, max_tokens=2))
    out, _ = run_step(sched)
    assert out.scheduled_new_reqs[0].num_computed_tokens == 24
    assert kv.managers[0].tables["b"][:3] == [NULL_BLOCK] * 3


def test_dense_retention_caches_every_window_tail() -> None:
    sched = scheduler((swa(10),), retention=None)
    sched.add_request(make_request("a", 26, max_tokens=1))
    while sched.has_requests():
        run_step(sched)
    # Dense: alignment 4 = one block per segment <= the 3 a hit needs: all 6 full blocks.
    assert len(manager(sched).block_pool.cached) == 6


def test_simple_hybrid_hit_is_the_shorter_of_the_two() -> None:
    """Full attention hits 5 blocks of a shared 20-token prefix; the window
    (W=6: a run of 2 blocks) has only the 2 blocks before a's replay
    boundary 31 cached (blocks 5, 6), so its hit is 0 and so is the
    reconciled one; the junction 20 = 0 + (20 - 0) is recorded for b, whose
    window tail before 20 (blocks 3, 4) is then cached, and a third
    request sharing the prefix hits all 20 tokens."""
    sched = scheduler((FULL, swa(6)))
    shared = prompt(20, 2)
    sched.add_request(make_request("a", tokens=shared + prompt(12, 3), max_tokens=1))
    while sched.has_requests():
        run_step(sched)
    sched.add_request(make_request("b", tokens=shared + prompt(12, 4), max_tokens=2))
    out, _ = run_step(sched)
    assert out.scheduled_new_reqs[0].num_computed_tokens == 0
    kv = manager(sched)
    assert kv.shared_prefix_boundary["b"] == 20
    while sched.has_requests():
        run_step(sched)
    # b cached the window tail before 20 (blocks 3, 4): a third request hits 20.
    sched.add_request(make_request("c", tokens=shared + prompt(12, 5), max_tokens=1))
    out, _ = run_step(sched)
    assert out.scheduled_new_reqs[0].num_computed_tokens == 20


def test_admission_cap_admits_a_prompt_whole_tables_would_not_fit() -> None:
    """reserve_full_isl with a window W=6, budget 8: the gate counts the window
    group as min(cdiv(57, 4), cap) with cap cdiv(min(5 + 8, 256), 4) + 1 = 5,
    so 15 + 5 = 20 blocks are enough for a 57-token sequence (not 30)."""
    sched = scheduler((FULL, swa(6)), blocks=21, caching=False, budget=8)
    sched.add_request(make_request("a", 50, max_tokens=7))
    out, _ = run_step(sched)
    assert list(out.num_scheduled_tokens) == ["a"]
    while sched.has_requests():
        run_step(sched)
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 20


def test_mamba_none_keeps_the_last_state_block() -> None:
    sched = scheduler((FULL, KVCacheGroup("mamba", 4)), caching=False)
    sched.add_request(make_request("a", 13, max_tokens=6))
    while sched.has_requests():
        run_step(sched)
        kv = manager(sched)
        table = kv.managers[1].tables.get("a", [])
        if len(table) > 4:
            # From the second step on, each allocation first frees every state
            # block but the one of the last computed token: that one plus the
            # block of the new token.
            assert sum(b != NULL_BLOCK for b in table) <= 2
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 63


def test_preemption_frees_every_group() -> None:
    sched = scheduler((FULL, swa(8)), blocks=14, caching=True, budget=16, reserve_full_isl=False)
    for rid in ("a", "b", "c"):
        sched.add_request(make_request(rid, 12, max_tokens=20))
    preempted = 0
    for _ in range(200):
        if not sched.has_requests():
            break
        out, _ = run_step(sched)
        preempted += len(out.preempted_req_ids)
    assert preempted > 0 and not sched.has_requests()
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 13


def test_mamba_block_aligned_split() -> None:
    """A 23-token prompt, blocks of 4, chunks of up to 10: a chunk ends on a
    block boundary (8), never past the last cacheable boundary (22 // 4 * 4
    = 20), and the final chunk runs to the prompt's end."""
    request = make_request("a", 23, max_tokens=4)
    assert mamba_block_aligned_split(request, 10, 0, 4, 10, 0) == 8
    request.num_computed_tokens = 16
    assert mamba_block_aligned_split(request, 7, 0, 4, 10, 0) == 4
    request.num_computed_tokens = 20
    assert mamba_block_aligned_split(request, 3, 0, 4, 10, 0) == 3
    # A 4-token prefix hit counts as computed; a junction at 10 inside the
    # chunk (4, 12] stops it at 4 + (10 - 4) // 4 * 4 = 8.
    request.num_computed_tokens = 0
    assert mamba_block_aligned_split(request, 10, 4, 4, 10, 10) == 4
    # A block wider than the budget: the chunk advances mid-block.
    assert mamba_block_aligned_split(request, 10, 0, 16, 10, 0) == 10
    # Decode (nothing left to prefill) is never cut.
    request.num_computed_tokens = 23
    assert mamba_block_aligned_split(request, 1, 0, 4, 10, 0) == 1


def mamba_ckpt(alignment: int | None, blocks: int = 1) -> KVCacheGroup:
    """A Mamba group with vLLM's prefill checkpoint (MambaMixer2: alignment 1;
    FlashInfer GDN: the block size)."""
    return KVCacheGroup("mamba", 4, num_prefill_checkpoint_blocks=blocks,
                        prefill_checkpoint_alignment=alignment)


def test_mamba_split_with_a_prefill_checkpoint() -> None:
    """The 23-token prompt of test_mamba_block_aligned_split, blocks of 4: a
    chunk reaching the prompt's end whose backend exports the state at 20
    (22 // 4 * 4) inside it runs to the end instead of stopping at 20."""
    request = make_request("a", 23, max_tokens=4)
    assert mamba_block_aligned_split(request, 23, 0, 4, 64, 0) == 20
    assert mamba_block_aligned_split(request, 23, 0, 4, 64, 0, checkpoint_alignment=4) == 23
    assert mamba_block_aligned_split(request, 23, 0, 4, 64, 0, checkpoint_alignment=1) == 23
    # 20 - 0 is no multiple of 8: the backend cannot export it, stop at 20.
    assert mamba_block_aligned_split(request, 23, 0, 4, 64, 0, checkpoint_alignment=8) == 20
    # A chunk ending before the prompt's end is split as without one.
    assert mamba_block_aligned_split(request, 22, 0, 4, 64, 0, checkpoint_alignment=4) == 20
    # From 16: the export column (cdiv(23, 4) - 2 = 4) is past the initial
    # state's ((16 - 1) // 4 = 3), and 16 + 4 <= 20 < 23.
    request.num_computed_tokens = 16
    assert mamba_block_aligned_split(request, 7, 0, 4, 64, 0, checkpoint_alignment=4) == 7
    # From 20 the boundary is not inside the chunk; from 18 (mid-block) no
    # export: the chunk stops at the next boundary as without one.
    request.num_computed_tokens = 18
    assert mamba_block_aligned_split(request, 5, 0, 4, 64, 0, checkpoint_alignment=1) == 2
    # A resumed request replays its 6 outputs: 29 tokens, the prefill ending
    # at num_tokens - 1 = 28. Without a checkpoint it stops at the last
    # cacheable boundary 28; with one (exported at 27 // 4 * 4 = 24) it runs all 29.
    resumed = make_request("r", 23, max_tokens=8)
    for _ in range(6):
        resumed.append_output(7)
    assert mamba_block_aligned_split(resumed, 29, 0, 4, 64, 0) == 28
    assert mamba_block_aligned_split(resumed, 29, 0, 4, 64, 0, checkpoint_alignment=4) == 29


def test_mamba_checkpoint_alignment_needs_every_mamba_group() -> None:
    # vLLM's scheduler: the first Mamba group's alignment, and only when every
    # Mamba group keeps a checkpoint block.
    def cache(*groups: KVCacheGroup) -> CacheConfig:
        return CacheConfig(num_gpu_blocks=9, block_size=4, kv_groups=groups)
    assert mamba_checkpoint_alignment(cache(FULL, mamba_ckpt(4))) == 4
    assert mamba_checkpoint_alignment(cache(FULL, mamba_ckpt(1), mamba_ckpt(4))) == 1
    assert mamba_checkpoint_alignment(cache(FULL, mamba_ckpt(4), KVCacheGroup("mamba", 4))) is None
    assert mamba_checkpoint_alignment(cache(FULL, mamba_ckpt(4, blocks=0))) is None
    assert mamba_checkpoint_alignment(cache(FULL, swa(8))) is None


def test_mamba_checkpoint_one_chunk_then_a_hit_on_its_state() -> None:
    """Full attention + Mamba with a checkpoint, blocks of 4: a 23-token
    prompt runs in one chunk; its Mamba table is 4 nulls, the checkpoint
    block (the state at 20) and the running state's, both taken this step.
    The resend of the prompt hits the checkpoint's state at 20."""
    sched = scheduler((FULL, mamba_ckpt(4)), blocks=40)
    tokens = prompt(23, 3)
    sched.add_request(make_request("a", tokens=tokens, max_tokens=3))
    out, _ = run_step(sched)
    assert dict(out.num_scheduled_tokens) == {"a": 23}
    kv = manager(sched)
    table = kv.managers[1].tables["a"]
    assert table[:4] == [NULL_BLOCK] * 4 and NULL_BLOCK not in table[4:] and len(table) == 6
    # The checkpoint block is in the prefix cache; the running state is not.
    assert table[4] in kv.block_pool.hash_of_block and table[5] not in kv.block_pool.hash_of_block
    # 39 usable - 6 full attention - 2 Mamba.
    assert kv.block_pool.get_num_free_blocks() == 31
    run_step(sched)
    sched.add_request(make_request("b", tokens=list(tokens), max_tokens=2))
    out, _ = run_step(sched)
    assert out.scheduled_new_reqs[0].num_computed_tokens == 20


def test_mamba_checkpoint_block_counts_against_a_tight_pool() -> None:
    """The 23-token prompt with a checkpoint takes 6 full-attention blocks and
    2 Mamba ones (the full-sequence gate counts both too): 8 usable blocks
    admit it, 7 do not. Without the checkpoint its first chunk stops at 20
    (5 + 1 blocks), so 7 usable blocks admit it with one to spare."""
    for usable, scheduled in ((8, {"a": 23}), (7, {})):
        sched = scheduler((FULL, mamba_ckpt(4)), blocks=usable + 1)
        sched.add_request(make_request("a", tokens=prompt(23, 3), max_tokens=2))
        out, _ = run_step(sched)
        assert dict(out.num_scheduled_tokens) == scheduled
        assert manager(sched).block_pool.get_num_free_blocks() == (0 if scheduled else usable)
    plain = scheduler((FULL, KVCacheGroup("mamba", 4)), blocks=8)
    plain.add_request(make_request("a", tokens=prompt(23, 3), max_tokens=2))
    out, _ = run_step(plain)
    assert dict(out.num_scheduled_tokens) == {"a": 20}
    assert manager(plain).block_pool.get_num_free_blocks() == 1


def test_mamba_checkpoint_per_chunk_under_dense_retention_only() -> None:
    """A 31-token prompt in chunks of 8 (budget 10): the scheduler splits at
    8, 16, 24, and the final chunk runs 24..31 past the boundary at 28.
    Retention 0 reserves a checkpoint only for that final chunk (a chunk's
    first step holds one Mamba block); dense retention (None) for every
    chunk that can export one (two blocks)."""
    for retention, first_step_blocks in ((0, 1), (None, 2)):
        sched = scheduler((FULL, mamba_ckpt(1)), budget=10, retention=retention)
        sched.add_request(make_request("a", tokens=prompt(31, 5), max_tokens=2))
        chunks = []
        for _ in range(4):
            out, _ = run_step(sched)
            chunks.append(out.num_scheduled_tokens["a"])
            if len(chunks) == 1:
                assert manager(sched).group_block_counts("a")[1] == [2, first_step_blocks]
        assert chunks == [8, 8, 8, 7]


def test_mamba_align_frees_old_states_and_refuses_a_same_step_hit() -> None:
    sched = scheduler((KVCacheGroup("mamba", 4),), retention=None, budget=64, explain=True)
    tokens = prompt(30, 7)
    sched.add_request(make_request("a", tokens=tokens, max_tokens=4))
    sched.add_request(make_request("b", tokens=[*tokens, 5, 5], max_tokens=4))
    out, _ = run_step(sched)
    # a runs 28 tokens (its last cacheable boundary); b would hit the state a
    # caches in this very step, so it waits a step.
    assert dict(out.num_scheduled_tokens) == {"a": 28}
    [why] = out.not_admitted
    assert why.request_id == "b" and "Mamba state another request caches" in why.detail
    out, _ = run_step(sched)
    assert out.scheduled_new_reqs[0].num_computed_tokens == 28
    kv = manager(sched)
    table = kv.managers[0].tables["a"]
    # a's table: nulls, then at most the last state and the one being written.
    assert sum(b != NULL_BLOCK for b in table) <= 2


def _run_mamba_workload(groups: tuple[KVCacheGroup, ...], lens: list[int], shared: int, blocks: int,
                        budget: int, retention: int | None) -> list[object]:
    """Requests sharing a ``shared``-token prefix through a scheduler over
    ``groups`` until all finish (invariants checked every step); each step's
    scheduled tokens, preemptions, free blocks and per-group tables."""
    sched = scheduler(groups, blocks=blocks, budget=budget, retention=retention, reserve_full_isl=False)
    base = prompt(shared, 99)
    for i, n in enumerate(lens):
        sched.add_request(make_request(f"r{i}", tokens=base + prompt(n, 200 + i), max_tokens=3))
    trace: list[object] = []
    for _ in range(400):
        if not sched.has_requests():
            break
        out, _ = run_step(sched)
        kv = manager(sched)
        trace.append((sorted(out.num_scheduled_tokens.items()), sorted(out.preempted_req_ids),
                      kv.block_pool.get_num_free_blocks(),
                      [kv.group_block_counts(r.request_id) for r in sched.running]))
    assert not sched.has_requests()
    return trace


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(lens=st.lists(st.integers(1, 30), min_size=1, max_size=4), shared=st.integers(0, 24),
       extra_blocks=st.integers(0, 30), budget=st.sampled_from([8, 10, 16, 64]),
       retention=st.sampled_from([0, None, 8]), alignment=st.sampled_from([1, 2, 4]),
       with_full=st.booleans())
def test_mamba_checkpoint_runs_clean_and_unexportable_ones_change_nothing(
        lens: list[int], shared: int, extra_blocks: int, budget: int, retention: int | None,
        alignment: int, with_full: bool) -> None:
    """Random Mamba workloads with a prefill checkpoint finish with the pool's
    invariants intact after every step; and a checkpoint the backend could
    never export (an alignment no chunk offset below max_model_len is a
    multiple of) schedules exactly as no checkpoint at all (vLLM reads the
    checkpoint only through is_mamba_prefill_checkpoint_valid)."""
    prefix = (FULL,) if with_full else ()
    # Enough for one whole request in every group, plus some.
    blocks = (len(prefix) + 1) * ((shared + max(lens) + 3) // 4 + 1) + 2 + extra_blocks
    _run_mamba_workload((*prefix, mamba_ckpt(alignment)), lens, shared, blocks, budget, retention)
    never = _run_mamba_workload((*prefix, mamba_ckpt(1024)), lens, shared, blocks, budget, retention)
    plain = _run_mamba_workload((*prefix, KVCacheGroup("mamba", 4)), lens, shared, blocks, budget,
                                retention)
    assert never == plain
