"""config.json parsing: transformers' defaults, rope scaling, sliding windows, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvsched.model.config import ModelConfig, load_model_config, parse_model_config

ARCHS = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
         "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def _minimal(model_type: str, **extra: Any) -> dict[str, Any]:
    return {"architectures": [ARCHS[model_type]], "model_type": model_type, "vocab_size": 1000,
            "hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": 3,
            "num_attention_heads": 32, **extra}


def _write(tmp_path: Path, cfg: dict[str, Any], gen: dict[str, Any] | None = None) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    if gen is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    return tmp_path


@pytest.mark.parametrize("model_type", list(ARCHS))
def test_defaults_match_transformers(model_type: str, tmp_path: Path) -> None:
    """Keys a config.json omits take transformers' defaults (Qwen3's head_dim is
    128, not hidden/heads; Mistral's kv heads default to 8, Qwen's to 32)."""
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    path = _write(tmp_path, _minimal(model_type))
    ours = load_model_config(path)
    ref = transformers.AutoConfig.from_pretrained(path)
    assert ours.architecture == ARCHS[model_type] and ours.model_type == model_type
    assert ours.head_dim == (getattr(ref, "head_dim", None) or ref.hidden_size // ref.num_attention_heads)
    assert ours.num_kv_heads == ref.num_key_value_heads
    assert ours.max_position_embeddings == ref.max_position_embeddings
    assert ours.rms_norm_eps == ref.rms_norm_eps
    assert ours.rope_theta == ref.rope_parameters["rope_theta"]
    assert ours.tie_word_embeddings == ref.tie_word_embeddings
    assert ours.rope_scaling is None and ref.rope_parameters["rope_type"] == "default"
    assert ours.attention_bias == (model_type == "qwen2")
    assert ours.attention_out_bias is False
    assert ours.qk_norm == (model_type == "qwen3")


def test_llama31_config(tmp_path: Path) -> None:
    cfg = _minimal("llama", num_key_value_heads=2, rope_theta=500000.0, torch_dtype="bfloat16",
                   max_position_embeddings=131072, bos_token_id=128000,
                   eos_token_id=[128001, 128008, 128009], tie_word_embeddings=True,
                   rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192, "rope_type": "llama3"})
    config = load_model_config(_write(tmp_path, cfg, {"eos_token_id": [128009, 128010]}))
    assert config.rope_theta == 500000.0
    assert config.rope_scaling_dict() == {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}
    assert config.eos_token_ids == (128001, 128008, 128009, 128010)
    assert config.bos_token_id == 128000
    assert config.torch_dtype == "bfloat16"
    assert config.tie_word_embeddings and config.head_dim == 8 and config.num_kv_heads == 2
    hash(config)  # frozen and hashable: rope_scaling is stored as sorted items


def test_llama3_original_max_defaults_to_max_position_embeddings() -> None:
    cfg = _minimal("llama", max_position_embeddings=4096, rope_scaling={
        "rope_type": "llama3", "factor": 2, "low_freq_factor": 1, "high_freq_factor": 4})
    scaling = parse_model_config(cfg).rope_scaling_dict()
    assert scaling is not None and scaling["original_max_position_embeddings"] == 4096


def test_attention_bias_per_architecture() -> None:
    assert parse_model_config(_minimal("llama", attention_bias=True)).attention_out_bias is True
    qwen2 = parse_model_config(_minimal("qwen2", attention_bias=False))
    assert (qwen2.attention_bias, qwen2.attention_out_bias) == (True, False)  # Qwen2 always has qkv bias
    qwen3 = parse_model_config(_minimal("qwen3", head_dim=64, num_key_value_heads=2))
    assert (qwen3.head_dim, qwen3.q_size, qwen3.kv_size) == (64, 2048, 128)


@pytest.mark.parametrize(("changes", "message"), [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     r"rope_scaling\.rope_type='yarn': unsupported RoPE scaling; supported: default, linear, llama3"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}},
     r"rope_scaling\.rope_type='dynamic': unsupported"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                       "high_freq_factor": 1.0}},
     r"rope_scaling\.high_freq_factor=1\.0: must be greater than low_freq_factor=4\.0"),
    ({"rope_scaling": {"rope_type": "linear"}}, r"rope_scaling\.factor=None: must be a number"),
    ({"partial_rotary_factor": 0.5}, r"partial_rotary_factor=0\.5: partial rotary embedding"),
    ({"hidden_act": "gelu"}, r"hidden_act='gelu': unsupported activation"),
    ({"mlp_bias": True}, r"mlp_bias=True: MLP biases are not supported"),
    ({"num_key_value_heads": 3}, r"num_key_value_heads=3: must divide num_attention_heads=32"),
    ({"hidden_size": 100}, r"hidden_size=100: not divisible by num_attention_heads=32"),
    ({"vocab_size": 0}, r"vocab_size=0: must be a positive integer"),
    ({"vocab_size": None}, r"config\.json: missing required field 'vocab_size'"),
    ({"architectures": ["GemmaForCausalLM"]},
     r"architectures=\['GemmaForCausalLM'\]: unsupported architecture; use a checkpoint of one of "
     r"LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"),
])
def test_bad_config_values(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_model_config({**_minimal("llama"), **changes})


def test_missing_key_and_missing_architectures() -> None:
    cfg = _minimal("llama")
    del cfg["intermediate_size"]
    with pytest.raises(ValueError, match=r"config\.json: missing required field 'intermediate_size'"):
        parse_model_config(cfg)
    cfg = _minimal("qwen3")
    del cfg["architectures"]
    assert parse_model_config(cfg).architecture == "Qwen3ForCausalLM"  # from model_type
    cfg["model_type"] = "gpt2"
    with pytest.raises(ValueError, match=r"model_type='gpt2': cannot tell the architecture"):
        parse_model_config(cfg)


def test_sliding_window() -> None:
    # Mistral v0.1: a 4096 window over 32768 positions on every layer.
    config = parse_model_config(_minimal("mistral", sliding_window=4096, max_position_embeddings=32768))
    assert config.layer_sliding_windows == (4096, 4096, 4096)
    assert parse_model_config(_minimal("mistral", sliding_window=None)).layer_sliding_windows == (None,) * 3
    # A window that covers every position is full attention.
    config = parse_model_config(_minimal("mistral", sliding_window=32768, max_position_embeddings=32768))
    assert config.layer_sliding_windows == (None,) * 3
    # Qwen: the window only counts with use_sliding_window and layers >= max_window_layers.
    parse_model_config(_minimal("qwen2", sliding_window=4096, use_sliding_window=False))
    parse_model_config(_minimal("qwen2", sliding_window=4096, use_sliding_window=True,
                                max_window_layers=3))
    with pytest.raises(ValueError, match=r"sliding_window=4096: a window on 2 of 3 layers "
                                         r"\(use_sliding_window with max_window_layers\) is not supported"):
        parse_model_config(_minimal("qwen3", sliding_window=4096, use_sliding_window=True,
                                    max_window_layers=1))


def test_directory_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"model='.*missing': not a directory; pass a local "
                                         r"Hugging Face checkpoint directory"):
        load_model_config(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"no config\.json in the directory"):
        load_model_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json: not valid JSON"):
        load_model_config(tmp_path)


def test_direct_construction_is_validated() -> None:
    with pytest.raises(ValueError, match=r"head_dim=15: rotary embedding needs an even head_dim"):
        ModelConfig(architecture="LlamaForCausalLM", model_type="llama", vocab_size=10,
                    hidden_size=60, intermediate_size=8, num_layers=1, num_heads=4, num_kv_heads=4,
                    head_dim=15, max_position_embeddings=64, tie_word_embeddings=False)


def _gemma3(**extra: Any) -> dict[str, Any]:
    return {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 128,
            "intermediate_size": 256, "num_hidden_layers": 8, "num_attention_heads": 4, **extra}


def _reference_gemma3(tmp_path: Path, cfg: dict[str, Any]) -> Any:
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    return transformers.AutoConfig.from_pretrained(_write(tmp_path, cfg))


@pytest.mark.parametrize("extra", [
    pytest.param({}, id="defaults"),
    # google/gemma-3-4b's text config spelling (transformers 4.x keys).
    pytest.param({"sliding_window": 1024, "sliding_window_pattern": 6, "rope_theta": 1000000.0,
                  "rope_local_base_freq": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                  "query_pre_attn_scalar": 256, "head_dim": 256, "num_key_value_heads": 4,
                  "final_logit_softcapping": None, "attn_logit_softcapping": None,
                  "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072,
                  "vocab_size": 262208}, id="published"),
    pytest.param({"sliding_window": 7, "sliding_window_pattern": 3, "rope_theta": 5e5,
                  "rope_local_base_freq": 2e4, "query_pre_attn_scalar": 48, "final_logit_softcapping": 30.0,
                  "tie_word_embeddings": False, "head_dim": 32}, id="custom"),
    pytest.param({"layer_types": ["full_attention", "sliding_attention"] * 4, "sliding_window": 64},
                 id="layer-types"),
])
def test_gemma3_matches_transformers(tmp_path: Path, extra: dict[str, Any]) -> None:
    """Keys a Gemma 3 config omits take Gemma3TextConfig's defaults; layer
    types, both RoPE bases and scalings, the query scalar and the caps are
    transformers' reading of the same file."""
    ref = _reference_gemma3(tmp_path, _gemma3(**extra))
    ours = load_model_config(tmp_path)
    assert ours.architecture == "Gemma3ForCausalLM" and ours.model_type == "gemma3_text"
    assert list(ours.layer_types) == ref.layer_types
    assert ours.layer_sliding_windows == tuple(ref.sliding_window if t == "sliding_attention" else None
                                               for t in ref.layer_types)
    assert ours.num_sliding_layers == ref.layer_types.count("sliding_attention")
    renamed = {"num_kv_heads": "num_key_value_heads", "hidden_act": "hidden_activation"}
    for name in ("head_dim", "num_kv_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
                 "tie_word_embeddings", "query_pre_attn_scalar", "final_logit_softcapping", "hidden_act"):
        assert getattr(ours, name) == getattr(ref, renamed.get(name, name)), name
    assert ours.attention_scale == ref.query_pre_attn_scalar ** -0.5
    full, local = ref.rope_parameters["full_attention"], ref.rope_parameters["sliding_attention"]
    assert ours.rope_theta == full["rope_theta"] and ours.local_rope_theta == local["rope_theta"]
    assert local["rope_type"] == "default"
    if full["rope_type"] == "default":
        assert ours.rope_scaling is None
    else:
        assert ours.rope_scaling_dict() == {"rope_type": full["rope_type"], "factor": full["factor"]}
    assert ours.qk_norm and not ours.attention_bias


def test_gemma3_reads_the_config_transformers_5_writes(tmp_path: Path) -> None:
    """transformers 5 saves RoPE per layer type (rope_parameters) and the layer types."""
    transformers = pytest.importorskip("transformers")
    ref = transformers.Gemma3TextConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=5, num_attention_heads=4,
        sliding_window=9, rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                              "rope_theta": 4e5},
                                           "sliding_attention": {"rope_type": "default", "rope_theta": 3e3}},
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                     "full_attention"])
    ref.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "rope_parameters" in saved and "rope_local_base_freq" not in saved
    saved["architectures"] = ["Gemma3ForCausalLM"]
    ours = parse_model_config(saved)
    assert ours.layer_sliding_windows == (9, None, 9, 9, None)
    assert (ours.rope_theta, ours.local_rope_theta) == (4e5, 3e3)
    assert ours.rope_scaling_dict() == {"rope_type": "linear", "factor": 2.0}


@pytest.mark.parametrize(("changes", "message"), [
    ({"attn_logit_softcapping": 50.0}, r"attn_logit_softcapping=50\.0: soft-capped attention scores are "
                                       r"not supported .*; set it to null"),
    ({"use_bidirectional_attention": True}, r"use_bidirectional_attention=True: only causal attention"),
    ({"hidden_activation": "gelu"}, r"hidden_activation='gelu': unsupported activation; Gemma 3 uses "
                                    r"gelu_pytorch_tanh"),
    ({"layer_types": ["full_attention"] * 3}, r"layer_types=.*must be a list of 8 strings"),
    ({"sliding_window_pattern": 0}, r"sliding_window_pattern=0: must be a positive integer"),
    ({"sliding_window": 0}, r"sliding_window=0: sliding_attention layers need a positive window"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "linear", "factor": 2.0}}},
     r"rope_parameters\.sliding_attention\.rope_type='linear': only unscaled RoPE"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, r"rope_scaling\.rope_type='yarn': unsupported"),
    ({"final_logit_softcapping": -1.0}, r"final_logit_softcapping=-1\.0: must be a positive number"),
])
def test_gemma3_bad_config_values(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_model_config(_gemma3(**changes))
