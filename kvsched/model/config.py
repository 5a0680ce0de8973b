"""The model configuration the engine needs, read from a Hugging Face checkpoint's
config.json (and generation_config.json). Torch-free, so the CLI can use it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# architecture -> (model_type, default head_dim, default num_key_value_heads,
# default max_position_embeddings): transformers' defaults for keys a config.json
# omits; None means hidden_size // num_attention_heads, resp. num_attention_heads.
_ARCHITECTURES: dict[str, tuple[str, int | None, int | None, int]] = {
    "LlamaForCausalLM": ("llama", None, None, 2048),
    "MistralForCausalLM": ("mistral", None, 8, 131072),
    "Qwen2ForCausalLM": ("qwen2", None, 32, 32768),
    "Qwen3ForCausalLM": ("qwen3", 128, 32, 32768),
}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(_ARCHITECTURES)
SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")

RopeScaling = tuple[tuple[str, float | int | str], ...]


@dataclass(slots=True, frozen=True)
class ModelConfig:
    """One Llama-family model's shape and numerics (vLLM's / transformers' names).

    ``rope_scaling`` is None for plain RoPE, else the sorted items of a dict with
    ``rope_type`` ("linear" or "llama3") and that type's parameters (see
    ``rope_scaling_dict``). ``attention_bias`` is the q/k/v projections' bias;
    ``o_proj_bias`` the output projection's (Llama/Qwen3 tie both to
    ``attention_bias`` in config.json, Qwen2 has q/k/v bias only)."""

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    torch_dtype: str | None = None
    o_proj_bias: bool = False

    def __post_init__(self) -> None:
        if self.architecture not in _ARCHITECTURES:
            raise ValueError(
                f"architectures={[self.architecture]!r}: unsupported architecture; "
                f"use a checkpoint of one of {', '.join(SUPPORTED_ARCHITECTURES)}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim",
                     "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r}: must be a positive integer; fix config.json")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads={self.num_key_value_heads}: must divide "
                f"num_attention_heads={self.num_attention_heads}; fix config.json")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim}: rotary embedding needs an even head_dim; "
                             "fix config.json")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps={self.rms_norm_eps!r}: must be > 0; fix config.json")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta={self.rope_theta!r}: must be > 0; fix config.json")

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def rope_scaling_dict(self) -> dict[str, float | int | str] | None:
        return None if self.rope_scaling is None else dict(self.rope_scaling)


def read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON ({e}); fix or re-download the file") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must hold a JSON object; fix or re-download the file")
    return data


def _number(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}={value!r}: must be a number; fix config.json")
    return float(value)


def _positive_int(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{where}={value!r}: must be a positive integer; fix config.json")
    return value


def _token_ids(where: str, value: Any) -> list[int]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise ValueError(f"{where}={value!r}: must be a token id or a list of token ids")
    return list(items)


def _rope(cfg: dict[str, Any], max_position_embeddings: int) -> tuple[float, RopeScaling | None]:
    """(rope_theta, rope_scaling) from either transformers 5's ``rope_parameters``
    or the older ``rope_theta`` + ``rope_scaling`` keys."""
    params = cfg.get("rope_parameters")
    where = "rope_parameters"
    if params is None:
        params, where = cfg.get("rope_scaling"), "rope_scaling"
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ValueError(f"{where}={params!r}: must be a JSON object or null; fix config.json")
    if any(isinstance(v, dict) for v in params.values()):
        raise ValueError(f"{where}: per-layer-type RoPE parameters are not supported by the "
                         "Llama-family model; use a checkpoint with one RoPE for all layers")
    theta = _number(f"{where}.rope_theta" if "rope_theta" in params else "rope_theta",
                    params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(f"partial_rotary_factor={partial!r}: partial rotary embedding is not "
                         "supported; only 1.0 (rotate the whole head) is")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"{where}.rope_type={rope_type!r}: unsupported RoPE scaling; "
                         f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    if rope_type == "default":
        return theta, None
    factor = _number(f"{where}.factor", params.get("factor"))
    if factor <= 0:
        raise ValueError(f"{where}.factor={factor!r}: must be > 0; fix config.json")
    scaling: dict[str, float | int | str] = {"rope_type": rope_type, "factor": factor}
    if rope_type == "llama3":
        # transformers falls back to max_position_embeddings the same way.
        orig = params.get("original_max_position_embeddings", max_position_embeddings)
        if isinstance(orig, bool) or not isinstance(orig, int) or orig <= 0:
            raise ValueError(f"{where}.original_max_position_embeddings={orig!r}: "
                             "must be a positive integer; fix config.json")
        low = _number(f"{where}.low_freq_factor", params.get("low_freq_factor"))
        high = _number(f"{where}.high_freq_factor", params.get("high_freq_factor"))
        if not high > low:
            raise ValueError(f"{where}.high_freq_factor={high!r}: must be greater than "
                             f"low_freq_factor={low!r}; fix config.json")
        scaling.update(low_freq_factor=low, high_freq_factor=high,
                       original_max_position_embeddings=orig)
    return theta, tuple(sorted(scaling.items()))


def _check_sliding_window(cfg: dict[str, Any], architecture: str, num_layers: int,
                          max_position_embeddings: int) -> None:
    """The model attends over the whole context, which equals sliding-window
    attention only when the window covers every position."""
    window = cfg.get("sliding_window")
    if architecture in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        if not cfg.get("use_sliding_window", False):
            return
        layer_types = cfg.get("layer_types")
        if isinstance(layer_types, list):
            sliding = "sliding_attention" in layer_types
        else:
            max_window_layers = cfg.get("max_window_layers", 28)
            sliding = not isinstance(max_window_layers, int) or max_window_layers < num_layers
        if not sliding:
            return
    elif architecture != "MistralForCausalLM":
        return
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, int):
        raise ValueError(f"sliding_window={window!r}: must be an integer or null; fix config.json")
    if window < max_position_embeddings:
        raise ValueError(
            f"sliding_window={window}: sliding-window attention is not supported and the window is "
            f"smaller than max_position_embeddings={max_position_embeddings}; use a checkpoint with "
            f"sliding_window null or >= max_position_embeddings")


def load_model_config(path: str | os.PathLike[str]) -> ModelConfig:
    """Read ``path``/config.json (and generation_config.json for extra EOS ids)."""
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"model={str(path)!r}: not a directory; pass a local Hugging Face "
                         "checkpoint directory (config.json, *.safetensors, tokenizer.json)")
    config_file = root / "config.json"
    if not config_file.is_file():
        raise ValueError(f"model={str(path)!r}: no config.json in the directory; pass a Hugging Face "
                         "checkpoint directory that contains config.json")
    gen_file = root / "generation_config.json"
    generation = read_json(gen_file) if gen_file.is_file() else None
    return parse_model_config(read_json(config_file), generation, str(config_file))


def parse_model_config(cfg: dict[str, Any], generation_config: dict[str, Any] | None = None,
                       source: str = "config.json") -> ModelConfig:
    """A ``ModelConfig`` from config.json's (and generation_config.json's) contents."""

    archs = cfg.get("architectures")
    if archs is None:
        by_type = {model_type: arch for arch, (model_type, *_) in _ARCHITECTURES.items()}
        if cfg.get("model_type") not in by_type:
            raise ValueError(f"architectures=None, model_type={cfg.get('model_type')!r}: cannot tell "
                             f"the architecture; set architectures to one of "
                             f"{', '.join(SUPPORTED_ARCHITECTURES)} in config.json")
        archs = [by_type[cfg["model_type"]]]
    if not isinstance(archs, list) or not archs or archs[0] not in _ARCHITECTURES:
        raise ValueError(f"architectures={archs!r}: unsupported architecture; use a checkpoint of "
                         f"one of {', '.join(SUPPORTED_ARCHITECTURES)}")
    arch: str = archs[0]
    model_type, default_head_dim, default_kv_heads, default_max_pos = _ARCHITECTURES[arch]

    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads"):
        if key not in cfg:
            raise ValueError(f"{key}: missing from {source}; the config is incomplete, "
                             "re-download or fix it")
        _positive_int(key, cfg[key])
    hidden_act = cfg.get("hidden_act", "silu")
    if hidden_act != "silu":
        raise ValueError(f"hidden_act={hidden_act!r}: unsupported activation; the Llama family "
                         "uses silu")
    if cfg.get("mlp_bias", False):
        raise ValueError("mlp_bias=True: MLP biases are not supported; use a checkpoint without them")

    heads = cfg["num_attention_heads"]
    # Like transformers: an absent key takes the class default, an explicit null
    # means multi-head attention.
    kv_heads = cfg.get("num_key_value_heads", default_kv_heads)
    if kv_heads is None:
        kv_heads = heads
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        if default_head_dim is not None:
            head_dim = default_head_dim
        elif cfg["hidden_size"] % heads == 0:
            head_dim = cfg["hidden_size"] // heads
        else:
            raise ValueError(f"hidden_size={cfg['hidden_size']!r}: not divisible by "
                             f"num_attention_heads={heads!r} and head_dim is not set; fix config.json")
    max_pos = _positive_int("max_position_embeddings",
                            cfg.get("max_position_embeddings", default_max_pos))
    rope_theta, rope_scaling = _rope(cfg, max_pos)
    _check_sliding_window(cfg, arch, cfg["num_hidden_layers"], max_pos)

    if arch == "Qwen2ForCausalLM":
        qkv_bias, o_bias = True, False
    elif arch == "MistralForCausalLM":
        qkv_bias = o_bias = False
    else:
        qkv_bias = o_bias = bool(cfg.get("attention_bias", False))

    eos = _token_ids("eos_token_id", cfg.get("eos_token_id"))
    bos = cfg.get("bos_token_id")
    if generation_config is not None:
        eos += [t for t in _token_ids("generation_config.eos_token_id",
                                      generation_config.get("eos_token_id")) if t not in eos]
        if bos is None:
            bos = generation_config.get("bos_token_id")
    if bos is not None and (isinstance(bos, bool) or not isinstance(bos, int)):
        raise ValueError(f"bos_token_id={bos!r}: must be a token id or null; fix config.json")
    dtype = cfg.get("torch_dtype", cfg.get("dtype"))

    return ModelConfig(
        architecture=arch,
        model_type=str(cfg.get("model_type", model_type)),
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=_number("rms_norm_eps", cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=qkv_bias,
        qk_norm=arch == "Qwen3ForCausalLM",
        eos_token_ids=tuple(eos),
        bos_token_id=bos,
        torch_dtype=dtype if isinstance(dtype, str) else None,
        o_proj_bias=o_bias,
    )
