"""A Hugging Face ``config.json`` -> :class:`~kvsched.perf.models.ModelSpec`,
one parser per ``model_type`` (:data:`SUPPORTED_MODEL_TYPES`), and the
architectures refused with the reason (:data:`REFUSED_MODEL_TYPES`).

Llama-family fields are read by ``kvsched.hf_config``, the reader the engine
shares; the other types' fields are read here through its typed
:class:`~kvsched.hf_config.HFConfig`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kvsched.errors import UserInputError
from kvsched.hf_config import (
    HFConfig,
    ModelShape,
    language_model_config,
    read_config_json,
    read_llama_family,
    split_heads,
)
from kvsched.jsonfile import show
from kvsched.perf.hybrid import MAMBA_CHUNK, HybridLayers
from kvsched.perf.models import ModelSpec

SUPPORTED_MODEL_TYPES = ("bloom", "chatglm", "deepseek_v2", "deepseek_v3", "deepseek_v32", "gemma2",
                         "gemma3_text", "glm4", "glm4_moe", "glm_moe_dsa", "gpt_oss", "kimi_k2", "llama",
                         "llama4_text", "mistral", "mixtral", "nemotron_h", "phi3", "qwen2", "qwen2_5_vl",
                         "qwen2_5_vl_text", "qwen3", "qwen3_5_moe_text", "qwen3_5_text", "qwen3_moe",
                         "qwen3_next", "qwen3_vl_moe_text", "qwen3_vl_text")

# The language models of the vision-language wrappers (the vision tower is
# kvsched.perf.vision's): each reads as the text model it is.
_VL_TEXT_TYPES: Mapping[str, str] = MappingProxyType({
    "qwen2_5_vl": "qwen2", "qwen2_5_vl_text": "qwen2", "qwen3_vl_text": "qwen3",
    "qwen3_vl_moe_text": "qwen3_moe"})

# Architectures vLLM serves that kvsched refuses, and why: what the KV cache
# or the step price would get wrong. The one owner of those reasons.
REFUSED_MODEL_TYPES: Mapping[str, str] = MappingProxyType({
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
    """llama, mistral, phi3, qwen2, qwen3, mixtral, qwen3_moe: read by
    kvsched.hf_config, whose ModelShape is ModelSpec's shape field for field."""
    read = read_llama_family(cfg, model_type)
    return _no_window_beyond_context({f.name: getattr(read, f.name) for f in dataclasses.fields(ModelShape)})


def _parse_vl_text(cfg: HFConfig, model_type: str) -> dict[str, Any]:
    """A vision-language model's language model (Qwen2.5-VL: Qwen2's
    layers, its fields at the top level or in text_config; Qwen3-VL:
    Qwen3's, dense or MoE). The vision tower's weights are not counted."""
    return _parse_llama_family(cfg, _VL_TEXT_TYPES[model_type])


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



def _linear_layout(cfg: HFConfig, layers: int) -> int:
    """Gated DeltaNet layers of a Qwen3-Next / Qwen3.5 config: those its
    ``layer_types`` names ``linear_attention``, else all but every
    ``full_attention_interval``-th (transformers' default layout)."""
    types = cfg.data.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or not all(
                t in ("linear_attention", "full_attention") for t in types):
            raise cfg.fail("layer_types", types, f"must list {layers} layers, each 'linear_attention' or "
                                                 "'full_attention'")
        return sum(1 for t in types if t == "linear_attention")
    interval = cfg.get_int("full_attention_interval", default=4)
    if interval < 1:
        raise cfg.fail("full_attention_interval", interval, "must be positive")
    return layers - layers // interval


# Qwen3.5's language models (under its multimodal wrappers, qwen3_5 and
# qwen3_5_moe): Qwen3-Next's layers.
_QWEN3_5_TEXT = ("qwen3_5_text", "qwen3_5_moe_text")
# Bytes per value of the dtypes a Mamba-style state may be kept in
# (mamba_ssm_cache_dtype's values).
STATE_DTYPE_BYTES: Mapping[str, int] = MappingProxyType({"float32": 4, "bfloat16": 2, "float16": 2})
# Nemotron-H keeps its SSM state in float32 unless config.json names
# another dtype (vLLM's NemotronHForCausalLMConfig).
NEMOTRON_H_SSM_DTYPE = "float32"


def _state_dtype_bytes(cfg: HFConfig, key: str, default: str) -> int:
    name = cfg.get_str(key, default)
    if name not in STATE_DTYPE_BYTES:
        raise cfg.fail(key, name, f"must be one of {', '.join(STATE_DTYPE_BYTES)}")
    return STATE_DTYPE_BYTES[name]


def _qwen3_5_state_dtype_bytes(cfg: HFConfig) -> int:
    """Qwen3.5's recurrent state dtype: vLLM's Qwen3.5 config classes set
    the Mamba SSM cache dtype to text_config's ``mamba_ssm_dtype`` (the
    published configs say float32); absent, the model's 16 bits. (vLLM
    applies no such rule to Qwen3-Next.)"""
    return _state_dtype_bytes(cfg, "mamba_ssm_dtype", "bfloat16")


def _parse_qwen3_next(cfg: HFConfig, model_type: str) -> dict[str, Any]:
    """Qwen3-Next / Qwen3.5 (dense or MoE): Gated DeltaNet layers
    (kvsched.perf.hybrid) with a full-attention layer every
    ``full_attention_interval``; MoE layers with one shared expert, or
    dense MLPs. The full layers' output gate (q_proj twice as wide) is not
    counted: 0.1 % of the weights. Qwen3.5's vision tower and MTP layer
    are not counted either."""
    hidden = cfg.get_int("hidden_size")
    layers = cfg.get_int("num_hidden_layers")
    heads = cfg.get_int("num_attention_heads")
    linear = _linear_layout(cfg, layers)
    spec: dict[str, Any] = {
        "hidden_size": hidden, "num_layers": layers, "num_heads": heads,
        "num_kv_heads": cfg.get_int("num_key_value_heads", default=heads),
        "head_dim": cfg.get_int("head_dim") if cfg.data.get("head_dim") is not None
        else split_heads(cfg, hidden, heads),
        "intermediate_size": 0, "vocab_size": cfg.get_int("vocab_size"),
        "max_position_embeddings": cfg.get_int("max_position_embeddings"),
        "tie_word_embeddings": cfg.get_bool("tie_word_embeddings", False), "qk_norm": True,
        "hybrid": HybridLayers(
            num_linear_layers=linear, linear_num_key_heads=cfg.get_int("linear_num_key_heads"),
            linear_num_value_heads=cfg.get_int("linear_num_value_heads"),
            linear_key_head_dim=cfg.get_int("linear_key_head_dim"),
            linear_value_head_dim=cfg.get_int("linear_value_head_dim"),
            linear_conv_kernel=cfg.get_int("linear_conv_kernel_dim", default=4),
            linear_state_dtype_bytes=_qwen3_5_state_dtype_bytes(cfg) if model_type in _QWEN3_5_TEXT else 2),
    }
    experts = cfg.get_int("num_experts", default=0)
    sparse_step = cfg.get_int("decoder_sparse_step", default=1)
    only_mlp = cfg.data.get("mlp_only_layers") or []
    if not isinstance(only_mlp, list):
        raise cfg.fail("mlp_only_layers", only_mlp, "must be a list of layer indices")
    if experts:
        dense = [i for i in range(layers) if i in only_mlp or (i + 1) % sparse_step]
        if dense:
            raise cfg.fail("mlp_only_layers", only_mlp, "dense layers between MoE layers are not priced "
                                                       "(every layer MoE, as the published configs)")
        moe = cfg.get_int("moe_intermediate_size")
        shared = cfg.get_int("shared_expert_intermediate_size", default=0)
        spec.update(num_experts=experts, experts_per_token=cfg.get_int("num_experts_per_tok"),
                    moe_intermediate_size=moe, num_shared_experts=1 if shared else 0,
                    shared_expert_intermediate_size=shared)
    else:
        spec["intermediate_size"] = cfg.get_int("intermediate_size")
    return spec


def _shared_index_layers(cfg: HFConfig, layers: int) -> int:
    """Layers that build no indexer and reuse the top-k of the closest one
    before them (vLLM's ``compute_skip_topk_layers`` in 0.34): those
    ``indexer_types`` names "shared" when given, else every layer but each
    ``index_topk_freq``-th counted from ``index_skip_topk_offset`` - 1 (the
    "S" entries of ``index_topk_pattern`` when given). vLLM 0.33's sparse
    attention reads the frequency rule only, so a config whose
    ``indexer_types`` disagrees with it is refused: the releases would build
    different models. GLM-5.2's 78 layers: 3 own, then 1 in 4 (21 own)."""
    freq = cfg.get_int("index_topk_freq", default=1)
    if freq < 1:
        raise cfg.fail("index_topk_freq", freq, "must be a positive integer (1: every layer has an indexer)")
    offset = cfg.get_int("index_skip_topk_offset", default=2)
    pattern = cfg.data.get("index_topk_pattern")
    if pattern is None:
        by_rule = {i for i in range(layers) if max(i - offset + 1, 0) % freq}
    elif isinstance(pattern, (str, list)):
        by_rule = {i for i in range(min(layers, len(pattern))) if pattern[i] == "S"}
    else:
        raise cfg.fail("index_topk_pattern", pattern, "must be a string or list of per-layer marks ('S': the "
                                                      "layer reuses an earlier layer's top-k)")
    types = cfg.data.get("indexer_types")
    if types is None:
        return len(by_rule)
    if not isinstance(types, list) or len(types) != layers or not all(t in ("full", "shared") for t in types):
        raise cfg.fail("indexer_types", types, f"must list {layers} layers, each 'full' or 'shared'")
    shared = {i for i, t in enumerate(types) if t == "shared"}
    if shared != by_rule:
        raise cfg.fail("indexer_types", types, "its 'shared' layers differ from those index_topk_freq / "
                                               "index_skip_topk_offset / index_topk_pattern give, which vLLM "
                                               "0.33 builds by (0.34 by indexer_types); make them agree")
    return len(shared)
# Nemotron-H's hybrid_override_pattern: one character per layer.
_NEMOTRON_BLOCKS = {"M": "Mamba-2 mixer", "*": "attention", "-": "MLP", "E": "MoE"}


def _parse_nemotron_h(cfg: HFConfig, model_type: str) -> dict[str, Any]:
    """Nemotron-H / Nemotron-3 (NemotronHForCausalLM): each layer is one
    block behind one RMSNorm, as ``hybrid_override_pattern`` names it
    (:data:`_NEMOTRON_BLOCKS`): a Mamba-2 mixer (vLLM's MambaMixer2: inner
    width mamba_num_heads x mamba_head_dim, ``expand`` unread as vLLM leaves
    it), grouped-query attention without biases or q/k norms, an MLP (up
    and down projections around a squared ReLU) or an MoE block (sigmoid
    routing with a score-correction bias, shared experts, optionally at a
    latent width). Defaults are transformers' NemotronHConfig's."""
    pattern = _nemotron_pattern(cfg)
    layers = len(pattern)
    count = {c: pattern.count(c) for c in _NEMOTRON_BLOCKS}
    hidden = cfg.get_int("hidden_size")
    heads = cfg.get_int("num_attention_heads")
    act = cfg.get_str("mlp_hidden_act", "relu2")
    if act != "relu2":
        raise cfg.fail("mlp_hidden_act", act, "must be 'relu2' (the published Nemotron-H activation; "
                                              "kvsched prices the MLP as up/down around it)")
    spec: dict[str, Any] = {
        "hidden_size": hidden, "num_layers": layers, "num_heads": heads,
        "num_kv_heads": cfg.get_int("num_key_value_heads", default=heads),
        # Older configs (Nemotron-H-8B) name the head dim attention_head_dim.
        "head_dim": cfg.get_int("head_dim", "attention_head_dim")
        if any(cfg.data.get(k) is not None for k in ("head_dim", "attention_head_dim"))
        else split_heads(cfg, hidden, heads),
        "vocab_size": cfg.get_int("vocab_size"),
        "max_position_embeddings": cfg.get_int("max_position_embeddings"),
        "tie_word_embeddings": cfg.get_bool("tie_word_embeddings", False),
        "mlp_kind": "relu2", "mlp_bias": cfg.get_bool("mlp_bias", False),
        "intermediate_size": _nemotron_mlp_size(cfg) if count["-"] else 0,
        "hybrid": HybridLayers(
            num_mamba_layers=count["M"], mamba_num_heads=cfg.get_int("mamba_num_heads"),
            mamba_head_dim=cfg.get_int("mamba_head_dim"), mamba_state_size=cfg.get_int("ssm_state_size"),
            mamba_n_groups=cfg.get_int("n_groups"), mamba_conv_kernel=cfg.get_int("conv_kernel", default=4),
            mamba_chunk_size=cfg.get_int("chunk_size", default=MAMBA_CHUNK),
            mamba_state_dtype_bytes=_state_dtype_bytes(cfg, "mamba_ssm_cache_dtype", NEMOTRON_H_SSM_DTYPE),
            mamba_conv_bias=cfg.get_bool("use_conv_bias", True),
            mamba_proj_bias=cfg.get_bool("use_bias", False),
            num_mixer_only_layers=count["M"] + count["*"], num_mlp_only_layers=count["-"] + count["E"]),
    }
    if count["E"]:
        shared = cfg.get_int("n_shared_experts", default=0)
        spec.update(num_experts=cfg.get_int("n_routed_experts"),
                    experts_per_token=cfg.get_int("num_experts_per_tok"),
                    moe_intermediate_size=cfg.get_int("moe_intermediate_size"), num_shared_experts=shared,
                    shared_expert_intermediate_size=cfg.get_int("moe_shared_expert_intermediate_size")
                    if shared else 0,
                    first_k_dense_layers=count["-"], router_bias=True,
                    moe_latent_size=cfg.get_int("moe_latent_size", default=0))
    return spec


# transformers' NemotronHConfig names for each block in ``layers_block_type``
# (Nemotron-3-Ultra's config spells the layers so, without a pattern), its
# current names and the legacy ones.
_NEMOTRON_BLOCK_TYPES = {"linear_attention": "M", "mamba": "M", "full_attention": "*", "attention": "*",
                         "mlp": "-", "moe": "E"}


def _nemotron_pattern(cfg: HFConfig) -> str:
    """The layers as ``hybrid_override_pattern`` characters: transformers'
    NemotronHConfig takes ``layers_block_type`` when given (its length is the
    layer count; ``num_hidden_layers`` is then deprecated and ignored), else
    converts ``hybrid_override_pattern`` (one character per
    ``num_hidden_layers``)."""
    types = cfg.data.get("layers_block_type")
    if types is not None:
        if not isinstance(types, list) or not types or not all(t in _NEMOTRON_BLOCK_TYPES for t in types):
            raise cfg.fail("layers_block_type", types, "must be a non-empty list of "
                           + ", ".join(repr(t) for t in _NEMOTRON_BLOCK_TYPES))
        return "".join(_NEMOTRON_BLOCK_TYPES[t] for t in types)
    layers = cfg.get_int("num_hidden_layers")
    pattern = cfg.get_str("hybrid_override_pattern", "")
    if len(pattern) != layers or not set(pattern) <= set(_NEMOTRON_BLOCKS):
        raise cfg.fail("hybrid_override_pattern", pattern,
                       f"must have one character per layer (num_hidden_layers={layers}), each one of "
                       + ", ".join(f"{c!r} ({kind})" for c, kind in _NEMOTRON_BLOCKS.items())
                       + "; or give layers_block_type")
    return pattern


def _nemotron_mlp_size(cfg: HFConfig) -> int:
    """The '-' layers' MLP width: ``intermediate_size``, or a list of one
    width per MLP layer (vLLM's), which must be one width here."""
    value = cfg.data.get("intermediate_size")
    if isinstance(value, list):
        if not value or len(set(value)) != 1:
            raise cfg.fail("intermediate_size", value, "MLP layers of different widths are not priced; "
                                                       "give one width")
        return HFConfig({"intermediate_size": value[0]}, cfg.source).get_int("intermediate_size")
    return cfg.get_int("intermediate_size")


def _parse_deepseek_v32(cfg: HFConfig, model_type: str) -> dict[str, Any]:
    """DeepSeek-V3.2 and GLM-5 (glm_moe_dsa, which vLLM serves with V3.2's
    model class): DeepSeek-V3's MLA and MoE layers, each layer's attention
    sparse behind a lightning indexer, or behind an earlier layer's top-k
    (:func:`_shared_index_layers`; kvsched.perf.hybrid). GLM-5's
    architecture turns an "auto" KV cache to fp8 on Blackwell (vLLM's
    GlmMoeDsaForCausalLM config hook)."""
    spec = _parse_deepseek(cfg, model_type)
    spec["fp8_kv_cache_on_sm100"] = model_type == "glm_moe_dsa"
    spec["hybrid"] = HybridLayers(index_topk=cfg.get_int("index_topk"),
                                  index_n_heads=cfg.get_int("index_n_heads"),
                                  index_head_dim=cfg.get_int("index_head_dim"),
                                  num_shared_index_layers=_shared_index_layers(cfg, spec["num_layers"]))
    return spec


def _parse_llama4_text(cfg: HFConfig, model_type: str) -> dict[str, Any]:
    """Llama 4's language model: chunked local attention
    (``attention_chunk_size``) on the RoPE layers (``no_rope_layers`` 1;
    by default all but every 4th), global NoPE attention on the others; MoE
    layers (every ``interleave_moe_layer_step``-th) of ``num_local_experts``
    routed experts and one shared expert of ``intermediate_size``, dense
    layers of ``intermediate_size_mlp``; weightless q/k L2 norms."""
    hidden = cfg.get_int("hidden_size")
    layers = cfg.get_int("num_hidden_layers")
    heads = cfg.get_int("num_attention_heads")
    rope = cfg.data.get("no_rope_layers")
    if rope is None or rope == []:
        rope = [int((i + 1) % 4 != 0) for i in range(layers)]
    if not isinstance(rope, list) or len(rope) != layers or not all(v in (0, 1) for v in rope):
        raise cfg.fail("no_rope_layers", rope, f"must list {layers} flags of 0 or 1")
    step = cfg.get_int("interleave_moe_layer_step", default=1)
    if step < 1:
        raise cfg.fail("interleave_moe_layer_step", step, "must be positive")
    moe_layers = sum(1 for i in range(layers) if (i + 1) % step == 0)
    expert = cfg.get_int("intermediate_size")
    chunk = cfg.get_int("attention_chunk_size", default=0)
    spec: dict[str, Any] = {
        "hidden_size": hidden, "num_layers": layers, "num_heads": heads,
        "num_kv_heads": cfg.get_int("num_key_value_heads", default=heads),
        "head_dim": cfg.get_int("head_dim") if cfg.data.get("head_dim") is not None
        else split_heads(cfg, hidden, heads),
        "vocab_size": cfg.get_int("vocab_size"),
        "max_position_embeddings": cfg.get_int("max_position_embeddings"),
        "tie_word_embeddings": cfg.get_bool("tie_word_embeddings", False),
        "attention_bias": cfg.get_bool("attention_bias", False),
        "intermediate_size": cfg.get_int("intermediate_size_mlp") if moe_layers < layers else 0,
        "num_experts": cfg.get_int("num_local_experts"),
        "experts_per_token": cfg.get_int("num_experts_per_tok"),
        "moe_intermediate_size": expert, "num_shared_experts": 1, "shared_expert_intermediate_size": expert,
        # transformers' Llama 4 puts the dense layers where (i + 1) % step != 0; the
        # spec counts MoE layers after the dense ones, the same totals.
        "first_k_dense_layers": layers - moe_layers,
        # Without attention_chunk_size every layer attends globally (vLLM's
        # Llama4Attention chunks only when the config sets it).
        "hybrid": HybridLayers(num_chunked_layers=sum(rope) if chunk else 0, attention_chunk_size=chunk),
    }
    return spec


_PARSERS = {
    "llama": _parse_llama_family, "mistral": _parse_llama_family, "qwen2": _parse_llama_family,
    "qwen3": _parse_llama_family, "qwen3_moe": _parse_llama_family, "mixtral": _parse_llama_family,
    "phi3": _parse_llama_family,
    # Kimi K2's model_type names DeepSeek-V3's architecture (its config says so).
    "deepseek_v2": _parse_deepseek, "deepseek_v3": _parse_deepseek, "kimi_k2": _parse_deepseek,
    # GLM-5's model_type: vLLM serves it with DeepSeek-V3.2's model class.
    "deepseek_v32": _parse_deepseek_v32, "glm_moe_dsa": _parse_deepseek_v32,
    "llama4_text": _parse_llama4_text, "qwen3_next": _parse_qwen3_next,
    "qwen3_5_text": _parse_qwen3_next, "qwen3_5_moe_text": _parse_qwen3_next, "nemotron_h": _parse_nemotron_h,
    "gemma2": _parse_gemma, "gemma3_text": _parse_gemma, "glm4": _parse_glm4, "glm4_moe": _parse_glm4_moe,
    "chatglm": _parse_chatglm,
    "gpt_oss": _parse_gpt_oss, "bloom": _parse_bloom,
    **{name: _parse_vl_text for name in _VL_TEXT_TYPES},
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
    return model_spec_from_config(data, name or _name_from_path(config_path), str(config_path))


def model_spec_from_config(data: Mapping[str, Any], label: str, source: str = "config.json") -> ModelSpec:
    """:func:`load_model_spec` of a config.json already read: ``data`` the
    JSON object, ``label`` the spec's name, ``source`` the file (for errors)."""
    if data.get("model_type") is None:
        raise UserInputError(f"{source}: missing required field 'model_type'")
    text, model_type = language_model_config(data)
    if model_type is not None and model_type in REFUSED_MODEL_TYPES:
        raise UserInputError(f"{label}: model_type={model_type!r} is not supported: "
                             f"{REFUSED_MODEL_TYPES[model_type]} ({source})")
    parser = _PARSERS.get(model_type) if model_type is not None else None
    if parser is None:
        shown = show(model_type if model_type is not None else data.get("model_type"))
        raise UserInputError(f"{source}: model_type={shown} is not supported; "
                             f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    assert model_type is not None
    cfg = HFConfig(text, source if text is data else f"{source}: text_config")
    fields = parser(cfg, model_type)
    try:
        return ModelSpec(name=label, **fields)
    except ValueError as err:
        raise UserInputError(f"{source}: {err}") from None
