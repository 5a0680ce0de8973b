"""Any Hugging Face id resolves to a config.json: the local hub cache (a fake
one here, as huggingface_hub lays it out), aiconfigurator-core's bundled
configs, never the network offline; typos get a did-you-mean; the new
architectures read right; the refused ones say why."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvsched.perf.checkpoint_format import CheckpointFormat, config_checkpoint_format
from kvsched.perf.model_catalog import MODELS, catalog_match, checkpoint_format, get_model
from kvsched.perf.model_parsers import load_model_spec
from kvsched.perf.model_source import bundled_model_ids, find_config, hub_cache_dir, suggestions

CONFIGS = Path(__file__).parent / "data" / "hf_configs"
HAS_BUNDLED = importlib.util.find_spec("aiconfigurator_core") is not None
needs_bundled = pytest.mark.skipif(not HAS_BUNDLED,
                                   reason="aiconfigurator-core (the [measured] extra) absent")
needs_hub = pytest.mark.skipif(importlib.util.find_spec("huggingface_hub") is None,
                               reason="huggingface_hub absent")


def install(cache: Path, model_id: str, config: Path | dict[str, object]) -> Path:
    """Put ``config`` in a hub cache the way huggingface_hub stores a download:
    models--ORG--NAME/snapshots/<rev>/config.json and refs/main naming <rev>."""
    repo = cache / f"models--{model_id.replace('/', '--')}"
    rev = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / rev
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    target = snapshot / "config.json"
    if isinstance(config, Path):
        shutil.copy(config, target)
    else:
        target.write_text(json.dumps(config))
    return target


def fake_hub_cache(cache: Path) -> None:
    for path in sorted(CONFIGS.glob("*.json")):
        install(cache, path.stem.replace("--", "/", 1), path)


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub_cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c"))
    assert hub_cache_dir() == tmp_path / "c"


@needs_hub
def test_a_cached_hub_id_resolves_offline(offline_cache: Path) -> None:
    install(offline_cache, "mistralai/Mistral-7B-Instruct-v0.3",
            CONFIGS / "mistralai--Mistral-7B-Instruct-v0.3.json")
    spec = get_model("mistralai/Mistral-7B-Instruct-v0.3")
    assert spec.name == "mistralai/Mistral-7B-Instruct-v0.3"
    # 32 x (attention 41,943,040 + MLP 176,160,768 + 2 norms of 4096) + 2 x 32768 x 4096 + final norm
    assert spec.num_params() == 32 * (41_943_040 + 176_160_768 + 8192) + 2 * 32768 * 4096 + 4096
    assert spec.num_sliding_layers == 0  # sliding_window null: full attention
    assert find_config("mistralai/Mistral-7B-Instruct-v0.3", MODELS).origin == "hf-cache"


@needs_hub
def test_offline_and_not_cached_is_one_line_naming_the_fix(offline_cache: Path) -> None:
    with pytest.raises(ValueError) as info:
        get_model("acme/NoSuch-7B")
    message = str(info.value)
    assert "\n" not in message
    for needle in ("'acme/NoSuch-7B'", "HF_HUB_OFFLINE", "local directory", str(offline_cache),
                   "huggingface-cli download acme/NoSuch-7B config.json"):
        assert needle in message, message


@needs_hub
@needs_bundled
def test_bundled_configs_answer_offline_and_the_cache_comes_first(offline_cache: Path) -> None:
    assert find_config("mistralai/Mixtral-8x22B-v0.1", MODELS).origin == "bundled"
    spec = get_model("mistralai/Mixtral-8x22B-v0.1")
    assert spec.name == "mistralai/Mixtral-8x22B-v0.1"
    assert (spec.num_layers, spec.num_experts, spec.experts_per_token) == (56, 8, 2)
    assert spec.num_params() / 1e9 == pytest.approx(140.6, abs=0.05)  # Mistral's "141B"
    bundled = json.loads(bundled_model_ids()["mistralai/Mixtral-8x22B-v0.1"].read_text())
    install(offline_cache, "mistralai/Mixtral-8x22B-v0.1", {**bundled, "num_hidden_layers": 2})
    assert get_model("mistralai/Mixtral-8x22B-v0.1").num_layers == 2


@needs_bundled
def test_without_huggingface_hub_the_bundled_configs_still_answer(tmp_path: Path) -> None:
    # A fresh interpreter where huggingface_hub cannot be imported.
    code = ("import sys; sys.modules['huggingface_hub'] = None\n"
            "from kvsched.perf.model_catalog import get_model\n"
            "print(get_model('mistralai/Mixtral-8x22B-v0.1').num_layers)\n"
            "try:\n    get_model('acme/NoSuch-7B')\nexcept ValueError as err:\n    print(err)\n")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    layers, message = out.stdout.strip().split("\n")
    assert layers == "56"
    assert "huggingface_hub is not installed" in message and "pip install 'kvsched[hub]'" in message
    assert "huggingface-cli download acme/NoSuch-7B config.json" in message


def test_typos_get_a_did_you_mean() -> None:
    assert suggestions("Qwen3-8b-instrct", MODELS)[0] == "Qwen/Qwen3-8B"
    assert suggestions("llama-3-8b", MODELS)[0] == "meta-llama/Llama-3.1-8B"
    assert suggestions("gpt-oss-20", MODELS)[0] == "openai/gpt-oss-20b"
    assert suggestions("completely-different", MODELS) == []
    with pytest.raises(ValueError, match=r"did you mean 'Qwen/Qwen3-8B'"):
        get_model("Qwen3-8b-instrct")


def test_importing_the_perf_layer_does_not_import_huggingface_hub() -> None:
    code = "import sys, kvsched.perf, kvsched.perf.model_source; print('huggingface_hub' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- the new architectures, against their model cards -------------------------------

# model id: (published total parameters in B, sliding layers, window, KV bytes/token BF16 over
# full-attention layers). Totals are the model cards' (text model only for Gemma 3).
NEW: dict[str, tuple[float, int, int, int]] = {
    "google/gemma-2-9b-it": (9.24, 21, 4096, 21 * 2 * 8 * 256 * 2),        # every 2nd layer global
    "google/gemma-2-27b-it": (27.2, 23, 4096, 23 * 2 * 16 * 128 * 2),
    "google/gemma-3-27b-it": (27.0, 52, 1024, 10 * 2 * 16 * 128 * 2),      # every 6th layer global
    "microsoft/phi-4": (14.7, 0, 0, 40 * 2 * 10 * 128 * 2),
    "microsoft/Phi-3-mini-128k-instruct": (3.82, 0, 0, 32 * 2 * 32 * 96 * 2),  # window > context
    "microsoft/Phi-3-mini-4k-instruct": (3.82, 32, 2047, 0),               # every layer slides
    "THUDM/glm-4-9b-chat-hf": (9.40, 0, 0, 40 * 2 * 2 * 128 * 2),
    "THUDM/glm-4-9b": (9.40, 0, 0, 40 * 2 * 2 * 128 * 2),                 # chatglm's own names
    "meta-llama/Llama-3.2-3B-Instruct": (3.21, 0, 0, 28 * 2 * 8 * 128 * 2),
    "Qwen/Qwen2.5-72B-Instruct": (72.7, 0, 0, 80 * 2 * 8 * 128 * 2),
}


@pytest.mark.parametrize("model_id", sorted(NEW))
def test_new_architectures_match_their_model_cards(model_id: str) -> None:
    total, sliding, window, kv = NEW[model_id]
    spec = load_model_spec(CONFIGS / f"{model_id.replace('/', '--')}.json", model_id)
    assert spec.num_params() / 1e9 == pytest.approx(total, rel=0.005)
    assert (spec.num_sliding_layers, spec.sliding_window) == (sliding, window)
    assert spec.kv_bytes_per_token(2) == kv


def test_glm45_is_gqa_over_deepseek_style_experts() -> None:
    spec = load_model_spec(CONFIGS / "zai-org--GLM-4.5.json", "zai-org/GLM-4.5")
    assert (spec.num_experts, spec.experts_per_token, spec.num_shared_experts, spec.first_k_dense_layers) == \
        (160, 8, 1, 3)
    assert spec.router_bias and spec.attention_bias and not spec.attention_out_bias and not spec.is_mla
    assert spec.num_mtp_layers == 1
    # Z.ai: 355 B total (with the MTP layer, ~3.9 B), 32 B active (without the embedding, 0.78 B)
    assert spec.num_params() / 1e9 == pytest.approx(355 - 3.9, rel=0.01)
    assert (spec.active_params_per_token() - spec.embedding_params()) / 1e9 == pytest.approx(32.9, rel=0.03)


def test_qwen3_next_reads_its_linear_layers() -> None:
    # config.json: 48 layers, a full-attention layer every 4th (full_attention_interval 4).
    spec = load_model_spec(CONFIGS / "Qwen--Qwen3-Next-80B-A3B-Instruct.json",
                           "Qwen/Qwen3-Next-80B-A3B-Instruct")
    assert spec.hybrid is not None and (spec.num_layers, spec.hybrid.num_linear_layers) == (48, 36)


@needs_bundled
def test_qwen3_5_reads_through_its_multimodal_wrapper() -> None:
    # config.json (model_type qwen3_5): text_config of 64 layers, every 4th full attention, and
    # mamba_ssm_dtype float32 (vLLM keeps the recurrent state in it).
    spec = get_model("Qwen/Qwen3.5-27B")
    assert spec.hybrid is not None and (spec.num_layers, spec.hybrid.num_linear_layers) == (64, 48)
    assert spec.hybrid.linear_state_dtype_bytes == 4


@needs_bundled
def test_deepseek_v32_reads_with_its_indexer() -> None:
    # config.json: 61 MLA layers, index_topk 2048, index_n_heads 64, index_head_dim 128.
    spec = get_model("deepseek-ai/DeepSeek-V3.2")
    assert spec.is_mla and spec.num_layers == 61 and spec.hybrid is not None
    assert (spec.hybrid.index_topk, spec.hybrid.index_n_heads, spec.hybrid.index_head_dim) == (2048, 64, 128)


@needs_bundled
def test_glm5_reads_as_deepseek_sparse_attention() -> None:
    # GLM-5's own model_type (glm_moe_dsa): DeepSeek-V3.2's layers, every layer its own indexer.
    spec = get_model("nvidia/GLM-5-NVFP4")
    assert spec.hybrid is not None and spec.hybrid.index_topk == 2048 and spec.num_index_layers == 78


# -- the checkpoint's own format -----------------------------------------------------

@pytest.mark.parametrize(("quant", "expected"), [
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, ("fp8_block", None, "all")),
    ({"quant_method": "fp8"}, ("fp8", None, "all")),
    ({"quant_method": "mxfp4"}, ("mxfp4", None, "experts")),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"},
     ("nvfp4", "fp8", "all")),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, ("fp8", None, "all")),
    ({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}, None),   # not priced: --dtype
    ({"quant_method": "awq", "bits": 4}, None),
])
def test_a_config_names_its_own_weight_format(quant: dict[str, object],
                                              expected: tuple[str, str | None, str] | None) -> None:
    fmt = config_checkpoint_format({"model_type": "llama", "quantization_config": quant})
    assert (None if fmt is None else (fmt.weights, fmt.kv_cache, fmt.layers)) == expected
    assert config_checkpoint_format({"model_type": "llama"}) is None


@needs_bundled
def test_a_resolved_checkpoint_is_priced_in_its_own_format(offline_cache: Path) -> None:
    kimi = checkpoint_format("moonshotai/Kimi-K2-Instruct")   # bundled config: block FP8
    assert kimi is not None and kimi.weights == "fp8_block"
    assert checkpoint_format("Qwen/Qwen3-Coder-480B-A35B-Instruct") is None   # a 16-bit checkpoint
    native = catalog_match("openai/gpt-oss-20b")   # the catalog's own rule comes first
    assert native is not None and checkpoint_format("openai/gpt-oss-20b") == native[1]


def test_an_hf_quant_config_beside_config_json_names_the_format(tmp_path: Path) -> None:
    # NVIDIA's ModelOpt checkpoints (GLM-5-NVFP4) keep their quantization in
    # hf_quant_config.json; vLLM reads it when config.json names none.
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert checkpoint_format(str(tmp_path)) is None
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": {
        "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8",
        "exclude_modules": ["lm_head", "model.layers.0.self_attn.q_proj"]}}))
    assert checkpoint_format(str(tmp_path)) == CheckpointFormat("nvfp4", "fp8", "mlp")


@pytest.mark.parametrize(("quant", "expected"), [
    ({"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]},
     CheckpointFormat("fp8", "fp8", "all")),
    # GLM-5.1's spelling in config.json: ignore and kv_cache_scheme.
    ({"quant_algo": "NVFP4", "kv_cache_scheme": {"num_bits": 8, "type": "float"},
      "ignore": ["lm_head", "model.layers.0*", "model.layers.3.mlp.shared_experts*",
                 "model.layers.3.self_attn*"]},
     CheckpointFormat("nvfp4", "fp8", "experts")),
    ({"quant_algo": "NVFP4", "ignore": ["model.language_model.layers.0.linear_attn*"]},
     CheckpointFormat("nvfp4", None, "mlp")),
    ({"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "FP8"}, None),
])
def test_modelopt_scopes_follow_the_excluded_modules(quant: dict[str, object],
                                                     expected: CheckpointFormat | None) -> None:
    data = {"model_type": "llama", "quantization_config": {"quant_method": "modelopt", **quant}}
    assert config_checkpoint_format(data) == expected


@needs_bundled
def test_glm5_nvfp4_is_priced_in_nvfp4() -> None:
    # aiconfigurator-core bundles its config.json and hf_quant_config.json:
    # NVFP4 experts and dense MLP, attention and the indexer 16-bit, FP8 KV.
    assert checkpoint_format("nvidia/GLM-5-NVFP4") == CheckpointFormat("nvfp4", "fp8", "mlp")
