"""Llama 4 Scout and DeepSeek-V3.2 deployments as the simulator builds them:
the KV cache vLLM plans for them (its defaults), and their other layer kinds
handed to the step-time model. Expected numbers are config.json's and vLLM's
planning goldens (tests/conformance/kv_planning), not the code's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsched.errors import UserInputError
from kvsched.sim.deployment import EngineOptions, build_deployment

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "tests" / "perf" / "data" / "hf_configs"
SCOUT = CONFIGS / "meta-llama--Llama-4-Scout-17B-16E-Instruct.json"
DSV32 = CONFIGS / "deepseek-ai--DeepSeek-V3.2.json"


def _golden(model: str, block_size: int, tp: int, disable_hma: bool) -> dict:
    data = json.loads((REPO / "tests/conformance/kv_planning/vllm_0_34.json").read_text())
    for result in data["results"]:
        c = result["case"]
        if (c["model"], c["block_size"], c["tensor_parallel_size"], c["disable_hybrid_kv_cache_manager"],
                c["kv_cache_dtype"], c["num_gpu_blocks_override"]) == (model, block_size, tp, disable_hma,
                                                                       "auto", None):
            return dict(result["vllm"])
    raise AssertionError(f"no golden for {model} bs{block_size} tp{tp}")


def test_llama4_scout_pages_its_chunked_layers_as_full_attention() -> None:
    # vLLM turns the hybrid KV cache manager off for attention_chunk_size unless
    # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1: one full-attention group of
    # all 48 layers, the scheduler's plain KV cache manager.
    d = build_deployment(EngineOptions(model=str(SCOUT), hardware="h100", tensor_parallel_size=8,
                                       block_size=64, max_model_len=32768))
    assert d.cache_config.kv_groups == () and d.cache_config.block_size == 64
    # config.json: 48 layers, 8 KV heads of 128 (one per rank at TP 8), bf16 K and V.
    assert d.memory.bytes_per_block == 48 * 64 * 2 * 1 * 128 * 2
    # vLLM's promoted plan at TP 1 (the golden, 8 KV heads a rank) is 8x this block.
    assert _golden("meta-llama/Llama-4-Scout-17B-16E-Instruct", 64, 1, True)["groups"][0]["bytes_per_block"] \
        == 8 * d.memory.bytes_per_block
    assert d.cache_config.num_gpu_blocks == int(d.memory.kv_cache_bytes) // d.memory.bytes_per_block
    # The step-time model prices 3 of every 4 layers as chunked local attention (chunks of 8192).
    hybrid = d.step_model.hybrid
    assert hybrid is not None and (hybrid.num_chunked_layers, hybrid.attention_chunk_size) == (36, 8192)
    assert d.step_model.full_layers == 12


def test_deepseek_v32_blocks_hold_the_indexer_keys() -> None:
    d = build_deployment(EngineOptions(model=str(DSV32), hardware="h200", tensor_parallel_size=8,
                                       block_size=64, max_model_len=32768))
    want = _golden("deepseek-ai/DeepSeek-V3.2", 64, 8, False)
    assert [g["kind"] for g in want["groups"]] == ["mla_attention"]
    assert d.memory.bytes_per_block == want["groups"][0]["bytes_per_block"]
    assert d.cache_config.kv_groups == ()
    hybrid = d.step_model.hybrid
    assert hybrid is not None and hybrid.index_topk == 2048


def test_deepseek_v32_fp8_kv_cache_is_refused() -> None:
    with pytest.raises(UserInputError, match=r"fp8_ds_mla"):
        build_deployment(EngineOptions(model=str(DSV32), hardware="h200", tensor_parallel_size=8,
                                       kv_cache_dtype="fp8", max_model_len=32768))
