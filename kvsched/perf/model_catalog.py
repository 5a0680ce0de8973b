"""The catalog of named models and the resolver of a ``--model`` value.

:data:`MODELS` holds the architectures kvsched knows by name, with aliases
and fine-tune/quantized variants matched to their base
(:func:`catalog_match`); :func:`get_model` resolves any ``--model`` value (a
catalog name, a local ``config.json``, a Hugging Face id) to a
:class:`~kvsched.perf.models.ModelSpec`, and :func:`checkpoint_format` to the
weight format its checkpoint brings.

Catalog values come from ``/work/shared/facts/models.md`` (source keys
``[AIC]`` aiconfigurator model configs, ``[THB]``, ``[BLIS]``, ``[TF]``,
``[DSV3]``, ``[OSS]``); the counts reproduce that file's §4 derived sizes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kvsched.hf_config import read_config_json
from kvsched.perf.checkpoint_format import CheckpointFormat, config_checkpoint_format, split_format_suffix
from kvsched.perf.model_parsers import load_model_spec
from kvsched.perf.model_source import find_config
from kvsched.perf.models import ModelSpec

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

# What the Llama 3.1 models share ([AIC]).
_LLAMA_3_1: dict[str, Any] = {
    "num_kv_heads": 8, "head_dim": 128, "vocab_size": 128256, "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
}
# What the Qwen3 models share ([AIC]): per-head q/k norms; and the MoE ones' layout.
_QWEN3: dict[str, Any] = {"head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
                          "qk_norm": True}
_QWEN3_MOE: dict[str, Any] = {**_QWEN3, "num_kv_heads": 4, "intermediate_size": 0,
                              "tie_word_embeddings": False, "num_experts": 128, "experts_per_token": 8}

_CATALOG: tuple[ModelSpec, ...] = (
    # models.md "Added for the Splitwise measurements" (public HF configs)
    ModelSpec(name="meta-llama/Llama-2-70b-hf", hidden_size=8192, num_layers=80, num_heads=64,
              num_kv_heads=8, head_dim=128, intermediate_size=28672, vocab_size=32000,
              tie_word_embeddings=False, max_position_embeddings=4096),
    # [AIC]
    ModelSpec(name="meta-llama/Llama-3.1-8B", hidden_size=4096, num_layers=32, num_heads=32,
              intermediate_size=14336, **_LLAMA_3_1),
    ModelSpec(name="meta-llama/Llama-3.1-70B", hidden_size=8192, num_layers=80, num_heads=64,
              intermediate_size=28672, **_LLAMA_3_1),
    ModelSpec(name="meta-llama/Llama-3.1-405B", hidden_size=16384, num_layers=126, num_heads=128,
              intermediate_size=53248, **_LLAMA_3_1),
    ModelSpec(name="meta-llama/Llama-3.2-1B", hidden_size=2048, num_layers=16, num_heads=32,  # [THB]
              num_kv_heads=8, head_dim=64, intermediate_size=8192, vocab_size=128256,
              tie_word_embeddings=True, max_position_embeddings=131072),
    # [BLIS] (Instruct config; identical dims). max_pos: base model's 131072 (approx. in models.md;
    # the Instruct config says 32768). q/k/v carry a bias, o does not.
    ModelSpec(name="Qwen/Qwen2.5-7B", hidden_size=3584, num_layers=28, num_heads=28,
              num_kv_heads=4, head_dim=128, intermediate_size=18944, vocab_size=152064,
              tie_word_embeddings=False, max_position_embeddings=131072, attention_bias=True),
    # [AIC]
    ModelSpec(name="Qwen/Qwen3-0.6B", hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8,
              intermediate_size=3072, tie_word_embeddings=True, **_QWEN3),
    ModelSpec(name="Qwen/Qwen3-8B", hidden_size=4096, num_layers=36, num_heads=32, num_kv_heads=8,
              intermediate_size=12288, tie_word_embeddings=False, **_QWEN3),
    ModelSpec(name="Qwen/Qwen3-32B", hidden_size=5120, num_layers=64, num_heads=64, num_kv_heads=8,
              intermediate_size=25600, tie_word_embeddings=False, **_QWEN3),
    ModelSpec(name="Qwen/Qwen3-30B-A3B", hidden_size=2048, num_layers=48, num_heads=32,
              moe_intermediate_size=768, **_QWEN3_MOE),
    ModelSpec(name="Qwen/Qwen3-235B-A22B", hidden_size=4096, num_layers=94, num_heads=64,
              moe_intermediate_size=1536, **_QWEN3_MOE),
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
    base, fmt = split_format_suffix(org, base)
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
