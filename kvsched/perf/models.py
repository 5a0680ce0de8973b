"""Model architecture catalog, and ``ModelSpec`` from a Hugging Face ``config.json``
(Llama-family fields via ``kvsched.hf_config``, the reader the engine shares).

A :class:`ModelSpec` holds architecture only (no dtype: that is chosen at run
time) and derives what the performance model needs: parameter counts (total,
active per token, and per-layer building blocks) and KV-cache bytes per token.
All derived numbers are for the FULL model, unsharded.

Catalog values come from ``/work/shared/facts/models.md`` (source keys
``[AIC]`` aiconfigurator model configs, ``[THB]``, ``[BLIS]``, ``[TF]``,
``[DSV3]``, ``[OSS]``); the counts reproduce that file's §4 derived sizes.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

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
    HFConfig,
    language_model_config,
    read_config_json,
    read_llama_family,
    split_heads,
)
from kvsched.jsonfile import show
from kvsched.perf.model_source import find_config

MLP_KINDS = ("swiglu", "gelu")
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
    "num_sliding_layers": MAX_LAYERS, "num_mtp_layers": MAX_LAYERS,
})


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's architecture, as far as cost is concerned.

    Beyond the fields the brief names, a few flags exist only so parameter
    counts come out exact: which projections carry biases, LayerNorm (weight
    + bias) vs RMSNorm (weight), Qwen3's per-head q/k norm, gpt-oss's attention
    sinks, BLOOM's embedding LayerNorm, and a router bias vector (gpt-oss's
    linear bias; DeepSeek-V3's ``e_score_correction_bias``).

    MoE: ``first_k_dense_layers`` counts the layers with a dense MLP instead of
    experts (DeepSeek's leading ``first_k_dense_replace``). Configs that place
    dense layers elsewhere are folded into this count: position does not change
    cost. ``intermediate_size`` is 0 when no layer has a dense MLP (Mixtral,
    Qwen3-MoE, gpt-oss ship an unused or expert-sized value there).

    MLA (DeepSeek): ``head_dim`` is the q/k head dim (nope + rope); the cache
    holds ``kv_lora_rank + qk_rope_head_dim`` values per token per layer.

    Sliding window: ``num_sliding_layers`` of the layers keep only the last
    ``sliding_window`` tokens; see :meth:`kv_bytes_per_token` and
    :meth:`sliding_kv_bytes_per_seq`.

    MTP: ``num_mtp_layers`` multi-token-prediction modules (eh_proj + one
    decoder layer each) ship beside the main layers; they are not in
    :meth:`num_params` and cost nothing unless speculative decoding uses them
    (kvsched.perf.drafter).
    """

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    mlp_kind: str = "swiglu"
    attention_bias: bool = False      # q/k/v projections carry a bias
    attention_out_bias: bool = False  # o projection carries a bias
    mlp_bias: bool = False            # dense MLP and expert projections carry biases
    norm_kind: str = "rmsnorm"
    qk_norm: bool = False
    attention_sinks: bool = False
    embedding_norm: bool = False
    # MoE
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    first_k_dense_layers: int = 0
    router_bias: bool = False
    # MLA
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # sliding-window attention
    sliding_window: int = 0
    num_sliding_layers: int = 0
    # Multi-token-prediction modules the checkpoint ships (DeepSeek's
    # ``num_nextn_predict_layers``): what vLLM's ``method: mtp`` drafts with.
    # Not counted in the parameters above (models.md counts MTP apart).
    num_mtp_layers: int = 0
    # Two more norms per layer, after attention and after the MLP (Gemma 2/3's
    # post_attention/post_feedforward norms, GLM-4's post_self_attn/post_mlp):
    # four per layer instead of two. Vectors only: no matmul.
    post_norms: bool = False

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
        if (self.sliding_window > 0) != (self.num_sliding_layers > 0):
            raise _fail(name, "sliding_window", self.sliding_window,
                        f"sliding_window and num_sliding_layers ({self.num_sliding_layers}) "
                        "must both be 0 or both be positive")

    def _check_moe(self) -> None:
        name = self.name
        if not self.num_experts:
            for field in ("experts_per_token", "moe_intermediate_size", "num_shared_experts",
                          "first_k_dense_layers"):
                if getattr(self, field):
                    raise _fail(name, field, getattr(self, field), "set on a dense model (num_experts=0)")
        else:
            if not 1 <= self.experts_per_token <= self.num_experts:
                raise _fail(name, "experts_per_token", self.experts_per_token,
                            f"must be between 1 and num_experts ({self.num_experts})")
            if self.moe_intermediate_size < 1:
                raise _fail(name, "moe_intermediate_size", self.moe_intermediate_size,
                            "must be positive for an MoE model")
            if self.first_k_dense_layers > self.num_layers:
                raise _fail(name, "first_k_dense_layers", self.first_k_dense_layers,
                            f"cannot exceed num_layers ({self.num_layers})")
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
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_k_dense_layers if self.is_moe else 0

    @property
    def num_dense_layers(self) -> int:
        """Layers whose MLP is dense (all of them for a dense model)."""
        return self.first_k_dense_layers if self.is_moe else self.num_layers

    @property
    def num_full_attention_layers(self) -> int:
        return self.num_layers - self.num_sliding_layers

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
        """One routed expert (0 for a dense model)."""
        return self._mlp_params(self.moe_intermediate_size) if self.is_moe else 0

    def shared_expert_params(self) -> int:
        """All shared experts of one MoE layer together (they always run; DeepSeek fuses them)."""
        if not self.num_shared_experts:
            return 0
        return self.num_shared_experts * self._mlp_params(self.shared_expert_intermediate_size)

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

    def _params(self, experts_counted: int) -> int:
        per_layer = self.attn_linear_params_per_layer() + self.misc_params_per_layer()
        moe_layer = (experts_counted * self.expert_params() + self.shared_expert_params()
                     + self.router_params_per_layer())
        return (self._outside_layers_params() + self.num_layers * per_layer
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


# -- catalog (models.md; "d" values there are what the counts above reproduce) --

_DEEPSEEK_V3 = ModelSpec(  # [AIC] deepseek-ai--DeepSeek-V3; its MTP module prices method "mtp" only
    name="deepseek-ai/DeepSeek-V3", hidden_size=7168, num_layers=61, num_heads=128, num_kv_heads=128,
    head_dim=192, intermediate_size=18432, vocab_size=129280, tie_word_embeddings=False,
    max_position_embeddings=163840,
    num_experts=256, experts_per_token=8, moe_intermediate_size=2048,
    num_shared_experts=1, shared_expert_intermediate_size=2048, first_k_dense_layers=3,
    router_bias=True,  # e_score_correction_bias (noaux_tc routing)
    q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    num_mtp_layers=1)  # num_nextn_predict_layers (models.md §2)

_GPT_OSS: dict[str, Any] = {  # [AIC] openai--gpt-oss-*; biases, router bias, sinks per [TF] gpt_oss
    "hidden_size": 2880, "num_heads": 64, "num_kv_heads": 8, "head_dim": 64, "intermediate_size": 0,
    "vocab_size": 201088, "tie_word_embeddings": False, "max_position_embeddings": 131072,
    "attention_bias": True, "attention_out_bias": True, "mlp_bias": True, "router_bias": True,
    "attention_sinks": True, "experts_per_token": 4, "moe_intermediate_size": 2880, "sliding_window": 128,
}

_CATALOG: tuple[ModelSpec, ...] = (
    # models.md "Added for the Splitwise measurements" (public HF configs)
    ModelSpec(name="meta-llama/Llama-2-70b-hf", hidden_size=8192, num_layers=80, num_heads=64,
              num_kv_heads=8, head_dim=128, intermediate_size=28672, vocab_size=32000,
              tie_word_embeddings=False, max_position_embeddings=4096),
    ModelSpec(name="meta-llama/Llama-3.1-8B", hidden_size=4096, num_layers=32, num_heads=32,  # [AIC]
              num_kv_heads=8, head_dim=128, intermediate_size=14336, vocab_size=128256,
              tie_word_embeddings=False, max_position_embeddings=131072),
    ModelSpec(name="meta-llama/Llama-3.1-70B", hidden_size=8192, num_layers=80, num_heads=64,  # [AIC]
              num_kv_heads=8, head_dim=128, intermediate_size=28672, vocab_size=128256,
              tie_word_embeddings=False, max_position_embeddings=131072),
    ModelSpec(name="meta-llama/Llama-3.1-405B", hidden_size=16384, num_layers=126, num_heads=128,  # [AIC]
              num_kv_heads=8, head_dim=128, intermediate_size=53248, vocab_size=128256,
              tie_word_embeddings=False, max_position_embeddings=131072),
    ModelSpec(name="meta-llama/Llama-3.2-1B", hidden_size=2048, num_layers=16, num_heads=32,  # [THB]
              num_kv_heads=8, head_dim=64, intermediate_size=8192, vocab_size=128256,
              tie_word_embeddings=True, max_position_embeddings=131072),
    # [BLIS] (Instruct config; identical dims). max_pos: base model's 131072 (approx. in models.md;
    # the Instruct config says 32768). q/k/v carry a bias, o does not.
    ModelSpec(name="Qwen/Qwen2.5-7B", hidden_size=3584, num_layers=28, num_heads=28,
              num_kv_heads=4, head_dim=128, intermediate_size=18944, vocab_size=152064,
              tie_word_embeddings=False, max_position_embeddings=131072, attention_bias=True),
    ModelSpec(name="Qwen/Qwen3-0.6B", hidden_size=1024, num_layers=28, num_heads=16,  # [AIC]
              num_kv_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
              tie_word_embeddings=True, max_position_embeddings=40960, qk_norm=True),
    ModelSpec(name="Qwen/Qwen3-8B", hidden_size=4096, num_layers=36, num_heads=32,  # [AIC]
              num_kv_heads=8, head_dim=128, intermediate_size=12288, vocab_size=151936,
              tie_word_embeddings=False, max_position_embeddings=40960, qk_norm=True),
    ModelSpec(name="Qwen/Qwen3-32B", hidden_size=5120, num_layers=64, num_heads=64,  # [AIC]
              num_kv_heads=8, head_dim=128, intermediate_size=25600, vocab_size=151936,
              tie_word_embeddings=False, max_position_embeddings=40960, qk_norm=True),
    ModelSpec(name="Qwen/Qwen3-30B-A3B", hidden_size=2048, num_layers=48, num_heads=32,  # [AIC]
              num_kv_heads=4, head_dim=128, intermediate_size=0, vocab_size=151936,
              tie_word_embeddings=False, max_position_embeddings=40960, qk_norm=True,
              num_experts=128, experts_per_token=8, moe_intermediate_size=768),
    ModelSpec(name="Qwen/Qwen3-235B-A22B", hidden_size=4096, num_layers=94, num_heads=64,  # [AIC]
              num_kv_heads=4, head_dim=128, intermediate_size=0, vocab_size=151936,
              tie_word_embeddings=False, max_position_embeddings=40960, qk_norm=True,
              num_experts=128, experts_per_token=8, moe_intermediate_size=1536),
    ModelSpec(name="mistralai/Mixtral-8x7B-v0.1", hidden_size=4096, num_layers=32, num_heads=32,  # [AIC]
              num_kv_heads=8, head_dim=128, intermediate_size=0, vocab_size=32000,
              tie_word_embeddings=False, max_position_embeddings=32768,
              num_experts=8, experts_per_token=2, moe_intermediate_size=14336),
    _DEEPSEEK_V3,
    # Same architecture fields per models.md §3 (V3.1 read from the NVFP4 repack's config).
    dataclasses.replace(_DEEPSEEK_V3, name="deepseek-ai/DeepSeek-V3.1"),
    dataclasses.replace(_DEEPSEEK_V3, name="deepseek-ai/DeepSeek-R1"),
    # Kimi-K2.5's text model (text_config of aiconfigurator-core's
    # model_configs/moonshotai--Kimi-K2.5_config.json, Apache-2.0): DeepSeek-V3's
    # architecture with 64 heads, 384 experts, 1 dense layer and a 163,840
    # vocabulary; the vision tower is not modelled. Its num_nextn_predict_layers
    # is 0: no MTP module.
    dataclasses.replace(_DEEPSEEK_V3, name="moonshotai/Kimi-K2.5", num_heads=64, num_kv_heads=64,
                        num_experts=384, first_k_dense_layers=1, vocab_size=163840,
                        max_position_embeddings=262144, num_mtp_layers=0),
    # aiconfigurator-core's model_configs/MiniMaxAI--MiniMax-M2.5_config.json
    # (Apache-2.0). Every layer is MoE (its intermediate_size 1536 is the
    # expert size); use_routing_bias is a score-correction bias; its 3 MTP
    # modules (num_mtp_modules) have no drafter in vLLM 0.33 (no MiniMax-M2
    # MTP model), so num_mtp_layers stays 0. Its q/k norms are per layer (over all heads:
    # 6144 + 1024 weights) where qk_norm counts per-head ones (2 x 128): the
    # count is 428,544 parameters short of 229 B (0.0002 %).
    ModelSpec(name="MiniMaxAI/MiniMax-M2.5", hidden_size=3072, num_layers=62, num_heads=48,
              num_kv_heads=8, head_dim=128, intermediate_size=0, vocab_size=200064,
              tie_word_embeddings=False, max_position_embeddings=196608, qk_norm=True,
              num_experts=256, experts_per_token=8, moe_intermediate_size=1536, router_bias=True),
    # layer_types alternate sliding/full starting with sliding: 12 + 12 and 18 + 18.
    ModelSpec(name="openai/gpt-oss-20b", num_layers=24, num_experts=32, num_sliding_layers=12, **_GPT_OSS),
    ModelSpec(name="openai/gpt-oss-120b", num_layers=36, num_experts=128, num_sliding_layers=18,
              **_GPT_OSS),
    # BLOOM-176B: ALiBi (no position table), fused qkv with bias, GELU 4x MLP with biases,
    # LayerNorms incl. one after the embedding; tied embeddings (≈176B only adds up tied).
    ModelSpec(name="bigscience/bloom", hidden_size=14336, num_layers=70, num_heads=112,
              num_kv_heads=112, head_dim=128, intermediate_size=57344, vocab_size=250880,
              tie_word_embeddings=True, max_position_embeddings=2048, mlp_kind="gelu",
              attention_bias=True, attention_out_bias=True, mlp_bias=True, norm_kind="layernorm",
              embedding_norm=True),
)

MODELS: Mapping[str, ModelSpec] = MappingProxyType({m.name: m for m in _CATALOG})

_ALIASES = {
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "bloom-176b": "bigscience/bloom",
    "llama-2-70b": "meta-llama/Llama-2-70b-hf",
    "meta-llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "meta-llama-3.1-70b": "meta-llama/Llama-3.1-70B",
    "meta-llama-3.1-405b": "meta-llama/Llama-3.1-405B",
}


def _build_lookup() -> Mapping[str, str]:
    table: dict[str, str] = {}
    for full in MODELS:
        for key in (full, full.split("/", 1)[1]):
            table[key.lower()] = full
    for alias, full in _ALIASES.items():
        table[alias] = full
        table[f"{full.split('/', 1)[0].lower()}/{alias}"] = full
    return MappingProxyType(table)


_LOOKUP = _build_lookup()


# Checkpoint names that differ from a catalog entry only by a fine-tune or
# packaging suffix: the same architecture, hence the same cost.
_VARIANT_SUFFIXES = ("-instruct", "-chat", "-base", "-it", "-hf")


# Which linear layers a quantized checkpoint stores in its format; the rest
# stay 16-bit. Routers, norms, embeddings and the LM head are 16-bit under
# every scope (vLLM builds MoE gates unquantized and keeps the LM head and
# embeddings in the activation dtype).
LINEAR_PARTS = ("attention", "dense_mlp", "shared_experts", "routed_experts")
_QUANTIZED_PARTS: Mapping[str, frozenset[str]] = MappingProxyType({
    "all": frozenset(LINEAR_PARTS),                                        # every linear layer
    "mlp": frozenset({"dense_mlp", "shared_experts", "routed_experts"}),   # attention stays 16-bit
    "experts": frozenset({"routed_experts"}),                              # routed experts only
})
QUANTIZED_LAYERS = tuple(_QUANTIZED_PARTS)


def check_quantized_layers(layers: str) -> None:
    if layers not in _QUANTIZED_PARTS:
        raise UserInputError(f"quantized_layers={layers!r}: use one of {', '.join(QUANTIZED_LAYERS)} "
                         "(which linear layers the weight format covers)")


def quantizes(layers: str, part: str) -> bool:
    """Whether a format covering ``layers`` stores ``part`` (one of
    :data:`LINEAR_PARTS`) quantized; the one owner of that rule."""
    check_quantized_layers(layers)
    if part not in LINEAR_PARTS:
        raise UserInputError(f"part={part!r}: use one of {', '.join(LINEAR_PARTS)}")
    return part in _QUANTIZED_PARTS[layers]


@dataclass(frozen=True, slots=True)
class CheckpointFormat:
    """What a checkpoint's own quantization config tells vLLM: the weights'
    format, which linear layers it covers (:data:`QUANTIZED_LAYERS`) and,
    for NVIDIA ModelOpt checkpoints (``kv_cache_quant_algo: FP8``), an FP8
    KV cache under ``--kv-cache-dtype auto``."""

    weights: str                  # kvsched's weight dtype name
    kv_cache: str | None = None   # None: the activation dtype
    layers: str = "all"

    def __post_init__(self) -> None:
        check_quantized_layers(self.layers)


# Catalog models whose published checkpoint is itself quantized (read from
# each config.json's quantization_config, as shipped in aiconfigurator-core's
# model_configs/).
_NATIVE_FORMATS: Mapping[str, CheckpointFormat] = MappingProxyType({
    # quant_method mxfp4; modules_to_not_convert: self_attn, router, embeddings, lm_head
    "openai/gpt-oss-20b": CheckpointFormat("mxfp4", layers="experts"),
    "openai/gpt-oss-120b": CheckpointFormat("mxfp4", layers="experts"),
    # quant_method fp8, weight_block_size 128 x 128; not converted: gate, lm_head
    "MiniMaxAI/MiniMax-M2.5": CheckpointFormat("fp8_block"),
    # DeepSeek's published V3, V3.1 and R1 checkpoints are FP8 themselves
    # (quant_method fp8, fmt e4m3, weight_block_size 128 x 128): every
    # linear layer; the MoE gates, embedding and LM head stay 16-bit
    "deepseek-ai/DeepSeek-V3": CheckpointFormat("fp8_block"),
    "deepseek-ai/DeepSeek-V3.1": CheckpointFormat("fp8_block"),
    "deepseek-ai/DeepSeek-R1": CheckpointFormat("fp8_block"),
    # compressed-tensors int4, group 32, symmetric; ignores self_attn,
    # shared_experts and the dense MLP: the routed experts only
    "moonshotai/Kimi-K2.5": CheckpointFormat("int4", layers="experts"),
})

# Quantized repacks whose exclude lists differ from their publisher's
# default (below), by lower-case name: (catalog base, format).
_REPACKS: Mapping[str, tuple[str, CheckpointFormat]] = MappingProxyType({
    # hf_quant_config: NVFP4, kv FP8; excluded: lm_head, every self_attn and MoE gate
    "nvidia/minimax-m2.5-nvfp4": ("MiniMaxAI/MiniMax-M2.5", CheckpointFormat("nvfp4", "fp8", "mlp")),
    # quantization_config (modelopt): NVFP4, kv_cache_scheme 8-bit float;
    # ignored: lm_head and every self_attn (dense MLP and shared experts quantized)
    "nvidia/kimi-k2.5-nvfp4": ("moonshotai/Kimi-K2.5", CheckpointFormat("nvfp4", "fp8", "mlp")),
})
assert set(_NATIVE_FORMATS) | {base for base, _ in _REPACKS.values()} <= set(MODELS)


def _checkpoint_format(org: str, suffix: str) -> CheckpointFormat | None:
    """The format a name suffix means, by publisher: NVIDIA's ``-FP8``
    checkpoints are ModelOpt (per-tensor FP8 weights, FP8 KV); other
    ``-FP8`` checkpoints (Qwen, DeepSeek) are block-quantized
    (``weight_block_size`` 128 x 128) with a 16-bit KV cache. NVIDIA's
    ``-NVFP4`` / ``-FP4`` checkpoints are ModelOpt NVFP4 with an FP8 KV
    cache over every linear layer but the LM head (ModelOpt's default, e.g.
    nvidia/Qwen3-235B-A22B-NVFP4); repacks that exclude more are listed in
    ``_REPACKS``. Nobody else's ``-FP4`` is known. ``-BF16`` names a 16-bit
    conversion of a checkpoint published in FP8 (DeepSeek's)."""
    if suffix == "-fp8":
        return CheckpointFormat("fp8", "fp8") if org == "nvidia" else CheckpointFormat("fp8_block")
    if suffix in ("-nvfp4", "-fp4") and org == "nvidia":
        return CheckpointFormat("nvfp4", "fp8")
    if suffix == "-bf16":  # a 16-bit conversion of an FP8 checkpoint (DeepSeek-V3-BF16)
        return CheckpointFormat("bf16")
    return None


def catalog_match(name: str) -> tuple[str, CheckpointFormat | None] | None:
    """(catalog name, the checkpoint format the name implies) for a catalog
    model or a variant of one (``meta-llama/Llama-3.1-8B-Instruct``,
    ``Qwen/Qwen3-235B-A22B-FP8``, ``nvidia/Llama-3.1-8B-Instruct-FP8``,
    ``nvidia/MiniMax-M2.5-NVFP4``); None if the name matches nothing. A
    catalog model's own name brings its native format (gpt-oss: MXFP4
    experts), None when its checkpoint is 16-bit."""
    key = name.strip().lower()
    repack = _REPACKS.get(key)
    if repack is not None:
        return repack
    full = _LOOKUP.get(key)
    if full is not None:
        return full, _NATIVE_FORMATS.get(full)
    org, base = key.split("/", 1) if "/" in key else ("", key)
    fmt = None
    for suffix in ("-fp8", "-nvfp4", "-fp4", "-bf16"):
        if base.endswith(suffix):
            fmt = _checkpoint_format(org, suffix)
            if fmt is not None:
                base = base[: -len(suffix)]
            break
    for variant in _VARIANT_SUFFIXES:
        if base.endswith(variant):
            base = base[: -len(variant)]
    full = _LOOKUP.get(base)
    if full is None:
        # A variant word before a version (Mixtral-8x7B-Instruct-v0.1 of Mixtral-8x7B-v0.1).
        for variant in _VARIANT_SUFFIXES:
            if full is None and f"{variant}-" in base:
                full = _LOOKUP.get(base.replace(f"{variant}-", "-", 1))
    if full is None:
        return None
    return full, fmt if fmt is not None else _NATIVE_FORMATS.get(full)


def config_checkpoint_format(data: Mapping[str, Any]) -> CheckpointFormat | None:
    """The weight format a config.json's own ``quantization_config`` names,
    as vLLM loads it: ``fp8`` with ``weight_block_size`` is block FP8
    (DeepSeek, Kimi-K2, Qwen -FP8, GLM -FP8), without it per-tensor FP8;
    ``mxfp4`` covers the experts (gpt-oss); ModelOpt's ``FP8`` / ``NVFP4``
    every linear layer, with an FP8 KV cache when ``kv_cache_quant_algo``
    says so. None: a 16-bit checkpoint, or a method kvsched does not price
    (compressed-tensors, AWQ, GPTQ, ModelOpt's MIXED_PRECISION), which is then
    priced in --dtype."""
    quant = data.get("quantization_config")
    if not isinstance(quant, Mapping):
        return None
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":
        return CheckpointFormat("fp8_block" if quant.get("weight_block_size") else "fp8")
    if method == "mxfp4":
        return CheckpointFormat("mxfp4", layers="experts")
    if method == "modelopt":
        kv = "fp8" if str(quant.get("kv_cache_quant_algo", "")).upper() == "FP8" else None
        algo = str(quant.get("quant_algo", "")).upper()
        if algo in ("FP8", "NVFP4"):
            return CheckpointFormat(algo.lower(), kv)
    return None


def checkpoint_format(name_or_path: str) -> CheckpointFormat | None:
    """The format a checkpoint brings without --quantization: a catalog
    name's (:func:`catalog_match`), else its config.json's
    (:func:`config_checkpoint_format`; a Hub id is resolved as
    :func:`get_model` resolves it). The one owner of that rule."""
    match = catalog_match(name_or_path)
    if match is not None:
        return match[1]
    path = Path(name_or_path).expanduser()
    if path.exists():
        config = path / "config.json" if path.is_dir() else path
    else:
        config = find_config(name_or_path, MODELS).path
    return config_checkpoint_format(read_config_json(config))


def get_model(name_or_path: str) -> ModelSpec:
    """A catalog model by HF id (with or without the org, any case; fine-tune
    and quantized variants by their base, see :func:`catalog_match`), a
    model read from disk, or any Hugging Face id whose config.json
    :func:`kvsched.perf.model_source.find_config` finds (the local HF cache,
    aiconfigurator-core's bundled configs, the Hub). The one resolver of a
    ``--model`` value.

    A path may be a Hugging Face model directory (holding ``config.json``) or a
    ``config.json`` file; see :func:`load_model_spec`.
    """
    match = catalog_match(name_or_path)
    if match is not None:
        return MODELS[match[0]]
    path = Path(name_or_path).expanduser()
    if path.exists():
        return load_model_spec(path)
    # A Hub id: the local HF cache, aiconfigurator-core's bundled configs, the Hub.
    source = find_config(name_or_path, MODELS)
    return load_model_spec(source.path, source.model_id)


# -- config.json reader ---------------------------------------------------------

SUPPORTED_MODEL_TYPES = ("bloom", "chatglm", "deepseek_v2", "deepseek_v3", "gemma2", "gemma3_text", "glm4",
                         "glm4_moe", "gpt_oss", "kimi_k2", "llama", "mistral", "mixtral", "phi3", "qwen2",
                         "qwen3", "qwen3_moe")

# Architectures vLLM serves that kvsched refuses, and why: what the KV cache
# or the step price would get wrong. The one owner of those reasons.
REFUSED_MODEL_TYPES: Mapping[str, str] = MappingProxyType({
    "qwen3_next": "hybrid linear attention: 3 of every 4 layers are Gated DeltaNet layers whose "
                  "fixed-size recurrent state vLLM keeps in Mamba-style cache groups beside the paged KV "
                  "cache; kvsched models paged attention KV only, so neither that state's memory nor the "
                  "linear-attention kernels' time would be priced",
    "qwen3_5": "hybrid linear attention (Gated DeltaNet layers with a recurrent state, as Qwen3-Next); "
               "kvsched models paged attention KV only",
    "qwen3_5_moe": "hybrid linear attention (Gated DeltaNet layers with a recurrent state, as Qwen3-Next); "
                   "kvsched models paged attention KV only",
    "deepseek_v32": "DeepSeek Sparse Attention: a lightning indexer picks the top index_topk tokens per "
                    "query (its own FP8 key cache per layer), so attention time stops growing with the "
                    "context; kvsched prices dense MLA over the whole context and sizes no indexer cache, "
                    "which would overstate long-context steps. deepseek-ai/DeepSeek-V3.1 has the same "
                    "weights with dense attention",
    "glm_moe_dsa": "DeepSeek Sparse Attention (an indexer selects the attended tokens, with its own key "
                   "cache), as DeepSeek-V3.2; kvsched prices dense attention only",
    "llama4": "chunked local attention (attention_chunk_size) on 3 of every 4 layers, which vLLM pages as "
              "its own KV group, plus NoPE global layers; kvsched sizes full and sliding-window layers "
              "only",
    "nemotron_h": "hybrid Mamba-2/attention layers: the Mamba layers' recurrent state is not paged KV and "
                  "kvsched does not size or price it",
    "deepseek_v4": "compressed sparse attention with a sliding window on every layer; kvsched prices "
                   "dense MLA only",
    "kimi_linear": "hybrid linear attention (Kimi Delta Attention layers with a recurrent state); kvsched "
                   "models paged attention KV only",
})


def _attention_dims(cfg: HFConfig, mla: bool = False) -> dict[str, Any]:
    """Attention shape of the non-Llama-family types (DeepSeek, gpt-oss); with
    ``mla`` the head dim is left to the caller (0 here)."""
    hidden = cfg.get_int("hidden_size")
    heads = cfg.get_int("num_attention_heads")
    if mla:
        head_dim = 0
    elif cfg.data.get("head_dim") is not None:
        head_dim = cfg.get_int("head_dim")
    else:
        head_dim = split_heads(cfg, hidden, heads)
    return {
        "hidden_size": hidden, "num_layers": cfg.get_int("num_hidden_layers"), "num_heads": heads,
        "num_kv_heads": cfg.get_int("num_key_value_heads", default=heads),
        "head_dim": head_dim,
        "vocab_size": cfg.get_int("vocab_size"),
        "max_position_embeddings": cfg.get_int("max_position_embeddings"),
        "tie_word_embeddings": cfg.get_bool("tie_word_embeddings", False),
    }


def _parse_llama_family(cfg: HFConfig, model_type: str) -> dict[str, Any]:
    """llama, mistral, phi3, qwen2, qwen3, mixtral, qwen3_moe: read by kvsched.hf_config."""
    f = read_llama_family(cfg, model_type)
    spec: dict[str, Any] = {
        "hidden_size": f.hidden_size, "num_layers": f.num_hidden_layers, "num_heads": f.num_attention_heads,
        "num_kv_heads": f.num_key_value_heads, "head_dim": f.head_dim,
        "intermediate_size": f.intermediate_size, "vocab_size": f.vocab_size,
        "max_position_embeddings": f.max_position_embeddings,
        "tie_word_embeddings": f.tie_word_embeddings, "attention_bias": f.attention_bias,
        "attention_out_bias": f.o_proj_bias, "mlp_bias": f.mlp_bias, "qk_norm": f.qk_norm,
        "sliding_window": f.sliding_window, "num_sliding_layers": f.num_sliding_layers,
    }
    if f.num_experts:
        spec.update(num_experts=f.num_experts, experts_per_token=f.num_experts_per_tok,
                    moe_intermediate_size=f.moe_intermediate_size, first_k_dense_layers=f.num_dense_layers)
    return _no_window_beyond_context(spec)


def _parse_deepseek(cfg: HFConfig, model_type: str) -> dict[str, Any]:
    spec = _attention_dims(cfg, mla=True)
    layers = spec["num_layers"]
    nope, rope = cfg.get_int("qk_nope_head_dim"), cfg.get_int("qk_rope_head_dim")
    # transformers stores head_dim = qk_rope_head_dim for rotary setup; MLA's q/k head is nope + rope.
    spec["head_dim"] = nope + rope
    bias = cfg.get_bool("attention_bias", False)
    spec.update(attention_bias=bias, attention_out_bias=bias,
                q_lora_rank=cfg.get_int("q_lora_rank", default=0),
                kv_lora_rank=cfg.get_int("kv_lora_rank"), qk_nope_head_dim=nope, qk_rope_head_dim=rope,
                v_head_dim=cfg.get_int("v_head_dim"),
                num_mtp_layers=cfg.get_int("num_nextn_predict_layers", default=0))
    experts = cfg.get_int("n_routed_experts", default=0)
    first_k = cfg.get_int("first_k_dense_replace", default=0)
    freq = cfg.get_int("moe_layer_freq", default=1)
    moe_layers = sum(1 for i in range(layers) if experts and i >= first_k and i % freq == 0)
    dense = layers - moe_layers
    spec["intermediate_size"] = cfg.get_int("intermediate_size") if dense else 0
    if moe_layers:
        moe_size = cfg.get_int("moe_intermediate_size")
        shared = cfg.get_int("n_shared_experts", default=0)
        spec.update(num_experts=experts, experts_per_token=cfg.get_int("num_experts_per_tok"),
                    moe_intermediate_size=moe_size, num_shared_experts=shared,
                    shared_expert_intermediate_size=moe_size if shared else 0, first_k_dense_layers=dense,
                    # V3's noaux_tc routing adds a per-expert score-correction bias.
                    router_bias=cfg.get_str("topk_method", "greedy") == "noaux_tc")
    return spec


def _parse_gpt_oss(cfg: HFConfig, model_type: str) -> dict[str, Any]:
    spec = _attention_dims(cfg)
    layers = spec["num_layers"]
    bias = cfg.get_bool("attention_bias", True)
    window = cfg.get_int("sliding_window", default=0)
    # Default layout (transformers): alternate, starting with a sliding layer.
    sliding = cfg.count_sliding_layers(window, layers, (layers + 1) // 2)
    spec.update(intermediate_size=0, attention_bias=bias, attention_out_bias=bias, mlp_bias=True,
                router_bias=True, attention_sinks=True, num_experts=cfg.get_int("num_local_experts"),
                experts_per_token=cfg.get_int("num_experts_per_tok", "experts_per_token"),
                moe_intermediate_size=cfg.get_int("intermediate_size"),
                sliding_window=window if sliding else 0, num_sliding_layers=sliding)
    return spec


def _no_window_beyond_context(spec: dict[str, Any]) -> dict[str, Any]:
    """A window at least the context slides nothing (Phi-3-mini-128k's
    262144 over 131072 positions): full attention."""
    if spec["num_sliding_layers"] and spec["sliding_window"] >= spec["max_position_embeddings"]:
        spec.update(sliding_window=0, num_sliding_layers=0)
    return spec


# transformers' class defaults for keys a Gemma config.json omits (Gemma2Config,
# Gemma3TextConfig): (num_key_value_heads, head_dim, vocab_size,
# max_position_embeddings, sliding_window, sliding_window_pattern). Gemma 3's
# published text_config relies on them (vocab, context).
_GEMMA_DEFAULTS: Mapping[str, tuple[int, int, int, int, int, int]] = MappingProxyType({
    "gemma2": (4, 256, 256000, 8192, 4096, 2),
    "gemma3_text": (4, 256, 262208, 131072, 4096, 6),
})


def _parse_gemma(cfg: HFConfig, model_type: str) -> dict[str, Any]:
    """Gemma 2 / Gemma 3 text: a gated GELU MLP (gate, up, down: the same
    weights as SwiGLU), four norms per layer, tied embeddings; Gemma 3 adds
    per-head q/k norms. Layers alternate local (sliding) and global per
    ``layer_types`` or, when absent, transformers' default pattern: every
    ``sliding_window_pattern``-th layer is global (Gemma 2: every 2nd).
    vLLM gives the local layers their own sliding-window KV group; their
    share is bounded like every sliding layer here. Soft-capping changes no
    cost. Gemma 3's vision tower (multimodal checkpoints) is not counted."""
    kv_default, head_default, vocab, positions, window_default, pattern_default = _GEMMA_DEFAULTS[model_type]
    hidden = cfg.get_int("hidden_size")
    heads = cfg.get_int("num_attention_heads")
    layers = cfg.get_int("num_hidden_layers")
    window = cfg.get_int("sliding_window", default=window_default)
    pattern = cfg.get_int("sliding_window_pattern", default=pattern_default) if model_type == "gemma3_text" \
        else pattern_default
    if pattern < 1:
        raise cfg.fail("sliding_window_pattern", pattern, "must be a positive integer (every n-th layer "
                                                          "is global)")
    sliding = cfg.count_sliding_layers(window, layers, layers - layers // pattern)
    return _no_window_beyond_context({
        "hidden_size": hidden, "num_layers": layers, "num_heads": heads,
        "num_kv_heads": cfg.get_int("num_key_value_heads", default=kv_default),
        "head_dim": cfg.get_int("head_dim", default=head_default),
        "intermediate_size": cfg.get_int("intermediate_size"),
        "vocab_size": cfg.get_int("vocab_size", default=vocab),
        "max_position_embeddings": cfg.get_int("max_position_embeddings", default=positions),
        "tie_word_embeddings": cfg.get_bool("tie_word_embeddings", True),
        "attention_bias": cfg.get_bool("attention_bias", False),
        "attention_out_bias": cfg.get_bool("attention_bias", False),
        "qk_norm": model_type == "gemma3_text", "post_norms": True,
        "sliding_window": window if sliding else 0, "num_sliding_layers": sliding,
    })


def _parse_glm4(cfg: HFConfig, model_type: str) -> dict[str, Any]:
    """GLM-4 (glm4): Llama's layout with q/k/v biases (not o), fused
    gate_up, four norms per layer (post_self_attn, post_mlp); partial rotary
    changes no cost. Defaults are transformers' Glm4Config's."""
    hidden = cfg.get_int("hidden_size")
    return {
        "hidden_size": hidden, "num_layers": cfg.get_int("num_hidden_layers"),
        "num_heads": cfg.get_int("num_attention_heads"),
        "num_kv_heads": cfg.get_int("num_key_value_heads", default=2),
        "head_dim": cfg.get_int("head_dim", default=128),
        "intermediate_size": cfg.get_int("intermediate_size"), "vocab_size": cfg.get_int("vocab_size"),
        "max_position_embeddings": cfg.get_int("max_position_embeddings", default=131072),
        "tie_word_embeddings": cfg.get_bool("tie_word_embeddings", False),
        "attention_bias": cfg.get_bool("attention_bias", True), "post_norms": True,
    }


def _parse_chatglm(cfg: HFConfig, model_type: str) -> dict[str, Any]:
    """ChatGLM's own config (THUDM/glm-4-9b, chatglm3-6b; vLLM's ChatGLM
    model): GLM-4's layers under Megatron-style names — ``num_layers``,
    ``ffn_hidden_size`` (fused gate/up), ``kv_channels`` (head dim),
    ``multi_query_group_num`` KV heads when ``multi_query_attention``,
    ``padded_vocab_size``, ``seq_length``; q/k/v bias per ``add_qkv_bias``,
    the other linear biases per ``add_bias_linear``; two norms per layer."""
    hidden = cfg.get_int("hidden_size")
    heads = cfg.get_int("num_attention_heads")
    grouped = cfg.get_bool("multi_query_attention", False)
    linear_bias = cfg.get_bool("add_bias_linear", False)
    return {
        "hidden_size": hidden, "num_layers": cfg.get_int("num_layers", "num_hidden_layers"),
        "num_heads": heads, "num_kv_heads": cfg.get_int("multi_query_group_num") if grouped else heads,
        "head_dim": cfg.get_int("kv_channels") if cfg.data.get("kv_channels") is not None
        else split_heads(cfg, hidden, heads),
        "intermediate_size": cfg.get_int("ffn_hidden_size"),
        "vocab_size": cfg.get_int("padded_vocab_size", "vocab_size"),
        "max_position_embeddings": cfg.get_int("seq_length", "max_position_embeddings"),
        "tie_word_embeddings": cfg.get_bool("tie_word_embeddings", False),
        "attention_bias": cfg.get_bool("add_qkv_bias", False), "attention_out_bias": linear_bias,
        "mlp_bias": linear_bias, "norm_kind": "rmsnorm" if cfg.get_bool("rmsnorm", True) else "layernorm",
    }


def _parse_glm4_moe(cfg: HFConfig, model_type: str) -> dict[str, Any]:
    """GLM-4.5/4.6 (glm4_moe): grouped-query attention (q/k/v biases when
    ``attention_bias``, optional per-head q/k norm) over DeepSeek-style MoE
    layers: ``n_routed_experts`` routed and ``n_shared_experts`` shared
    experts after ``first_k_dense_replace`` dense layers, a score-correction
    router bias; ``num_nextn_predict_layers`` MTP modules."""
    hidden = cfg.get_int("hidden_size")
    heads = cfg.get_int("num_attention_heads")
    layers = cfg.get_int("num_hidden_layers")
    experts = cfg.get_int("n_routed_experts")
    first_k = min(cfg.get_int("first_k_dense_replace", default=1), layers)
    moe_size = cfg.get_int("moe_intermediate_size")
    shared = cfg.get_int("n_shared_experts", default=1)
    spec: dict[str, Any] = {
        "hidden_size": hidden, "num_layers": layers, "num_heads": heads,
        "num_kv_heads": cfg.get_int("num_key_value_heads", default=8),
        "head_dim": cfg.get_int("head_dim") if cfg.data.get("head_dim") is not None
        else split_heads(cfg, hidden, heads),
        "intermediate_size": cfg.get_int("intermediate_size") if first_k else 0,
        "vocab_size": cfg.get_int("vocab_size"),
        "max_position_embeddings": cfg.get_int("max_position_embeddings", default=131072),
        "tie_word_embeddings": cfg.get_bool("tie_word_embeddings", False),
        "attention_bias": cfg.get_bool("attention_bias", False),
        "qk_norm": cfg.get_bool("use_qk_norm", False),
        "num_mtp_layers": cfg.get_int("num_nextn_predict_layers", default=0),
    }
    if experts and first_k < layers:
        spec.update(num_experts=experts, experts_per_token=cfg.get_int("num_experts_per_tok"),
                    moe_intermediate_size=moe_size, num_shared_experts=shared,
                    shared_expert_intermediate_size=moe_size if shared else 0,
                    first_k_dense_layers=first_k, router_bias=True)
    else:
        spec["intermediate_size"] = cfg.get_int("intermediate_size")
    return spec


def _parse_bloom(cfg: HFConfig, model_type: str) -> dict[str, Any]:
    hidden = cfg.get_int("hidden_size", "n_embed")
    heads = cfg.get_int("num_attention_heads", "n_head")
    return {
        "hidden_size": hidden, "num_layers": cfg.get_int("num_hidden_layers", "n_layer"), "num_heads": heads,
        "num_kv_heads": heads, "head_dim": split_heads(cfg, hidden, heads), "intermediate_size": 4 * hidden,
        "vocab_size": cfg.get_int("vocab_size"),
        # ALiBi has no position table; 2048 is the training length, used when the config is silent.
        "max_position_embeddings": cfg.get_int("seq_length", "max_position_embeddings", default=2048),
        "tie_word_embeddings": cfg.get_bool("tie_word_embeddings", True),
        "mlp_kind": "gelu", "attention_bias": True, "attention_out_bias": True, "mlp_bias": True,
        "norm_kind": "layernorm", "embedding_norm": True,
    }


_PARSERS = {
    "llama": _parse_llama_family, "mistral": _parse_llama_family, "qwen2": _parse_llama_family,
    "qwen3": _parse_llama_family, "qwen3_moe": _parse_llama_family, "mixtral": _parse_llama_family,
    "phi3": _parse_llama_family,
    # Kimi K2's model_type names DeepSeek-V3's architecture (its config says so).
    "deepseek_v2": _parse_deepseek, "deepseek_v3": _parse_deepseek, "kimi_k2": _parse_deepseek,
    "gemma2": _parse_gemma, "gemma3_text": _parse_gemma, "glm4": _parse_glm4, "glm4_moe": _parse_glm4_moe,
    "chatglm": _parse_chatglm,
    "gpt_oss": _parse_gpt_oss, "bloom": _parse_bloom,
}
assert tuple(sorted(_PARSERS)) == SUPPORTED_MODEL_TYPES

_HF_CACHE_DIR = re.compile(r"models--([^/]+?)--(.+)")


def _name_from_path(config_path: Path) -> str:
    """``org/name`` from an HF cache layout (models--org--name/snapshots/<rev>), else the dir name."""
    # absolute(), not resolve(): HF cache snapshot files are symlinks into blobs/.
    for part in reversed(config_path.absolute().parent.parts):
        match = _HF_CACHE_DIR.fullmatch(part)
        if match:
            return f"{match.group(1)}/{match.group(2)}"
    return config_path.absolute().parent.name or str(config_path)


def load_model_spec(path: str | Path, name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face ``config.json`` (or the directory holding one).

    The spec's name is ``name`` when given (a Hub id the config was resolved
    for), else ``org/name`` when the path is inside a Hugging Face cache
    (``models--org--name``), else the model directory's name. A multimodal
    wrapper (Gemma 3) is read through its ``text_config``. Architectures
    kvsched cannot price are refused with the reason
    (:data:`REFUSED_MODEL_TYPES`).
    """
    p = Path(path).expanduser()
    config_path = p / "config.json" if p.is_dir() else p
    data = read_config_json(config_path)
    if data.get("model_type") is None:
        raise UserInputError(f"{config_path}: missing required field 'model_type'")
    text, model_type = language_model_config(data)
    label = name or _name_from_path(config_path)
    if model_type is not None and model_type in REFUSED_MODEL_TYPES:
        raise UserInputError(f"{label}: model_type={model_type!r} is not supported: "
                             f"{REFUSED_MODEL_TYPES[model_type]} ({config_path})")
    parser = _PARSERS.get(model_type) if model_type is not None else None
    if parser is None:
        shown = show(model_type if model_type is not None else data.get("model_type"))
        raise UserInputError(f"{config_path}: model_type={shown} is not supported; "
                         f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    assert model_type is not None
    source = str(config_path) if text is data else f"{config_path}: text_config"
    cfg = HFConfig(text, source)
    fields = parser(cfg, model_type)
    try:
        return ModelSpec(name=label, **fields)
    except ValueError as err:
        raise UserInputError(f"{config_path}: {err}") from None
