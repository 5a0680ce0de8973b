"""Paged attention for one engine step: the scheduler's block tables drive
every KV write and read.

``AttentionMetadata.build`` turns the step's per-request query lengths,
sequence lengths and block tables into positions, the slot of every new
token, and the gather plan shared by all layers. ``PagedAttention`` (the
model's ``Attention``) writes each layer's new k/v into the cache, then
attends: decode rows (query length 1) sorted by context length and cut into
groups, one batched SDPA call per group over a padded gather of the group's
contexts (small enough to stay in the CPU cache, with little padding);
prefill chunks one SDPA call each, causal inside the chunk and over the
cached prefix before it.

A model's layers may fall into several KV cache groups
(:mod:`kvsched.model.kv_groups`), each with its own block tables: one
``AttentionMetadata`` per group, and each layer uses its group's. A
sliding-window group's metadata reads only the window: the query at position
p sees the keys at p - window + 1 .. p, and blocks wholly before the first
query's window are never read, so the scheduler may have freed them (vLLM's
sliding-window manager puts the null block 0 in their place).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import Tensor

from kvsched.errors import UserInputError

# Bytes of K and V one decode group gathers. Gathering contexts in pieces
# that stay in the CPU's last-level cache while SDPA reads them back beats one
# big padded gather by ~1.5x (measured at 256 rows, contexts 30..770, 8x64
# heads, float32: 8 MiB best among 2..32 MiB).
DECODE_GATHER_BYTES = 8 << 20


def decode_group_keys(num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Padded keys per decode group that fill DECODE_GATHER_BYTES of K and V."""
    token_bytes = 2 * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
    return max(1, DECODE_GATHER_BYTES // token_bytes)


@dataclass(slots=True)
class DecodeGroup:
    """Decode rows of similar context length, padded to the longest."""

    token_idx: Tensor  # [n] rows of the flat batch
    block_ids: Tensor  # [n * num_blocks] the rows' block tables, padded with null block 0
    num_blocks: int
    # Keys attended: the longest row's context (the gathered blocks' tail
    # past it is left out; with vLLM's CPU block size of 128 that tail can
    # be most of a block per row).
    num_keys: int
    key_mask: Tensor  # [n, 1, 1, num_keys]: True inside the row's context


@dataclass(slots=True)
class PrefillChunk:
    """A request's chunk of more than one query token: flat rows start..end."""

    start: int
    end: int
    # Slots of the context the chunk attends to (the cached prefix, or the
    # window's part of it, then the chunk); None when nothing cached is in
    # view, so the chunk attends over its own k/v.
    context_slots: Tensor | None
    # [query_len, keys]: True where a query sees a key; None: plain causal
    # over the chunk's own k/v (is_causal).
    mask: Tensor | None


@dataclass(slots=True)
class AttentionMetadata:
    """One step's layout, shared by every layer."""

    block_size: int
    positions: Tensor  # [T] int64: position of each token inside its sequence
    slot_mapping: Tensor  # [T] int64: cache slot each token's k/v is written to
    decode_groups: list[DecodeGroup]
    prefill_chunks: list[PrefillChunk]
    sliding_window: int | None = None  # keys a query sees, itself included; None: all

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @classmethod
    def build(cls, query_lens: Sequence[int], seq_lens: Sequence[int],
              block_tables: Sequence[Sequence[int]], block_size: int,
              device: torch.device | str = "cpu", group_keys: int = 2048,
              sliding_window: int | None = None) -> AttentionMetadata:
        """Requests in flat-batch order. Request i owns the next ``query_lens[i]``
        tokens, at positions ``seq_lens[i] - query_lens[i]`` .. ``seq_lens[i] - 1``
        (the tokens before them are in the cache already); ``block_tables[i]``
        must cover its ``seq_lens[i]`` tokens. Decode groups hold at most
        ``group_keys`` padded keys (or one row); see ``decode_group_keys``.
        With ``sliding_window`` W each query sees its own key and the W - 1
        before it; table entries of blocks that lie wholly before the first
        query's window are not read (they may be the null block 0)."""
        if sliding_window is not None and sliding_window < 1:
            raise UserInputError(f"sliding_window={sliding_window}: must be a positive number of "
                                 "tokens, or None for full attention")
        num_reqs = len(query_lens)
        if len(seq_lens) != num_reqs or len(block_tables) != num_reqs:
            raise UserInputError(
                f"len(seq_lens)={len(seq_lens)}, len(block_tables)={len(block_tables)}: "
                f"must equal len(query_lens)={num_reqs}; pass one entry per request")
        # Index arithmetic in numpy: a few small arrays per step, where
        # torch's per-op overhead would dominate.
        q_lens = np.array(query_lens, dtype=np.int64)
        s_lens = np.array(seq_lens, dtype=np.int64)
        blocks_needed = -(-s_lens // block_size)
        max_blocks = int(blocks_needed.max(initial=0))
        # One padded table for the whole step; rows pad with the null block 0.
        table = np.zeros((num_reqs, max_blocks), dtype=np.int64)
        for i, t in enumerate(block_tables):
            table[i, :len(t)] = t[:max_blocks]
        num_tokens = int(q_lens.sum())
        cu = np.cumsum(q_lens) - q_lens  # first flat row of each request
        positions = np.arange(num_tokens, dtype=np.int64) + np.repeat(s_lens - q_lens - cu, q_lens)
        req_idx = np.repeat(np.arange(num_reqs), q_lens)
        slot_mapping = table[req_idx, positions // block_size] * block_size + positions % block_size

        # The first position the request's first query sees, and its block:
        # the blocks before it are not read.
        window = sliding_window
        first_key = (np.zeros_like(s_lens) if window is None
                     else np.maximum(s_lens - q_lens - window + 1, 0))
        first_block = first_key // block_size
        row_blocks = blocks_needed - first_block  # blocks each request reads

        groups = []
        decode_rows = np.flatnonzero(q_lens == 1)
        for rows in _group_decode_rows(decode_rows, row_blocks, group_keys // block_size):
            nb = int(row_blocks[rows[-1]])  # rows come sorted by length
            row_lens = s_lens[rows]
            if window is None:
                num_keys = int(row_lens.max())
                mask = np.arange(num_keys)[None, :] < row_lens[:, None]
                ids = table[rows, :nb]
            else:
                # Row r's gathered key j is position first_block[r] * block_size + j.
                base = first_block[rows] * block_size
                num_keys = int((row_lens - base).max())
                key_pos = base[:, None] + np.arange(num_keys)[None, :]
                mask = (key_pos < row_lens[:, None]) & (key_pos >= (row_lens - window)[:, None])
                cols = first_block[rows][:, None] + np.arange(nb)[None, :]
                # Columns past a row's table read the null block 0 (masked).
                ids = np.where(cols < max_blocks, table[rows[:, None], np.minimum(cols, max_blocks - 1)], 0)
            groups.append(DecodeGroup(
                token_idx=_to(cu[rows], device),
                block_ids=_to(ids.reshape(-1), device),
                num_blocks=nb,
                num_keys=num_keys,
                key_mask=_to(mask[:, None, None, :], device)))
        chunks = []
        offsets = np.arange(block_size)
        for i in np.flatnonzero(q_lens > 1).tolist():
            n, seq_len = int(q_lens[i]), int(s_lens[i])
            cached = seq_len - n
            lo = int(first_key[i])
            q_pos = (cached + np.arange(n))[:, None]
            slots = chunk_mask = None
            if cached > lo:  # some cached keys are in view: read the context from the cache
                fb, nb = int(first_block[i]), int(blocks_needed[i])
                context = (table[i, fb:nb, None] * block_size + offsets).reshape(-1)
                slots = _to(context[lo - fb * block_size:seq_len - fb * block_size], device)
                key_pos = np.arange(lo, seq_len)[None, :]
            elif window is not None and n > window:  # the chunk alone outgrows the window
                key_pos = np.arange(cached, seq_len)[None, :]
            else:
                key_pos = None
            if key_pos is not None:
                seen = key_pos <= q_pos
                if window is not None:
                    seen &= key_pos > q_pos - window
                chunk_mask = _to(seen, device)
            start = int(cu[i])
            chunks.append(PrefillChunk(start, start + n, slots, chunk_mask))
        return cls(block_size, _to(positions, device), _to(slot_mapping, device), groups, chunks,
                   window)

    def check(self, num_slots: int) -> None:
        """Debug check: every slot the step writes or reads lies inside a
        cache of ``num_slots`` slots, and none is in the null block 0 (the hot
        path does not pay for this)."""
        bad = ((self.slot_mapping < self.block_size) | (self.slot_mapping >= num_slots)).nonzero()
        if bad.numel():
            row = int(bad[0, 0])
            raise AssertionError(f"slot_mapping[{row}]={int(self.slot_mapping[row])} outside the "
                                 f"cache's slots {self.block_size}..{num_slots - 1}")
        num_blocks = num_slots // self.block_size
        for g in self.decode_groups:
            if g.block_ids.numel() and not 0 <= int(g.block_ids.min()) <= int(g.block_ids.max()) \
                    < num_blocks:
                raise AssertionError(f"decode block ids outside the cache of {num_blocks} blocks")
        for c in self.prefill_chunks:
            s = c.context_slots
            if s is not None and s.numel() and not self.block_size <= int(s.min()) \
                    <= int(s.max()) < num_slots:
                raise AssertionError(f"chunk at rows {c.start}..{c.end}: context slot outside "
                                     f"the cache of {num_slots} slots")


def _to(a: npt.NDArray[np.int64] | npt.NDArray[np.bool_], device: torch.device | str) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


def _group_decode_rows(rows: npt.NDArray[np.int64], blocks_needed: npt.NDArray[np.int64],
                       max_blocks: int) -> list[npt.NDArray[np.int64]]:
    """Sort decode rows by context length and cut them into runs of at most
    ``max_blocks`` padded blocks (each run at least one row). Neighbours in
    length order pad each other very little."""
    order = rows[np.argsort(blocks_needed[rows], kind="stable")]
    groups = []
    start = 0
    for j, nb in enumerate(blocks_needed[order].tolist()):
        # Rows ascend, so the run start..j pads to row j's length.
        if j > start and (j + 1 - start) * nb > max_blocks:
            groups.append(order[start:j])
            start = j
    if len(order):
        groups.append(order[start:])
    return groups


class GatherBuffers:
    """Reusable scratch for the decode gathers, kept across layers and steps
    (a fresh allocation per group would pay page faults every time)."""

    __slots__ = ("k", "v")

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def get(self, numel: int, like: Tensor) -> tuple[Tensor, Tensor]:
        k, v = self.k, self.v
        if k is None or v is None or k.numel() < numel or k.dtype != like.dtype \
                or k.device != like.device:
            k = self.k = torch.empty(numel, dtype=like.dtype, device=like.device)
            v = self.v = torch.empty(numel, dtype=like.dtype, device=like.device)
        return k[:numel], v[:numel]


class PagedAttention:
    """The model's ``Attention`` for one step over a paged KV cache.

    ``kv_caches[layer]`` is (K, V), each [num_blocks, block_size,
    num_kv_heads, head_dim]: a block id names the same page in every
    layer's tensors. ``metadata`` is the step's layout, or one per KV cache
    group with ``layer_groups[layer]`` naming each layer's (None: every layer
    in group 0). ``scale`` is the softmax scale (None: head_dim ** -0.5).
    Every call writes the layer's new k/v into the slots of its group's
    ``slot_mapping`` first, then reads the contexts back."""

    __slots__ = ("kv_caches", "metadata", "buffers", "layer_groups", "scale")

    def __init__(self, kv_caches: Sequence[tuple[Tensor, Tensor]],
                 metadata: AttentionMetadata | Sequence[AttentionMetadata],
                 buffers: GatherBuffers | None = None, *,
                 layer_groups: Sequence[int] | None = None, scale: float | None = None) -> None:
        self.kv_caches = kv_caches
        self.metadata = [metadata] if isinstance(metadata, AttentionMetadata) else list(metadata)
        self.buffers = GatherBuffers() if buffers is None else buffers
        self.layer_groups = layer_groups
        self.scale = scale

    def __call__(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        groups = self.layer_groups
        md = self.metadata[0 if groups is None else groups[layer_idx]]
        k_cache, v_cache = self.kv_caches[layer_idx]
        num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
        k_slots = k_cache.view(-1, num_kv_heads, head_dim)
        v_slots = v_cache.view(-1, num_kv_heads, head_dim)
        k_slots.index_copy_(0, md.slot_mapping, k)
        v_slots.index_copy_(0, md.slot_mapping, v)

        num_heads = q.shape[1]
        group = num_heads // num_kv_heads
        scale = head_dim ** -0.5 if self.scale is None else self.scale
        out = torch.empty_like(q)
        if md.decode_groups:
            largest = max(g.block_ids.numel() for g in md.decode_groups)
            block_numel = block_size * num_kv_heads * head_dim
            k_buf, v_buf = self.buffers.get(largest * block_numel, k_cache)
            k_blocks = k_cache.view(num_blocks, block_numel)
            v_blocks = v_cache.view(num_blocks, block_numel)
        for g in md.decode_groups:
            n, keys = g.token_idx.shape[0], g.num_blocks * block_size
            size = g.block_ids.numel()
            kg = torch.index_select(k_blocks, 0, g.block_ids, out=k_buf[:size * block_numel]
                                    .view(size, block_numel))
            vg = torch.index_select(v_blocks, 0, g.block_ids, out=v_buf[:size * block_numel]
                                    .view(size, block_numel))
            # [n, H_kv, keys, D]; a kv head's query heads ride as `group` query rows.
            kg = kg.view(n, keys, num_kv_heads, head_dim)[:, :g.num_keys].transpose(1, 2)
            vg = vg.view(n, keys, num_kv_heads, head_dim)[:, :g.num_keys].transpose(1, 2)
            qg = q.index_select(0, g.token_idx).view(n, num_kv_heads, group, head_dim)
            og = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.key_mask, scale=scale)
            out.index_copy_(0, g.token_idx, og.reshape(n, num_heads, head_dim))
        for c in md.prefill_chunks:
            qc = q[c.start:c.end].transpose(0, 1).unsqueeze(0)
            if c.context_slots is None:
                kc, vc = k[c.start:c.end], v[c.start:c.end]
            else:
                kc, vc = k_slots[c.context_slots], v_slots[c.context_slots]
            oc = F.scaled_dot_product_attention(
                qc, kc.transpose(0, 1).unsqueeze(0), vc.transpose(0, 1).unsqueeze(0),
                attn_mask=c.mask, is_causal=c.mask is None, scale=scale,
                enable_gqa=group > 1)
            out[c.start:c.end] = oc[0].transpose(0, 1)
        return out
