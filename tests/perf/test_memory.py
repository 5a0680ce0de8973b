"""The KV-capacity plan against figures computed here from the checkpoint's
architecture and the GPU's visible memory."""

from __future__ import annotations

from kvsched.config import KVCacheGroup
from kvsched.perf import get_hardware, get_model
from kvsched.perf.memory import MemoryPlan, plan_memory
from kvsched.perf.step_time import ParallelConfig, RuntimeConfig

GIB = 2**30


def test_qwen3_235b_fp8_tp8_on_h200_has_135381_blocks() -> None:
    # Qwen/Qwen3-235B-A22B-FP8's config.json: hidden 4096, 94 layers, 64 query
    # heads, 4 KV heads of 128, 128 experts (top 8) of 1536, vocabulary
    # 151,936, untied embeddings, per-head q/k norms; block-FP8 weights (1
    # byte) over every linear layer, 16 bits for the rest.
    hidden, layers, heads, kv_heads, head_dim = 4096, 94, 64, 4, 128
    experts, top_k, expert_width, vocab = 128, 8, 1536, 151_936
    tp, block_size, batched_tokens, seqs = 8, 16, 8192, 1024
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2   # q, o; k, v
    expert_weights = experts * 3 * hidden * expert_width                           # gate, up, down
    sixteen_bit = (2 * vocab * hidden                                              # embedding, LM head
                   + layers * (hidden * experts + 2 * hidden + 2 * head_dim)       # router, norms
                   + hidden)                                                       # final norm
    weights = (layers * (attention + expert_weights) * 1 + sixteen_bit * 2) / tp
    assert weights == 29_548_546_944
    # Activation peak: residual + normed input + the wider of QKV and the
    # experts' gate/up outputs, 16-bit, per batched token; float32 logits
    # for every sequence.
    qkv = (heads + 2 * kv_heads) * head_dim // tp
    mlp = 2 * expert_width * top_k // tp
    activations = batched_tokens * (2 * hidden + max(qkv, mlp)) * 2 + seqs * vocab * 4
    budget = 0.9 * 143_771 * 2**20                        # H200: 143,771 MiB visible
    kv_bytes = budget - weights - activations - 1 * GIB   # 1 GiB non-torch memory
    # 4 KV heads over 8 ranks: vLLM replicates them, one KV head per rank.
    per_block = block_size * layers * 2 * 1 * head_dim * 2
    assert per_block == 770_048
    expected = int(kv_bytes // per_block)
    assert expected == 135_381

    plan = plan_memory(get_model("Qwen/Qwen3-235B-A22B"), get_hardware("h200"), ParallelConfig(tp),
                       RuntimeConfig(dtype="fp8_block"), block_size, 0.9, batched_tokens, seqs)
    assert plan.bytes_per_block == per_block
    assert plan.num_gpu_blocks == expected


# -- vLLM 0.34's extensible KV cache (module doc of kvsched.perf.memory) -------

# Llama-3.1-8B's config.json: hidden 4096, 32 layers, 32 query heads, 8 KV heads
# of 128, MLP 14336, vocabulary 128,256, untied embeddings; bf16 weights and KV.
_LLAMA8B_WEIGHTS = 2 * (2 * 128_256 * 4096 + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336
                                                    + 2 * 4096) + 4096)
# 8192 batched tokens x (residual + normed input + the MLP's gate/up, wider than
# QKV's 6144) in 16 bits, plus float32 logits for 256 sequences.
_LLAMA8B_ACTIVATIONS = 8192 * (2 * 4096 + 2 * 14336) * 2 + 256 * 128_256 * 4
_H100 = 85_520_809_984  # 81,559 MiB visible


def _llama8b(block_size: int, utilization: float, extensible: bool, hardware: str = "h100-sxm") -> MemoryPlan:
    return plan_memory(get_model("meta-llama/Llama-3.1-8B"), get_hardware(hardware), ParallelConfig(),
                       RuntimeConfig(), block_size, utilization, 8192, 256, extensible=extensible)


def test_the_extensible_cache_keeps_the_warmup_peak_and_a_margin_free() -> None:
    assert _LLAMA8B_WEIGHTS == 16_060_522_496 and _LLAMA8B_ACTIVATIONS == 735_313_920
    # Kept free: the profiled peak, activations plus vLLM's CUDA-graph estimate
    # (0.5 GiB here); margin max(1 GiB, 0.75 x that) = 1 GiB; resident the
    # weights and 1 GiB of non-torch memory and graphs. gpu_memory_utilization
    # 1.0: the device less the margin caps the budget.
    kept = _LLAMA8B_ACTIVATIONS + GIB // 2
    assert 0.75 * kept < GIB
    free = (_H100 - GIB) - (_LLAMA8B_WEIGHTS + GIB) - kept
    assert free == 66_040_619_008
    per_block = 64 * 32 * 2 * 8 * 128 * 2  # 64 tokens, K and V of 32 layers, 8 heads of 128, 2 bytes
    plan = _llama8b(64, 1.0, extensible=True)
    assert (plan.bytes_per_block, plan.num_gpu_blocks) == (per_block, free // per_block) == (8_388_608, 7872)
    assert (plan.extensible, plan.margin_bytes, plan.cuda_graph_bytes) == (True, GIB, GIB // 2)
    assert plan.describe() == (
        "7872 KV blocks, extensible KV cache sized after warmup: 78.6 GiB budget (a 1.00 GiB margin kept) - "
        "15.0 weights - 1.0 other - 1.18 warmup peak kept free (0.68 activations + 0.50 CUDA graphs) = "
        "61.5 GiB for KV")


def test_a_utilization_below_one_caps_the_extensible_budget() -> None:
    # 0.9 x memory is below memory - margin: the budget is the utilisation's.
    kept = _LLAMA8B_ACTIVATIONS + GIB // 2
    free = 0.9 * _H100 - (_LLAMA8B_WEIGHTS + GIB) - kept
    plan = _llama8b(64, 0.9, extensible=True)
    assert plan.num_gpu_blocks == int(free // 8_388_608) == 6981
    # The estimate rule at the same utilisation keeps the graphs out of it.
    estimate = _llama8b(64, 0.9, extensible=False)
    assert estimate.num_gpu_blocks == int((0.9 * _H100 - _LLAMA8B_WEIGHTS - GIB - _LLAMA8B_ACTIVATIONS)
                                          // 8_388_608) == 7045


def test_rocm_keeps_a_three_gib_margin() -> None:
    # MI300X: 192 GiB class, a ROCm device (vLLM's KV_CACHE_MARGIN_FLOOR_BYTES is 3 GiB there).
    plan = _llama8b(64, 1.0, extensible=True, hardware="mi300x")
    memory = get_hardware("mi300x").memory_bytes
    kept = _LLAMA8B_ACTIVATIONS + GIB // 2
    assert plan.margin_bytes == 3 * GIB
    assert plan.num_gpu_blocks == int(((memory - 3 * GIB) - (_LLAMA8B_WEIGHTS + GIB) - kept) // 8_388_608)


def test_the_estimate_plan_is_the_release_default_0_33_one() -> None:
    # 0.92 x memory - weights - activations - 1 GiB, in blocks of 16 tokens (2 MiB).
    plan = _llama8b(16, 0.92, extensible=False)
    assert plan.num_gpu_blocks == int((0.92 * _H100 - _LLAMA8B_WEIGHTS - _LLAMA8B_ACTIVATIONS - GIB)
                                      // 2_097_152) == 28_996
    assert not plan.extensible
    assert plan.describe().startswith("28996 KV blocks: 73.3 GiB budget - 15.0 weights")


# -- hybrid models: vLLM's KV cache groups (kvsched.perf.kv_cache_planning) -----


def test_gpt_oss_120b_blocks_are_pages_of_one_group_of_18_layers() -> None:
    # gpt-oss-120b: 36 layers, 18 sliding (window 128) and 18 full, 8 KV heads of
    # 64. vLLM forms one sliding and one full group of 18 layers; a block id is
    # one 16-token page in each of 18 layers: 16 x 18 x (2 x 8 x 64 x 2 bytes).
    plan = plan_memory(get_model("openai/gpt-oss-120b"), get_hardware("h100-sxm"), ParallelConfig(),
                       RuntimeConfig(dtype="mxfp4"), 16, 0.92, 8192, 256)
    per_block = 16 * 18 * 2 * 8 * 64 * 2
    assert per_block == 589_824
    assert plan.bytes_per_block == per_block
    # No window set aside: every byte of the KV room is pool.
    assert plan.num_gpu_blocks == int(plan.kv_cache_bytes) // per_block
    assert plan.kv_groups == (KVCacheGroup("sliding_window", 16, 18, sliding_window=128),
                              KVCacheGroup("full_attention", 16, 18))


def test_a_model_of_one_kind_tells_the_scheduler_no_groups() -> None:
    # One full-attention group of the block size is CacheConfig's default (kv_groups empty).
    assert _llama8b(16, 0.9, extensible=False).kv_groups == ()
