"""The model configuration the engine needs, read from a Hugging Face checkpoint's
config.json (and generation_config.json). Torch-free, so the CLI can use it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kvsched.errors import UserInputError
from kvsched.fields import is_int, is_number
from kvsched.hf_config import (
    LAYER_TYPES,
    HFConfig,
    LlamaFamilyConfig,
    RopeFields,
    read_config_json,
    read_llama_family,
    read_rope,
)
from kvsched.perf.model_parsers import _GEMMA_DEFAULTS as GEMMA_DEFAULTS  # its one owner

# The architectures the engine runs, with their config.json model_type.
_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3_text",
}
# The MLP's activation per architecture (config.json's hidden_act, Gemma's
# hidden_activation): SwiGLU for the Llama family, GeGLU with tanh GELU for Gemma.
_ACTIVATIONS: Mapping[str, str] = MappingProxyType({
    "gemma3_text": "gelu_pytorch_tanh"})
DEFAULT_ACTIVATION = "silu"
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(_ARCHITECTURES)
SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3")

RopeScaling = tuple[tuple[str, float | int | str], ...]
# config.json's key for the shape fields it names otherwise, so that a
# message names what the user fixes.
_CONFIG_KEYS: Mapping[str, str] = MappingProxyType({
    "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads"})


@dataclass(slots=True, frozen=True, kw_only=True)
class ModelConfig(LlamaFamilyConfig):
    """One Llama-family model as the engine runs it: the checkpoint's shape
    (:class:`kvsched.hf_config.LlamaFamilyConfig`, whose ModelShape the
    simulator's ModelSpec shares, declared there once) and what only running
    it needs.

    ``rope_scaling`` is None for plain RoPE, else the sorted items of a dict with
    ``rope_type`` ("linear" or "llama3") and that type's parameters (see
    ``rope_scaling_dict``)."""

    architecture: str
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    torch_dtype: str | None = None
    # Gemma 3: each layer's "full_attention" / "sliding_attention" (empty:
    # every layer full), the RoPE base of the sliding layers (their RoPE is
    # unscaled), the attention's query scaling and the logits' tanh cap.
    layer_types: tuple[str, ...] = ()
    local_rope_theta: float | None = None
    query_pre_attn_scalar: float | None = None
    final_logit_softcapping: float | None = None

    def __post_init__(self) -> None:
        if self.architecture not in _ARCHITECTURES:
            raise UserInputError(
                f"architectures={[self.architecture]!r}: unsupported architecture; "
                f"use a checkpoint of one of {', '.join(SUPPORTED_ARCHITECTURES)}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not is_int(value) or value <= 0:
                raise UserInputError(f"{_CONFIG_KEYS.get(name, name)}={value!r}: must be a positive integer; "
                                     "fix config.json")
        if self.num_heads % self.num_kv_heads:
            raise UserInputError(
                f"num_key_value_heads={self.num_kv_heads}: must divide "
                f"num_attention_heads={self.num_heads}; fix config.json")
        if self.head_dim % 2:
            raise UserInputError(f"head_dim={self.head_dim}: rotary embedding needs an even head_dim; "
                             "fix config.json")
        activation = _ACTIVATIONS.get(self.model_type, DEFAULT_ACTIVATION)
        if self.hidden_act != activation:
            raise UserInputError(f"hidden_act={self.hidden_act!r}: unsupported activation; "
                                 f"{self.architecture} uses {activation}")
        if self.mlp_bias:
            raise UserInputError("mlp_bias=True: MLP biases are not supported; use a checkpoint without them")
        if self.num_experts:
            raise UserInputError(f"num_experts={self.num_experts}: mixture-of-experts layers are not "
                                 "supported by the engine; use a dense checkpoint")
        if self.layer_types:
            if len(self.layer_types) != self.num_layers or not set(self.layer_types) <= set(LAYER_TYPES):
                raise UserInputError(
                    f"layer_types={list(self.layer_types)!r}: must list {self.num_layers} entries "
                    f"(num_hidden_layers), each {' or '.join(map(repr, LAYER_TYPES))}; fix config.json")
        # Without layer_types the engine slides every layer (Mistral) or none;
        # Qwen's window on only the layers from max_window_layers on is not run.
        elif 0 < self.num_sliding_layers < self.num_layers \
                and self.sliding_window < self.max_position_embeddings:
            raise UserInputError(
                f"sliding_window={self.sliding_window}: a window on {self.num_sliding_layers} of "
                f"{self.num_layers} layers (use_sliding_window with max_window_layers) is not supported "
                f"and the window is smaller than max_position_embeddings={self.max_position_embeddings}; "
                "use a checkpoint with use_sliding_window false or sliding_window >= "
                "max_position_embeddings")
        if not self.rms_norm_eps > 0:
            raise UserInputError(f"rms_norm_eps={self.rms_norm_eps!r}: must be > 0; fix config.json")
        if not self.rope_theta > 0:
            raise UserInputError(f"rope_theta={self.rope_theta!r}: must be > 0; fix config.json")

        if "sliding_attention" in self.layer_types and not self.sliding_window > 0:
            raise UserInputError(f"sliding_window={self.sliding_window!r}: sliding_attention layers need "
                                 "a positive window; fix config.json")
        for name in ("query_pre_attn_scalar", "final_logit_softcapping", "local_rope_theta"):
            value = getattr(self, name)
            if value is not None and not (is_number(value) and value > 0):
                raise UserInputError(f"{name}={value!r}: must be a positive number or null; "
                                     "fix config.json")

    @property
    def attention_scale(self) -> float:
        """The softmax scale of every layer: Gemma's query_pre_attn_scalar ** -0.5,
        else head_dim ** -0.5."""
        scalar = self.query_pre_attn_scalar
        # x ** -0.5, not 1 / sqrt(x): transformers' rounding of the scale.
        scale: float = float(self.head_dim if scalar is None else scalar) ** -0.5
        return scale

    @property
    def layer_sliding_windows(self) -> tuple[int | None, ...]:
        """Each layer's window, None for full attention: a sliding layer's
        query at position p sees the keys at positions p - window + 1 .. p
        (transformers' mask: kv > q - window; vLLM's window of window - 1
        keys to the left)."""
        if not self.layer_types:
            # Mistral's window covers every layer; one that covers every
            # position is full attention (the engine ran such checkpoints so).
            slides = self.num_sliding_layers == self.num_layers \
                and 0 < self.sliding_window < self.max_position_embeddings
            return (self.sliding_window if slides else None,) * self.num_layers
        return tuple(self.sliding_window if t == "sliding_attention" else None
                     for t in self.layer_types)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def rope_scaling_dict(self) -> dict[str, float | int | str] | None:
        return None if self.rope_scaling is None else dict(self.rope_scaling)


def _number(where: str, value: Any) -> float:
    if not is_number(value):
        raise UserInputError(f"{where}={value!r}: must be a number; fix config.json")
    return float(value)


def _token_ids(where: str, value: Any) -> list[int]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    for item in items:
        if not is_int(item) or item < 0:
            raise UserInputError(f"{where}={value!r}: must be a token id or a list of token ids")
    return list(items)


def _rope_scaling(rope: RopeFields, max_position_embeddings: int) -> RopeScaling | None:
    """The RoPE scalings the model implements, checked (the spelling is
    kvsched.hf_config's ``read_rope``)."""
    where, params = rope.where, rope.parameters
    if rope.partial_rotary_factor != 1.0:
        raise UserInputError(f"partial_rotary_factor={rope.partial_rotary_factor!r}: partial rotary "
                         "embedding is not supported; only 1.0 (rotate the whole head) is")
    if rope.rope_type not in SUPPORTED_ROPE_TYPES:
        raise UserInputError(f"{where}.rope_type={rope.rope_type!r}: unsupported RoPE scaling; "
                         f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    if rope.rope_type == "default":
        return None
    factor = _number(f"{where}.factor", params.get("factor"))
    if factor <= 0:
        raise UserInputError(f"{where}.factor={factor!r}: must be > 0; fix config.json")
    scaling: dict[str, float | int | str] = {"rope_type": rope.rope_type, "factor": factor}
    if rope.rope_type == "llama3":
        # transformers falls back to max_position_embeddings the same way.
        orig = params.get("original_max_position_embeddings", max_position_embeddings)
        if not is_int(orig) or orig <= 0:
            raise UserInputError(f"{where}.original_max_position_embeddings={orig!r}: "
                             "must be a positive integer; fix config.json")
        low = _number(f"{where}.low_freq_factor", params.get("low_freq_factor"))
        high = _number(f"{where}.high_freq_factor", params.get("high_freq_factor"))
        if not high > low:
            raise UserInputError(f"{where}.high_freq_factor={high!r}: must be greater than "
                             f"low_freq_factor={low!r}; fix config.json")
        scaling.update(low_freq_factor=low, high_freq_factor=high,
                       original_max_position_embeddings=orig)
    return tuple(sorted(scaling.items()))


def load_model_config(path: str | os.PathLike[str]) -> ModelConfig:
    """Read ``path``/config.json (and generation_config.json for extra EOS ids)."""
    root = Path(path)
    if not root.is_dir():
        raise UserInputError(f"model={str(path)!r}: not a directory; pass a local Hugging Face "
                         "checkpoint directory (config.json, *.safetensors, tokenizer.json)")
    config_file = root / "config.json"
    if not config_file.is_file():
        raise UserInputError(f"model={str(path)!r}: no config.json in the directory; pass a Hugging Face "
                         "checkpoint directory that contains config.json")
    gen_file = root / "generation_config.json"
    generation = read_config_json(gen_file) if gen_file.is_file() else None
    return parse_model_config(read_config_json(config_file), generation, str(config_file))


def _architecture(cfg: dict[str, Any]) -> str:
    archs = cfg.get("architectures")
    if archs is None:
        by_type = {model_type: arch for arch, model_type in _ARCHITECTURES.items()}
        if cfg.get("model_type") not in by_type:
            raise UserInputError(f"architectures=None, model_type={cfg.get('model_type')!r}: cannot tell "
                             f"the architecture; set architectures to one of "
                             f"{', '.join(SUPPORTED_ARCHITECTURES)} in config.json")
        return by_type[cfg["model_type"]]
    if not isinstance(archs, list) or not archs or archs[0] not in _ARCHITECTURES:
        raise UserInputError(f"architectures={archs!r}: unsupported architecture; use a checkpoint of "
                         f"one of {', '.join(SUPPORTED_ARCHITECTURES)}")
    arch: str = archs[0]
    return arch


# Gemma 3's RoPE bases where config.json omits them (transformers'
# Gemma3TextConfig.default_theta): global layers, then sliding ones.
GEMMA3_ROPE_THETA = (1_000_000.0, 10_000.0)
# Gemma3TextConfig's query_pre_attn_scalar where config.json omits it.
GEMMA3_QUERY_PRE_ATTN_SCALAR = 256.0


def _gemma3(reader: HFConfig) -> tuple[dict[str, Any], RopeScaling | None]:
    """A Gemma 3 text config (Gemma3ForCausalLM): the shape with its
    transformers class defaults (``GEMMA_DEFAULTS``, the simulator's too),
    each layer's type, both RoPEs and the Gemma-only fields."""
    kv_heads, head_dim, vocab, positions, window, pattern = GEMMA_DEFAULTS["gemma3_text"]
    layers = reader.get_int("num_hidden_layers")
    window = reader.get_int("sliding_window", default=window)
    types = reader.layer_types(layers)
    if types is None:
        # transformers' default: every pattern-th layer is global.
        pattern = reader.get_int("sliding_window_pattern", default=pattern)
        if pattern < 1:
            raise reader.fail("sliding_window_pattern", pattern,
                              "must be a positive integer (every n-th layer is global)")
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if reader.data.get("attn_logit_softcapping") is not None:
        raise reader.fail("attn_logit_softcapping", reader.data["attn_logit_softcapping"],
                          "soft-capped attention scores are not supported (Gemma 3 checkpoints have "
                          "null); set it to null")
    if reader.get_bool("use_bidirectional_attention", False):
        raise reader.fail("use_bidirectional_attention", True, "only causal attention is supported; "
                          "set it to false")
    activation = reader.get_str("hidden_activation", _ACTIVATIONS["gemma3_text"])
    if activation != _ACTIVATIONS["gemma3_text"]:
        raise reader.fail("hidden_activation", activation,
                          f"unsupported activation; Gemma 3 uses {_ACTIVATIONS['gemma3_text']}")
    positions = reader.get_int("max_position_embeddings", default=positions)
    full_rope, local_theta = _gemma3_rope(reader)
    sliding = sum(t == "sliding_attention" for t in types)
    bias = reader.get_bool("attention_bias", False)
    # A null cap means none (Gemma 3's published configs).
    cap = None if reader.data.get("final_logit_softcapping") is None \
        else reader.get_number("final_logit_softcapping", 0.0)
    scalars = {"final_logit_softcapping": cap,
               "query_pre_attn_scalar": reader.get_number("query_pre_attn_scalar",
                                                          GEMMA3_QUERY_PRE_ATTN_SCALAR)}
    fields: dict[str, Any] = dict(
        model_type="gemma3_text", vocab_size=reader.get_int("vocab_size", default=vocab),
        hidden_size=reader.get_int("hidden_size"), num_layers=layers,
        num_heads=reader.get_int("num_attention_heads"),
        num_kv_heads=reader.get_int("num_key_value_heads", default=kv_heads),
        head_dim=reader.get_int("head_dim", default=head_dim),
        intermediate_size=reader.get_int("intermediate_size"),
        max_position_embeddings=positions,
        tie_word_embeddings=reader.get_bool("tie_word_embeddings", True),
        rms_norm_eps=reader.get_number("rms_norm_eps", 1e-6),
        hidden_act=activation,
        attention_bias=bias, attention_out_bias=bias, qk_norm=True,
        sliding_window=window if sliding else 0, num_sliding_layers=sliding,
        rope_theta=full_rope.rope_theta, layer_types=tuple(types), local_rope_theta=local_theta,
        **scalars)
    return fields, _rope_scaling(full_rope, positions)


def _gemma3_rope(reader: HFConfig) -> tuple[RopeFields, float]:
    """(the global layers' RoPE, the sliding layers' base). transformers 5
    writes ``rope_parameters`` per layer type; 4.x configs (the published
    ones) give ``rope_theta``, ``rope_local_base_freq`` and a ``rope_scaling``
    that applies to the global layers only."""
    params = reader.data.get("rope_parameters")
    if isinstance(params, dict) and any(isinstance(v, dict) for v in params.values()):
        per_type: dict[str, tuple[float, Mapping[str, Any]]] = {}
        for layer_type, default in zip(LAYER_TYPES, GEMMA3_ROPE_THETA):
            where = f"rope_parameters.{layer_type}"
            own = params.get(layer_type) or {}
            if not isinstance(own, dict):
                raise reader.fail(where, own, "must be a JSON object or null")
            theta = HFConfig(own, f"{reader.source}: {where}").get_number("rope_theta", default)
            per_type[layer_type] = theta, own
        theta, full = per_type["full_attention"]
        local_theta, local = per_type["sliding_attention"]
        if local.get("rope_type", "default") != "default":
            raise reader.fail("rope_parameters.sliding_attention.rope_type", local["rope_type"],
                              "only unscaled RoPE is supported on the sliding layers")
        rope = RopeFields("rope_parameters.full_attention", theta,
                          str(full.get("rope_type", "default")),
                          full.get("partial_rotary_factor", 1.0), full)
        return rope, local_theta
    scaling = reader.data.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise reader.fail("rope_scaling", scaling, "must be a JSON object or null")
    scaling = scaling or {}
    theta = reader.get_number("rope_theta", GEMMA3_ROPE_THETA[0])
    rope = RopeFields("rope_scaling", theta, str(scaling.get("rope_type", scaling.get("type", "default"))),
                      1.0, scaling)
    return rope, reader.get_number("rope_local_base_freq", GEMMA3_ROPE_THETA[1])


def parse_model_config(cfg: dict[str, Any], generation_config: dict[str, Any] | None = None,
                       source: str = "config.json") -> ModelConfig:
    """A ``ModelConfig`` from config.json's (and generation_config.json's) contents.

    The fields are read by ``kvsched.hf_config`` (shared with the simulator);
    here are only what the engine supports and the token ids."""
    arch = _architecture(cfg)
    reader = HFConfig(cfg, source)
    if _ARCHITECTURES[arch] == "gemma3_text":
        shape, rope_scaling = _gemma3(reader)
    else:
        f = read_llama_family(reader, _ARCHITECTURES[arch])
        rope = read_rope(reader)
        rope_scaling = _rope_scaling(rope, f.max_position_embeddings)
        shape = {field.name: getattr(f, field.name) for field in fields(LlamaFamilyConfig)}
        shape["model_type"] = str(cfg.get("model_type", f.model_type))
        shape["rope_theta"] = rope.rope_theta

    eos = _token_ids("eos_token_id", cfg.get("eos_token_id"))
    bos = cfg.get("bos_token_id")
    if generation_config is not None:
        eos += [t for t in _token_ids("generation_config.eos_token_id",
                                      generation_config.get("eos_token_id")) if t not in eos]
        if bos is None:
            bos = generation_config.get("bos_token_id")
    if bos is not None and (not is_int(bos)):
        raise UserInputError(f"bos_token_id={bos!r}: must be a token id or null; fix config.json")
    dtype = cfg.get("torch_dtype", cfg.get("dtype"))

    return ModelConfig(
        **shape,
        architecture=arch,
        rope_scaling=rope_scaling,
        eos_token_ids=tuple(eos),
        bos_token_id=bos,
        torch_dtype=dtype if isinstance(dtype, str) else None,
    )
