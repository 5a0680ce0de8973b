"""Checkpoint formats: which linear layers a quantized checkpoint stores in
which weight format, and the format a checkpoint's name suffix or its
config.json's ``quantization_config`` implies.

Which *catalog* models ship quantized, and the resolution of a ``--model``
value to its format, are :mod:`kvsched.perf.model_catalog`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from kvsched.errors import UserInputError

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


# The quantization suffixes a checkpoint's name may end in, tried in this order.
_FORMAT_SUFFIXES = ("-fp8", "-nvfp4", "-fp4", "-bf16")


def _suffix_format(org: str, suffix: str) -> CheckpointFormat | None:
    """The format a name suffix means, by publisher: NVIDIA's ``-FP8``
    checkpoints are ModelOpt (per-tensor FP8 weights, FP8 KV); other
    ``-FP8`` checkpoints (Qwen, DeepSeek) are block-quantized
    (``weight_block_size`` 128 x 128) with a 16-bit KV cache. NVIDIA's
    ``-NVFP4`` / ``-FP4`` checkpoints are ModelOpt NVFP4 with an FP8 KV
    cache over every linear layer but the LM head (ModelOpt's default, e.g.
    nvidia/Qwen3-235B-A22B-NVFP4); repacks that exclude more are listed in
    :mod:`kvsched.perf.model_catalog`. Nobody else's ``-FP4`` is known. ``-BF16`` names a 16-bit
    conversion of a checkpoint published in FP8 (DeepSeek's)."""
    if suffix == "-fp8":
        return CheckpointFormat("fp8", "fp8") if org == "nvidia" else CheckpointFormat("fp8_block")
    if suffix in ("-nvfp4", "-fp4") and org == "nvidia":
        return CheckpointFormat("nvfp4", "fp8")
    if suffix == "-bf16":  # a 16-bit conversion of an FP8 checkpoint (DeepSeek-V3-BF16)
        return CheckpointFormat("bf16")
    return None


def split_format_suffix(org: str, base: str) -> tuple[str, CheckpointFormat | None]:
    """(``base`` less its quantization suffix, the format the suffix means)
    for a lower-case checkpoint name ``base`` published by ``org``; ``base``
    unchanged and None when it ends in no suffix, or in one whose format is
    unknown for ``org`` (see :func:`_suffix_format`)."""
    for suffix in _FORMAT_SUFFIXES:
        if base.endswith(suffix):
            fmt = _suffix_format(org, suffix)
            return (base[: -len(suffix)], fmt) if fmt is not None else (base, None)
    return base, None


def config_checkpoint_format(data: Mapping[str, Any],
                             hf_quant: Mapping[str, Any] | None = None) -> CheckpointFormat | None:
    """The weight format a config.json's own ``quantization_config`` names,
    as vLLM loads it: ``fp8`` with ``weight_block_size`` is block FP8
    (DeepSeek, Kimi-K2, Qwen -FP8, GLM -FP8), without it per-tensor FP8;
    ``mxfp4`` covers the experts (gpt-oss); ModelOpt's ``FP8`` / ``NVFP4``
    every linear layer, with an FP8 KV cache when ``kv_cache_quant_algo``
    says so. None: a 16-bit checkpoint, or a method kvsched does not price
    (compressed-tensors, AWQ, GPTQ, ModelOpt's MIXED_PRECISION), which is then
    priced in --dtype. ``hf_quant``: the ModelOpt ``hf_quant_config.json``
    beside it, which vLLM reads when config.json names no quantization
    (NVIDIA's -NVFP4 checkpoints of GLM-5, DeepSeek-V3.2, Qwen3.5)."""
    quant = data.get("quantization_config")
    if not isinstance(quant, Mapping):
        if isinstance(hf_quant, Mapping) and isinstance(hf_quant.get("quantization"), Mapping):
            return _modelopt_format(hf_quant["quantization"])
        return None
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":
        return CheckpointFormat("fp8_block" if quant.get("weight_block_size") else "fp8")
    if method == "mxfp4":
        return CheckpointFormat("mxfp4", layers="experts")
    if method == "modelopt":
        return _modelopt_format(quant)
    return None


# Module-name fragments of ModelOpt's exclude_modules that keep a part of
# every decoder layer 16-bit: attention (MLA, GQA, Gated DeltaNet) and the
# shared experts.
_ATTENTION_MODULES = ("self_attn", ".attn.", "linear_attn")
_SHARED_EXPERT_MODULES = ("shared_expert",)


def _modelopt_format(quant: Mapping[str, Any]) -> CheckpointFormat | None:
    """The format of a ModelOpt quantization config (an ``hf_quant_config.json``'s
    ``quantization`` object, or config.json's ``quantization_config``):
    ``quant_algo`` FP8 or NVFP4 (MIXED_PRECISION is not priced: None),
    ``kv_cache_quant_algo`` FP8, and the scope its ``exclude_modules``
    leaves quantized: attention excluded is "mlp", attention and shared
    experts excluded (GLM-5.1, Kimi-K2.6: their dense first layers too) is
    "experts", else "all". A part excluded on some layers only (Nemotron-3's
    six attention layers) counts as excluded on all: the scopes are
    per part, not per layer."""
    algo = str(quant.get("quant_algo", "")).upper()
    if algo not in ("FP8", "NVFP4"):
        return None
    # hf_quant_config.json spells the KV format kv_cache_quant_algo and the
    # 16-bit modules exclude_modules; newer config.json quantization_configs
    # kv_cache_scheme (8-bit float) and ignore.
    scheme = quant.get("kv_cache_scheme")
    fp8_scheme = isinstance(scheme, Mapping) and scheme.get("num_bits") == 8 \
        and str(scheme.get("type", "")).lower() == "float"
    kv = "fp8" if str(quant.get("kv_cache_quant_algo", "")).upper() == "FP8" or fp8_scheme else None
    excluded = [str(m) for m in (quant.get("exclude_modules") or quant.get("ignore") or ())]
    attention = any(f in m for m in excluded for f in _ATTENTION_MODULES)
    shared = any(f in m for m in excluded for f in _SHARED_EXPERT_MODULES)
    layers = ("experts" if shared else "mlp") if attention else "all"
    return CheckpointFormat(algo.lower(), kv, layers)
