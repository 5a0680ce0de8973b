"""Physics sanity checks of the step-time model: which resource bounds a step,
and how tensor and expert parallelism change what a rank reads.

Not accuracy targets (the measured errors live in docs/validation.md).
"""

from __future__ import annotations

import dataclasses

from kvsched.perf import get_hardware, get_model
from kvsched.perf.step_time import BatchShape, ParallelConfig, RuntimeConfig, StepTimeModel


def _model(name: str, hw: str, tp: int = 1, dtype: str = "bf16", dp: int = 1,
           ep: bool = False) -> StepTimeModel:
    return StepTimeModel(get_model(name), get_hardware(hw), ParallelConfig(tp, dp, ep),
                         RuntimeConfig(dtype=dtype))


def test_llama8b_decode_on_h100_is_weight_bandwidth_bound() -> None:
    m = get_model("meta-llama/Llama-3.1-8B")
    hw = get_hardware("h100-sxm")
    sm = _model("meta-llama/Llama-3.1-8B", "h100-sxm")
    t = sm.gpu_time(BatchShape.decode(1, 512))
    weights = 2.0 * m.num_params()
    assert t > weights / hw.mem_bw * 0.8          # cannot beat the peak by much (embedding is not read)
    achieved = weights / (hw.mem_bw * hw.weight_bw_frac)
    assert 0.75 * achieved <= t <= 1.25 * achieved


def test_long_prefill_is_compute_bound() -> None:
    name = "meta-llama/Llama-3.1-8B"
    m = get_model(name)
    hw = get_hardware("h100-sxm")
    sm = _model(name, "h100-sxm")

    def prefill(tokens: int) -> float:
        return sm.gpu_time(BatchShape(tokens, 1, 1, 0, 0, tokens, tokens, tokens * (tokens + 1) // 2))

    t = prefill(8192)
    linear_flops = 2.0 * 8192 * (m.num_params() - m.embedding_params() - m.lm_head_params())
    assert t >= linear_flops / hw.bf16_flops                       # never above peak FLOP rate
    assert t >= 10 * 2.0 * m.num_params() / hw.mem_bw             # far beyond one read of the weights
    assert prefill(8192) / prefill(4096) >= 1.95                    # time grows with tokens, not bytes


def test_tp2_decode_of_70b_is_faster_than_tp1() -> None:
    name = "meta-llama/Llama-3.1-70B"  # FP8 so that TP1 fits one H100
    shape = BatchShape.decode(16, 16 * 2048)
    tp1 = _model(name, "h100-sxm", 1, "fp8").step_time(shape)
    tp2 = _model(name, "h100-sxm", 2, "fp8").step_time(shape)
    assert tp2 < tp1
    assert tp2 > tp1 / 2  # all-reduce and fixed costs: no better than perfect scaling


def test_moe_decode_reads_only_touched_experts() -> None:
    name = "Qwen/Qwen3-30B-A3B"
    m = get_model(name)
    # The bytes alone: the hardware's own factors (a renamed copy of the catalog
    # entry), without the per-layer MoE latency learned from the tables,
    # which dominates a one-token decode.
    hw = dataclasses.replace(get_hardware("h100-sxm"), id="h100-own")
    sm = StepTimeModel(m, hw)
    bw = hw.mem_bw * hw.weight_bw_frac
    one = sm.gpu_time(BatchShape.decode(1, 1024))
    total = 2.0 * m.num_params() / bw
    active = 2.0 * (m.active_params_per_token() - m.embedding_params()) / bw
    assert active <= one < 0.25 * total  # 8 of 128 experts per layer, not all of them
    expert_bytes = 2.0 * m.num_moe_layers * m.num_experts * m.expert_params()
    many = sm.gpu_time(BatchShape.decode(512, 512 * 1024))
    assert many >= 0.95 * expert_bytes / bw  # 512 tokens x 8 picks touch nearly every expert


def test_expert_parallel_decode_reads_the_rank_share_of_experts() -> None:
    name = "deepseek-ai/DeepSeek-V3"
    m = get_model(name)
    hw = get_hardware("h200")
    dp = 8
    sm = _model(name, "h200", 1, "fp8", dp=dp, ep=True)
    shape = BatchShape.decode(64, 64 * 2048)
    t = sm.gpu_time(shape, global_tokens=64 * dp)
    rank_experts = m.num_moe_layers * m.num_experts * m.expert_params() / dp  # FP8: one byte each
    assert t >= rank_experts / (hw.mem_bw * hw.weight_bw_frac)
