"""PagedAttention against plain causal attention over each request's whole
sequence, held contiguously (a naive softmax(q k^T) v written out here)."""

from __future__ import annotations

import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kvsched.executor.paged_attention import (  # noqa: E402
    DECODE_GATHER_BYTES,
    AttentionMetadata,
    GatherBuffers,
    PagedAttention,
    _group_decode_rows,
    decode_group_keys,
)


def naive_attention(q, k, v):
    """q: [L, H, D] (the last L positions of the sequence), k, v: [S, Hkv, D]."""
    num_q, num_heads, head_dim = q.shape
    seq_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    kk = k.repeat_interleave(group, dim=1)
    vv = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), kk.double()) / head_dim ** 0.5
    q_pos = torch.arange(seq_len - num_q, seq_len)[:, None]
    scores = scores.masked_fill(torch.arange(seq_len)[None, :] > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv.double()).float()


def make_case(rng, specs, block_size, num_heads, num_kv_heads, head_dim=16):
    """specs: (cached, query_len) per request. Returns what a step needs plus
    each request's full k/v sequence (what the cache must end up holding)."""
    total_blocks = sum(-(-(c + n) // block_size) for c, n in specs) + 3
    free = list(range(1, total_blocks))  # block 0 is the null block
    rng.shuffle(free)
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    k_cache = torch.randn(total_blocks, block_size, num_kv_heads, head_dim, generator=g)
    v_cache = torch.randn(total_blocks, block_size, num_kv_heads, head_dim, generator=g)
    seqs, tables = [], []
    for cached, n in specs:
        seq_len = cached + n
        table = [free.pop() for _ in range(-(-seq_len // block_size))]
        k_seq = torch.randn(seq_len, num_kv_heads, head_dim, generator=g)
        v_seq = torch.randn(seq_len, num_kv_heads, head_dim, generator=g)
        for p in range(cached):  # the prefix is in the cache already
            k_cache[table[p // block_size], p % block_size] = k_seq[p]
            v_cache[table[p // block_size], p % block_size] = v_seq[p]
        q_new = torch.randn(n, num_heads, head_dim, generator=g)
        seqs.append((k_seq, v_seq, q_new))
        tables.append(table)
    return k_cache, v_cache, seqs, tables


def run_step(specs, block_size, num_heads=4, num_kv_heads=4, seed=0, buffers=None,
             group_keys=2048):
    rng = random.Random(seed)
    k_cache, v_cache, seqs, tables = make_case(rng, specs, block_size, num_heads, num_kv_heads)
    md = AttentionMetadata.build([n for _, n in specs], [c + n for c, n in specs], tables,
                                 block_size, group_keys=group_keys)
    md.check(k_cache.shape[0] * block_size)
    q = torch.cat([s[2] for s in seqs])
    k = torch.cat([s[0][c:] for s, (c, _) in zip(seqs, specs)])
    v = torch.cat([s[1][c:] for s, (c, _) in zip(seqs, specs)])
    attn = PagedAttention([(k_cache, v_cache)], md, buffers)
    out = attn(0, q, k, v)
    start = 0
    for (k_seq, v_seq, q_new), (cached, n), table in zip(seqs, specs, tables):
        expect = naive_attention(q_new, k_seq, v_seq)
        torch.testing.assert_close(out[start:start + n], expect, atol=1e-5, rtol=1e-5)
        # Every position of the sequence now sits at its block-table slot.
        for p in range(cached + n):
            assert torch.equal(k_cache[table[p // block_size], p % block_size], k_seq[p])
            assert torch.equal(v_cache[table[p // block_size], p % block_size], v_seq[p])
        start += n
    return md


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("group_keys", [64, 4096])
def test_mixed_batch_matches_naive(block_size, heads, group_keys):
    # Prefill chunks with and without cached prefix, at offsets inside and on
    # block boundaries, interleaved with decode rows of many context lengths
    # (in one decode group, or several).
    specs = [(0, 7), (5, 1), (0, 1), (33, 1), (16, 9), (3, 12), (70, 1), (2, 1), (12, 4), (0, 20)]
    md = run_step(specs, block_size, *heads, group_keys=group_keys)
    assert (len(md.decode_groups) == 1) == (group_keys == 4096)


@pytest.mark.parametrize("seed", range(4))
def test_random_batches_match_naive(seed):
    rng = random.Random(100 + seed)
    specs = []
    for _ in range(rng.randint(1, 12)):
        cached = rng.choice([0, rng.randint(0, 60)])
        specs.append((cached, 1 if rng.random() < 0.6 else rng.randint(1, 25)))
    run_step(specs, rng.choice([1, 4, 16]), *rng.choice([(4, 4), (4, 2), (8, 2)]), seed=seed,
             group_keys=rng.choice([16, 100, 4096]))


def test_decode_only_many_groups_and_reused_buffers():
    # Widely spread contexts make several decode groups; the scratch buffers
    # carry over between steps of different shapes.
    buffers = GatherBuffers()
    specs = [(c, 1) for c in (1, 2, 300, 5, 150, 151, 16, 17, 900, 63, 64, 65)]
    md = run_step(specs, 4, 4, 2, buffers=buffers, group_keys=600)
    assert 1 < len(md.decode_groups) < len(specs)
    run_step([(c, 1) for c in (3, 40, 41)], 16, 4, 2, seed=1, buffers=buffers, group_keys=1)


def test_prefill_with_no_cache_is_plain_causal():
    md = run_step([(0, 33)], 4)
    assert md.prefill_chunks[0].context_slots is None and not md.decode_groups


def test_positions_and_slot_mapping():
    md = AttentionMetadata.build([3, 1, 2], [5, 9, 2], [[7, 3], [1, 2, 4], [6]], 4)
    assert md.positions.tolist() == [2, 3, 4, 8, 0, 1]
    assert md.slot_mapping.tolist() == [30, 31, 12, 16, 24, 25]


def test_check_rejects_slots_outside_the_cache():
    md = AttentionMetadata.build([2], [2], [[5]], 4)
    md.check(24)
    with pytest.raises(AssertionError, match="outside"):
        md.check(20)
    with pytest.raises(AssertionError, match="outside"):  # a short table falls into block 0
        AttentionMetadata.build([1], [6], [[5]], 4).check(24)


def test_decode_groups_are_sorted_runs_under_the_key_budget():
    rng = np.random.default_rng(3)
    blocks = rng.integers(1, 51, 300)
    rows = np.arange(0, 300, 2)  # only some requests decode
    groups = _group_decode_rows(rows, blocks, 128)
    assert sorted(r for g in groups for r in g.tolist()) == rows.tolist()
    lengths = [blocks[g].tolist() for g in groups]
    assert [n for run in lengths for n in run] == sorted(blocks[rows].tolist())  # sorted runs
    for run in lengths:
        assert len(run) * max(run) <= 128 or len(run) == 1
    padded = sum(len(run) * max(run) for run in lengths)
    assert padded < 1.1 * blocks[rows].sum()  # one group would pad to ~2x
    assert [g.tolist() for g in _group_decode_rows(np.arange(3), np.array([5, 1, 3]), 9)] \
        == [[1, 2], [0]]
    assert [g.tolist() for g in _group_decode_rows(np.arange(2), np.array([200, 300]), 9)] \
        == [[0], [1]]
    assert _group_decode_rows(np.arange(0), np.array([], dtype=np.int64), 9) == []


def test_group_keys_fill_the_gather_budget():
    assert decode_group_keys(8, 64, torch.float32) * 8 * 64 * 4 * 2 == DECODE_GATHER_BYTES
    assert decode_group_keys(2, 64, torch.bfloat16) == 8 * decode_group_keys(8, 64, torch.float32)


def windowed_attention(q, k, v, window):
    """naive_attention where the query at position p sees only p - window + 1 .. p."""
    num_q, num_heads, head_dim = q.shape
    seq_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    kk = k.repeat_interleave(group, dim=1).double()
    vv = v.repeat_interleave(group, dim=1).double()
    out = torch.empty(num_q, num_heads, head_dim, dtype=torch.float64)
    for i in range(num_q):
        p = seq_len - num_q + i
        lo = max(0, p - window + 1)
        scores = torch.einsum("hd,khd->hk", q[i].double(), kk[lo:p + 1]) / head_dim ** 0.5
        out[i] = torch.einsum("hk,khd->hd", scores.softmax(-1), vv[lo:p + 1])
    return out.float()


@pytest.mark.parametrize("window", [1, 3, 8, 21, 500])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_sliding_window_reads_only_the_window(window, block_size):
    """Each query sees its own key and the window - 1 before it. The blocks
    wholly before the first query's window are freed: their pages hold NaN
    (reading one, even masked, would make the output NaN: 0 * NaN), and
    every other request's table has the null block 0 in their place (as
    after a prefix-cache hit), the others keep the stale ids (as the
    runner's copy of a running request's table does)."""
    specs = [(0, 7), (5, 1), (0, 1), (33, 1), (16, 9), (3, 12), (70, 1), (2, 1), (12, 4), (0, 30),
             (40, 25), (60, 2)]
    rng = random.Random(window * 100 + block_size)
    k_cache, v_cache, seqs, tables = make_case(rng, specs, block_size, 4, 2)
    nulled = stale = 0
    for i, ((cached, _), table) in enumerate(zip(specs, tables)):
        first_block = max(0, cached - window + 1) // block_size
        for j in range(first_block):
            k_cache[table[j]] = float("nan")
            v_cache[table[j]] = float("nan")
            if i % 2:
                table[j] = 0
                nulled += 1
            else:
                stale += 1
    assert (nulled > 0 and stale > 0) == (window < 500)
    md = AttentionMetadata.build([n for _, n in specs], [c + n for c, n in specs], tables,
                                 block_size, group_keys=64, sliding_window=window)
    md.check(k_cache.shape[0] * block_size)
    q = torch.cat([s[2] for s in seqs])
    k = torch.cat([s[0][c:] for s, (c, _) in zip(seqs, specs)])
    v = torch.cat([s[1][c:] for s, (c, _) in zip(seqs, specs)])
    out = PagedAttention([(k_cache, v_cache)], md)(0, q, k, v)
    start = 0
    for (k_seq, v_seq, q_new), (_, n) in zip(seqs, specs):
        torch.testing.assert_close(out[start:start + n], windowed_attention(q_new, k_seq, v_seq, window),
                                   atol=1e-5, rtol=1e-5)
        start += n


def test_a_window_changes_the_output():
    """The windowed reference differs from full attention on these shapes
    (so the test above can fail when the window is ignored)."""
    rng = random.Random(7)
    _, _, seqs, _ = make_case(rng, [(40, 25)], 4, 4, 2)
    k_seq, v_seq, q_new = seqs[0]
    full = naive_attention(q_new, k_seq, v_seq)
    assert not torch.allclose(windowed_attention(q_new, k_seq, v_seq, 8), full, atol=1e-3)
    torch.testing.assert_close(windowed_attention(q_new, k_seq, v_seq, 65), full)


def test_layers_read_their_groups_metadata_and_scale():
    """Two KV cache groups over one pool: layer 0 full attention on one
    table, layer 1 a window of 5 on another; each layer's output is its
    group's attention, at the given softmax scale."""
    g = torch.Generator().manual_seed(5)
    seq_len, block_size, heads, kv_heads, dim = 19, 4, 4, 2, 16
    k_seq = torch.randn(seq_len, kv_heads, dim, generator=g)
    v_seq = torch.randn(seq_len, kv_heads, dim, generator=g)
    q = torch.randn(seq_len, heads, dim, generator=g)
    caches = [(torch.zeros(12, block_size, kv_heads, dim), torch.zeros(12, block_size, kv_heads, dim))
              for _ in range(2)]
    tables = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    mds = [AttentionMetadata.build([seq_len], [seq_len], [t], block_size, sliding_window=w)
           for t, w in zip(tables, (None, 5))]
    attn = PagedAttention(caches, mds, layer_groups=[0, 1], scale=0.3)
    scale_fix = (0.3 * dim ** 0.5)  # the naive references divide by sqrt(dim)
    full = attn(0, q, k_seq, v_seq)
    local = attn(1, q, k_seq, v_seq)
    torch.testing.assert_close(full, naive_attention(q * scale_fix, k_seq, v_seq), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(local, windowed_attention(q * scale_fix, k_seq, v_seq, 5), atol=1e-5,
                               rtol=1e-5)
    # Each layer wrote its k/v into its own group's blocks only.
    assert caches[0][0][6:11].abs().sum() == 0 and caches[1][0][1:6].abs().sum() == 0
    assert torch.equal(caches[1][0][6].view(-1), k_seq[:4].reshape(-1))
