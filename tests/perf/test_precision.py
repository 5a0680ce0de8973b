"""Weight formats beyond 16/8 bits (NVFP4, MXFP4, int4): bytes per weight,
which layers a checkpoint quantizes, the FLOP rate each runs at, the
measured tables each reads, the checkpoints that carry them, and the two
catalog models added for them (MiniMax-M2.5, Kimi-K2.5).

Expected values are written by hand from the sources named next to them
(aiconfigurator-core 0.12's model_configs/ and vLLM 0.24.0 parquet tables,
OpenAI's gpt-oss model card), not computed by the code under test.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvsched.perf import get_hardware, get_model
from kvsched.perf.checkpoint_format import CheckpointFormat, quantizes
from kvsched.perf.kernels import GEMM_DTYPES, MOE_DTYPES, MoeKey, load_tables
from kvsched.perf.measured import MeasuredStepTimeModel, RooflineGemm
from kvsched.perf.memory import weight_bytes_per_device
from kvsched.perf.model_catalog import MODELS, catalog_match
from kvsched.perf.roofline_factors import DEFAULT_FILE
from kvsched.perf.step_time import (
    DTYPE_BYTES,
    ParallelConfig,
    RuntimeConfig,
    StepTimeModel,
    math_dtype,
    model_dtype,
)
from kvsched.sim.deployment import (
    QUANTIZATIONS,
    EngineOptions,
    build_deployment,
    validate_engine_options,
    weight_format,
)

H100 = get_hardware("h100-sxm")
H200 = get_hardware("h200")
B200 = get_hardware("b200")
GIB = 2**30


# -- bytes and layers -----------------------------------------------------------


def test_bytes_per_weight_include_the_scales() -> None:
    assert DTYPE_BYTES["nvfp4"] == 0.5625    # 4 bits + one 8-bit scale per 16
    assert DTYPE_BYTES["mxfp4"] == 0.53125   # 4 bits + one 8-bit scale per 32
    assert DTYPE_BYTES["int4"] == 0.5625     # 4 bits + one 16-bit scale per 32


@pytest.mark.parametrize(("layers", "expected"), [
    ("all", (True, True, True, True)),
    ("mlp", (False, True, True, True)),
    ("experts", (False, False, False, True)),
])
def test_which_linear_layers_a_scope_quantizes(layers: str, expected: tuple[bool, ...]) -> None:
    parts = ("attention", "dense_mlp", "shared_experts", "routed_experts")
    assert tuple(quantizes(layers, p) for p in parts) == expected
    with pytest.raises(ValueError, match="quantized_layers='half'"):
        quantizes("half", "attention")
    with pytest.raises(ValueError, match="quantized_layers='half'"):
        RuntimeConfig(quantized_layers="half")


def test_gpt_oss_mxfp4_weights_match_the_model_card_checkpoint_sizes() -> None:
    # OpenAI's gpt-oss model card: checkpoints of 60.8 GiB (120b) and 12.8 GiB
    # (20b), MXFP4 experts and everything else in BF16.
    big = weight_bytes_per_device(get_model("gpt-oss-120b"), ParallelConfig(), "mxfp4", "experts")
    small = weight_bytes_per_device(get_model("gpt-oss-20b"), ParallelConfig(), "mxfp4", "experts")
    assert big / GIB == pytest.approx(60.8, rel=2e-3)
    assert small / GIB == pytest.approx(12.8, rel=5e-3)


def test_only_the_quantized_layers_take_the_quantized_bytes() -> None:
    kimi = get_model("moonshotai/Kimi-K2.5")
    # 60 MoE layers x 384 experts x (gate, up, down of 7168 x 2048)
    experts = 60 * 384 * 3 * 7168 * 2048
    int4 = weight_bytes_per_device(kimi, ParallelConfig(8), "int4", "experts")
    assert int4 == pytest.approx(((kimi.num_params() - experts) * 2 + experts * 0.5625) / 8, rel=1e-12)
    minimax = get_model("MiniMaxAI/MiniMax-M2.5")
    # 62 layers of q (3072 x 6144), k and v (3072 x 1024 each), o (6144 x 3072)
    attention = 62 * (3072 * 6144 + 2 * 3072 * 1024 + 6144 * 3072)
    every = weight_bytes_per_device(minimax, ParallelConfig(), "nvfp4", "all")
    mlp = weight_bytes_per_device(minimax, ParallelConfig(), "nvfp4", "mlp")
    assert mlp - every == pytest.approx(attention * (2 - 0.5625), rel=1e-9)


# -- FLOP rates -------------------------------------------------------------------


def test_fp4_peaks_are_aiconfigurators() -> None:
    # systems/b200_sxm.yaml fp4_tc_flops 9000e12; gb200.yaml 10e15; Hopper has none.
    assert B200.fp4_flops == 9000e12 and B200.has_fp4
    assert get_hardware("gb200").fp4_flops == 10000e12
    assert H100.fp4_flops is None and not H100.has_fp4


@pytest.mark.parametrize(("dtype", "hardware", "math"), [
    ("nvfp4", "b200", "fp4"),     # W4A4 on FP4 tensor cores
    ("nvfp4", "h100-sxm", "bf16"),  # Marlin: 4-bit weights, 16-bit math
    ("mxfp4", "b200", "bf16"),    # FlashInfer MXFP4 x BF16, vLLM's Blackwell default
    ("mxfp4", "h100-sxm", "bf16"),
    ("int4", "h200", "bf16"),
    ("fp8_block", "h100-sxm", "fp8"),
    ("bf16", "b200", "bf16"),
])
def test_math_each_format_runs_in(dtype: str, hardware: str, math: str) -> None:
    assert math_dtype(dtype, get_hardware(hardware)) == math


def _learned_fp8_flops_eff() -> float:
    """FP8 GEMMs' FLOP efficiency as the shipped factors file holds it (FP4 takes FP8's)."""
    return float(json.loads(DEFAULT_FILE.read_text())["factors"]["pooled"]["gemm_fp8"]["flops_eff"])


def test_the_roofline_prices_nvfp4_at_the_fp4_rate_on_blackwell_only() -> None:
    llama = get_model("Llama-3.1-70B")
    # The hardware's own efficiencies (a copy under another id: no learned factors) ...
    b200 = StepTimeModel(llama, dataclasses.replace(B200, id="b200-own"),
                         runtime=RuntimeConfig(dtype="nvfp4"))
    assert b200.lin_flops == pytest.approx(9000e12 * 0.47)       # B200 fp8_gemm_mfu 0.47
    assert b200.weight_bytes == 0.5625 and b200.dense16_params == 0
    h100 = StepTimeModel(llama, H100, runtime=RuntimeConfig(dtype="nvfp4"))
    assert h100.lin_flops == pytest.approx(989.4e12 * 0.79)      # H100 bf16 x gemm_mfu 0.79
    # ... and the catalog's B200, at the FP8 GEMM efficiency learned from the tables.
    learned = StepTimeModel(llama, B200, runtime=RuntimeConfig(dtype="nvfp4"))
    assert learned.lin_flops == pytest.approx(9000e12 * _learned_fp8_flops_eff())


def test_mxfp4_experts_leave_attention_and_router_16_bit() -> None:
    oss = get_model("gpt-oss-120b")
    sm = StepTimeModel(oss, H100, runtime=RuntimeConfig(dtype="mxfp4", quantized_layers="experts"))
    # q 2880 x 4096 (+bias), k, v 2880 x 512 (+bias), o 4096 x 2880 (+bias); router 2880 x 128 + 128
    attention = 2880 * 4096 + 4096 + 2 * (2880 * 512 + 512) + 4096 * 2880 + 2880
    router = 2880 * 128 + 128
    assert sm.dense_params == 0
    assert sm.dense16_params == 36 * (attention + router)
    # Decode of one token, memory bound: 4 experts of (3 x 2880 x 2880 + 3 x 2880) per layer at
    # 0.53125 bytes, read at H100's 3.35 TB/s x 0.87 (the hardware's own factors, on a renamed copy) ...
    weights = 4 * (3 * 2880 * 2880 + 3 * 2880) * 0.53125
    own = StepTimeModel(oss, dataclasses.replace(H100, id="h100-own"),
                        runtime=RuntimeConfig(dtype="mxfp4", quantized_layers="experts"))
    assert own._routed_expert_time(1, 1) == pytest.approx(weights / (3.35e12 * 0.87), rel=1e-9)
    # ... and for the catalog's H100 at the 16-bit-math MoE factors learned from
    # Hopper's fused-MoE tables, plus their latency per layer.
    moe = json.loads(DEFAULT_FILE.read_text())["factors"]["hopper"]["moe_bf16"]
    assert sm._routed_expert_time(1, 1) == pytest.approx(
        weights / (3.35e12 * moe["bw_eff"]) + moe["latency_s"], rel=1e-9)


def test_nvfp4_mlp_checkpoint_runs_experts_at_fp4_and_attention_at_bf16() -> None:
    sm = StepTimeModel(get_model("MiniMax-M2.5"), B200,
                       runtime=RuntimeConfig(dtype="nvfp4", quantized_layers="mlp"))
    # FP4 experts take the FP8 MoE factors: the fit did not ship them (they
    # lost to the catalog's on the B200 held out), so B200's fp8_gemm_mfu 0.47.
    assert "moe_fp8" not in json.loads(DEFAULT_FILE.read_text())["factors"]["pooled"]
    assert sm.expert_flops == pytest.approx(9000e12 * 0.47)
    assert sm.expert_bytes == 0.5625
    assert sm.dense_params == 0
    # qkv, o, router and its score-correction bias
    assert sm.dense16_params == 62 * (3072 * 8192 + 6144 * 3072 + 3072 * 256 + 256)


# -- measured tables ------------------------------------------------------------


def test_table_names_of_each_format() -> None:
    assert GEMM_DTYPES["nvfp4"] == "nvfp4" and "mxfp4" not in GEMM_DTYPES and "int4" not in GEMM_DTYPES
    assert (MOE_DTYPES["nvfp4"], MOE_DTYPES["mxfp4"], MOE_DTYPES["int4"]) == (
        "nvfp4", "w4a16_mxfp4", "int4_wo")


def test_nvfp4_gemms_come_from_the_b200_table() -> None:
    # b200_sxm gemm_perf.parquet, gemm_dtype nvfp4, n 8192 k 8192 (Llama-3.1-70B's o_proj at TP1):
    # m 64 0.012880 ms, m 1024 0.041525 ms (FlashInferCuteDslNvFp4LinearKernel).
    sm = MeasuredStepTimeModel(get_model("Llama-3.1-70B"), B200, runtime=RuntimeConfig(dtype="nvfp4"))
    o_proj = sm._gemms[1][0]
    assert o_proj(64) == pytest.approx(0.012879999975363413e-3, rel=1e-9)
    assert o_proj(1024) == pytest.approx(0.04152533411979675e-3, rel=1e-9)
    assert sm.roofline_parts == []


def test_block_fp8_gemms_read_the_per_tensor_fp8_table() -> None:
    # b200_sxm gemm_perf.parquet, n 2048 k 3072 (MiniMax-M2.5's qkv at TP4), m 4:
    # fp8 (CutlassFP8ScaledMMLinearKernel) 0.0072756 ms; fp8_block 0.169696 ms, the block
    # table's eager per-call floor that CUDA graphs do not pay.
    sm = MeasuredStepTimeModel(get_model("MiniMax-M2.5"), B200, ParallelConfig(4),
                               RuntimeConfig(dtype="fp8_block"))
    qkv = sm._gemms[0][0]
    assert qkv(4) == pytest.approx(0.007275555696752336e-3, rel=1e-9)
    assert GEMM_DTYPES["fp8_block"] == "fp8" and MOE_DTYPES["fp8_block"] == "fp8_block"


def test_nvfp4_gemms_off_blackwell_fall_back_to_the_roofline_and_say_so() -> None:
    sm = MeasuredStepTimeModel(get_model("Llama-3.1-70B"), H100, runtime=RuntimeConfig(dtype="nvfp4"))
    assert sm.roofline_parts == ["attention, dense mlp GEMMs (no measured nvfp4 GEMMs on h100_sxm)"]
    o_proj = sm._gemms[1][0]
    assert isinstance(o_proj, RooflineGemm)
    # 8192 x 8192 weights at 0.5625 bytes over 3.35 TB/s x 0.87, plus 3 us per kernel
    assert o_proj(1) == pytest.approx(8192 * 8192 * 0.5625 / (3.35e12 * 0.87) + 3e-6, rel=1e-9)
    assert "roofline for attention, dense mlp GEMMs" in sm.describe_backend()


@pytest.mark.parametrize(("model", "hardware", "tp", "runtime", "tokens", "ms"), [
    # moe_perf.parquet rows (vLLM 0.24.0, power_law_1.01, moe_ep 1):
    # gpt-oss-120b w4a16_mxfp4 2880/2880/top-4/128 experts, moe_tp 4 (triton mxfp4 on H100)
    ("gpt-oss-120b", "h100-sxm", 4, RuntimeConfig(dtype="mxfp4", quantized_layers="experts"), 64,
     0.1672767996788025),
    # same on B200 (flashinfer_trtllm_mxfp4_bf16)
    ("gpt-oss-120b", "b200", 4, RuntimeConfig(dtype="mxfp4", quantized_layers="experts"), 1,
     0.01852159947156906),
    # MiniMax-M2.5 nvfp4 3072/1536/top-8/256 experts, moe_tp 1
    ("MiniMax-M2.5", "b200", 1, RuntimeConfig(dtype="nvfp4", kv_cache_dtype="fp8", quantized_layers="mlp"),
     256, 0.28312320709228517),
    # MiniMax-M2.5 fp8_block, moe_tp 4
    ("MiniMax-M2.5", "b200", 4, RuntimeConfig(dtype="fp8_block"), 1024, 0.31768319606781004),
])
def test_routed_experts_come_from_the_formats_moe_table(model: str, hardware: str, tp: int,
                                                        runtime: RuntimeConfig, tokens: int,
                                                        ms: float) -> None:
    sm = MeasuredStepTimeModel(get_model(model), get_hardware(hardware), ParallelConfig(tp), runtime)
    assert sm._moe is not None and sm.roofline_parts == []
    assert sm._moe(tokens) == pytest.approx(ms * 1e-3, rel=1e-9)
    # the attention GEMMs stay on the 16-bit table unless the format covers them
    qkv = sm._gemms[0][0]
    assert not isinstance(qkv, RooflineGemm)


def test_kimi_int4_experts_have_a_table() -> None:
    # h200_sxm int4_wo 7168/2048/top-8/384 experts, moe_tp 8: 128 tokens 0.399002 ms (Marlin).
    curve = load_tables("h200_sxm").moe(MoeKey(MOE_DTYPES["int4"], 7168, 2048, 8, 384, 8, 1))
    assert curve is not None and curve(128) == pytest.approx(0.3990015983581543e-3, rel=1e-9)


def test_nvfp4_experts_off_blackwell_are_roofline() -> None:
    sm = MeasuredStepTimeModel(get_model("MiniMax-M2.5"), H200, ParallelConfig(4),
                               RuntimeConfig(dtype="nvfp4", quantized_layers="mlp"))
    assert len(sm.roofline_parts) == 1 and "routed experts (no measured" in sm.roofline_parts[0]


# -- checkpoints and --quantization -------------------------------------------


@pytest.mark.parametrize(("name", "base", "fmt"), [
    ("openai/gpt-oss-120b", "openai/gpt-oss-120b", CheckpointFormat("mxfp4", None, "experts")),
    ("gpt-oss-20b", "openai/gpt-oss-20b", CheckpointFormat("mxfp4", None, "experts")),
    ("MiniMaxAI/MiniMax-M2.5", "MiniMaxAI/MiniMax-M2.5", CheckpointFormat("fp8_block")),
    ("nvidia/MiniMax-M2.5-NVFP4", "MiniMaxAI/MiniMax-M2.5", CheckpointFormat("nvfp4", "fp8", "mlp")),
    ("moonshotai/Kimi-K2.5", "moonshotai/Kimi-K2.5", CheckpointFormat("int4", None, "experts")),
    ("nvidia/Kimi-K2.5-NVFP4", "moonshotai/Kimi-K2.5", CheckpointFormat("nvfp4", "fp8", "mlp")),
    ("nvidia/Llama-3.1-70B-Instruct-FP4", "meta-llama/Llama-3.1-70B", CheckpointFormat("nvfp4", "fp8")),
    ("nvidia/Qwen3-235B-A22B-NVFP4", "Qwen/Qwen3-235B-A22B", CheckpointFormat("nvfp4", "fp8")),
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B", None),
    # DeepSeek publishes V3, V3.1 and R1 in block FP8 (config.json: quant_method
    # fp8, weight_block_size [128, 128]); -BF16 names a 16-bit conversion.
    ("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3", CheckpointFormat("fp8_block")),
    ("deepseek-ai/DeepSeek-V3.1", "deepseek-ai/DeepSeek-V3.1", CheckpointFormat("fp8_block")),
    ("DeepSeek-R1", "deepseek-ai/DeepSeek-R1", CheckpointFormat("fp8_block")),
    ("deepseek-ai/DeepSeek-V3-BF16", "deepseek-ai/DeepSeek-V3", CheckpointFormat("bf16")),
])
def test_checkpoint_formats(name: str, base: str, fmt: CheckpointFormat | None) -> None:
    assert catalog_match(name) == (base, fmt)


def test_someone_elses_fp4_name_is_not_guessed() -> None:
    assert catalog_match("someone/Llama-3.1-8B-FP4") is None


def test_quantization_accepts_vllms_method_names() -> None:
    assert QUANTIZATIONS == ("fp8", "modelopt_fp4", "mxfp4")
    assert weight_format(EngineOptions(model="Llama-3.1-70B", quantization="modelopt_fp4")) == (
        CheckpointFormat("nvfp4"))
    # naming the checkpoint's own method keeps its layers and KV format
    assert weight_format(EngineOptions(model="openai/gpt-oss-120b", quantization="mxfp4")) == (
        CheckpointFormat("mxfp4", None, "experts"))
    assert weight_format(EngineOptions(model="nvidia/MiniMax-M2.5-NVFP4", quantization="modelopt_fp4")) == (
        CheckpointFormat("nvfp4", "fp8", "mlp"))
    assert weight_format(EngineOptions(model="MiniMaxAI/MiniMax-M2.5", quantization="fp8")) == (
        CheckpointFormat("fp8_block"))
    # vLLM's mxfp4 method quantizes fused-MoE experts only
    assert weight_format(EngineOptions(model="Qwen3-30B-A3B", quantization="mxfp4")) == (
        CheckpointFormat("mxfp4", None, "experts"))
    with pytest.raises(ValueError, match=r"quantization='mxfp4' \(--quantization\): mxfp4 quantizes "
                                         "MoE experts only and meta-llama/Llama-3.1-8B is dense"):
        build_deployment(EngineOptions(model="Llama-3.1-8B", quantization="mxfp4"))
    with pytest.raises(ValueError, match="quantization='awq'"):
        build_deployment(EngineOptions(quantization="awq"))


def test_a_deployment_carries_the_checkpoints_format() -> None:
    d = build_deployment(EngineOptions(model="nvidia/MiniMax-M2.5-NVFP4", hardware="b200",
                                       max_model_len=8192))
    assert (d.runtime.dtype, d.runtime.quantized_layers, d.runtime.kv_cache_dtype) == ("nvfp4", "mlp", "fp8")
    assert d.step_model.backend == "measured"
    assert "(nvfp4)" in d.describe()


# -- catalog ----------------------------------------------------------------------


def test_minimax_m2_5_is_its_config_json() -> None:
    # aiconfigurator-core model_configs/MiniMaxAI--MiniMax-M2.5_config.json
    m = MODELS["MiniMaxAI/MiniMax-M2.5"]
    assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim) == (62, 3072, 48, 8, 128)
    assert (m.num_experts, m.experts_per_token, m.moe_intermediate_size) == (256, 8, 1536)
    assert (m.vocab_size, m.max_position_embeddings, m.tie_word_embeddings) == (200064, 196608, False)
    assert (m.intermediate_size, m.num_shared_experts, m.first_k_dense_layers) == (0, 0, 0)
    assert m.qk_norm and m.router_bias and not m.is_mla
    assert m.kv_bytes_per_token() == 62 * 2 * 8 * 128 * 2
    # MiniMax's published size: 229 B parameters (about 10 B active, embeddings excluded)
    assert m.num_params() / 1e9 == pytest.approx(229, rel=0.01)


def test_kimi_k2_5_is_its_config_json() -> None:
    # model_configs/moonshotai--Kimi-K2.5_config.json, text_config
    m = MODELS["moonshotai/Kimi-K2.5"]
    assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads) == (61, 7168, 64, 64)
    assert (m.num_experts, m.experts_per_token, m.moe_intermediate_size, m.num_shared_experts) == (
        384, 8, 2048, 1)
    assert (m.first_k_dense_layers, m.intermediate_size, m.vocab_size) == (1, 18432, 163840)
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (
        1536, 512, 128, 64, 128)
    assert m.max_position_embeddings == 262144 and m.router_bias
    assert m.kv_bytes_per_token() == 61 * 576 * 2
    # Moonshot's published size: 1 T parameters, 32 B active (the text model)
    assert m.num_params() / 1e12 == pytest.approx(1.03, rel=0.01)
    assert m.active_params_per_token() / 1e9 == pytest.approx(32.9, rel=0.01)


# -- --dtype: vLLM's model dtype, never a weight format ------------------------


@pytest.mark.parametrize(("value", "expected"), [
    ("auto", "bf16"), ("bfloat16", "bf16"), ("bf16", "bf16"), ("half", "fp16"), ("float16", "fp16"),
    ("fp16", "fp16"), ("BFloat16", "bf16")])
def test_dtype_takes_vllms_model_dtypes(value: str, expected: str) -> None:
    assert model_dtype(value) == expected
    validate_engine_options(EngineOptions(dtype=value))
    assert weight_format(EngineOptions(dtype=value)) == CheckpointFormat(expected)


@pytest.mark.parametrize("value", ["int4", "nvfp4", "mxfp4", "fp8", "fp8_block", "fp8_e4m3"])
def test_dtype_refuses_a_weight_format(value: str) -> None:
    # Before: --dtype nvfp4 on a dense model was accepted and halved its TPOT.
    with pytest.raises(ValueError, match=rf"dtype='{value}' \(--dtype\): {value} is a weight "
                                         r"quantization.*--quantization"):
        build_deployment(EngineOptions(model="Llama-3.1-8B", dtype=value))


@pytest.mark.parametrize(("value", "match"), [
    ("float32", r"dtype='float32' \(--dtype\): kvsched prices 16-bit models only"),
    ("float", r"dtype='float' \(--dtype\): kvsched prices 16-bit"),
    ("int3", r"dtype='int3' \(--dtype\): unknown model dtype; use one of auto, bfloat16")])
def test_dtype_refuses_what_kvsched_cannot_price(value: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        validate_engine_options(EngineOptions(dtype=value))


@pytest.mark.parametrize("name", ["deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3.1",
                                  "deepseek-ai/DeepSeek-R1"])
def test_deepseek_is_priced_in_its_checkpoints_fp8_and_fits_8_h200s(name: str) -> None:
    # 671 B parameters: 16-bit they are ~1.34 TB, over 8 x 141 GB; in FP8
    # (the checkpoint's own format, no --quantization needed) ~84 GB per GPU.
    d = build_deployment(EngineOptions(model=name, hardware="h200", tensor_parallel_size=8,
                                       max_model_len=8192))
    assert (d.runtime.dtype, d.runtime.quantized_layers) == ("fp8_block", "all")
    assert 80e9 < d.memory.weight_bytes < 90e9
    same = build_deployment(EngineOptions(model=name, hardware="h200", tensor_parallel_size=8,
                                          max_model_len=8192, quantization="fp8"))
    assert same.memory == d.memory
    with pytest.raises(ValueError, match="does not fit"):
        build_deployment(EngineOptions(model=f"{name}-BF16", hardware="h200", tensor_parallel_size=8,
                                       max_model_len=8192))
