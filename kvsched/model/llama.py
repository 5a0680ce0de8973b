"""The Llama family in plain PyTorch: Llama 2/3 (3.1's rope scaling), Mistral,
Qwen2/2.5 (q/k/v bias) and Qwen3 (per-head q/k RMSNorm).

The model sees no batch and no padding: T tokens of many requests flattened,
each with its absolute position in its own sequence; an ``Attention`` object
knows which token belongs to which request and where its KV cache lives.
q/k/v and gate/up projections are fused (one matmul each); the loader packs
transformers' separate tensors into them (``PACKED_MODULES``)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kvsched.model.attention import Attention
from kvsched.model.config import ModelConfig
from kvsched.model.cpu_gemm import CpuGemm

# Our fused module -> transformers' modules stacked in it along the output dim.
PACKED_MODULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    ("gate_up_proj", ("gate_proj", "up_proj")),
)


def rope_inv_freq(config: ModelConfig, local: bool = False) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] in float32 on CPU, with rope scaling;
    ``local``: the sliding layers' own RoPE (Gemma 3: its base, unscaled)."""
    dim = config.head_dim
    theta = config.local_rope_theta if local and config.local_rope_theta is not None \
        else config.rope_theta
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim))
    scaling = None if local else config.rope_scaling_dict()
    if scaling is None:
        return inv_freq
    factor = float(scaling["factor"])
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    # llama3: keep high frequencies, divide low ones by factor, blend in between.
    old_len = float(scaling["original_max_position_embeddings"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, blended, scaled)


class RotaryEmbedding:
    """cos/sin of position * inv_freq, computed and applied in float32 (as
    transformers computes them) then cast back to the activations' dtype."""

    def __init__(self, config: ModelConfig, local: bool = False) -> None:
        self.inv_freq = rope_inv_freq(config, local)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, 1, D] each, broadcast over heads: cos twice, and -sin then sin
        (the rotate-half convention as one product, see ``apply``)."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        cos, sin = freqs.cos(), freqs.sin()
        return torch.cat((cos, cos), -1)[:, None, :], torch.cat((-sin, sin), -1)[:, None, :]

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate [T, heads, D] by the neox (rotate-half) convention:
        (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin). Rolling x by D/2 gives
        (x2, x1), so the whole is x * cos + roll(x) * (-sin, sin): three
        element-wise ops instead of six, each element's arithmetic unchanged
        (x1 cos + x2 (-sin) rounds as x1 cos - x2 sin), so bit for bit the same."""
        xf = x.float()
        out = xf * cos + xf.roll(x.shape[-1] // 2, -1) * sin
        return out.to(x.dtype)


class Linear(nn.Module):
    """``y = x W^T + b`` with uninitialised parameters: the loader assigns the
    checkpoint's tensors, so nn.Linear's random init (slow on the meta device,
    seconds at first use) would be wasted work."""

    def __init__(self, in_features: int, out_features: int, bias: bool, *,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device))
        self.bias = (nn.Parameter(torch.empty(out_features, dtype=dtype, device=device))
                     if bias else None)
        self.gemm: CpuGemm | None = None

    def use_cpu_gemm(self) -> None:
        """Multiply through :class:`CpuGemm` from now on. ``weight`` becomes
        a view of its transposed copy, so the layer holds two layouts, not three."""
        gemm = CpuGemm(self.weight)
        self.weight = nn.Parameter(gemm.transposed.t(), requires_grad=False)
        self.gemm = gemm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gemm is not None:
            return self.gemm(x, self.bias)
        return F.linear(x, self.weight, self.bias)


class Embedding(nn.Module):
    """A lookup table with uninitialised parameters (see ``Linear``)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim, dtype=dtype, device=device))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class RMSNorm(nn.Module):
    """``unit_offset``: Gemma's norm, whose checkpoint stores the scale minus
    one and which scales in float32 before casting back (transformers'
    Gemma order); otherwise Llama's."""

    def __init__(self, size: int, eps: float, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, unit_offset: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype, device=device))
        self.eps = eps
        self.unit_offset = unit_offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.unit_offset:
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return (xf * (1.0 + self.weight.float())).to(x.dtype)
        if x.dtype == torch.float32:
            # torch's fused kernel, the same arithmetic in float32 (one op, not six).
            return torch.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Normalise in float32, cast back, then scale: transformers' order.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class LlamaAttention(nn.Module):
    """q/k/v, (per-head q/k norms), rotary embedding, attention, o. The
    softmax scale and a layer's window are the ``Attention``'s business."""

    def __init__(self, config: ModelConfig, layer_idx: int, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, unit_offset_norms: bool = False) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size,
                               bias=config.attention_bias, dtype=dtype, device=device)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=config.attention_out_bias,
                             dtype=dtype, device=device)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype=dtype, device=device,
                                  unit_offset=unit_offset_norms)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype=dtype, device=device,
                                  unit_offset=unit_offset_norms)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attention: Attention) -> torch.Tensor:
        t = hidden.shape[0]
        qkv = self.qkv_proj(hidden)
        v = qkv[:, self.q_size + self.kv_size:].reshape(t, self.num_kv_heads, self.head_dim).contiguous()
        if self.q_norm is not None and self.k_norm is not None:
            q, k = qkv[:, :self.q_size + self.kv_size].split([self.q_size, self.kv_size], dim=-1)
            q = RotaryEmbedding.apply(self.q_norm(q.reshape(t, self.num_heads, self.head_dim)), cos, sin)
            k = RotaryEmbedding.apply(self.k_norm(k.reshape(t, self.num_kv_heads, self.head_dim)), cos, sin)
        else:
            # q's and k's heads side by side: one rotation for both.
            qk = qkv[:, :self.q_size + self.kv_size].reshape(t, self.num_heads + self.num_kv_heads,
                                                             self.head_dim)
            rotated = RotaryEmbedding.apply(qk, cos, sin)
            q, k = rotated[:, :self.num_heads], rotated[:, self.num_heads:]
        out = attention(self.layer_idx, q, k, v)
        return self.o_proj(out.reshape(t, self.q_size))  # type: ignore[no-any-return]


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False,
                                   dtype=dtype, device=device)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False,
                                dtype=dtype, device=device)
        # SwiGLU, or Gemma's GeGLU (tanh GELU); ModelConfig checked the name.
        self.tanh_gelu = config.hidden_act == "gelu_pytorch_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        act = F.gelu(gate, approximate="tanh") if self.tanh_gelu else F.silu(gate)
        return self.down_proj(act * up)  # type: ignore[no-any-return]


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype,
                                       device=device)
        self.self_attn = LlamaAttention(config, layer_idx, dtype=dtype, device=device)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps,
                                                dtype=dtype, device=device)
        self.mlp = LlamaMLP(config, dtype=dtype, device=device)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attention: Attention) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, attention)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))  # type: ignore[no-any-return]


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, dtype=dtype,
                                      device=device)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i, dtype=dtype, device=device)
                                    for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype, device=device)
        self.rotary_emb = RotaryEmbedding(config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attention: Attention) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb.cos_sin(positions)  # shared by all layers
        for layer in self.layers:
            hidden = layer(hidden, cos, sin, attention)
        return self.norm(hidden)  # type: ignore[no-any-return]


class LlamaForCausalLM(nn.Module):
    """Llama, Mistral, Qwen2 and Qwen3 decoders (``config.architecture``).

    ``dtype``/``device`` set where the parameters are created (the loader uses
    device "meta" and then assigns the checkpoint's tensors)."""

    # The decoder stack a subclass swaps in (same forward signature).
    model_class: type[LlamaModel] = LlamaModel

    def __init__(self, config: ModelConfig, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.config = config
        self.model = self.model_class(config, dtype=dtype, device=device)
        # Tied embeddings: no lm_head module, the logits reuse embed_tokens.weight.
        self.lm_head: Linear | None = None
        if not config.tie_word_embeddings:
            self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False, dtype=dtype,
                                  device=device)
        self.logits_gemm: CpuGemm | None = None

    def use_cpu_gemm(self) -> None:
        """Every linear layer and the logits through :class:`CpuGemm` (call
        once the weights are loaded; see ``cpu_gemm.use_cpu_gemm``). Tied
        embeddings keep their row-major table for the lookup and get the two
        layouts beside it."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.use_cpu_gemm()
        if self.lm_head is None:
            self.logits_gemm = CpuGemm(self.model.embed_tokens.weight)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attention: Attention) -> torch.Tensor:
        """input_ids, positions: [T] int64 -> final-normed hidden states [T, hidden_size]."""
        return self.model(input_ids, positions, attention)  # type: ignore[no-any-return]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden_size] -> [N, vocab_size] float32 (matmul in the model's
        dtype, then Gemma's tanh soft-cap there, as transformers does)."""
        if self.lm_head is not None:
            logits: torch.Tensor = self.lm_head(hidden)
        elif self.logits_gemm is not None:
            logits = self.logits_gemm(hidden)
        else:
            logits = F.linear(hidden, self.model.embed_tokens.weight)
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()
