"""The one config.json reader (kvsched.hf_config): the simulator's ModelSpec and
the engine's ModelConfig read the same fields from the same file.

Expected values are written out from the configs (and transformers' class
defaults: Qwen3's head_dim 128, Mistral's 8 KV heads), not computed."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvsched.hf_config import HFConfig, ModelShape, language_model_config, read_llama_family, read_rope
from kvsched.model.config import load_model_config as load_engine_config
from kvsched.perf.model_parsers import load_model_spec as load_sim_spec
from kvsched.perf.models import ModelSpec

BASE = {"vocab_size": 1000, "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
        "num_attention_heads": 8}

# name -> (config.json, expected shared fields:
# (num_kv_heads, head_dim, max_position_embeddings, tie, qkv bias, o bias, qk_norm))
DENSE: dict[str, tuple[dict[str, Any], tuple[int, int, int, bool, bool, bool, bool]]] = {
    "llama": ({"architectures": ["LlamaForCausalLM"], "model_type": "llama", **BASE,
               "num_key_value_heads": 2, "max_position_embeddings": 8192, "tie_word_embeddings": True,
               "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
              (2, 64, 8192, True, False, False, False)),
    "llama-bias-defaults": ({"architectures": ["LlamaForCausalLM"], "model_type": "llama", **BASE,
                             "attention_bias": True},
                            (8, 64, 2048, False, True, True, False)),
    "llama-null-kv-heads": ({"architectures": ["LlamaForCausalLM"], "model_type": "llama", **BASE,
                             "num_key_value_heads": None, "max_position_embeddings": 4096},
                            (8, 64, 4096, False, False, False, False)),
    "qwen2": ({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **BASE,
               "num_key_value_heads": 4, "max_position_embeddings": 32768, "use_sliding_window": False,
               "sliding_window": 4096, "max_window_layers": 2},
              (4, 64, 32768, False, True, False, False)),
    "qwen3-defaults": ({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", **BASE,
                        "num_key_value_heads": 4},
                       (4, 128, 32768, False, False, False, True)),
    "qwen3-transformers5": ({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", **BASE,
                             "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 40960,
                             "tie_word_embeddings": True,
                             "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
                            (2, 32, 40960, True, False, False, True)),
    "mistral-defaults": ({"architectures": ["MistralForCausalLM"], "model_type": "mistral", **BASE,
                          "sliding_window": None},
                         (8, 64, 131072, False, False, False, False)),
}


def _write(tmp_path: Path, name: str, config: dict[str, Any]) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


def _shared(spec: ModelSpec) -> tuple[int, int, int, bool, bool, bool, bool]:
    return (spec.num_kv_heads, spec.head_dim, spec.max_position_embeddings, spec.tie_word_embeddings,
            spec.attention_bias, spec.attention_out_bias, spec.qk_norm)


@pytest.mark.parametrize("name", sorted(DENSE))
def test_simulator_and_engine_read_the_same_model(tmp_path: Path, name: str) -> None:
    config, expected = DENSE[name]
    directory = _write(tmp_path, name, config)
    spec = load_sim_spec(directory)
    engine = load_engine_config(directory)
    assert _shared(spec) == expected
    assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.intermediate_size, spec.vocab_size) \
        == (512, 4, 8, 1024, 1000)
    # One declared shape (ModelShape): both consumers hold the same value in every field of it.
    names = [f.name for f in dataclasses.fields(ModelShape)]
    assert len(names) > 15 and [getattr(engine, n) for n in names] == [getattr(spec, n) for n in names]
    assert spec.num_sliding_layers == 0 and not spec.is_moe


# name -> (config.json, (num_kv_heads, head_dim, experts, experts_per_token, moe size, dense layers,
# dense intermediate_size, qk_norm)); the engine runs dense models only.
MOE: dict[str, tuple[dict[str, Any], tuple[int, int, int, int, int, int, int, bool]]] = {
    "mixtral": ({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", **BASE,
                 "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2},
                (8, 64, 8, 2, 1024, 0, 0, False)),
    "qwen3_moe": ({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", **BASE,
                   "head_dim": 128, "num_key_value_heads": 4, "num_experts": 16, "num_experts_per_tok": 4,
                   "moe_intermediate_size": 256, "mlp_only_layers": [0]},
                  (4, 128, 16, 4, 256, 1, 1024, True)),
}


@pytest.mark.parametrize("name", sorted(MOE))
def test_moe_configs_read_for_the_simulator_and_refused_by_the_engine(tmp_path: Path, name: str) -> None:
    config, expected = MOE[name]
    directory = _write(tmp_path, name, config)
    spec = load_sim_spec(directory)
    assert (spec.num_kv_heads, spec.head_dim, spec.num_experts, spec.experts_per_token,
            spec.moe_intermediate_size, spec.first_k_dense_layers, spec.intermediate_size,
            spec.qk_norm) == expected
    fields = read_llama_family(HFConfig(config), config["model_type"])
    assert (fields.num_kv_heads, fields.head_dim, fields.num_experts) == expected[:3]
    with pytest.raises(ValueError, match=rf"architectures=\['{config['architectures'][0]}'\]: "
                                         "unsupported architecture"):
        load_engine_config(directory)


def test_sliding_window_is_read_once_and_judged_by_each_consumer(tmp_path: Path) -> None:
    # Qwen2 with the window on for layers >= 2 of 4: two sliding layers of 1024.
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **BASE,
              "num_key_value_heads": 4, "max_position_embeddings": 32768, "use_sliding_window": True,
              "sliding_window": 1024,
              "max_window_layers": 2}
    fields = read_llama_family(HFConfig(config), "qwen2")
    assert (fields.sliding_window, fields.num_sliding_layers) == (1024, 2)
    directory = _write(tmp_path, "qwen2-sliding", config)
    spec = load_sim_spec(directory)
    assert (spec.sliding_window, spec.num_sliding_layers) == (1024, 2)
    with pytest.raises(ValueError, match=r"sliding_window=1024: a window on 2 of 4 layers "
                                         r"\(use_sliding_window with max_window_layers\) is not supported"):
        load_engine_config(directory)


def test_phi3_reads_as_llama_for_the_simulator_and_stays_refused_by_the_engine(tmp_path: Path) -> None:
    # Phi3Config's defaults: KV heads = heads (absent key), every layer slides when a window is set.
    config = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", **BASE, "sliding_window": 2047,
              "max_position_embeddings": 4096}
    config.pop("num_key_value_heads", None)
    fields = read_llama_family(HFConfig(config), "phi3")
    assert (fields.num_kv_heads, fields.attention_bias, fields.attention_out_bias) == (
        config["num_attention_heads"], False, False)
    assert (fields.sliding_window, fields.num_sliding_layers) == (2047, config["num_hidden_layers"])
    directory = _write(tmp_path, "phi3", config)
    assert load_sim_spec(directory).num_sliding_layers == config["num_hidden_layers"]
    with pytest.raises(ValueError, match=r"architectures=\['Phi3ForCausalLM'\]: unsupported architecture"):
        load_engine_config(directory)


def test_a_multimodal_wrapper_is_read_through_its_text_config() -> None:
    text = {"hidden_size": 64, "num_hidden_layers": 2}
    assert language_model_config({"model_type": "gemma3", "text_config": text}) == (text, "gemma3_text")
    named = {"model_type": "gemma3", "text_config": {**text, "model_type": "x"}}
    assert language_model_config(named)[1] == "x"
    plain = {"model_type": "llama", "text_config": text}   # only the listed wrappers are unwrapped
    assert language_model_config(plain) == (plain, "llama")


@pytest.mark.parametrize(("config", "expected"), [
    ({}, ("rope_scaling", 10000.0, "default")),
    ({"rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2.0}},
     ("rope_scaling", 500000.0, "linear")),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 8.0e5, "factor": 8.0}},
     ("rope_parameters", 800000.0, "llama3")),
])
def test_rope_spellings_of_transformers_4_and_5(config: dict[str, Any],
                                                 expected: tuple[str, float, str]) -> None:
    rope = read_rope(HFConfig(config))
    assert (rope.where, rope.rope_theta, rope.rope_type) == expected


def test_reader_names_file_and_field() -> None:
    cfg = HFConfig({"model_type": "llama", **BASE, "hidden_size": 100}, "/x/config.json")
    with pytest.raises(ValueError, match=r"/x/config\.json: hidden_size=100: not divisible by "
                                         r"num_attention_heads=8"):
        read_llama_family(cfg, "llama")
    cfg = HFConfig({"model_type": "llama", **BASE, "num_attention_heads": 0}, "/x/config.json")
    with pytest.raises(ValueError, match=r"num_attention_heads=0: must be a positive integer"):
        read_llama_family(cfg, "llama")


def test_reader_and_defaults_import_without_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None; import kvsched.hf_config, kvsched.scheduler_defaults, "
            "kvsched.perf.models, kvsched.perf.model_catalog, kvsched.validation.published, "
            "kvsched.sim.deployment, kvsched.model.config")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
