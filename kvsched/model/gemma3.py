"""Gemma 3's text decoder (Gemma3ForCausalLM) in plain PyTorch, on the Llama
modules: interleaved local (sliding-window) and global layers, each kind
with its own RoPE base; per-head q/k norms; norms that scale by 1 + weight;
a norm after attention and around the MLP; a tanh-GELU gated MLP; the
embedding scaled by sqrt(hidden_size); tied logits, optionally soft-capped.

The window and the softmax scale (``query_pre_attn_scalar ** -0.5``) are the
``Attention``'s: the model runner reads them from the config, the window per
layer through the layer's KV cache group (:mod:`kvsched.model.kv_groups`)."""

from __future__ import annotations

import torch
from torch import nn

from kvsched.model.attention import Attention
from kvsched.model.config import ModelConfig
from kvsched.model.llama import (
    Embedding,
    LlamaAttention,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
    RMSNorm,
    RotaryEmbedding,
)


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.is_sliding = config.layer_sliding_windows[layer_idx] is not None

        def norm() -> RMSNorm:
            return RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype, device=device,
                           unit_offset=True)

        self.input_layernorm = norm()
        self.self_attn = LlamaAttention(config, layer_idx, dtype=dtype, device=device,
                                        unit_offset_norms=True)
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.mlp = LlamaMLP(config, dtype=dtype, device=device)
        self.post_feedforward_layernorm = norm()

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attention: Attention) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(hidden), cos, sin, attention)
        hidden = hidden + self.post_attention_layernorm(attn)
        mlp = self.mlp(self.pre_feedforward_layernorm(hidden))
        return hidden + self.post_feedforward_layernorm(mlp)  # type: ignore[no-any-return]


class Gemma3Model(LlamaModel):
    def __init__(self, config: ModelConfig, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        nn.Module.__init__(self)  # LlamaModel's layers are not these
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, dtype=dtype,
                                      device=device)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(config, i, dtype=dtype, device=device)
                                    for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype, device=device,
                            unit_offset=True)
        self.rotary_emb = RotaryEmbedding(config)
        self.local_rotary_emb = RotaryEmbedding(config, local=True)
        self.hidden_size = config.hidden_size

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attention: Attention) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        # sqrt(hidden_size) rounded to the activations' dtype first, as
        # transformers multiplies by it held in the weights' dtype.
        scale = float(torch.tensor(self.hidden_size ** 0.5, dtype=torch.float32).to(hidden.dtype))
        hidden = hidden * scale
        global_rope = self.rotary_emb.cos_sin(positions)
        local_rope = self.local_rotary_emb.cos_sin(positions)
        for layer in self.layers:
            cos, sin = local_rope if layer.is_sliding else global_rope
            hidden = layer(hidden, cos, sin, attention)
        return self.norm(hidden)  # type: ignore[no-any-return]


class Gemma3ForCausalLM(LlamaForCausalLM):
    """Gemma 3 text (``config.architecture`` Gemma3ForCausalLM)."""

    model_class = Gemma3Model
