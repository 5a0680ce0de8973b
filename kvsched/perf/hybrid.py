"""The layers of a hybrid model that are not full attention, and what they
cost per step.

:class:`HybridLayers` (``ModelSpec.hybrid``) names them by kind, as vLLM
builds them from ``config.json``:

- **linear attention** (Gated DeltaNet: Qwen3-Next, Qwen3.5): a recurrent
  state of ``num_value_heads x key_head_dim x value_head_dim`` per request
  and layer, plus a short convolution's state; each token costs the same
  whatever the context (its projections are weights like any layer's; the
  recurrence is :meth:`HybridLayers.linear_flops_per_token`), and a step
  reads and writes each scheduled request's state once
  (:meth:`HybridLayers.linear_state_bytes`);
- **chunked local attention** (Llama 4's RoPE layers): each token attends
  only to the tokens of its own ``attention_chunk_size`` chunk; priced as a
  window of the chunk size over the batch's aggregates (an upper bound:
  exact while every context is within its first chunk);
- **DeepSeek Sparse Attention** (DeepSeek-V3.2, GLM-5): an MLA layer's
  lightning indexer scores the whole context (``index_n_heads`` heads of
  ``index_head_dim``, FP8 keys with a 4-byte scale), then attention runs
  over the ``index_topk`` best keys only
  (:func:`kvsched.perf.step_time.sparse_shape` caps the batch's attention
  aggregates at top-k keys per query). ``num_shared_index_layers`` of the
  layers build no indexer (GLM-5.2's ``indexer_types`` "shared"): they
  attend over the top-k the closest indexer layer before them picked, so
  they have no indexer weights, cost or key cache.

- **Mamba-2** (SSD: Nemotron-H, Nemotron-3): like linear attention, a
  per-request state (``num_heads x head_dim x state_size`` plus the
  convolution's) and a per-token cost independent of the context
  (:meth:`HybridLayers.mamba_flops_per_token`,
  :meth:`HybridLayers.mamba_state_bytes`);
- **single-block layers** (Nemotron-H's ``hybrid_override_pattern``): a
  layer that is one block alone behind one norm, a token mixer without an
  MLP (``num_mixer_only_layers``: its Mamba-2 and attention layers) or an
  MLP / MoE block without a mixer (``num_mlp_only_layers``). The spec's
  parameter counts, MLP layers and attention layers leave out what such a
  layer lacks (:class:`~kvsched.perf.models.ModelSpec`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsched.errors import UserInputError
from kvsched.jsonfile import show

# fla's chunked Gated DeltaNet kernels (vLLM's prefill path) work in chunks of 64 tokens.
GDN_CHUNK = 64
# Mamba-2's chunked scan (SSD) in a prefill, when the config names no chunk_size.
MAMBA_CHUNK = 256
# DeepSeek-V3.2's indexer keys: FP8 values plus one FP32 scale per key.
INDEX_KEY_SCALE_BYTES = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class HybridLayers:
    """A hybrid model's non-full-attention layers (module docstring): the
    counts are layers of the model's ``num_layers``; the shapes those
    layers' kind has. All 0: none of that kind."""

    num_linear_layers: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    # Bytes per value of the recurrent state (vLLM's mamba_ssm_cache_dtype:
    # the model's 16 bits unless the config asks float32, as Qwen3.5's).
    linear_state_dtype_bytes: int = 2
    num_mamba_layers: int = 0
    mamba_num_heads: int = 0
    mamba_head_dim: int = 0
    mamba_state_size: int = 0
    mamba_n_groups: int = 0
    mamba_conv_kernel: int = 0
    mamba_chunk_size: int = MAMBA_CHUNK
    # Bytes per value of the SSM state (mamba_ssm_cache_dtype).
    mamba_state_dtype_bytes: int = 2
    # MambaMixer2's biases: the convolution's (use_conv_bias) and the
    # input/output projections' (use_bias).
    mamba_conv_bias: bool = False
    mamba_proj_bias: bool = False
    # Single-block layers (module doc): of the model's layers, those that
    # are a mixer alone and those that are an MLP or MoE block alone.
    num_mixer_only_layers: int = 0
    num_mlp_only_layers: int = 0
    num_chunked_layers: int = 0
    attention_chunk_size: int = 0
    index_topk: int = 0
    index_n_heads: int = 0
    index_head_dim: int = 0
    num_shared_index_layers: int = 0

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name in ("mamba_conv_bias", "mamba_proj_bias"):
                if not isinstance(value, bool):
                    raise UserInputError(f"HybridLayers {name}={show(value)}: must be true or false")
            elif not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UserInputError(f"HybridLayers {name}={show(value)}: must be an integer >= 0")
        groups = {
            "num_linear_layers": ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                  "linear_value_head_dim", "linear_conv_kernel"),
            "num_chunked_layers": ("attention_chunk_size",),
            "num_mamba_layers": ("mamba_num_heads", "mamba_head_dim", "mamba_state_size", "mamba_n_groups",
                                 "mamba_conv_kernel", "mamba_chunk_size"),
            "index_topk": ("index_n_heads", "index_head_dim"),
        }
        if self.num_shared_index_layers and not self.index_topk:
            raise UserInputError(f"HybridLayers num_shared_index_layers={self.num_shared_index_layers}: "
                                 "layers sharing an indexer's top-k need DeepSeek Sparse Attention "
                                 "(index_topk > 0)")
        for count, shape in groups.items():
            if getattr(self, count):
                for name in shape:
                    if getattr(self, name) < 1:
                        raise UserInputError(f"HybridLayers {name}={getattr(self, name)}: must be positive "
                                             f"with {count}={getattr(self, count)}")
        if self.num_mamba_layers > self.num_mixer_only_layers and self.num_mixer_only_layers:
            raise UserInputError(f"HybridLayers num_mamba_layers={self.num_mamba_layers}: a single-block "
                                 f"model's Mamba layers are among its num_mixer_only_layers="
                                 f"{self.num_mixer_only_layers}")
        if self.num_linear_layers and self.linear_num_value_heads % self.linear_num_key_heads:
            raise UserInputError(f"HybridLayers linear_num_value_heads={self.linear_num_value_heads}: must "
                                 f"be a multiple of linear_num_key_heads={self.linear_num_key_heads}")

    @property
    def num_other_layers(self) -> int:
        """Layers that are not full (or sliding-window) attention: linear,
        chunked, Mamba-2 and MLP-only ones."""
        return (self.num_linear_layers + self.num_chunked_layers + self.num_mamba_layers
                + self.num_mlp_only_layers)

    @property
    def num_single_block_layers(self) -> int:
        """Layers that are one block alone (one norm, one residual add)."""
        return self.num_mixer_only_layers + self.num_mlp_only_layers

    @property
    def linear_conv_dim(self) -> int:
        """Channels of the short convolution: q, k (key heads) and v (value heads)."""
        return (2 * self.linear_num_key_heads * self.linear_key_head_dim
                + self.linear_num_value_heads * self.linear_value_head_dim)

    def linear_params_per_layer(self, hidden_size: int) -> int:
        """One Gated DeltaNet layer's weights: the q/k/v/z input projection,
        the b/a (beta, decay) projection, the convolution, the decay
        parameters, the gated norm and the output projection."""
        nk, nv = self.linear_num_key_heads, self.linear_num_value_heads
        dk, dv = self.linear_key_head_dim, self.linear_value_head_dim
        qkvz = hidden_size * (2 * nk * dk + 2 * nv * dv)
        ba = hidden_size * 2 * nv
        conv = self.linear_conv_dim * self.linear_conv_kernel
        return qkvz + ba + conv + 2 * nv + dv + nv * dv * hidden_size

    def linear_flops_per_token(self, prefill: bool) -> float:
        """The recurrence's FLOPs per token and layer (projections apart):
        per value head, the state's product with k, its rank-one update and
        its product with q (2 dk dv each); the convolution; in a prefill the
        chunked kernel's intra-chunk products besides."""
        dk, dv, nv = self.linear_key_head_dim, self.linear_value_head_dim, self.linear_num_value_heads
        flops = 6.0 * nv * dk * dv + 2.0 * self.linear_conv_dim * self.linear_conv_kernel
        if prefill:
            flops += 2.0 * nv * GDN_CHUNK * (dk + dv)
        return flops

    def linear_state_bytes(self) -> float:
        """One request's state in one linear layer: the recurrent state (at
        ``linear_state_dtype_bytes``) and the convolution's last
        ``kernel - 1`` inputs (16-bit)."""
        state = self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim
        conv = self.linear_conv_dim * (self.linear_conv_kernel - 1)
        return float(state * self.linear_state_dtype_bytes + conv * 2)

    @property
    def mamba_inner(self) -> int:
        """Mamba-2's inner width: heads x head dim."""
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of Mamba-2's convolution: x, B and C."""
        return self.mamba_inner + 2 * self.mamba_n_groups * self.mamba_state_size

    def mamba_params_per_layer(self, hidden_size: int) -> int:
        """One Mamba-2 mixer's weights as vLLM's MambaMixer2 holds them: the
        input projection (z, x, B, C and dt), the convolution, A, D and
        dt's bias, the gated norm and the output projection, with the
        biases the config asks for."""
        inner, heads = self.mamba_inner, self.mamba_num_heads
        in_width = 2 * inner + 2 * self.mamba_n_groups * self.mamba_state_size + heads
        in_proj = hidden_size * in_width + (in_width if self.mamba_proj_bias else 0)
        conv = self.mamba_conv_dim * (self.mamba_conv_kernel + int(self.mamba_conv_bias))
        out_proj = inner * hidden_size + (hidden_size if self.mamba_proj_bias else 0)
        return in_proj + conv + 3 * heads + inner + out_proj

    def mamba_flops_per_token(self, prefill: bool) -> float:
        """The scan's FLOPs per token and layer (projections apart): per
        head, the state's decay, its rank-one update by B and x, and its
        read-out by C (2 head_dim state_size each); the convolution; in a
        prefill the chunked scan's intra-chunk products besides."""
        hd, ds, nh = self.mamba_head_dim, self.mamba_state_size, self.mamba_num_heads
        flops = 6.0 * nh * hd * ds + 2.0 * self.mamba_conv_dim * self.mamba_conv_kernel
        if prefill:
            flops += 2.0 * nh * self.mamba_chunk_size * (hd + ds)
        return flops

    def mamba_state_bytes(self) -> float:
        """One request's state in one Mamba-2 layer: the SSM state (at
        ``mamba_state_dtype_bytes``) and the convolution's last ``kernel - 1``
        inputs (16-bit)."""
        state = self.mamba_num_heads * self.mamba_head_dim * self.mamba_state_size
        conv = self.mamba_conv_dim * (self.mamba_conv_kernel - 1)
        return float(state * self.mamba_state_dtype_bytes + conv * 2)

    def indexer_params_per_layer(self, hidden_size: int, q_lora_rank: int) -> int:
        """DSA's indexer weights: its query projection from the q latent,
        its key projection, key norm and per-head weights."""
        if not self.index_topk:
            return 0
        q_in = q_lora_rank or hidden_size
        return (q_in * self.index_n_heads * self.index_head_dim + hidden_size * self.index_head_dim
                + 2 * self.index_head_dim + hidden_size * self.index_n_heads)

