"""Model catalog: parameter counts and KV bytes match /work/shared/facts/models.md §4;
lookups; config.json reading reproduces the catalog; bad configs name the field."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from kvsched.perf import MODELS, SUPPORTED_MODEL_TYPES, ModelSpec, get_model, load_model_spec

# models.md §4: total params (B), active params/token (B), KV bytes/token BF16 (full-attention layers).
TABLE: dict[str, tuple[float, float, int]] = {
    "meta-llama/Llama-3.1-8B": (8.030, 8.030, 131_072),
    "meta-llama/Llama-3.1-70B": (70.554, 70.554, 327_680),
    "meta-llama/Llama-3.1-405B": (405.853, 405.853, 516_096),
    "meta-llama/Llama-3.2-1B": (1.236, 1.236, 32_768),
    "Qwen/Qwen2.5-7B": (7.616, 7.616, 57_344),
    "Qwen/Qwen3-0.6B": (0.596, 0.596, 114_688),
    "Qwen/Qwen3-8B": (8.191, 8.191, 147_456),
    "Qwen/Qwen3-32B": (32.762, 32.762, 262_144),
    "Qwen/Qwen3-30B-A3B": (30.532, 3.353, 98_304),
    "Qwen/Qwen3-235B-A22B": (235.094, 22.191, 192_512),
    "mistralai/Mixtral-8x7B-v0.1": (46.703, 12.880, 131_072),
    # main model, MTP layer excluded
    "deepseek-ai/DeepSeek-V3": (671.03, 37.55, 70_272),
    "deepseek-ai/DeepSeek-V3.1": (671.03, 37.55, 70_272),
    "deepseek-ai/DeepSeek-R1": (671.03, 37.55, 70_272),
    # active includes the input embedding (models.md's count); "effective" KV = full layers only
    "openai/gpt-oss-120b": (116.829, 5.712, 36_864),
    "openai/gpt-oss-20b": (20.915, 4.187, 24_576),
}


def test_catalog_has_exactly_the_listed_models() -> None:
    assert set(MODELS) == {*TABLE, "meta-llama/Llama-2-70b-hf", "bigscience/bloom",
                           "MiniMaxAI/MiniMax-M2.5", "moonshotai/Kimi-K2.5"}
    for name, spec in MODELS.items():
        assert spec.name == name


@pytest.mark.parametrize("name", sorted(TABLE))
def test_derived_sizes_match_models_md(name: str) -> None:
    spec = MODELS[name]
    total, active, kv = TABLE[name]
    assert spec.num_params() / 1e9 == pytest.approx(total, rel=2e-3)
    assert spec.active_params_per_token() / 1e9 == pytest.approx(active, rel=2e-3)
    assert spec.kv_bytes_per_token() == kv
    # the table's figures are rounded to their last digit; we are well inside that, not just 0.2%
    assert spec.num_params() / 1e9 == pytest.approx(total, abs=0.0051)
    assert spec.active_params_per_token() / 1e9 == pytest.approx(active, abs=0.0051)


def test_splitwise_models_match_their_approximate_sizes() -> None:
    assert MODELS["meta-llama/Llama-2-70b-hf"].num_params() / 1e9 == pytest.approx(69, rel=0.01)
    bloom = MODELS["bigscience/bloom"]
    assert bloom.num_params() / 1e9 == pytest.approx(176, rel=0.01)   # only adds up with tied embeddings
    assert bloom.kv_bytes_per_token() == 2 * 70 * 112 * 128 * 2           # MHA


def test_bf16_weight_bytes_column() -> None:
    # models.md: BF16 weights GB = 2 x params
    assert 2 * MODELS["deepseek-ai/DeepSeek-V3"].num_params() / 1e9 == pytest.approx(1342.05, abs=0.01)
    assert 2 * MODELS["meta-llama/Llama-3.1-405B"].num_params() / 2**30 == pytest.approx(755.96, abs=0.01)


def test_gpt_oss_sliding_window_and_published_active() -> None:
    big, small = get_model("gpt-oss-120b"), get_model("gpt-oss-20b")
    assert (big.sliding_window, big.num_sliding_layers, small.num_sliding_layers) == (128, 18, 12)
    # "formula" KV (all layers) vs the effective per-token growth
    assert big.num_layers * big.kv_bytes_per_layer_per_token() == 73_728
    assert small.num_layers * small.kv_bytes_per_layer_per_token() == 49_152
    assert big.sliding_kv_bytes_per_seq() / 1e6 == pytest.approx(4.72, abs=0.005)
    assert small.sliding_kv_bytes_per_seq() / 1e6 == pytest.approx(3.15, abs=0.005)
    assert big.kv_bytes_for_tokens(100) == 36 * 100 * 2048
    assert big.kv_bytes_for_tokens(1000) == (18 * 1000 + 18 * 128) * 2048
    # OpenAI's published "active" excludes the input embedding table
    for spec, published in ((big, 5.133), (small, 3.608)):
        excl = spec.active_params_per_token() - spec.embedding_params()
        assert excl / 1e9 == pytest.approx(published, abs=0.0051)


def test_building_blocks() -> None:
    llama = get_model("Llama-3.1-8B")
    assert llama.attn_linear_params_per_layer() == 2 * 4096 * 4096 + 2 * 4096 * 1024
    assert llama.dense_mlp_params_per_layer() == 3 * 4096 * 14336
    assert (llama.expert_params(), llama.router_params_per_layer(), llama.num_moe_layers) == (0, 0, 0)
    assert llama.num_dense_layers == 32 and not llama.is_moe and not llama.is_mla
    assert llama.lm_head_params() == llama.lm_head_matmul_params() == 128256 * 4096

    tied = get_model("Qwen3-0.6B")
    assert tied.lm_head_params() == 0                        # tied: no extra weights...
    assert tied.lm_head_matmul_params() == 151936 * 1024     # ...but the matmul still runs

    ds = get_model("DeepSeek-V3")
    assert ds.is_moe and ds.is_mla
    assert (ds.num_dense_layers, ds.num_moe_layers) == (3, 58)
    assert ds.expert_params() == 3 * 7168 * 2048
    assert ds.shared_expert_params() == 3 * 7168 * 2048
    assert ds.router_params_per_layer() == 256 * 7168 + 256
    assert ds.dense_mlp_params_per_layer() == 3 * 7168 * 18432
    assert ds.attn_linear_params_per_layer() == (
        7168 * 1536 + 1536 * 128 * 192          # q down / up
        + 7168 * 576 + 512 * 128 * (128 + 128)  # kv down (latent + rope key) / up (k nope + v)
        + 128 * 128 * 7168)                     # o
    assert ds.kv_bytes_per_token() == 61 * 576 * 2
    assert ds.kv_bytes_per_token(kv_dtype_bytes=1) == 61 * 576

    mixtral = get_model("Mixtral-8x7B")
    assert mixtral.expert_params() == 3 * 4096 * 14336 and mixtral.intermediate_size == 0
    assert mixtral.kv_bytes_per_token(1) == 65_536


@pytest.mark.parametrize(("name", "full"), [
    ("Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
    ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
    ("llama-3.1-8b", "meta-llama/Llama-3.1-8B"),
    ("META-LLAMA/LLAMA-3.1-8B", "meta-llama/Llama-3.1-8B"),
    ("Meta-Llama-3.1-70B", "meta-llama/Llama-3.1-70B"),
    ("Mixtral-8x7B", "mistralai/Mixtral-8x7B-v0.1"),
    ("mixtral-8x7b-v0.1", "mistralai/Mixtral-8x7B-v0.1"),
    ("BLOOM-176B", "bigscience/bloom"),
    ("bloom", "bigscience/bloom"),
    ("Llama-2-70b", "meta-llama/Llama-2-70b-hf"),
    ("deepseek-r1", "deepseek-ai/DeepSeek-R1"),
    ("Qwen3-235B-A22B", "Qwen/Qwen3-235B-A22B"),
    ("openai/gpt-oss-20b", "openai/gpt-oss-20b"),
])
def test_lookups(name: str, full: str) -> None:
    assert get_model(name) is MODELS[full]


def test_unknown_model_lists_the_catalog() -> None:
    with pytest.raises(ValueError) as info:
        get_model("Llama-9-1T")
    assert "'Llama-9-1T'" in str(info.value) and "meta-llama/Llama-3.1-8B" in str(info.value)


# -- config.json ------------------------------------------------------------------
# Written from models.md's numbers, with the field names Hugging Face uses.

CONFIGS: dict[str, dict[str, Any]] = {
    "meta-llama/Llama-3.1-8B": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
        "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "head_dim": 128,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0},
    },
    "meta-llama/Llama-3.2-1B": {
        "model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192, "vocab_size": 128256,
        "max_position_embeddings": 131072, "tie_word_embeddings": True,
    },
    "Qwen/Qwen2.5-7B": {
        "model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
        "max_position_embeddings": 131072, "tie_word_embeddings": False,
        "use_sliding_window": False, "sliding_window": 131072, "max_window_layers": 28,
    },
    "Qwen/Qwen3-8B": {
        "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
        "max_position_embeddings": 40960, "tie_word_embeddings": False, "attention_bias": False,
        "use_sliding_window": False, "sliding_window": None, "layer_types": ["full_attention"] * 36,
    },
    "Qwen/Qwen3-30B-A3B": {
        "model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
        "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "vocab_size": 151936,
        "max_position_embeddings": 40960, "tie_word_embeddings": False, "num_experts": 128,
        "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "norm_topk_prob": True,
    },
    "mistralai/Mixtral-8x7B-v0.1": {
        "model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
        "max_position_embeddings": 32768, "tie_word_embeddings": False, "num_local_experts": 8,
        "num_experts_per_tok": 2, "sliding_window": None,
    },
    "deepseek-ai/DeepSeek-V3": {
        "model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
        "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
        "vocab_size": 129280, "max_position_embeddings": 163840, "tie_word_embeddings": False,
        "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
        "n_shared_experts": 1, "first_k_dense_replace": 3, "moe_layer_freq": 1, "q_lora_rank": 1536,
        "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
        "num_nextn_predict_layers": 1,
    },
    "openai/gpt-oss-120b": {
        "model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "vocab_size": 201088,
        "max_position_embeddings": 131072, "tie_word_embeddings": False, "num_local_experts": 128,
        "num_experts_per_tok": 4, "experts_per_token": 4, "attention_bias": True, "sliding_window": 128,
        "swiglu_limit": 7.0,
        "layer_types": ["sliding_attention", "full_attention"] * 18,
    },
    "openai/gpt-oss-20b": {  # no layer_types: the default alternation must give 12 + 12
        "model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "vocab_size": 201088,
        "max_position_embeddings": 131072, "num_local_experts": 32, "experts_per_token": 4,
        "sliding_window": 128,
    },
    "bigscience/bloom": {  # BLOOM's own names; no max_position_embeddings (ALiBi)
        "model_type": "bloom", "n_embed": 14336, "n_layer": 70, "num_attention_heads": 112,
        "vocab_size": 250880, "layer_norm_epsilon": 1e-5,
    },
}


def _model_dir(root: Path, config: dict[str, Any], dirname: str = "model") -> Path:
    directory = root / dirname
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_json_reproduces_the_catalog(tmp_path: Path, name: str) -> None:
    directory = _model_dir(tmp_path, CONFIGS[name], name.split("/")[1])
    spec = get_model(str(directory))
    assert spec.name == name.split("/")[1]                  # plain directory: its name
    assert dataclasses.replace(spec, name=name) == MODELS[name]


def test_config_json_file_and_hf_cache_layout(tmp_path: Path) -> None:
    snapshot = _model_dir(tmp_path, CONFIGS["meta-llama/Llama-3.1-8B"],
                          "hub/models--meta-llama--Llama-3.1-8B/snapshots/0123abc")
    assert get_model(str(snapshot)) == MODELS["meta-llama/Llama-3.1-8B"]
    assert get_model(str(snapshot / "config.json")) == MODELS["meta-llama/Llama-3.1-8B"]
    assert load_model_spec(snapshot) == MODELS["meta-llama/Llama-3.1-8B"]


def test_deepseek_v2_fields(tmp_path: Path) -> None:
    # Parsing check with made-up small dims: no q LoRA (q_lora_rank null), 2 shared experts,
    # MoE every other layer after the first, greedy routing (no score-correction bias).
    config = {
        "model_type": "deepseek_v2", "hidden_size": 256, "num_hidden_layers": 5, "num_attention_heads": 4,
        "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
        "n_shared_experts": 2, "first_k_dense_replace": 1, "moe_layer_freq": 2, "q_lora_rank": None,
        "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "topk_method": "greedy",
    }
    spec = get_model(str(_model_dir(tmp_path, config)))
    assert (spec.q_lora_rank, spec.head_dim, spec.router_bias) == (0, 24, False)
    assert (spec.num_moe_layers, spec.num_dense_layers) == (2, 3)    # layers 2 and 4 are MoE
    assert spec.shared_expert_params() == 2 * 3 * 256 * 64
    assert spec.attn_linear_params_per_layer() == (256 * 4 * 24 + 256 * 40 + 32 * 4 * 32 + 4 * 16 * 256)
    assert spec.kv_bytes_per_token() == 5 * 40 * 2


def test_qwen3_moe_dense_layers_and_mistral_window(tmp_path: Path) -> None:
    config = dict(CONFIGS["Qwen/Qwen3-30B-A3B"], mlp_only_layers=[0, 47])
    spec = get_model(str(_model_dir(tmp_path, config, "a")))
    assert (spec.num_dense_layers, spec.num_moe_layers, spec.intermediate_size) == (2, 46, 6144)

    mistral = {"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32,
               "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
               "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096}
    spec = get_model(str(_model_dir(tmp_path, mistral, "b")))
    assert (spec.sliding_window, spec.num_sliding_layers, spec.kv_bytes_per_token()) == (4096, 32, 0)
    assert spec.kv_bytes_for_tokens(10_000) == 32 * 4096 * 2 * 8 * 128 * 2


def _without(config: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != key}


@pytest.mark.parametrize(("config", "needles"), [
    ({"model_type": "gpt2", "n_embd": 768}, ("model_type='gpt2'", "not supported", "llama", "deepseek_v3")),
    (_without(CONFIGS["meta-llama/Llama-3.1-8B"], "model_type"), ("missing required field 'model_type'",)),
    (_without(CONFIGS["meta-llama/Llama-3.1-8B"], "hidden_size"), ("missing required field 'hidden_size'",)),
    (_without(CONFIGS["deepseek-ai/DeepSeek-V3"], "kv_lora_rank"), ("'kv_lora_rank'",)),
    (_without(CONFIGS["Qwen/Qwen3-30B-A3B"], "num_experts"), ("'num_experts'",)),
    (_without(CONFIGS["bigscience/bloom"], "n_embed"), ("'hidden_size'", "'n_embed'")),
    (_without(CONFIGS["openai/gpt-oss-20b"], "experts_per_token"), ("'num_experts_per_tok'",)),
    (dict(CONFIGS["meta-llama/Llama-3.1-8B"], num_hidden_layers="32"), ("num_hidden_layers='32'", "integer")),
    (dict(CONFIGS["meta-llama/Llama-3.1-8B"], tie_word_embeddings="no"), ("tie_word_embeddings='no'",)),
    (dict(CONFIGS["meta-llama/Llama-3.1-8B"], num_key_value_heads=0), ("num_key_value_heads=0",)),
    (dict(CONFIGS["Qwen/Qwen3-30B-A3B"], num_experts_per_tok=200), ("experts_per_token=200",)),
    (dict(CONFIGS["openai/gpt-oss-120b"], layer_types=["full_attention"]), ("layer_types",)),
    ([1, 2, 3], ("top level must be a JSON object",)),
])
def test_bad_configs_name_file_and_field(tmp_path: Path, config: object, needles: tuple[str, ...]) -> None:
    directory = tmp_path / "bad"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ValueError) as info:
        get_model(str(directory))
    message = str(info.value)
    assert str(directory / "config.json") in message, message
    for needle in needles:
        assert needle in message, message


def test_unreadable_configs(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no such file"):
        get_model(str(empty))
    broken = tmp_path / "config.json"
    broken.write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid JSON"):
        get_model(str(broken))


def test_supported_model_types() -> None:
    assert set(SUPPORTED_MODEL_TYPES) == {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral",
                                          "deepseek_v2", "deepseek_v3", "gpt_oss", "bloom",
                                          # issue 23
                                          "phi3", "gemma2", "gemma3_text", "glm4", "glm4_moe", "kimi_k2",
                                          "chatglm",
                                          # issue 37: vision-language models' language models
                                          "qwen2_5_vl", "qwen2_5_vl_text", "qwen3_vl_text",
                                          "qwen3_vl_moe_text",
                                          # issue 37: hybrid models whose KV cache is planned as vLLM's
                                          "llama4_text", "deepseek_v32", "qwen3_next",
                                          # Nemotron-H (Mamba-2) and Qwen3.5's language models
                                          "nemotron_h", "qwen3_5_text", "qwen3_5_moe_text",
                                          # GLM-5: DeepSeek Sparse Attention under its own config
                                          "glm_moe_dsa"}


# -- spec validation ---------------------------------------------------------------

@pytest.mark.parametrize(("changes", "field"), [
    ({"experts_per_token": 9}, "experts_per_token=9"),
    ({"intermediate_size": 14336}, "intermediate_size=14336"),   # unused on an all-MoE model
    ({"mlp_kind": "relu"}, "mlp_kind='relu'"),
    ({"num_sliding_layers": 4}, "sliding_window=0"),
    ({"hidden_size": -1}, "hidden_size=-1"),
    ({"tie_word_embeddings": 1}, "tie_word_embeddings=1"),
])
def test_spec_validation_names_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field.replace("(", r"\(")):
        dataclasses.replace(get_model("Mixtral-8x7B"), **changes)


def test_spec_is_frozen_and_slotted() -> None:
    spec: ModelSpec = get_model("Qwen3-8B")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.num_layers = 1  # type: ignore[misc]
    assert not hasattr(spec, "__dict__")


def test_fine_tuned_and_quantized_checkpoints_resolve_to_their_catalog_base() -> None:
    from kvsched.perf.checkpoint_format import CheckpointFormat
    from kvsched.perf.model_catalog import catalog_match

    assert catalog_match("meta-llama/Llama-3.1-8B-Instruct") == ("meta-llama/Llama-3.1-8B", None)
    assert catalog_match("Meta-Llama-3.1-70B-Instruct") == ("meta-llama/Llama-3.1-70B", None)
    # Qwen's FP8 checkpoints: 128 x 128 blocks (weight_block_size), 16-bit KV.
    assert catalog_match("Qwen/Qwen3-235B-A22B-FP8") == ("Qwen/Qwen3-235B-A22B",
                                                         CheckpointFormat("fp8_block"))
    # NVIDIA's ModelOpt FP8: per-tensor weights and kv_cache_quant_algo FP8.
    assert catalog_match("nvidia/Llama-3.1-8B-Instruct-FP8") == ("meta-llama/Llama-3.1-8B",
                                                                 CheckpointFormat("fp8", "fp8"))
    assert catalog_match("someone/Llama-3.1-8B-Instruct-FP16") is None
    assert get_model("meta-llama/Llama-3.1-8B-Instruct").name == "meta-llama/Llama-3.1-8B"


@pytest.mark.parametrize(("name", "tp", "expected"), [
    # 4 KV heads of 128 over 8 ranks: replicated, one per rank; K and V, 2 bytes.
    ("Qwen/Qwen3-235B-A22B", 8, 2 * 1 * 128 * 2),
    ("Qwen/Qwen3-235B-A22B", 2, 2 * 2 * 128 * 2),
    ("Llama-3.1-70B", 4, 2 * 2 * 128 * 2),        # 8 KV heads over 4 ranks
    ("Llama-3.1-70B", 1, 2 * 8 * 128 * 2),
    # MLA: the 512 + 64 latent, replicated on every rank.
    ("deepseek-ai/DeepSeek-V3", 1, (512 + 64) * 2),
    ("deepseek-ai/DeepSeek-V3", 8, (512 + 64) * 2),
])
def test_kv_bytes_per_layer_per_rank(name: str, tp: int, expected: int) -> None:
    assert get_model(name).kv_bytes_per_layer_per_rank(2, tp) == expected
    assert get_model(name).kv_bytes_per_layer_per_rank(1, tp) == expected / 2  # an FP8 cache


def test_the_step_time_and_the_memory_plan_read_the_same_kv_bytes() -> None:
    from kvsched.perf import get_hardware
    from kvsched.perf.memory import plan_memory
    from kvsched.perf.step_time import ParallelConfig, RuntimeConfig, StepTimeModel

    qwen, h200 = get_model("Qwen/Qwen3-235B-A22B"), get_hardware("h200")
    runtime = RuntimeConfig(dtype="fp8_block")
    assert StepTimeModel(qwen, h200, ParallelConfig(8), runtime).kv_bytes_per_layer == 512
    plan = plan_memory(qwen, h200, ParallelConfig(8), runtime, 16, 0.9, 8192, 256)
    assert plan.bytes_per_block == 16 * 94 * 512


@pytest.mark.parametrize(("name", "tp", "match"), [
    ("Llama-3.1-8B", 3, r"tensor_parallel_size=3 \(--tensor-parallel-size\): must divide the 32 attention "
                        r"heads of meta-llama/Llama-3.1-8B; use one of 1, 2, 4, 8, 16, 32$"),
    # 48 query heads, 8 KV heads: 12 divides the query heads but splits the KV
    # heads unevenly (vLLM refuses it at start-up).
    ("MiniMaxAI/MiniMax-M2.5", 12, r"tensor_parallel_size=12 .*must divide the 8 KV heads of "
                                   r"MiniMaxAI/MiniMax-M2.5 or be a multiple of them.*"
                                   r"use one of 1, 2, 4, 8, 16, 24, 48$"),
])
def test_tensor_parallel_sizes_the_heads_refuse(name: str, tp: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        get_model(name).check_tensor_parallel_size(tp)


@pytest.mark.parametrize(("name", "tp"), [
    ("Llama-3.1-8B", 8), ("Llama-3.1-8B", 32),          # 8 KV heads: split, then replicated 4 times
    ("Qwen/Qwen3-235B-A22B", 8),                        # 4 KV heads, each on 2 ranks
    ("deepseek-ai/DeepSeek-V3", 64),                    # MLA: query heads only
])
def test_tensor_parallel_sizes_the_heads_take(name: str, tp: int) -> None:
    get_model(name).check_tensor_parallel_size(tp)
    assert get_model(name).splits_over(tp)
