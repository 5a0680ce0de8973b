"""The attention interface the model calls, and a reference implementation for
one contiguous sequence without a KV cache (tests use it against transformers)."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F


class Attention(Protocol):
    """Attention of one step for one layer.

    ``q``: [T, num_heads, head_dim]; ``k``, ``v``: [T, num_kv_heads,
    head_dim], after rotary embedding (and Qwen3's q/k norm), possibly strided views. Returns
    [T, num_heads, head_dim]. The T tokens may belong to many requests; the
    implementation knows which, and each layer's softmax scale and window
    (``ModelConfig.attention_scale``, ``layer_sliding_windows``)."""

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor: ...


class CausalAttention:
    """All T tokens are one sequence starting at position 0: plain causal
    attention over the whole sequence at scale head_dim ** -0.5 (a
    Llama-family reference, and the engine's memory profile)."""

    __slots__ = ()

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        group = q.shape[1] // k.shape[1]
        # [T, H, D] -> [H, T, D]; kv head h serves query heads h*group .. h*group+group-1.
        qh = q.transpose(0, 1)
        kh = k.repeat_interleave(group, dim=1).transpose(0, 1)
        vh = v.repeat_interleave(group, dim=1).transpose(0, 1)
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True,
                                             scale=q.shape[-1] ** -0.5)
        return out.transpose(0, 1)
