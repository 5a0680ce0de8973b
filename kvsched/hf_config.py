"""The one reader of Hugging Face ``config.json`` files.

Both the simulator's ``ModelSpec`` (``kvsched.perf.model_parsers``) and the engine's
``ModelConfig`` (``kvsched.model.config``) read checkpoints through this
module, so every field rule lives here once: transformers' class defaults for
keys a config omits, the 4.x and 5.x spellings of RoPE, which projections
carry biases per model type, sliding-window layouts, the MoE layouts of
Mixtral and Qwen3-MoE. What each consumer *supports* (the engine runs dense
models with plain, linear or llama3 RoPE only) is checked by that consumer.

Torch-free: the core, the simulator and the CLI import it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kvsched.errors import UserInputError
from kvsched.fields import is_int, is_number
from kvsched.files import read_text
from kvsched.jsonfile import json_problem, show, strict_loads

LLAMA_FAMILY = ("llama", "mistral", "mixtral", "phi3", "qwen2", "qwen3", "qwen3_moe")

# model_type -> transformers' class defaults for keys a config.json may omit:
# (head_dim, num_key_value_heads, max_position_embeddings); a None head_dim is
# hidden_size // num_attention_heads, a None num_key_value_heads is
# num_attention_heads.
_CLASS_DEFAULTS: dict[str, tuple[int | None, int | None, int]] = {
    "llama": (None, None, 2048),
    "mistral": (None, 8, 131072),
    "mixtral": (None, 8, 131072),
    # Phi-3/Phi-4: Llama's layout with fused qkv and gate_up projections (the
    # same weights, no biases); partial rotary changes no cost.
    "phi3": (None, None, 4096),
    "qwen2": (None, 32, 32768),
    "qwen3": (128, 32, 32768),
    "qwen3_moe": (None, 4, 32768),
}
# Qwen's default for the first layer that may slide (transformers' max_window_layers).
QWEN_MAX_WINDOW_LAYERS = 28
_MISSING = object()


# -- stated bounds ---------------------------------------------------------------
# Every number kvsched reads from a config.json has a range, checked when the
# field is read and before anything is computed or allocated from it. Each
# bound holds for every published checkpoint with a wide margin; a value
# beyond it is a corrupt or mistyped file, not a model. The ModelSpec of
# kvsched.perf.models holds the same bounds for models built in code.

# A config.json is 1-60 KB (multimodal ones with label tables a few hundred
# KB); 16 MiB is read at most, so a wrong path (a weights file) fails fast.
MAX_CONFIG_BYTES = 16 * 2**20
# Published widths are at most 16,384-20,480 (Llama 3.1 405B: 16,384;
# Megatron-Turing 530B: 20,480); latent ranks (MLA) are below the width.
MAX_HIDDEN_SIZE = 2**17
# The deepest published models have ~126 layers (Llama 3.1 405B).
MAX_LAYERS = 1024
# Published models have at most 128 query heads (DeepSeek-V3, Llama 3.1 405B)
# and heads of at most 256-512 dims.
MAX_HEADS = 2**12
MAX_HEAD_DIM = 2**12
# The widest published MLPs are 53,248-73,728 (Llama 3.1 405B, PaLM 540B).
MAX_INTERMEDIATE_SIZE = 2**20
# The largest published vocabularies are ~256K tokens (Gemma: 262,144).
MAX_VOCAB_SIZE = 2**24
# The longest published context is 10,485,760 tokens (Llama 4 Scout).
MAX_POSITIONS = 2**26
# The most routed experts published are 384 (Kimi K2); research MoEs a few thousand.
MAX_EXPERTS = 2**14
# Integers kvsched reads without a field-specific rule still fit an int64.
_INT64 = (-(2**63), 2**63 - 1, "an integer field fits in 64 bits")

_WIDTH = (1, MAX_HIDDEN_SIZE, "the widest published models are 16,384-20,480 wide")
_LAYER_COUNT = (1, MAX_LAYERS, "the deepest published models have ~126 layers")
_HEADS = (1, MAX_HEADS, "published models have at most 128 attention heads")
_HEAD_DIM = (1, MAX_HEAD_DIM, "published heads are 64-512 wide")
_MLP = (1, MAX_INTERMEDIATE_SIZE, "the widest published MLPs are 53,248-73,728")
_EXPERTS = (0, MAX_EXPERTS, "the most routed experts published are 384 (Kimi K2)")
_POSITIONS = (1, MAX_POSITIONS, "the longest published context is 10,485,760 tokens")
# (lowest, highest, why) per config.json field, by the name the file uses.
INT_BOUNDS: Mapping[str, tuple[int, int, str]] = MappingProxyType({
    "hidden_size": _WIDTH, "n_embed": _WIDTH,
    "num_hidden_layers": _LAYER_COUNT, "n_layer": _LAYER_COUNT, "num_layers": _LAYER_COUNT,
    "num_attention_heads": _HEADS, "n_head": _HEADS, "num_key_value_heads": _HEADS,
    "multi_query_group_num": _HEADS, "kv_channels": _HEAD_DIM,
    "head_dim": _HEAD_DIM, "qk_nope_head_dim": _HEAD_DIM, "qk_rope_head_dim": _HEAD_DIM,
    "v_head_dim": _HEAD_DIM,
    "q_lora_rank": (0, MAX_HIDDEN_SIZE, "a latent rank is below the model width; 0 or null: none"),
    "kv_lora_rank": (1, MAX_HIDDEN_SIZE, "a latent rank is below the model width"),
    "intermediate_size": _MLP, "moe_intermediate_size": _MLP, "ffn_hidden_size": _MLP,
    "vocab_size": (1, MAX_VOCAB_SIZE, "the largest published vocabularies are ~256K tokens"),
    "padded_vocab_size": (1, MAX_VOCAB_SIZE, "the largest published vocabularies are ~256K tokens"),
    "max_position_embeddings": _POSITIONS, "seq_length": _POSITIONS,
    "sliding_window": (0, MAX_POSITIONS, "a window is at most the context; 0 or null: none"),
    "num_experts": _EXPERTS, "num_local_experts": _EXPERTS, "n_routed_experts": _EXPERTS,
    "n_shared_experts": (0, MAX_EXPERTS, "published MoEs share 1-2 experts"),
    "num_experts_per_tok": (1, MAX_EXPERTS, "a token is routed to at least one expert"),
    "experts_per_token": (1, MAX_EXPERTS, "a token is routed to at least one expert"),
    "first_k_dense_replace": (0, MAX_LAYERS, "a count of layers"),
    "max_window_layers": (0, MAX_LAYERS, "a layer index"),
    # transformers computes `layer % step`: 0 divides by zero there.
    "decoder_sparse_step": (1, MAX_LAYERS, "every step-th layer is MoE; 1: every layer"),
    "moe_layer_freq": (1, MAX_LAYERS, "every freq-th layer is MoE; 1: every layer"),
})
# Finite numbers in the open interval (lowest, highest), and why.
NUMBER_BOUNDS: Mapping[str, tuple[float, float, str]] = MappingProxyType({
    "rms_norm_eps": (0.0, 1.0, "a small positive constant; published: 1e-6 to 1e-5"),
    "rope_theta": (0.0, math.inf, "the RoPE base; published: 1e4 to 1e8"),
})
LAYER_TYPES = ("full_attention", "sliding_attention")


def parse_json(path: Path, text: str, fix: str) -> object:
    """JSON from ``text``; duplicate keys, over-long integers and deep
    nesting are errors naming ``path``."""
    try:
        return strict_loads(text)
    except ValueError as err:
        raise UserInputError(f"{path}: {json_problem(err)}; {fix}") from None


# Multimodal wrappers whose language model sits in ``text_config``, with the
# text model_type transformers gives it when the nested config omits one.
TEXT_CONFIG_TYPES: Mapping[str, str] = MappingProxyType({
    "gemma3": "gemma3_text", "llama4": "llama4_text", "qwen3_vl": "qwen3_vl_text",
    "qwen3_vl_moe": "qwen3_vl_moe_text", "qwen2_5_vl": "qwen2_5_vl_text", "qwen3_5": "qwen3_5_text",
    "qwen3_5_moe": "qwen3_5_moe_text"})


def language_model_config(data: Mapping[str, Any]) -> tuple[Mapping[str, Any], str | None]:
    """(the mapping that describes the language model, its model_type): a
    multimodal wrapper's ``text_config`` (:data:`TEXT_CONFIG_TYPES`), else
    ``data`` itself. The vision tower is not read."""
    model_type = data.get("model_type")
    if isinstance(model_type, str) and model_type in TEXT_CONFIG_TYPES:
        text = data.get("text_config")
        if isinstance(text, dict):
            inner = text.get("model_type", TEXT_CONFIG_TYPES[model_type])
            return text, inner if isinstance(inner, str) else None
    return data, model_type if isinstance(model_type, str) else None


def read_config_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path`` (config.json, generation_config.json)."""
    text = read_text(path, MAX_CONFIG_BYTES, "a Hugging Face config.json")
    data = parse_json(path, text, "fix or re-download the file")
    if not isinstance(data, dict):
        raise UserInputError(f"{path}: top level must be a JSON object; fix or re-download the file")
    return data


class HFConfig:
    """Typed access to a config.json mapping; every error names the file and field.

    A key set to null counts as absent (it takes the default), except where a
    rule says otherwise (``num_key_value_heads``).
    """

    def __init__(self, data: Mapping[str, Any], source: str = "config.json") -> None:
        self.data = data
        self.source = source

    def fail(self, key: str, value: object, rule: str) -> UserInputError:
        return UserInputError(f"{self.source}: {key}={show(value)}: {rule}; fix config.json")

    def _raw(self, keys: tuple[str, ...], default: object) -> tuple[str, object]:
        for key in keys:
            if self.data.get(key) is not None:
                return key, self.data[key]
        if default is _MISSING:
            alt = f" (or {', '.join(repr(k) for k in keys[1:])})" if len(keys) > 1 else ""
            raise UserInputError(f"{self.source}: missing required field {keys[0]!r}{alt} for "
                             f"model_type {show(self.data.get('model_type'))}; the config is "
                             "incomplete, re-download or fix it")
        return keys[0], default

    def get_int(self, *keys: str, default: object = _MISSING) -> int:
        """An integer within the field's stated bounds (:data:`INT_BOUNDS`)."""
        key, value = self._raw(keys, default)
        if not is_int(value):
            raise self.fail(key, value, "must be an integer")
        low, high, why = INT_BOUNDS.get(key, _INT64)
        if not low <= value <= high:
            span = f"a positive integer, at most {high:,}" if low == 1 else \
                f"an integer from {low:,} to {high:,}"
            raise self.fail(key, value, f"must be {span} ({why})")
        return value

    def get_number(self, key: str, default: float) -> float:
        """A finite number within the field's stated bounds (:data:`NUMBER_BOUNDS`)."""
        _, value = self._raw((key,), default)
        if not is_number(value):
            raise self.fail(key, value, "must be a number")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        low, high, why = NUMBER_BOUNDS.get(key, (-math.inf, math.inf, "a number"))
        if not (math.isfinite(number) and low < number < high):
            raise self.fail(key, value, f"must be a finite number between {low:g} and {high:g} "
                                        f"({why})")
        return number

    def get_bool(self, key: str, default: bool) -> bool:
        _, value = self._raw((key,), default)
        if not isinstance(value, bool):
            raise self.fail(key, value, "must be true or false")
        return value

    def get_str(self, key: str, default: str) -> str:
        _, value = self._raw((key,), default)
        if not isinstance(value, str):
            raise self.fail(key, value, "must be a string")
        return value

    def layer_indices(self, key: str, num_layers: int) -> set[int]:
        """A list of layer indices (each below ``num_layers``), as a set."""
        _, value = self._raw((key,), [])
        if not isinstance(value, list) or len(value) > num_layers or not all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v < num_layers for v in value):
            raise self.fail(key, value, f"must be a list of layer indices from 0 to {num_layers - 1} "
                                        f"(num_hidden_layers={num_layers})")
        return set(value)

    def layer_types(self, num_layers: int) -> list[str] | None:
        value = self.data.get("layer_types")
        if value is None:
            return None
        if not isinstance(value, list) or len(value) != num_layers \
                or not all(isinstance(v, str) and v in LAYER_TYPES for v in value):
            raise UserInputError(f"{self.source}: layer_types={show(value)}: must be a list of "
                             f"{num_layers} strings (one per layer), each "
                             f"{' or '.join(map(repr, LAYER_TYPES))}; fix config.json")
        return value

    def count_sliding_layers(self, window: int, num_layers: int, default: int) -> int:
        """Sliding layers: from ``layer_types`` when the config lists them, else ``default``."""
        if not window:
            return 0
        types = self.layer_types(num_layers)
        if types is None:
            return default
        return sum(1 for t in types if t == "sliding_attention")


@dataclass(frozen=True, slots=True)
class RopeFields:
    """RoPE as config.json spells it: transformers 5's ``rope_parameters``, or
    4.x's top-level ``rope_theta`` with ``rope_scaling``. ``where`` names the
    key the parameters came from, for error messages."""

    where: str
    rope_theta: float
    rope_type: str
    partial_rotary_factor: object
    parameters: Mapping[str, Any]


def read_rope(cfg: HFConfig) -> RopeFields:
    params = cfg.data.get("rope_parameters")
    where = "rope_parameters"
    if params is None:
        params, where = cfg.data.get("rope_scaling"), "rope_scaling"
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise cfg.fail(where, params, "must be a JSON object or null")
    if any(isinstance(v, dict) for v in params.values()):
        raise UserInputError(f"{cfg.source}: {where}: per-layer-type RoPE parameters are not supported; "
                         "use a checkpoint with one RoPE for all layers")
    if "rope_theta" in params:
        theta = HFConfig(params, f"{cfg.source}: {where}").get_number("rope_theta", 10000.0)
    else:
        theta = cfg.get_number("rope_theta", 10000.0)
    partial = params.get("partial_rotary_factor", cfg.data.get("partial_rotary_factor", 1.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    return RopeFields(where, theta, str(rope_type), partial, params)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """A decoder-only transformer's shape: what the simulator's cost model
    (:class:`kvsched.perf.models.ModelSpec`) and the engine's model
    (:class:`kvsched.model.config.ModelConfig`, through
    :class:`LlamaFamilyConfig`) both read, declared once here.

    Both extend this class rather than compose small parts (an attention,
    an MLP, a sliding-window dataclass): the cost model reads these fields
    on every step-time call and in every catalog entry as ``spec.num_heads``,
    ``dataclasses.replace(spec, num_experts=...)``, and a flat slotted field
    is read as fast as before, where a part would add an indirection per
    read and change every reader. The names are the simulator's (its readers
    are the many); the config.json key each comes from is the reader's
    business (:func:`read_llama_family`, :mod:`kvsched.perf.model_parsers`).

    ``intermediate_size`` is the dense MLP's (0 when every layer is MoE).
    ``first_k_dense_layers`` counts the layers of an MoE model whose MLP is
    dense; where they stand does not change cost (DeepSeek's leading
    ``first_k_dense_replace``, Qwen3-MoE's ``mlp_only_layers``).
    ``num_sliding_layers`` of the layers keep only the last ``sliding_window``
    tokens (both 0 when no layer slides).
    """

    hidden_size: int
    num_layers: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    # attention
    num_heads: int
    num_kv_heads: int
    head_dim: int
    attention_bias: bool = False      # q/k/v projections carry a bias
    attention_out_bias: bool = False  # o projection carries a bias
    qk_norm: bool = False             # per-head q/k norms (Qwen3)
    sliding_window: int = 0
    num_sliding_layers: int = 0
    # MLP
    intermediate_size: int
    mlp_bias: bool = False            # dense MLP and expert projections carry biases
    # mixture of experts
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    first_k_dense_layers: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LlamaFamilyConfig(ModelShape):
    """A Llama-family checkpoint as :func:`read_llama_family` reads it: the
    :class:`ModelShape` plus what only running the model needs. The engine's
    :class:`kvsched.model.config.ModelConfig` is this plus RoPE, token ids
    and dtype."""

    model_type: str
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"


def _head_dim_and_kv_heads(cfg: HFConfig, model_type: str, hidden: int, heads: int) -> tuple[int, int]:
    default_head_dim, default_kv_heads, _ = _CLASS_DEFAULTS[model_type]
    # Like transformers: an absent key takes the class default, an explicit
    # null means multi-head attention.
    if "num_key_value_heads" not in cfg.data:
        kv_heads = heads if default_kv_heads is None else default_kv_heads
    else:
        kv_heads = cfg.get_int("num_key_value_heads", default=heads)
    if cfg.data.get("head_dim") is not None:
        return cfg.get_int("head_dim"), kv_heads
    if default_head_dim is not None:
        return default_head_dim, kv_heads
    return split_heads(cfg, hidden, heads), kv_heads


def split_heads(cfg: HFConfig, hidden: int, heads: int) -> int:
    """The head dim when a config leaves it to ``hidden_size // num_attention_heads``."""
    if hidden % heads:
        raise cfg.fail("hidden_size", hidden, f"not divisible by num_attention_heads={heads} and "
                                              "head_dim is not set")
    return hidden // heads


def _sliding(cfg: HFConfig, model_type: str, num_layers: int) -> tuple[int, int]:
    """(sliding_window, sliding layers); (0, 0) when no layer slides."""
    if model_type in ("qwen2", "qwen3", "qwen3_moe"):
        # Qwen: a window only with use_sliding_window; then layers >= max_window_layers slide.
        if not cfg.get_bool("use_sliding_window", False):
            return 0, 0
        window = cfg.get_int("sliding_window", default=0)
        first = cfg.get_int("max_window_layers", default=QWEN_MAX_WINDOW_LAYERS)
        sliding = cfg.count_sliding_layers(window, num_layers, max(0, num_layers - first))
    elif model_type in ("mistral", "mixtral", "phi3"):
        # An absent window reads as none (transformers' class default, 4096, is
        # spelled out by the checkpoints that use it).
        window = cfg.get_int("sliding_window", default=0)
        sliding = cfg.count_sliding_layers(window, num_layers, num_layers)
    else:
        return 0, 0
    return (window, sliding) if sliding else (0, 0)


def read_llama_family(cfg: HFConfig, model_type: str) -> LlamaFamilyConfig:
    """The fields of a llama, mistral, mixtral, qwen2, qwen3 or qwen3_moe config:
    one attention layout, different MLPs."""
    if model_type not in _CLASS_DEFAULTS:
        raise cfg.fail("model_type", model_type, f"not a Llama-family model ({', '.join(LLAMA_FAMILY)})")
    hidden = cfg.get_int("hidden_size")
    heads = cfg.get_int("num_attention_heads")
    layers = cfg.get_int("num_hidden_layers")
    head_dim, kv_heads = _head_dim_and_kv_heads(cfg, model_type, hidden, heads)
    if model_type == "qwen2":
        qkv_bias, o_bias = True, False  # hard-wired on q/k/v in Qwen2, never on o
    elif model_type in ("mistral", "mixtral", "phi3"):
        qkv_bias = o_bias = False
    else:
        qkv_bias = o_bias = cfg.get_bool("attention_bias", False)  # llama/qwen3: q, k, v and o
    window, sliding = _sliding(cfg, model_type, layers)
    fields: dict[str, Any] = {}
    if model_type == "mixtral":
        fields.update(num_experts=cfg.get_int("num_local_experts"),
                      experts_per_token=cfg.get_int("num_experts_per_tok"),
                      moe_intermediate_size=cfg.get_int("intermediate_size"), intermediate_size=0)
    elif model_type == "qwen3_moe":
        experts = cfg.get_int("num_experts")
        step = cfg.get_int("decoder_sparse_step", default=1)
        dense_only = cfg.layer_indices("mlp_only_layers", layers)
        moe_layers = sum(1 for i in range(layers)
                         if i not in dense_only and experts > 0 and (i + 1) % step == 0)
        dense = layers - moe_layers
        fields.update(num_experts=experts, experts_per_token=cfg.get_int("num_experts_per_tok"),
                      moe_intermediate_size=cfg.get_int("moe_intermediate_size"), first_k_dense_layers=dense,
                      intermediate_size=cfg.get_int("intermediate_size") if dense else 0)
    else:
        fields["intermediate_size"] = cfg.get_int("intermediate_size")
    if not fields.get("num_experts"):
        # An MoE type whose config names no experts is dense: its expert
        # fields stay 0, as ModelShape's dense models have them.
        fields = {"intermediate_size": fields["intermediate_size"]}
    return LlamaFamilyConfig(
        model_type=model_type, vocab_size=cfg.get_int("vocab_size"), hidden_size=hidden,
        num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        max_position_embeddings=cfg.get_int("max_position_embeddings",
                                            default=_CLASS_DEFAULTS[model_type][2]),
        tie_word_embeddings=cfg.get_bool("tie_word_embeddings", False),
        rms_norm_eps=cfg.get_number("rms_norm_eps", 1e-6),
        hidden_act=cfg.get_str("hidden_act", "silu"),
        attention_bias=qkv_bias, attention_out_bias=o_bias,
        mlp_bias=cfg.get_bool("mlp_bias", False) if model_type == "llama" else False,
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        sliding_window=window, num_sliding_layers=sliding, **fields)
