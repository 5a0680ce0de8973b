"""``kvsched simulate``'s engine arguments: vLLM serve's defaults and one
validation place that names the flag (kvsched.sim.deployment)."""

from __future__ import annotations

from typing import Any

import pytest

from kvsched.sim.deployment import EngineOptions, build_deployment, validate_engine_options


def test_serve_defaults_are_vllm_serves_by_device() -> None:
    h100 = build_deployment(EngineOptions(model="Llama-3.1-8B", hardware="h100-sxm")).scheduler_config
    assert (h100.max_num_batched_tokens, h100.max_num_seqs, h100.max_model_len) == (8192, 1024, 131072)
    a100 = build_deployment(EngineOptions(model="Llama-3.1-8B", hardware="a100-80gb")).scheduler_config
    assert (a100.max_num_batched_tokens, a100.max_num_seqs) == (2048, 256)


def test_default_budget_is_capped_at_max_num_seqs_times_max_model_len() -> None:
    sc = build_deployment(EngineOptions(model="Llama-3.1-8B", max_num_seqs=2, max_model_len=1000)
                          ).scheduler_config
    assert sc.max_num_batched_tokens == 2000


@pytest.mark.parametrize(("field", "value", "message"), [
    ("max_num_seqs", 0, r"max_num_seqs=0 \(--max-num-seqs\)"),
    ("max_num_seqs", -4, r"max_num_seqs=-4 \(--max-num-seqs\)"),
    ("max_num_batched_tokens", 0, r"max_num_batched_tokens=0 \(--max-num-batched-tokens\)"),
    ("max_model_len", 0, r"max_model_len=0 \(--max-model-len\)"),
    ("num_gpu_blocks_override", 0, r"num_gpu_blocks_override=0.*>= 2"),
    ("num_gpu_blocks_override", 1, r"num_gpu_blocks_override=1.*>= 2"),
    ("block_size", 7, r"block_size=7 \(--block-size\).*multiple of 16"),
    ("block_size", 0, r"block_size=0 \(--block-size\)"),
    ("block_size", 8, r"block_size=8 \(--block-size\)"),
    ("gpu_memory_utilization", 0.0, r"gpu_memory_utilization=0\.0.*\(0, 1\]"),
    ("gpu_memory_utilization", 1.5, r"gpu_memory_utilization=1\.5.*\(0, 1\]"),
    ("long_prefill_token_threshold", -1, r"long_prefill_token_threshold=-1"),
    ("tensor_parallel_size", 0, r"tensor_parallel_size=0 \(--tensor-parallel-size\)"),
    ("data_parallel_size", 0, r"data_parallel_size=0 \(--data-parallel-size\)"),
    ("dtype", "int3", r"dtype='int3'"),
    ("kv_cache_dtype", "bf16", r"kv_cache_dtype='bf16' \(--kv-cache-dtype\)"),
    ("prefill_schedule_interval", 0, r"prefill_schedule_interval=0 \(--prefill-schedule-interval\)"),
])
def test_bad_engine_arguments_are_refused_before_anything_is_built(field: str, value: Any,
                                                                   message: str) -> None:
    # An unknown model: the flag must be judged first, on its own.
    opts = EngineOptions(model="no-such-model", **{field: value})
    with pytest.raises(ValueError, match=message):
        validate_engine_options(opts)
    with pytest.raises(ValueError, match=message):
        build_deployment(opts)


@pytest.mark.parametrize("block_size", [16, 32, 128])
def test_multiples_of_16_are_valid_block_sizes(block_size: int) -> None:
    d = build_deployment(EngineOptions(model="Llama-3.1-8B", block_size=block_size))
    assert d.cache_config.block_size == block_size


@pytest.mark.parametrize("name, kv_bytes", [("auto", 2), ("bfloat16", 2), ("fp8", 1), ("fp8_e5m2", 1)])
def test_vllm_kv_cache_dtype_names_are_accepted(name: str, kv_bytes: int) -> None:
    opts = EngineOptions(kv_cache_dtype=name)
    validate_engine_options(opts)
    # Accepted and priced: the KV cache holds this many bytes per element.
    assert build_deployment(opts).runtime.kv_bytes == kv_bytes


def test_weights_take_the_checkpoints_quantization_unless_told_otherwise() -> None:
    from kvsched.sim.deployment import kv_cache_dtype, weight_dtype

    assert weight_dtype(EngineOptions(model="nvidia/Llama-3.1-8B-Instruct-FP8")) == "fp8"
    assert kv_cache_dtype(EngineOptions(model="nvidia/Llama-3.1-8B-Instruct-FP8")) == "fp8"
    assert kv_cache_dtype(EngineOptions(model="nvidia/Llama-3.1-8B-Instruct-FP8",
                                        kv_cache_dtype="bfloat16")) == "bfloat16"
    assert weight_dtype(EngineOptions(model="Qwen/Qwen3-235B-A22B-FP8")) == "fp8_block"
    assert kv_cache_dtype(EngineOptions(model="Qwen/Qwen3-235B-A22B-FP8")) == "auto"
    assert weight_dtype(EngineOptions(model="meta-llama/Llama-3.1-8B-Instruct")) == "bf16"
    assert weight_dtype(EngineOptions(model="Qwen/Qwen3-32B", quantization="fp8")) == "fp8"
    d = build_deployment(EngineOptions(model="Qwen/Qwen3-235B-A22B-FP8", hardware="h200",
                                       tensor_parallel_size=4))
    assert d.runtime.dtype == "fp8_block"
    # 235B parameters at one byte each leave room for KV that bf16 would not.
    bf16 = build_deployment(EngineOptions(model="Qwen/Qwen3-235B-A22B", hardware="h200",
                                          tensor_parallel_size=4))
    assert d.cache_config.num_gpu_blocks > 2 * bf16.cache_config.num_gpu_blocks
    with pytest.raises(ValueError, match=r"quantization='int4' \(--quantization\)"):
        build_deployment(EngineOptions(quantization="int4"))
