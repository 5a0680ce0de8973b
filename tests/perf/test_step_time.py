"""The step-time roofline and the KV-capacity plan, against hand-computed physics."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvsched.perf import get_hardware, get_model
from kvsched.perf.memory import plan_memory, weight_bytes_per_device
from kvsched.perf.roofline_factors import DEFAULT_FILE
from kvsched.perf.step_time import (
    KERNEL_LATENCY_S,
    KERNELS_PER_LAYER,
    BatchShape,
    ParallelConfig,
    RuntimeConfig,
    StepTimeModel,
    combine_step_time,
    cudagraph_capture_sizes,
    weight_split,
)

# The roofline on the hardware's own efficiency fields: a copy of the
# catalog entry under another id is not the catalog's, so it gets no learned factors
# (kvsched.perf.roofline_factors); the hand physics below is that form.
H100 = dataclasses.replace(get_hardware("h100-sxm"), id="h100-own")
LLAMA8 = get_model("Llama-3.1-8B")
NO_CPU = RuntimeConfig(async_scheduling=False, cpu_step_s=0.0, cpu_per_request_s=0.0)


def prefill(n: int, context: int = 0) -> BatchShape:
    return BatchShape(n, 1, 1, 0, 0, n, context + n, n * context + n * (n + 1) // 2)


def test_decode_batch_of_one_is_weight_bandwidth_bound() -> None:
    model = StepTimeModel(LLAMA8, H100, runtime=NO_CPU)
    # Every matmul weight read once (the LM head at 16 bits, as the rest).
    weights = (LLAMA8.num_params() - LLAMA8.embedding_params()) * 2
    kv = 1000 * LLAMA8.kv_bytes_per_token()
    fixed = LLAMA8.num_layers * KERNELS_PER_LAYER * KERNEL_LATENCY_S
    expected = (weights / (H100.mem_bw * H100.weight_bw_frac)
                + kv / (H100.mem_bw * H100.attn_bw_frac) + fixed)
    # Norm weights are counted in num_params but read by no matmul: within 0.1%.
    assert model.gpu_time(BatchShape.decode(1, 1000)) == pytest.approx(expected, rel=1e-3)


def test_long_prefill_is_compute_bound() -> None:
    model = StepTimeModel(LLAMA8, H100, runtime=NO_CPU)
    n = 8192
    linear_flops = 2 * n * (LLAMA8.num_params() - 2 * LLAMA8.embedding_params())
    t = model.gpu_time(prefill(n))
    assert t > linear_flops / (H100.bf16_flops * H100.gemm_mfu)
    assert t < 1.6 * linear_flops / (H100.bf16_flops * H100.gemm_mfu)


def test_decode_time_grows_with_context_and_batch() -> None:
    model = StepTimeModel(LLAMA8, H100, runtime=NO_CPU)
    short = model.gpu_time(BatchShape.decode(64, 64 * 100))
    long = model.gpu_time(BatchShape.decode(64, 64 * 8000))
    assert long > short
    # KV read for 64 × 7900 more tokens at the attention bandwidth.
    extra = 64 * 7900 * LLAMA8.kv_bytes_per_token() / (H100.mem_bw * H100.attn_bw_frac)
    assert long - short == pytest.approx(extra, rel=1e-6)


def test_tensor_parallel_speeds_up_a_70b_decode_but_adds_all_reduce() -> None:
    llama70 = get_model("Llama-3.1-70B")
    tp1 = StepTimeModel(llama70, H100, ParallelConfig(1), NO_CPU).gpu_time(BatchShape.decode(8, 8000))
    tp2 = StepTimeModel(llama70, H100, ParallelConfig(2), NO_CPU).gpu_time(BatchShape.decode(8, 8000))
    assert tp2 < tp1
    assert tp2 > tp1 / 2  # communication and fixed latency do not shrink


def test_moe_decode_reads_only_touched_experts() -> None:
    moe = get_model("Qwen3-30B-A3B")
    model = StepTimeModel(moe, H100, runtime=NO_CPU)
    one = model.gpu_time(BatchShape.decode(1, 500))
    many = model.gpu_time(BatchShape.decode(256, 256 * 500))
    all_experts = moe.num_moe_layers * moe.num_experts * moe.expert_params() * 2
    # A single token touches 8 of 128 experts per layer: far below reading them all.
    assert one < 0.5 * all_experts / (H100.mem_bw * H100.weight_bw_frac)
    assert many > one


def test_decode_batches_are_padded_to_cuda_graph_sizes() -> None:
    assert cudagraph_capture_sizes(512)[:5] == [1, 2, 4, 8, 16]
    assert cudagraph_capture_sizes(300)[-1] == 288
    model = StepTimeModel(LLAMA8, H100, runtime=NO_CPU)
    assert model.padded_tokens(5) == 8 and model.padded_tokens(1000) == 1000


def test_async_scheduling_overlaps_cpu_with_the_forward_pass() -> None:
    shape = BatchShape.decode(32, 32 * 1000)
    sync = StepTimeModel(LLAMA8, H100, runtime=RuntimeConfig(async_scheduling=False))
    overlap = StepTimeModel(LLAMA8, H100, runtime=RuntimeConfig(async_scheduling=True))
    gpu, cpu = sync.gpu_time(shape), sync.cpu_time(shape)
    assert sync.step_time(shape) == pytest.approx(gpu + cpu)
    assert overlap.step_time(shape) == pytest.approx(max(gpu, cpu))


@pytest.mark.parametrize("name", ["gpt-oss-20b", "Llama-3.1-8B"])  # with and without sliding-window layers
def test_decode_fast_path_equals_the_general_formula(name: str) -> None:
    model = StepTimeModel(get_model(name), H100)
    for b, kv in ((1, 10), (7, 7000), (300, 90000)):
        general = model.gpu_time(BatchShape.decode(b, kv))
        assert model.decode_step_time(b, kv) == max(general, model.cpu_time(BatchShape.decode(b, kv)))
        # A stretch's steps, each its context b tokens further, priced in one call.
        stretch = model.decode_step_times(b, kv, b, 5)
        for j, t in enumerate(stretch):
            shape = BatchShape.decode(b, kv + j * b)
            assert t == max(model.gpu_time(shape), model.cpu_time(shape))


def test_fp8_needs_hardware_with_fp8() -> None:
    with pytest.raises(ValueError, match="no FP8"):
        StepTimeModel(LLAMA8, get_hardware("a100-80gb"), runtime=RuntimeConfig(dtype="fp8"))
    with pytest.raises(ValueError, match="dtype"):
        RuntimeConfig(dtype="int3")


def test_memory_plan_subtracts_weights_activations_and_overhead() -> None:
    plan = plan_memory(LLAMA8, H100, ParallelConfig(), RuntimeConfig(), 16, 0.9, 8192, 256)
    assert plan.weight_bytes == pytest.approx(LLAMA8.num_params() * 2, rel=1e-9)
    kv = 0.9 * H100.memory_bytes - plan.weight_bytes - plan.activation_bytes - plan.non_torch_bytes
    assert plan.num_gpu_blocks == int(kv // (16 * LLAMA8.kv_bytes_per_token()))


def test_memory_plan_shards_weights_and_kv_heads_over_tp() -> None:
    llama70 = get_model("Llama-3.1-70B")
    assert weight_bytes_per_device(llama70, ParallelConfig(4), "bf16") == pytest.approx(
        llama70.num_params() * 2 / 4, rel=1e-9)
    with pytest.raises(ValueError, match="does not fit"):
        plan_memory(llama70, H100, ParallelConfig(1), RuntimeConfig(), 16, 0.9, 8192, 256)
    tp4 = plan_memory(llama70, H100, ParallelConfig(4), RuntimeConfig(), 16, 0.9, 8192, 256)
    assert tp4.bytes_per_block == 16 * llama70.kv_bytes_per_token() / 4


def test_fp8_kv_cache_doubles_capacity_per_byte() -> None:
    bf16 = plan_memory(LLAMA8, H100, ParallelConfig(), RuntimeConfig(), 16, 0.9, 8192, 256)
    fp8 = plan_memory(LLAMA8, H100, ParallelConfig(), RuntimeConfig(kv_cache_dtype="fp8"), 16, 0.9,
                      8192, 256)
    assert fp8.bytes_per_block == bf16.bytes_per_block / 2
    assert fp8.num_gpu_blocks in (2 * bf16.num_gpu_blocks, 2 * bf16.num_gpu_blocks + 1)


@pytest.mark.parametrize("cpu_step_s", [0.0, 0.5])
def test_async_scheduling_overlaps_cpu_on_a_step_with_prefill(cpu_step_s: float) -> None:
    # A mixed step (a 512-token prefill chunk beside 8 decodes) takes the
    # general path, not the decode fast path: its CPU work must overlap the
    # forward pass too. 0.5 s of CPU per step is far above the forward pass,
    # 0 far below it: both sides of the max are checked.
    shape = BatchShape(520, 9, 9, 8, 8 * 2000, 512, 512, 512 * 513 // 2)
    terms = {"cpu_step_s": cpu_step_s, "cpu_per_request_s": 1e-3}
    gpu = StepTimeModel(LLAMA8, H100, runtime=RuntimeConfig(async_scheduling=False, **terms)).gpu_time(shape)
    cpu = cpu_step_s + 9 * 1e-3
    overlap = StepTimeModel(LLAMA8, H100, runtime=RuntimeConfig(async_scheduling=True, **terms))
    sync = StepTimeModel(LLAMA8, H100, runtime=RuntimeConfig(async_scheduling=False, **terms))
    assert overlap.step_time(shape) == pytest.approx(max(gpu, cpu), rel=1e-12)
    assert sync.step_time(shape) == pytest.approx(gpu + cpu, rel=1e-12)


@pytest.mark.parametrize(("gpu", "cpu", "overlap", "expected"), [
    (3e-3, 1e-3, True, 3e-3), (1e-3, 3e-3, True, 3e-3),
    (3e-3, 1e-3, False, 4e-3), (1e-3, 3e-3, False, 4e-3)])
def test_combine_step_time(gpu: float, cpu: float, overlap: bool, expected: float) -> None:
    assert combine_step_time(gpu, cpu, overlap) == pytest.approx(expected, rel=1e-15)


# Qwen3-30B-A3B: 48 layers, hidden 2048, 32 query and 4 KV heads of 128,
# 128 experts of 768 (gate, up, down), vocabulary 151,936 untied, per-head
# q/k norms.
QWEN30_ATTENTION = 48 * (2 * 2048 * 32 * 128 + 2 * 2048 * 4 * 128)   # q, o; k, v
QWEN30_ROUTERS = 48 * 2048 * 128
QWEN30_EXPERTS = 48 * 128 * 3 * 2048 * 768
QWEN30_REST = 2 * 151_936 * 2048 + 48 * (2 * 2048 + 2 * 128) + 2048  # embeddings, norms


def test_weight_split_of_a_moe_over_tp_and_over_ep() -> None:
    qwen = get_model("Qwen3-30B-A3B")
    # MXFP4-style format over the routed experts only, TP2 without EP:
    # attention and routers 16-bit over TP, every expert split over TP.
    split = weight_split(qwen, ParallelConfig(2), "experts")
    assert (split.quantized, split.linear16, split.routed_experts) == (
        0, QWEN30_ATTENTION + QWEN30_ROUTERS, QWEN30_EXPERTS)
    assert split.sixteen_bit == QWEN30_ATTENTION + QWEN30_ROUTERS + QWEN30_REST
    assert (split.tensor_parallel_size, split.expert_shards, split.experts_quantized) == (2, 2, True)
    assert split.bytes_per_device(1.0) == pytest.approx(
        (QWEN30_ATTENTION + QWEN30_ROUTERS + QWEN30_REST) * 2 / 2 + QWEN30_EXPERTS / 2, rel=1e-15)
    # TP2 x DP2 with expert parallelism: whole experts over the 4 ranks.
    ep = weight_split(qwen, ParallelConfig(2, 2, True), "all")
    assert (ep.quantized, ep.linear16, ep.expert_shards) == (QWEN30_ATTENTION, QWEN30_ROUTERS, 4)
    assert ep.bytes_per_device(1.0) == pytest.approx(
        ((QWEN30_ROUTERS + QWEN30_REST) * 2 + QWEN30_ATTENTION) / 2 + QWEN30_EXPERTS / 4, rel=1e-15)
    assert weight_bytes_per_device(qwen, ParallelConfig(2, 2, True), "fp8") == ep.bytes_per_device(1.0)
    # The step time reads the same split: per-device linear weights.
    sm = StepTimeModel(qwen, H100, ParallelConfig(2, 2, True), RuntimeConfig(dtype="fp8"))
    assert (sm.dense_params, sm.dense16_params, sm.expert_shards) == (
        QWEN30_ATTENTION / 2, QWEN30_ROUTERS / 2, 4)


def _learned(kind: str) -> dict[str, float]:
    """A kind's learned factors as the shipped file holds them (pooled, or Hopper's)."""
    data = json.loads(DEFAULT_FILE.read_text())
    return data["factors"].get("hopper", {}).get(kind) or data["factors"]["pooled"][kind]


def test_catalog_h100_decode_of_one_reads_the_learned_attention_factors() -> None:
    # The catalog's H100 (no override) is priced with the factors
    # benchmarks/fit_roofline.py learned from the measured tables: decode
    # attention at its learned bandwidth plus its learned latency per layer,
    # the 16-bit GEMMs (not shipped: today's factors won) at the catalog's
    # weight bandwidth, 3 us per elementwise kernel and per GEMM.
    catalog = get_hardware("h100-sxm")
    model = StepTimeModel(LLAMA8, catalog, runtime=NO_CPU)
    assert model.factors.learned_kinds >= {"attention_decode", "attention_prefill"}
    assert "gemm_bf16" not in model.factors.learned_kinds
    decode = _learned("attention_decode")
    weights = (LLAMA8.num_params() - LLAMA8.embedding_params()) * 2
    kv = 1000 * LLAMA8.kv_bytes_per_token()
    L = LLAMA8.num_layers
    expected = (weights / (catalog.mem_bw * catalog.weight_bw_frac)
                + kv / (catalog.mem_bw * decode["bw_eff"])
                + L * (3 * 3e-6 + 4 * 3e-6) + L * decode["latency_s"])
    assert model.gpu_time(BatchShape.decode(1, 1000)) == pytest.approx(expected, rel=1e-3)
    # Slower than the roofline on the hardware's factors, as the tables are.
    assert model.gpu_time(BatchShape.decode(1, 1000)) > \
        StepTimeModel(LLAMA8, H100, runtime=NO_CPU).gpu_time(BatchShape.decode(1, 1000))


def test_a_mixed_step_pays_both_attention_latencies_once_per_layer() -> None:
    catalog = get_hardware("h100-sxm")
    model = StepTimeModel(LLAMA8, catalog, runtime=NO_CPU)
    L = LLAMA8.num_layers
    decode_only = model._attention_time(BatchShape.decode(4, 4000))
    mixed = BatchShape(4 + 64, 5, 5, 4, 4000, 64, 64, 64 * 65 // 2)
    prefill_part = model._attention_layer(0, 64, 64 * 65 // 2) * L
    assert model._attention_time(mixed) == pytest.approx(
        decode_only + prefill_part + L * _learned("attention_prefill")["latency_s"], rel=1e-12)


def test_a_hardware_file_or_an_override_keeps_its_own_efficiencies() -> None:
    own = StepTimeModel(LLAMA8, H100)
    assert own.factors.learned_kinds == frozenset()
    assert own.describe_backend() == "roofline (efficiencies: hardware efficiencies; no host terms)"
    assert own.decode_attn_bw == H100.mem_bw * H100.attn_bw_frac
    learned = StepTimeModel(LLAMA8, get_hardware("h100-sxm"))
    assert "learned from vLLM 0.24.0 kernel tables" in learned.describe_backend()
