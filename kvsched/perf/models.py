"""``ModelSpec``: a model's architecture and what it costs.

A :class:`ModelSpec` holds architecture only (no dtype: that is chosen at run
time) and derives what the performance model needs: parameter counts (total,
active per token, and per-layer building blocks) and KV-cache bytes per token.
All derived numbers are for the FULL model, unsharded.

The named models are :mod:`kvsched.perf.model_catalog`'s; a Hugging Face
``config.json`` becomes a spec in :mod:`kvsched.perf.model_parsers`; what a
quantized checkpoint stores is :mod:`kvsched.perf.checkpoint_format`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kvsched.errors import UserInputError
from kvsched.fields import is_int
from kvsched.hf_config import (
    MAX_EXPERTS,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN_SIZE,
    MAX_INTERMEDIATE_SIZE,
    MAX_LAYERS,
    MAX_POSITIONS,
    MAX_VOCAB_SIZE,
    ModelShape,
)
from kvsched.jsonfile import show
from kvsched.perf.hybrid import HybridLayers

# The MLP's activation and shape: SwiGLU (gate, up, down), or an up and a
# down projection around GELU or a squared ReLU (Nemotron-H's relu2).
MLP_KINDS = ("swiglu", "gelu", "relu2")
NORM_KINDS = ("rmsnorm", "layernorm")


def _fail(model: str, field: str, value: object, rule: str) -> UserInputError:
    return UserInputError(f"model {show(model)}: {field}={show(value)}: {rule}")


# The stated upper bound of each integer field (the reasons are kvsched.hf_config's,
# which checks the same bounds on a config.json's fields as it reads them).
_UPPER_BOUNDS: Mapping[str, int] = MappingProxyType({
    "hidden_size": MAX_HIDDEN_SIZE, "num_layers": MAX_LAYERS, "num_heads": MAX_HEADS,
    "num_kv_heads": MAX_HEADS, "head_dim": MAX_HEAD_DIM, "intermediate_size": MAX_INTERMEDIATE_SIZE,
    "vocab_size": MAX_VOCAB_SIZE, "max_position_embeddings": MAX_POSITIONS,
    "num_experts": MAX_EXPERTS, "experts_per_token": MAX_EXPERTS,
    "moe_intermediate_size": MAX_INTERMEDIATE_SIZE, "num_shared_experts": MAX_EXPERTS,
    "shared_expert_intermediate_size": MAX_INTERMEDIATE_SIZE, "first_k_dense_layers": MAX_LAYERS,
    "q_lora_rank": MAX_HIDDEN_SIZE, "kv_lora_rank": MAX_HIDDEN_SIZE, "qk_nope_head_dim": MAX_HEAD_DIM,
    "qk_rope_head_dim": MAX_HEAD_DIM, "v_head_dim": MAX_HEAD_DIM, "sliding_window": MAX_POSITIONS,
    "num_sliding_layers": MAX_LAYERS, "num_mtp_layers": MAX_LAYERS, "moe_latent_size": MAX_HIDDEN_SIZE,
})


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec(ModelShape):
    """A decoder-only transformer's architecture, as far as cost is concerned.

    The shape (widths, heads, biases, MoE and sliding-window layout) is
    :class:`kvsched.hf_config.ModelShape`'s, declared there once for this
    class and the engine's model config alike; its docstring says why a base
    class rather than parts. Beyond it, a few fields exist only so parameter
    counts come out exact: LayerNorm (weight + bias) vs RMSNorm (weight),
    gpt-oss's attention sinks, BLOOM's embedding LayerNorm, and a router
    bias vector (gpt-oss's linear bias; DeepSeek-V3's
    ``e_score_correction_bias``).

    MoE: ``intermediate_size`` is 0 when no layer has a dense MLP (Mixtral,
    Qwen3-MoE, gpt-oss ship an unused or expert-sized value there).

    MLA (DeepSeek): ``head_dim`` is the q/k head dim (nope + rope); the cache
    holds ``kv_lora_rank + qk_rope_head_dim`` values per token per layer.

    Sliding window: see :meth:`kv_bytes_per_token` and
    :meth:`sliding_kv_bytes_per_seq`.

    Single-block layers (Nemotron-H, :class:`~kvsched.perf.hybrid.HybridLayers`):
    a layer that is a mixer alone has no MLP, one that is an MLP or MoE
    block alone has no attention, and either has one norm; the layer counts
    (:attr:`num_dense_layers`, :attr:`num_moe_layers`,
    :attr:`num_full_attention_layers`) leave those out.

    Latent MoE (``moe_latent_size``, Nemotron-3-Super): the routed experts
    work at the latent width, between a projection into it and one out of
    it that every token runs.

    MTP: ``num_mtp_layers`` multi-token-prediction modules (eh_proj + one
    decoder layer each) ship beside the main layers; they are not in
    :meth:`num_params` and cost nothing unless speculative decoding uses them
    (kvsched.perf.drafter).
    """

    name: str
    # Attention beyond the shape: gpt-oss's per-head sinks; DeepSeek's MLA
    # latent ranks and head dims (all 0 without MLA).
    attention_sinks: bool = False
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # The MLP beyond the shape: its activation, the shared experts of each
    # MoE layer (they always run) and the router's bias vector.
    mlp_kind: str = "swiglu"
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    router_bias: bool = False
    moe_latent_size: int = 0
    # Norms: their kind; two more per layer, after attention and after the
    # MLP (Gemma 2/3's post_attention/post_feedforward norms, GLM-4's
    # post_self_attn/post_mlp), four per layer instead of two, vectors only;
    # BLOOM's LayerNorm after the embedding.
    norm_kind: str = "rmsnorm"
    post_norms: bool = False
    embedding_norm: bool = False
    # Multi-token-prediction modules the checkpoint ships (DeepSeek's
    # ``num_nextn_predict_layers``): what vLLM's ``method: mtp`` drafts with.
    # Not counted in the parameters above (models.md counts MTP apart).
    num_mtp_layers: int = 0
    # vLLM's GlmMoeDsaForCausalLM config hook (GLM-5): an "auto" KV cache is
    # fp8 on SM100-family GPUs (kvsched.sim.deployment.kv_cache_dtype).
    fp8_kv_cache_on_sm100: bool = False
    # A hybrid model's layers that are not full attention, by kind
    # (linear attention, chunked local attention) and DeepSeek Sparse
    # Attention's indexer (kvsched.perf.hybrid); None: none.
    hybrid: HybridLayers | None = None

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not name:
            raise _fail(str(name), "name", name, "must be a non-empty string")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (not is_int(value) or value < 0):
                raise _fail(name, f.name, value, "must be a non-negative integer")
            if f.type == "int" and value > _UPPER_BOUNDS[f.name]:
                raise _fail(name, f.name, value, f"must be at most {_UPPER_BOUNDS[f.name]:,} (beyond "
                            "every published model; see kvsched.hf_config for each bound's reason)")
            if f.type == "bool" and not isinstance(value, bool):
                raise _fail(name, f.name, value, "must be true or false")
        for field in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                      "vocab_size", "max_position_embeddings"):
            if getattr(self, field) < 1:
                raise _fail(name, field, getattr(self, field), "must be positive")
        if self.mlp_kind not in MLP_KINDS:
            raise _fail(name, "mlp_kind", self.mlp_kind, f"must be one of {', '.join(MLP_KINDS)}")
        if self.norm_kind not in NORM_KINDS:
            raise _fail(name, "norm_kind", self.norm_kind, f"must be one of {', '.join(NORM_KINDS)}")
        if self.num_heads % self.num_kv_heads:
            raise _fail(name, "num_kv_heads", self.num_kv_heads,
                        f"must divide num_heads ({self.num_heads})")
        self._check_moe()
        if self.kv_lora_rank:
            for field in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, field) < 1:
                    raise _fail(name, field, getattr(self, field), "must be positive for MLA")
            if self.head_dim != self.qk_nope_head_dim + self.qk_rope_head_dim:
                raise _fail(name, "head_dim", self.head_dim,
                            "must equal qk_nope_head_dim + qk_rope_head_dim for MLA")
        elif self.q_lora_rank or self.qk_nope_head_dim or self.qk_rope_head_dim or self.v_head_dim:
            raise _fail(name, "kv_lora_rank", 0, "MLA fields are set but kv_lora_rank is 0")
        if self.num_sliding_layers > self.num_layers:
            raise _fail(name, "num_sliding_layers", self.num_sliding_layers,
                        f"cannot exceed num_layers ({self.num_layers})")
        if self.hybrid is not None:
            if not isinstance(self.hybrid, HybridLayers):
                raise _fail(name, "hybrid", self.hybrid, "must be a HybridLayers or None")
            if self.num_sliding_layers + self.hybrid.num_other_layers > self.num_layers:
                raise _fail(name, "hybrid", self.hybrid.num_other_layers,
                            f"linear and chunked layers plus {self.num_sliding_layers} sliding ones exceed "
                            f"num_layers ({self.num_layers})")
            if self.hybrid.num_single_block_layers > self.num_layers:
                raise _fail(name, "hybrid", self.hybrid.num_single_block_layers,
                            f"single-block layers exceed num_layers ({self.num_layers})")
            if self.hybrid.index_topk and not self.is_mla:
                raise _fail(name, "hybrid.index_topk", self.hybrid.index_topk,
                            "DeepSeek Sparse Attention needs MLA (kv_lora_rank)")
            if self.hybrid.num_shared_index_layers >= self.num_layers:
                raise _fail(name, "hybrid.num_shared_index_layers", self.hybrid.num_shared_index_layers,
                            f"must be under num_layers ({self.num_layers}): a layer sharing top-k reuses "
                            "an earlier layer's indexer")
        if (self.sliding_window > 0) != (self.num_sliding_layers > 0):
            raise _fail(name, "sliding_window", self.sliding_window,
                        f"sliding_window and num_sliding_layers ({self.num_sliding_layers}) "
                        "must both be 0 or both be positive")

    def _check_moe(self) -> None:
        name = self.name
        if not self.num_experts:
            for field in ("experts_per_token", "moe_intermediate_size", "num_shared_experts",
                          "first_k_dense_layers", "moe_latent_size"):
                if getattr(self, field):
                    raise _fail(name, field, getattr(self, field), "set on a dense model (num_experts=0)")
        else:
            if not 1 <= self.experts_per_token <= self.num_experts:
                raise _fail(name, "experts_per_token", self.experts_per_token,
                            f"must be between 1 and num_experts ({self.num_experts})")
            if self.moe_intermediate_size < 1:
                raise _fail(name, "moe_intermediate_size", self.moe_intermediate_size,
                            "must be positive for an MoE model")
            if self.first_k_dense_layers > self.num_mlp_layers:
                raise _fail(name, "first_k_dense_layers", self.first_k_dense_layers,
                            f"cannot exceed the layers with an MLP ({self.num_mlp_layers})")
        if (self.num_shared_experts > 0) != (self.shared_expert_intermediate_size > 0):
            raise _fail(name, "shared_expert_intermediate_size", self.shared_expert_intermediate_size,
                        f"and num_shared_experts ({self.num_shared_experts}) must both be 0 or positive")
        if self.num_dense_layers and self.intermediate_size < 1:
            raise _fail(name, "intermediate_size", self.intermediate_size,
                        f"must be positive: {self.num_dense_layers} layer(s) have a dense MLP")
        if not self.num_dense_layers and self.intermediate_size:
            raise _fail(name, "intermediate_size", self.intermediate_size,
                        "must be 0 when every layer is MoE (the value would be unused)")

    # -- structure ------------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_mlp_layers(self) -> int:
        """Layers with an MLP or MoE block: all but a single-block model's
        mixer-only layers."""
        return self.num_layers - (self.hybrid.num_mixer_only_layers if self.hybrid is not None else 0)

    @property
    def num_moe_layers(self) -> int:
        return self.num_mlp_layers - self.first_k_dense_layers if self.is_moe else 0

    @property
    def num_dense_layers(self) -> int:
        """Layers whose MLP is dense (every MLP of a dense model)."""
        return self.first_k_dense_layers if self.is_moe else self.num_mlp_layers

    @property
    def num_blocks(self) -> int:
        """Residual blocks (a mixer and an MLP in each layer, one in a
        single-block layer): each ends in a tensor-parallel all-reduce."""
        single = self.hybrid.num_single_block_layers if self.hybrid is not None else 0
        return 2 * self.num_layers - single

    @property
    def num_full_attention_layers(self) -> int:
        """Layers of full attention: neither sliding-window nor a hybrid
        model's other kinds (:class:`~kvsched.perf.hybrid.HybridLayers`)."""
        other = self.hybrid.num_other_layers if self.hybrid is not None else 0
        return self.num_layers - self.num_sliding_layers - other

    @property
    def num_index_layers(self) -> int:
        """Layers with their own DeepSeek Sparse Attention indexer (its
        weights, its scoring, its key cache): every layer but those sharing
        another's top-k; 0 without DSA. The one owner of that count."""
        h = self.hybrid
        if h is None or not h.index_topk:
            return 0
        return self.num_layers - h.num_shared_index_layers

    # -- per-layer building blocks (params = weights + biases) ----------------

    def attn_linear_params_per_layer(self) -> int:
        """q, k, v, o projections (MLA: q down/up, kv down/up, o), with their biases."""
        h, bias = self.hidden_size, self.attention_bias
        if self.is_mla:
            qk_dim = self.num_heads * self.head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank * qk_dim + (self.q_lora_rank if bias else 0)
            else:
                q = h * qk_dim + (qk_dim if bias else 0)
            kv_down = self.kv_lora_rank + self.qk_rope_head_dim  # latent + shared rope key
            kv = h * kv_down + (kv_down if bias else 0)
            kv += self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
            o_in = self.num_heads * self.v_head_dim
        else:
            q_dim = self.num_heads * self.head_dim
            kv_dim = self.num_kv_heads * self.head_dim
            q = h * q_dim + (q_dim if bias else 0)
            kv = 2 * (h * kv_dim + (kv_dim if bias else 0))
            o_in = q_dim
        o = o_in * h + (h if self.attention_out_bias else 0)
        return q + kv + o

    def _mlp_params(self, intermediate: int) -> int:
        h = self.hidden_size
        if self.mlp_kind == "swiglu":  # gate, up, down
            return 3 * h * intermediate + ((2 * intermediate + h) if self.mlp_bias else 0)
        return 2 * h * intermediate + ((intermediate + h) if self.mlp_bias else 0)

    def dense_mlp_params_per_layer(self) -> int:
        """One dense-MLP layer's MLP (0 when the model has none)."""
        return self._mlp_params(self.intermediate_size) if self.intermediate_size else 0

    def expert_params(self) -> int:
        """One routed expert (0 for a dense model), at the latent width in a latent MoE."""
        if not self.is_moe:
            return 0
        if not self.moe_latent_size:
            return self._mlp_params(self.moe_intermediate_size)
        width, inter = self.moe_latent_size, self.moe_intermediate_size
        gates = 3 if self.mlp_kind == "swiglu" else 2
        return gates * width * inter + (((gates - 1) * inter + width) if self.mlp_bias else 0)

    def shared_expert_params(self) -> int:
        """All shared experts of one MoE layer together (they always run;
        DeepSeek fuses them), and a latent MoE's projections into and out of
        the latent width (every token runs them too)."""
        n = self.num_shared_experts * self._mlp_params(self.shared_expert_intermediate_size) \
            if self.num_shared_experts else 0
        if self.moe_latent_size:
            bias = self.moe_latent_size + self.hidden_size if self.mlp_bias else 0
            n += 2 * self.hidden_size * self.moe_latent_size + bias
        return n

    def router_params_per_layer(self) -> int:
        if not self.is_moe:
            return 0
        return self.num_experts * self.hidden_size + (self.num_experts if self.router_bias else 0)

    def _norm(self, width: int) -> int:
        return 2 * width if self.norm_kind == "layernorm" else width

    def misc_params_per_layer(self) -> int:
        """Vectors that cost no matmul: the two (four) norms, q/k norms, MLA latent norms, sinks."""
        n = (4 if self.post_norms else 2) * self._norm(self.hidden_size)
        if self.qk_norm:
            n += 2 * self._norm(self.head_dim)
        if self.is_mla:
            n += self._norm(self.kv_lora_rank) + (self._norm(self.q_lora_rank) if self.q_lora_rank else 0)
        if self.attention_sinks:
            n += self.num_heads
        return n

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def lm_head_params(self) -> int:
        """Extra parameters of the output projection: 0 when tied to the embedding."""
        return 0 if self.tie_word_embeddings else self.lm_head_matmul_params()

    def lm_head_matmul_params(self) -> int:
        """Weights the LM-head matmul reads per token, tied or not."""
        return self.vocab_size * self.hidden_size

    def _outside_layers_params(self) -> int:
        n = self.embedding_params() + self.lm_head_params() + self._norm(self.hidden_size)  # final norm
        if self.embedding_norm:
            n += self._norm(self.hidden_size)
        return n

    # -- whole-model totals ---------------------------------------------------

    def mixer_params(self) -> int:
        """Every layer's token-mixing projections: attention's q/k/v/o, or a
        hybrid model's linear-attention or Mamba mixer in its layers, plus
        DeepSeek Sparse Attention's indexer beside each MLA layer that has
        one (:attr:`num_index_layers`). The one
        owner of that count (the parameter totals and the step time's
        weights read it)."""
        attn = self.attn_linear_params_per_layer()
        n = self.num_layers * attn
        h = self.hybrid
        if h is not None:
            # MLP-only layers have no mixer at all.
            n += (h.num_linear_layers * (h.linear_params_per_layer(self.hidden_size) - attn)
                  - h.num_mlp_only_layers * attn
                  + h.num_mamba_layers * (h.mamba_params_per_layer(self.hidden_size) - attn)
                  + self.num_index_layers * h.indexer_params_per_layer(self.hidden_size, self.q_lora_rank))
        return n

    def _params(self, experts_counted: int) -> int:
        moe_layer = (experts_counted * self.expert_params() + self.shared_expert_params()
                     + self.router_params_per_layer())
        # A single-block layer has one norm where others have two.
        single = self.hybrid.num_single_block_layers if self.hybrid is not None else 0
        return (self._outside_layers_params() + self.mixer_params()
                + self.num_layers * self.misc_params_per_layer() - single * self._norm(self.hidden_size)
                + self.num_dense_layers * self.dense_mlp_params_per_layer()
                + self.num_moe_layers * moe_layer)

    def num_params(self) -> int:
        """All parameters: embeddings, LM head unless tied, norms, biases, routers, sinks."""
        return self._params(self.num_experts)

    def active_params_per_token(self) -> int:
        """Parameters one token touches: only ``experts_per_token`` routed experts per MoE layer.

        Includes the input embedding (as models.md §4 does; OpenAI's published
        "active" for gpt-oss excludes it).
        """
        return self._params(self.experts_per_token)

    # -- KV cache ---------------------------------------------------------------

    def kv_bytes_per_layer_per_token(self, kv_dtype_bytes: float = 2) -> float:
        if self.is_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * kv_dtype_bytes
        return 2 * self.num_kv_heads * self.head_dim * kv_dtype_bytes

    def splits_over(self, tensor_parallel_size: int) -> bool:
        """Whether vLLM can shard this model's attention over
        ``tensor_parallel_size`` ranks: the size divides the query heads, and
        the KV heads split evenly (a multiple of the size) or are replicated
        evenly (the size a multiple of them). MLA's latent has no KV heads to
        split."""
        tp = tensor_parallel_size
        if self.num_heads % tp:
            return False
        kv = self.num_kv_heads
        return self.is_mla or (kv % tp == 0 if kv >= tp else tp % kv == 0)

    def check_tensor_parallel_size(self, tensor_parallel_size: int) -> None:
        """vLLM's start-up check of the TP size against the heads (see
        :meth:`splits_over`); the one owner, for the deployment builder and
        the tuner's space alike."""
        tp = tensor_parallel_size
        if self.splits_over(tp):
            return
        sizes = ", ".join(str(n) for n in range(1, self.num_heads + 1) if self.splits_over(n))
        if self.num_heads % tp:
            rule = f"must divide the {self.num_heads} attention heads of {self.name}"
        else:
            rule = (f"must divide the {self.num_kv_heads} KV heads of {self.name} or be a multiple of "
                    "them (vLLM splits or replicates them evenly)")
        raise UserInputError(f"tensor_parallel_size={tp} (--tensor-parallel-size): {rule}; use one "
                             f"of {sizes}")

    def kv_heads_per_rank(self, tensor_parallel_size: int) -> float:
        """KV heads on one tensor-parallel rank: split over the ranks, but
        never below one (vLLM replicates them when there are fewer KV heads
        than ranks). The one owner of that rule."""
        return max(1.0, self.num_kv_heads / tensor_parallel_size)

    def kv_bytes_per_layer_per_rank(self, kv_dtype_bytes: float, tensor_parallel_size: int) -> float:
        """KV-cache bytes one token adds to one layer on one tensor-parallel
        rank: K and V of the rank's KV heads (:meth:`kv_heads_per_rank`);
        MLA's latent is replicated on every rank. The one owner of the KV
        bytes per token that the step time reads and the memory plan holds."""
        if self.is_mla:
            return float(self.kv_bytes_per_layer_per_token(kv_dtype_bytes))
        return 2 * self.kv_heads_per_rank(tensor_parallel_size) * self.head_dim * kv_dtype_bytes

    def kv_bytes_per_token(self, kv_dtype_bytes: float = 2) -> float:
        """KV bytes each token adds, over full-attention layers only.

        Sliding-window layers stop growing after ``sliding_window`` tokens; their
        bounded share is :meth:`sliding_kv_bytes_per_seq`.
        """
        return self.num_full_attention_layers * self.kv_bytes_per_layer_per_token(kv_dtype_bytes)

    def sliding_kv_bytes_per_seq(self, kv_dtype_bytes: float = 2) -> float:
        """Most KV bytes the sliding-window layers hold for one sequence (0 if none)."""
        return (self.num_sliding_layers * self.sliding_window
                * self.kv_bytes_per_layer_per_token(kv_dtype_bytes))

    def kv_bytes_for_tokens(self, num_tokens: int, kv_dtype_bytes: float = 2) -> float:
        """KV bytes one sequence of ``num_tokens`` tokens holds (before block rounding)."""
        per_layer = self.kv_bytes_per_layer_per_token(kv_dtype_bytes)
        return (self.num_full_attention_layers * num_tokens
                + self.num_sliding_layers * min(num_tokens, self.sliding_window)) * per_layer
