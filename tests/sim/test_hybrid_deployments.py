"""Llama 4 Scout and DeepSeek-V3.2 deployments as the simulator builds them:
the KV cache vLLM plans for them (its defaults), and their other layer kinds
handed to the step-time model. Expected numbers are config.json's and vLLM's
planning goldens (tests/conformance/kv_planning), not the code's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsched.errors import UserInputError
from kvsched.perf.model_parsers import load_model_spec
from kvsched.sim.deployment import EngineOptions, build_deployment
from kvsched.sim.kv_transfer import transfer_bytes_per_rank
from kvsched.sim.run import run
from kvsched.sim.spec import RunSpec, WorkloadSpec

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


NEXT = CONFIGS / "Qwen--Qwen3-Next-80B-A3B-Instruct.json"


def test_qwen3_next_without_prefix_caching_keeps_its_state_in_mamba_groups() -> None:
    d = build_deployment(EngineOptions(model=str(NEXT), hardware="h200", tensor_parallel_size=2,
                                       block_size=64, enable_prefix_caching=False, max_model_len=4096))
    cc = d.cache_config
    # config.json: 36 Gated DeltaNet layers, 12 full (every 4th); vLLM groups them 12 a group,
    # the Mamba groups first (layer 0 is linear), as its plan of this model does (the golden).
    golden = _golden("Qwen/Qwen3-Next-80B-A3B-Instruct", 64, 1, False)
    assert [(g.kind, g.num_layers) for g in cc.kv_groups] == \
        [(g["kind"], g["num_layers"]) for g in golden["groups"]]
    # Mamba cache mode "none" without prefix caching: one state block spanning max_model_len.
    assert cc.mamba_cache_mode == "none"
    assert [g.block_size for g in cc.kv_groups if g.kind == "mamba"] == [4096] * 3
    # The attention block holds a state page: per rank, conv 3 x (2 x 16 x 128 + 32 x 128) / 2
    # bf16 + SSM 32 / 2 x 128 x 128 bf16 = 548,864 bytes over 1 KV head x 256 x K,V x 2 bytes
    # = 1024 bytes a token: 64 x cdiv(548864, 64 x 1024) = 576 tokens (alignment max(16, 64)).
    assert [g.block_size for g in cc.kv_groups if g.kind == "full_attention"] == [576]
    assert d.memory.bytes_per_block == 12 * 576 * 1024
    # The scheduler's block: the groups' least common multiple (vLLM's resolve_kv_cache_block_sizes).
    assert cc.block_size == 36864
    hybrid = d.step_model.hybrid
    assert hybrid is not None and hybrid.num_linear_layers == 36


def test_qwen3_next_at_defaults_keeps_a_prefill_checkpoint_block() -> None:
    # vLLM's default for hybrid models: prefix caching on, Mamba cache mode "align"; its GDN
    # layers (FlashInfer's prefill exports mid-prefill states) add a prefill checkpoint block
    # on the prefix-cache grid, the Mamba block.
    d = build_deployment(EngineOptions(model=str(NEXT), hardware="h200", tensor_parallel_size=2,
                                       block_size=64, max_model_len=4096))
    cc = d.cache_config
    assert cc.enable_prefix_caching and cc.mamba_cache_mode == "align"
    # The 576-token block of the test above (a multiple of 64, the GDN checkpoint stride),
    # now shared by every group: align mode pages a Mamba state per attention block.
    assert [(g.kind, g.block_size) for g in cc.kv_groups] == [("mamba", 576)] * 3 + [("full_attention", 576)]
    assert [(g.num_prefill_checkpoint_blocks, g.prefill_checkpoint_alignment)
            for g in cc.kv_groups if g.kind == "mamba"] == [(1, 576)] * 3
    assert all(g.num_prefill_checkpoint_blocks == 0 and g.prefill_checkpoint_alignment is None
               for g in cc.kv_groups if g.kind != "mamba")
    assert cc.block_size == 576
    # vLLM's MambaSpec.max_memory_usage_bytes in align mode: 2 states + the checkpoint block.
    assert d.memory.mamba is not None and d.memory.mamba.state_blocks_per_request == 3


def test_qwen3_next_simulates_prefix_hits_at_defaults() -> None:
    # Prompts of a shared 1200-token prefix and 300 tokens of their own: a later prompt
    # resumes from the Mamba state at 1152 (2 blocks of 576) the first one cached.
    spec = RunSpec(workload=WorkloadSpec(num_prompts=8, random_input_len=300, random_prefix_len=1200,
                                         random_output_len=16, seed=0)).with_engine(
        model=str(NEXT), hardware="h200", tensor_parallel_size=2, max_model_len=4096,
        num_gpu_blocks_override=64)
    result = run(spec)
    assert result.metrics["completed"] == 8
    assert result.prepared.deployment.cache_config.enable_prefix_caching
    assert result.metrics["prefix_cache_hit_rate"] > 0


def test_qwen3_next_simulates_a_run_without_prefix_caching() -> None:
    spec = RunSpec(workload=WorkloadSpec(num_prompts=16, random_input_len=1500, random_output_len=32,
                                         seed=0)).with_engine(
        model=str(NEXT), hardware="h200", tensor_parallel_size=2, max_model_len=4096,
        enable_prefix_caching=False, num_gpu_blocks_override=16)
    result = run(spec)
    # 15 usable blocks: a request of ~1530 tokens holds 3 attention blocks of 576 tokens and one
    # state block (mode "none": one spanning max_model_len) in each of the 3 Mamba groups: 6
    # blocks, so 2 run at once and hold 12 of the 15.
    assert result.metrics["completed"] == 16
    assert result.metrics["mean_batch_size"] == 2.0
    assert result.metrics["max_kv_cache_usage"] == pytest.approx(12 / 15)


def test_pd_transfer_moves_every_layers_kv_and_the_indexer_keys() -> None:
    # Llama 4 Scout at TP 8: all 48 layers hold every token (vLLM's hybrid manager off),
    # 1 KV head of 128 a rank, K and V in bf16.
    scout = load_model_spec(SCOUT, "meta-llama/Llama-4-Scout-17B-16E-Instruct")
    assert transfer_bytes_per_rank(scout, 2, 8, 1000) == 48 * 1000 * 2 * 1 * 128 * 2
    # DeepSeek-V3.2: 61 layers of a 576-value bf16 latent plus 128 fp8 indexer bytes and a 4-byte scale.
    dsv32 = load_model_spec(DSV32, "deepseek-ai/DeepSeek-V3.2")
    assert transfer_bytes_per_rank(dsv32, 2, 8, 1000) == 61 * 1000 * (576 * 2 + 128 + 4)
    nxt = load_model_spec(NEXT, "Qwen/Qwen3-Next-80B-A3B-Instruct")
    with pytest.raises(UserInputError, match="--disaggregation"):
        transfer_bytes_per_rank(nxt, 2, 2, 1000)


def test_drafter_layers_share_the_blocks_as_the_targets_layers() -> None:
    # DeepSeek-V3.2's MTP layer is a V3.2 decoder layer (vLLM's deepseek_mtp.py): its block
    # holds a latent and indexer page too, 62 layers of 64 x (576 x 2 + 128 + 4) bytes.
    d = build_deployment(EngineOptions(model=str(DSV32), hardware="h200", tensor_parallel_size=8,
                                       block_size=64,
                                       speculative_config='{"method": "mtp", "num_speculative_tokens": 1}',
                                       max_model_len=8192))
    assert d.memory.bytes_per_block == 62 * 64 * (576 * 2 + 128 + 4)
    # Llama 4 Scout with an EAGLE-3 head: one more full-attention layer (1 KV head of 128 a rank).
    d = build_deployment(EngineOptions(model=str(SCOUT), hardware="h200", tensor_parallel_size=8,
                                       block_size=64,
                                       speculative_config='{"method": "eagle3", "model": "x/eagle3", '
                                                          '"num_speculative_tokens": 2}', max_model_len=8192))
    assert d.cache_config.kv_groups == ()
    assert d.memory.bytes_per_block == 49 * 64 * 2 * 1 * 128 * 2


def test_qwen3_next_start_up_check_counts_the_checkpoint_block() -> None:
    # vLLM's start-up check: one max_model_len request must fit beside the null block. At
    # 4096 tokens in 576-token blocks: 8 full-attention blocks, and per Mamba group
    # MambaSpec.max_memory_usage_bytes' 2 states + 1 checkpoint block (align mode): 8 + 3 x 3 = 17.
    opts = {"model": str(NEXT), "hardware": "h200", "tensor_parallel_size": 2, "max_model_len": 4096}
    build_deployment(EngineOptions(**opts, num_gpu_blocks_override=18))
    with pytest.raises(UserInputError, match="needs 17 KV blocks"):
        build_deployment(EngineOptions(**opts, num_gpu_blocks_override=17))
