"""Issue 23's acceptance, grown by issue 37: 40 model ids users run (vLLM's
supported-models page, the traces' papers, current releases) each simulate a
short run through the run spec, or are refused with the reason; the
vision-language ones also simulate a run with images (random-mm). Offline:
the catalog, aiconfigurator-core's bundled configs, and a fake local Hugging
Face cache holding the published configs of tests/perf/data/hf_configs
(HF_HUB_OFFLINE=1: no network). docs/catalogs.md lists the same 40 with their
outcome."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from kvsched.sim.run import run
from kvsched.sim.spec import RunSpec, WorkloadSpec

CONFIGS = Path(__file__).parents[1] / "perf" / "data" / "hf_configs"

# id: (where its config comes from, hardware, tensor-parallel size, None or a
# phrase of the refusal). Sources: catalog (kvsched.perf.model_catalog), bundled
# (aiconfigurator-core's model_configs/), cache (the fake HF cache).
MODEL_IDS: dict[str, tuple[str, str, int, str | None]] = {
    "meta-llama/Llama-3.1-8B-Instruct": ("catalog", "h100", 1, None),
    "meta-llama/Llama-3.1-70B-Instruct": ("catalog", "h100", 4, None),
    "meta-llama/Llama-3.3-70B-Instruct": ("cache", "mi325x", 1, None),
    "meta-llama/Llama-3.2-3B-Instruct": ("cache", "l4", 1, None),
    "meta-llama/Meta-Llama-3-8B-Instruct": ("cache", "a10g", 1, None),
    "meta-llama/Llama-2-70b-hf": ("catalog", "a100-80gb", 4, None),
    "mistralai/Mistral-7B-Instruct-v0.3": ("cache", "a10g", 1, None),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": ("catalog", "h100", 2, None),
    "mistralai/Mixtral-8x22B-v0.1": ("bundled", "h200", 4, None),
    "Qwen/Qwen2.5-7B-Instruct": ("catalog", "l40s", 1, None),
    "Qwen/Qwen2.5-72B-Instruct": ("cache", "h20", 2, None),
    "Qwen/Qwen3-8B": ("catalog", "h100", 1, None),
    "Qwen/Qwen3-30B-A3B": ("catalog", "h100", 1, None),
    "Qwen/Qwen3-235B-A22B": ("catalog", "mi355x", 2, None),
    "Qwen/Qwen3-Coder-480B-A35B-Instruct": ("bundled", "b300", 8, None),
    # 160 GB of bf16 weights: two H200s. At vLLM's default (prefix caching on, Mamba cache
    # mode "align", a GDN prefill checkpoint block; tests/sim/test_hybrid_deployments.py).
    "Qwen/Qwen3-Next-80B-A3B-Instruct": ("cache", "h200", 2, None),
    "google/gemma-2-9b-it": ("cache", "l4", 1, None),
    "google/gemma-2-27b-it": ("cache", "h100", 1, None),
    "google/gemma-3-27b-it": ("cache", "h100", 1, None),
    "microsoft/Phi-3-mini-4k-instruct": ("cache", "l4", 1, None),  # every layer slides: charged as full
    "microsoft/phi-4": ("cache", "h100", 1, None),
    "THUDM/glm-4-9b": ("cache", "a10g", 1, None),            # ChatGLM's own config (chatglm)
    "THUDM/glm-4-9b-chat-hf": ("cache", "h100", 1, None),    # the transformers port (glm4)
    "zai-org/GLM-4.5": ("cache", "gb300", 4, None),
    "deepseek-ai/DeepSeek-V3": ("catalog", "h200", 8, None),
    "deepseek-ai/DeepSeek-R1": ("catalog", "b300", 8, None),
    "deepseek-ai/DeepSeek-V3.2": ("bundled", "h200", 8, None),
    "openai/gpt-oss-20b": ("catalog", "h100", 1, None),
    "openai/gpt-oss-120b": ("catalog", "h100", 1, None),
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": ("cache", "h100", 8, None),
    # Issue 37: vision-language models, hybrid models, current releases.
    "Qwen/Qwen3-VL-8B-Instruct": ("bundled", "h100", 1, None),
    "Qwen/Qwen3-VL-30B-A3B-Instruct": ("bundled", "h100", 2, None),
    "Qwen/Qwen3-VL-235B-A22B-Instruct": ("bundled", "h200", 8, None),
    "Qwen/Qwen3-32B": ("bundled", "h100", 2, None),
    "Qwen/Qwen3-235B-A22B-FP8": ("bundled", "h200", 4, None),
    "moonshotai/Kimi-K2-Instruct": ("bundled", "b300", 8, None),
    "MiniMaxAI/MiniMax-M2.5": ("bundled", "h200", 4, None),
    # Qwen3.5 (Qwen3-Next's layers, a float32 recurrent state) and Nemotron-3 (Mamba-2 layers,
    # MambaMixer2's prefill checkpoint block) at vLLM's default, prefix caching on. GLM-5:
    # DeepSeek Sparse Attention under its own config (glm_moe_dsa), NVFP4 MLPs from its
    # hf_quant_config.json, an fp8 KV cache on B200 (vLLM's rule for it on SM100):
    "Qwen/Qwen3.5-27B": ("bundled", "h100", 1, None),
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": ("bundled", "h100", 1, None),
    "nvidia/GLM-5-NVFP4": ("bundled", "b200", 8, None),
}
# The vision-language ids of MODEL_IDS, run with images (vllm bench serve's
# random-mm defaults: one 256x256 or 720x1280 image per request); None or
# the refusal's phrase.
VLM_IDS: dict[str, str | None] = {
    "Qwen/Qwen3-VL-8B-Instruct": None,
    "Qwen/Qwen3-VL-30B-A3B-Instruct": None,
    "google/gemma-3-27b-it": None,
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": None,
}
needs_extras = pytest.mark.skipif(
    any(importlib.util.find_spec(pkg) is None for pkg in ("aiconfigurator_core", "huggingface_hub")),
    reason="the bundled configs ([measured]) and huggingface_hub are both needed")


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hugging Face hub cache holding every config of tests/perf/data/hf_configs, offline."""
    cache = tmp_path / "hub"
    rev = "0123456789abcdef0123456789abcdef01234567"
    for path in sorted(CONFIGS.glob("*.json")):
        repo = cache / f"models--{path.stem}"
        (repo / "snapshots" / rev).mkdir(parents=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(rev)
        shutil.copy(path, repo / "snapshots" / rev / "config.json")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_the_list_has_forty_ids_and_counts_its_outcomes() -> None:
    assert len(MODEL_IDS) == 40
    refused = [m for m, (_, _, _, why) in MODEL_IDS.items() if why is not None]
    assert (40 - len(refused), len(refused)) == (40, 0)
    assert set(VLM_IDS) <= set(MODEL_IDS)
    cached = {p.stem.replace("--", "/", 1) for p in CONFIGS.glob("*.json")}
    assert {m for m, (src, *_) in MODEL_IDS.items() if src == "cache"} <= cached


@needs_extras
@pytest.mark.parametrize("model_id", list(MODEL_IDS))
def test_each_model_id_simulates_or_is_refused_with_its_reason(model_id: str, hub_cache: Path) -> None:
    _, hardware, tp, refusal = MODEL_IDS[model_id]
    spec = RunSpec(workload=WorkloadSpec(num_prompts=4, random_input_len=256, random_output_len=8,
                                         seed=0)).with_engine(model=model_id, hardware=hardware,
                                                              tensor_parallel_size=tp, max_model_len=4096)
    if refusal is not None:
        with pytest.raises(ValueError) as info:
            run(spec)
        assert refusal in str(info.value), str(info.value)
        return
    result = run(spec)
    assert result.metrics["completed"] == 4
    assert result.prepared.deployment.model.num_params() > 1e9


@needs_extras
@pytest.mark.parametrize("model_id", list(VLM_IDS))
def test_each_vlm_simulates_with_images_or_is_refused(model_id: str, hub_cache: Path) -> None:
    _, hardware, tp, _ = MODEL_IDS[model_id]
    refusal = VLM_IDS[model_id]
    spec = RunSpec(workload=WorkloadSpec(dataset_name="random-mm", num_prompts=4, random_input_len=64,
                                         random_output_len=8, seed=0)).with_engine(
        model=model_id, hardware=hardware, tensor_parallel_size=tp, max_model_len=4096)
    if refusal is not None:
        with pytest.raises(ValueError) as info:
            run(spec)
        assert refusal in str(info.value), str(info.value)
        return
    result = run(spec)
    assert result.metrics["completed"] == 4
    # Every request carried one image (the default: base 1, ratio 0), its tokens in the prompt.
    requests = result.prepared.workload.requests
    assert all(len(r.mm_items) == 1 and r.num_prompt_tokens > r.mm_items[0].length for r in requests)
