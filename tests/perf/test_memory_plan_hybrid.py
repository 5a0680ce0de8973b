"""The simulator's memory plan (kvsched.perf.memory.kv_cache_plan) for the
hybrid models it runs, against vLLM's own planning code: the goldens of
tests/conformance/kv_planning (vLLM 0.33 and 0.34's get_kv_cache_groups /
get_kv_cache_config_from_groups) at the hybrid-manager setting vLLM
resolves by default. Llama 4's chunked local attention turns the hybrid KV
cache manager off unless VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE
is set, so its chunked layers allocate as full attention (one group of 48
layers); DeepSeek-V3.2's and GLM-5's latent and indexer keys form one MLA
group (GLM-5.2's shared-top-k layers without indexer keys), their fp8
latent FlashMLA's fp8_ds_mla row or FlashInfer's plain fp8 per backend;
Qwen3-Next's and Qwen3.5's Gated DeltaNet layers (Qwen3.5's recurrent
state in float32) and Nemotron-H's Mamba-2 layers form Mamba groups, the
block size raised to hold a state page (its cache mode per prefix
caching); Nemotron-H's MLP-only layers hold no cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsched.perf.memory import kv_cache_plan, scheduler_kv_groups
from kvsched.perf.model_parsers import model_spec_from_config
from kvsched.perf.step_time import kv_cache_dtype_bytes

REPO = Path(__file__).resolve().parents[2]
GOLDENS = REPO / "tests" / "conformance" / "kv_planning"
# vLLM's default --disable-hybrid-kv-cache-manager per model (its VllmConfig
# post-init): on for chunked local attention, off otherwise.
DEFAULT_DISABLE = {"meta-llama/Llama-4-Scout-17B-16E-Instruct": True, "deepseek-ai/DeepSeek-V3.2": False,
                   "Qwen/Qwen3-Next-80B-A3B-Instruct": False, "Qwen/Qwen3.5-27B": False,
                   "Qwen/Qwen3.5-35B-A3B": False, "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": False,
                   "nvidia/Nemotron-H-8B-Base-8K": False, "zai-org/GLM-5": False, "zai-org/GLM-5.2": False}


def _cases() -> list[pytest.ParameterSet]:
    out = []
    for release in ("0_33", "0_34"):
        data = json.loads((GOLDENS / f"vllm_{release}.json").read_text())
        for result in data["results"]:
            c = result["case"]
            default = DEFAULT_DISABLE.get(c["model"])
            if (default is not None and c["disable_hybrid_kv_cache_manager"] == default
                    and c["num_gpu_blocks_override"] is None):
                name = c["model"].split("/")[1]
                apc = "apc" if c["enable_prefix_caching"] else "noapc"
                backend = f"-{c['sparse_mla_backend']}" if "sparse_mla_backend" in c else ""
                out.append(pytest.param(result, id=f"{release}-{name}-bs{c['block_size']}-"
                                                   f"tp{c['tensor_parallel_size']}-{c['available_bytes']}-{apc}-"
                                                   f"{c['kv_cache_dtype']}{backend}"))
    return out


@pytest.mark.parametrize("result", _cases())
def test_memory_plan_is_vllms_default_plan(result: dict) -> None:
    case, want = result["case"], result["vllm"]
    model = model_spec_from_config(json.loads((REPO / case["config"]).read_text()), case["model"])
    plan = kv_cache_plan(model, model.num_layers, model.num_sliding_layers, case["block_size"],
                         case["tensor_parallel_size"], kv_cache_dtype_bytes(case["kv_cache_dtype"]), 0,
                         float(case["available_bytes"]), enable_prefix_caching=case["enable_prefix_caching"],
                         max_model_len=case["max_model_len"],
                         fp8_ds_mla=case.get("sparse_mla_backend", "FLASHMLA_SPARSE") == "FLASHMLA_SPARSE")
    assert plan.num_blocks == want["num_blocks"]
    assert [(g.kind, g.num_layers, g.block_size, g.bytes_per_block) for g in plan.groups] == \
        [(g["kind"], g["num_layers"], g["block_size"], g["bytes_per_block"]) for g in want["groups"]]
    mamba = plan.mamba
    got = ((mamba.mamba_cache_mode, mamba.mamba_block_size, mamba.mamba_page_size_padded, mamba.block_size)
           if mamba is not None else (None, None, None, case["block_size"]))
    assert got == (want["mamba_cache_mode"], want["mamba_block_size"], want["mamba_page_size_padded"],
                   want["attention_block_size"])
    groups = scheduler_kv_groups(plan, case["block_size"])
    if mamba is None:
        # One full-attention (or MLA) group of the block size: the scheduler's plain KV cache manager.
        assert groups == ()
    else:
        # Each Mamba-state hybrid's groups as vLLM's: Qwen3-Next and Qwen3.5 3 Mamba groups and
        # one full-attention group (3:1 layers); Nemotron-H's 23 (24) Mamba-2 layers in groups of
        # the 6 (4) attention layers.
        assert [g.kind for g in groups] == [g["kind"] for g in want["groups"]]
        assert len(groups) >= 4 and groups[-1].kind == "full_attention"


def test_cases_cover_the_models() -> None:
    assert {p.values[0]["case"]["model"] for p in _cases()} == set(DEFAULT_DISABLE)


def test_cases_cover_both_sparse_fp8_layouts() -> None:
    # DeepSeek-V3.2, GLM-5 and GLM-5.2 with an fp8 cache under FlashMLA's fp8_ds_mla and FlashInfer's fp8.
    got = {(p.values[0]["case"]["model"], p.values[0]["case"].get("sparse_mla_backend")) for p in _cases()
           if "sparse_mla_backend" in p.values[0]["case"]}
    assert got == {(m, b) for m in ("deepseek-ai/DeepSeek-V3.2", "zai-org/GLM-5", "zai-org/GLM-5.2")
                   for b in ("FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE")}
