"""The measured step-time backend: its figures against aiconfigurator's own
engine on the same tables, exactness for fast-forward, what it reports, and
how a deployment picks it."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.cli import main
from kvsched.perf import get_hardware, get_model
from kvsched.perf.host import NO_HOST_TIME
from kvsched.perf.kernels import AttentionKey, MlaKey, MoeKey, aic_data_dir
from kvsched.perf.measured import MeasuredStepTimeModel, measured_coverage
from kvsched.perf.step_time import BatchShape, ParallelConfig, RuntimeConfig, StepTimeModel
from kvsched.sim.deployment import EngineOptions, build_deployment

H100 = get_hardware("h100-sxm")
LLAMA_8B = MeasuredStepTimeModel(get_model("Llama-3.1-8B"), H100)
GPT_OSS = MeasuredStepTimeModel(get_model("gpt-oss-120b"), H100,
                                runtime=RuntimeConfig(dtype="mxfp4", quantized_layers="experts"))


def test_llama_70b_fp8_tp4_matches_aiconfigurators_engine_on_the_same_tables() -> None:
    # aiconfigurator-core 0.12's EngineHandle on h100_sxm / vLLM 0.24.0,
    # Meta-Llama-3.1-70B, fp8 GEMMs, TP4, bf16 KV: decode_step_latency(64,
    # 1024, 2) = 14.656 ms (KV 1026 per sequence), predict_prefill_latency(1,
    # 1024) = 57.527 ms. Its composition differs in small terms (embedding,
    # 13 µs per context-attention call), so within a few per cent.
    # Kernels only: aiconfigurator's engine adds no host time either.
    sm = MeasuredStepTimeModel(get_model("Llama-3.1-70B"), H100, ParallelConfig(4),
                               RuntimeConfig(dtype="fp8"), host=NO_HOST_TIME)
    decode = sm.gpu_time(BatchShape.decode(64, 64 * 1026))
    prefill = sm.gpu_time(BatchShape(1024, 1, 1, 0, 0, 1024, 1024, 1024 * 1025 // 2))
    assert decode == pytest.approx(14.656e-3, rel=0.02)
    assert prefill == pytest.approx(57.527e-3, rel=0.04)
    # And the roofline on the hardware's own efficiencies (a copy of the
    # catalog entry under another id: not the catalog's, so no learned factors), for
    # contrast, is well below both (issue 21's finding) ...
    own = dataclasses.replace(H100, id="h100-own")
    roof = StepTimeModel(get_model("Llama-3.1-70B"), own, ParallelConfig(4), RuntimeConfig(dtype="fp8"))
    assert roof.gpu_time(BatchShape.decode(64, 64 * 1026)) < 0.85 * decode
    assert roof.gpu_time(BatchShape(1024, 1, 1, 0, 0, 1024, 1024, 1024 * 1025 // 2)) < 0.9 * prefill
    # ... while the roofline with the factors learned from the tables
    # (kvsched/perf/data/roofline_factors_vllm-0.24.json) lands within 2 % of
    # aiconfigurator's decode (14.81 ms) and 13 % above its prefill (64.8 ms).
    learned = StepTimeModel(get_model("Llama-3.1-70B"), H100, ParallelConfig(4), RuntimeConfig(dtype="fp8"))
    assert learned.gpu_time(BatchShape.decode(64, 64 * 1026)) == pytest.approx(14.656e-3, rel=0.02)
    assert learned.gpu_time(BatchShape(1024, 1, 1, 0, 0, 1024, 1024, 1024 * 1025 // 2)) == \
        pytest.approx(57.527e-3, rel=0.15)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(1, 600), st.integers(0, 2_000_000), st.integers(1, 4), st.integers(1, 40))
def test_a_stretch_prices_each_step_as_stepping_does(num_reqs: int, extra_kv: int, per_step: int,
                                                     count: int) -> None:
    _check_stretch(LLAMA_8B, num_reqs, extra_kv, per_step, count)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.integers(1, 600), st.integers(0, 2_000_000), st.integers(0, 4), st.integers(1, 40))
def test_a_sliding_window_stretch_prices_each_step_as_stepping_does(num_reqs: int, extra_kv: int,
                                                                    per_step: int, count: int) -> None:
    # gpt-oss-120b: half its layers windowed, so the stretch reads two curves.
    _check_stretch(GPT_OSS, num_reqs, extra_kv, per_step, count)


def _check_stretch(sm: StepTimeModel, num_reqs: int, extra_kv: int, per_step: int, count: int) -> None:
    # Fast-forward is exact only if a stretch's step times are the very
    # floats step_time gives each step on its own.
    first = num_reqs + extra_kv
    stretch = sm.decode_step_times(num_reqs, first, num_reqs * per_step, count)
    single = [sm.step_time(BatchShape.decode(num_reqs, first + j * num_reqs * per_step))
              for j in range(count)]
    assert stretch == single


def test_queries_past_the_tables_are_recorded() -> None:
    sm = MeasuredStepTimeModel(get_model("Llama-3.1-8B"), H100)
    sm.extrapolated.clear()
    sm.gpu_time(BatchShape(40_000, 1, 1, 0, 0, 40_000, 40_000, 40_000 * 40_001 // 2))
    assert any("GEMM m=40000" in n for n in sm.extrapolated)
    assert any("context attention" in n for n in sm.extrapolated)
    sm.gpu_time(BatchShape.decode(8, 8 * 500_000))
    assert any("generation attention batch 8" in n for n in sm.extrapolated)
    assert "past the tables" in sm.describe_backend()


def test_moe_experts_come_from_the_fused_moe_table() -> None:
    # Qwen3-30B-A3B, bf16, experts over 2 DP ranks (EP 2): the table's
    # triton fused-MoE kernel, power-law routing: 64 tokens 0.216922 ms,
    # 80 tokens 0.239578 ms (h100_sxm, vLLM 0.24.0).
    sm = MeasuredStepTimeModel(get_model("Qwen3-30B-A3B"), H100,
                               ParallelConfig(1, 2, enable_expert_parallel=True))
    assert sm.roofline_parts == ["all-to-all (no measured DeepEP over 2 GPUs for 128 experts, top-8, "
                                 "hidden 2048 on h100_sxm)"]
    assert sm._moe is not None
    assert sm._moe(64) == pytest.approx(0.216922e-3, rel=1e-4)
    assert sm._moe(72) == pytest.approx((0.216922 + 0.239578) / 2 * 1e-3, rel=1e-4)
    # Sharded experts see both ranks' tokens: 32 here and 32 there.
    router_and_shared = sum(c(32) for c in sm._moe_gemms)
    assert sm._moe_time(32, 64) == pytest.approx(router_and_shared + 0.216922e-3, rel=1e-4)
    assert "roofline for all-to-all" in sm.describe_backend()


# -- MLA (Kimi-K2.5, DeepSeek-V3) ---------------------------------------------------

B200 = get_hardware("b200")
KIMI = get_model("moonshotai/Kimi-K2.5")
# Kimi-K2.5 as NVIDIA's NVFP4 checkpoint serves it: 4-bit experts, 16-bit
# attention, FP8 KV cache.
KIMI_FP4 = RuntimeConfig(dtype="nvfp4", quantized_layers="experts", kv_cache_dtype="fp8")
KIMI_TP8 = MeasuredStepTimeModel(KIMI, B200, ParallelConfig(8), KIMI_FP4, host=NO_HOST_TIME)
MLA_GEN = "mla/vllm/0.24.0/mla_generation_module_perf.parquet"
MLA_CTX = "mla/vllm/0.24.0/mla_context_module_perf.parquet"


def _raw(system: str, rel: str, **where: object) -> list[dict[str, Any]]:
    """Rows of an aiconfigurator-core table, read with pyarrow alone."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    rows: list[dict[str, Any]] = pq.read_table(aic_data_dir() / system / rel).to_pylist()
    return [r for r in rows if all(r[c] == v for c, v in where.items())]


def test_coverage_accepts_kimi_and_deepseek_where_the_mla_modules_have_their_heads() -> None:
    assert measured_coverage(KIMI, B200, ParallelConfig(8), KIMI_FP4) is None
    assert KIMI_TP8.roofline_parts == []
    deepseek, h200 = get_model("deepseek-ai/DeepSeek-V3"), get_hardware("h200")
    for tp in (1, 2, 4, 8):
        assert measured_coverage(deepseek, h200, ParallelConfig(tp), RuntimeConfig(dtype="fp8_block")) is None
    # The modules time DeepSeek-V3's latent (512 + 64): another one is refused.
    other = dataclasses.replace(KIMI, kv_lora_rank=256)
    reason = measured_coverage(other, B200, ParallelConfig(8), KIMI_FP4)
    assert reason is not None and "DeepSeek-V3's (512 + 64" in reason
    assert measured_coverage(KIMI, B200, ParallelConfig(3), KIMI_FP4) == (
        "64 heads (64 KV) do not split over TP 3")


def test_mla_blocks_match_aiconfigurators_engine_on_the_same_tables() -> None:
    # aiconfigurator-core 0.12's EngineHandle, moonshotai/Kimi-K2.5 on
    # b200_sxm / vLLM 0.24.0, TP 8, bf16 attention GEMMs, nvfp4 MoE, fp8 KV,
    # run_static_per_op(batch_size=16, isl=1024, osl=2): generation_mla_block
    # 2.4278 ms, context_mla_block 38.2104 ms (its MLAModule rows, 61 layers).
    # Here: the block's projections at the step's tokens plus the modules'
    # attention part, which give the module back at these shapes.
    sm = KIMI_TP8
    projections = sm._gemms[:3]
    decode = BatchShape.decode(16, 16 * 1025)
    mla = sum(c(16) * n for c, n in projections) + sm._attention_time(decode)
    assert mla == pytest.approx(2.4278e-3, rel=1e-6)
    T = 16 * 1024
    prefill = BatchShape(T, 16, 16, 0, 0, T, T, 16 * 1024 * 1025 // 2)
    mla = sum(c(T) * n for c, n in projections) + sm._attention_time(prefill)
    assert mla == pytest.approx(38.2104e-3, rel=1e-6)


def test_mla_decode_grows_with_the_kv_as_the_module_rows_do() -> None:
    sm = KIMI_TP8
    times = [sm.step_time(BatchShape.decode(8, 8 * kv)) for kv in (64, 512, 2048, 8192, 32768, 131072)]
    assert times == sorted(times) and len(set(times)) == len(times)
    # All else equal, two KV lengths differ by 61 layers x the module rows'
    # difference (batch 16, steps 1024 and 4096: KV 1025 and 4097).
    rows = {r["step"]: r["latency"] for r in _raw("b200_sxm", MLA_GEN, num_heads=8, kv_cache_dtype="fp8",
                                                  gemm_type="bfloat16", mla_dtype="bfloat16", batch_size=16)}
    diff = sm.gpu_time(BatchShape.decode(16, 16 * 4097)) - sm.gpu_time(BatchShape.decode(16, 16 * 1025))
    assert diff == pytest.approx(61 * (rows[4096] - rows[1024]) * 1e-3, rel=1e-9)


def test_mla_prefill_of_equal_tokens_differs_by_the_context_module_rows() -> None:
    # One 4096-token prompt against four of 1024: the same tokens (so the
    # same GEMMs, MoE, all-reduce, norms and latent up-projection), different
    # attention, which the module rows time.
    sm = KIMI_TP8
    rows = {(r["batch_size"], r["isl"]): r["latency"]
            for r in _raw("b200_sxm", MLA_CTX, num_heads=8, kv_cache_dtype="fp8", gemm_type="bfloat16",
                          mla_dtype="bfloat16")}
    one = sm.gpu_time(BatchShape(4096, 1, 1, 0, 0, 4096, 4096, 4096 * 4097 // 2))
    four = sm.gpu_time(BatchShape(4096, 4, 1, 0, 0, 4096, 4096, 4 * 1024 * 1025 // 2))
    assert one - four == pytest.approx(61 * (rows[(1, 4096)] - rows[(4, 1024)]) * 1e-3, rel=1e-9)


def test_a_chunk_after_cached_context_runs_its_projections_on_its_new_tokens() -> None:
    # 1024 new tokens after 7168 cached: attention as a fresh prompt with the
    # same query-key pairs, but q/o projections over 1024 tokens only, so
    # less than that prompt, and more than 1024 fresh tokens.
    sm = KIMI_TP8
    pairs = 1024 * 7168 + 1024 * 1025 // 2
    chunk = sm.gpu_time(BatchShape(1024, 1, 1, 0, 0, 1024, 8192, pairs))
    fresh = sm.gpu_time(BatchShape(1024, 1, 1, 0, 0, 1024, 1024, 1024 * 1025 // 2))
    length = round((math.sqrt(8.0 * pairs + 1.0) - 1.0) / 2.0)   # 4,351: the same pairs
    same_pairs = sm.gpu_time(BatchShape(length, 1, 1, 0, 0, length, length, length * (length + 1) // 2))
    assert fresh < chunk < same_pairs


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.integers(1, 600), st.integers(0, 2_000_000), st.integers(1, 4), st.integers(1, 40))
def test_an_mla_stretch_prices_each_step_as_stepping_does(num_reqs: int, extra_kv: int, per_step: int,
                                                          count: int) -> None:
    _check_stretch(KIMI_TP8, num_reqs, extra_kv, per_step, count)


# -- MoE all-to-all ---------------------------------------------------------------------

DEEPSEEK_EP8 = MeasuredStepTimeModel(get_model("deepseek-ai/DeepSeek-V3"), B200,
                                     ParallelConfig(1, 8, enable_expert_parallel=True),
                                     RuntimeConfig(dtype="fp8_block"), host=NO_HOST_TIME)


def test_all_to_all_comes_from_deepep_where_the_table_has_the_ep_size() -> None:
    sm = DEEPSEEK_EP8
    assert sm.roofline_parts == []
    rows = {(r["comm_backend"], r["phase"], r["num_tokens"]): r["latency"] * 1e-6   # µs
            for r in _raw("b200_sxm", "comm/vllm/0.24.0/moe_a2a_perf.parquet", hidden_size=7168, topk=8,
                          num_experts=256, ep_size=8)}
    # 58 MoE layers; a decode-only step of 8 (a capture size): the
    # low-latency kernels; a step with prefill: the high-throughput ones.
    decode = BatchShape.decode(8, 8 * 1000)
    ll = 58 * (rows[("deepep_ll", "dispatch", 8)] + rows[("deepep_ll", "combine", 8)])
    assert sm._attention_time(decode) - sm._decode_attention(8, 8 * 1000) == pytest.approx(ll, rel=1e-9)
    prefill = BatchShape(4096, 1, 1, 0, 0, 4096, 4096, 4096 * 4097 // 2)
    ht = 58 * (rows[("deepep_ht", "dispatch", 4096)] + rows[("deepep_ht", "combine", 4096)])
    assert sm._measured_all_to_all(4096, True) == pytest.approx(ht, rel=1e-9)
    without = sm._attention_time(prefill) - sm._measured_all_to_all(4096, True)
    assert sm._attention_time(prefill) == pytest.approx(without + ht, rel=1e-12)
    # And the roofline's formula is not added on top.
    assert sm._all_to_all_time(4096) == 0.0


def test_all_to_all_over_an_unmeasured_ep_size_stays_roofline() -> None:
    ep4 = ParallelConfig(1, 4, enable_expert_parallel=True)
    fp8 = RuntimeConfig(dtype="fp8_block")
    sm = MeasuredStepTimeModel(get_model("deepseek-ai/DeepSeek-V3"), B200, ep4, fp8)
    assert sm.roofline_parts == ["all-to-all (no measured DeepEP over 4 GPUs for 256 experts, top-8, "
                                 "hidden 7168 on b200_sxm)"]
    assert sm._all_to_all_time(64) == StepTimeModel._all_to_all_time(sm, 64) > 0


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(1, 300), st.integers(0, 500_000), st.integers(1, 4), st.integers(1, 30))
def test_a_stretch_with_measured_all_to_all_prices_each_step_as_stepping_does(
        num_reqs: int, extra_kv: int, per_step: int, count: int) -> None:
    sm = DEEPSEEK_EP8
    first = num_reqs + extra_kv
    stretch = sm.decode_step_times(num_reqs, first, num_reqs * per_step, count, 8 * num_reqs)
    single = [sm.step_time(BatchShape.decode(num_reqs, first + j * num_reqs * per_step), 8 * num_reqs)
              for j in range(count)]
    assert stretch == single


@pytest.mark.parametrize("name, parallel, runtime", [
    ("moonshotai/Kimi-K2.5", ParallelConfig(8), KIMI_FP4),
    ("deepseek-ai/DeepSeek-V3", ParallelConfig(1, 8, enable_expert_parallel=True),
     RuntimeConfig(dtype="fp8_block")),
])
def test_the_inlined_decode_stretch_is_gpu_times_float(name: str, parallel: ParallelConfig,
                                                      runtime: RuntimeConfig) -> None:
    # Without CPU time a step is its GPU time: the stretch's inlined
    # attention (and all-to-all) must be _attention_time's very float.
    no_cpu = dataclasses.replace(runtime, cpu_step_s=0.0, cpu_per_request_s=0.0)
    sm = MeasuredStepTimeModel(get_model(name), B200, parallel, no_cpu, host=NO_HOST_TIME)
    for num_reqs, kv in ((1, 700), (7, 7 * 3000), (64, 64 * 1025), (300, 300 * 20_000)):
        assert sm.decode_step_times(num_reqs, kv, 0, 1)[0] == sm.gpu_time(BatchShape.decode(num_reqs, kv))


def test_moe_shapes_the_table_lacks_stay_roofline_and_say_so() -> None:
    sm = MeasuredStepTimeModel(get_model("openai/gpt-oss-20b"), H100, ParallelConfig(2))
    assert len(sm.roofline_parts) == 1 and "routed experts (no measured" in sm.roofline_parts[0]
    assert sm.gpu_time(BatchShape.decode(8, 8000)) > 0


def test_auto_picks_measured_where_covered_and_says_why_not_elsewhere(tmp_path: Path) -> None:
    d = build_deployment(EngineOptions(model="Llama-3.1-8B", hardware="h100-sxm"))
    assert d.step_model.backend == "measured"
    assert "measured vLLM 0.24.0 kernels (h100_sxm" in d.describe()
    d = build_deployment(EngineOptions(model="Llama-3.1-8B", hardware="mi300x"))
    assert d.step_model.backend == "roofline"
    assert "no measured vLLM tables for mi300x" in d.describe()
    d = build_deployment(EngineOptions(model="Llama-3.1-8B", step_time_backend="roofline"))
    assert d.step_model.backend == "roofline" and "measured" not in d.step_model.describe_backend()
    eff = tmp_path / "eff.yaml"
    eff.write_text("gemm_mfu: 0.5\n")
    d = build_deployment(EngineOptions(model="Llama-3.1-8B", efficiency_file=str(eff)))
    assert d.step_model.backend == "roofline"
    assert "efficiency-file" in d.describe()


def test_asking_for_measured_where_it_cannot_price_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"step_time_backend='measured'.*mi300x.*use roofline"):
        build_deployment(EngineOptions(model="Llama-3.1-8B", hardware="mi300x", step_time_backend="measured"))
    with pytest.raises(ValueError, match=r"step_time_backend='fast'.*auto, measured, roofline"):
        build_deployment(EngineOptions(step_time_backend="fast"))


def test_cli_names_the_backend_in_the_summary_and_the_saved_json(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    small = ["--num-prompts", "20", "--random-input-len", "128", "--random-output-len", "8", "--no-progress"]
    assert main(["simulate", *small, "--save-result", str(out)]) == 0
    assert "; step times: measured vLLM 0.24.0 kernels" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["deployment"]["step_times"]["backend"] == "measured"
    assert saved["deployment"]["step_times"]["requested"] == "auto"
    assert main(["simulate", *small, "--step-time-backend", "roofline"]) == 0
    assert "; step times: roofline" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["simulate", *small, "--step-time-backend", "fast"])
    assert e.value.code == 2


def test_messages_describe_table_keys_in_words() -> None:
    # Users read these in the deployment summary: no dataclass reprs.
    bloom = build_deployment(EngineOptions(model="bigscience/bloom", hardware="h100-sxm",
                                           tensor_parallel_size=8, max_model_len=2048))
    text = bloom.describe()
    assert ("measured kernels not used: no measured attention with 14 query and 14 KV heads per GPU, "
            "head size 128, bfloat16 KV cache on h100_sxm") in text
    minimax = MeasuredStepTimeModel(get_model("MiniMaxAI/MiniMax-M2.5"), H100, ParallelConfig(4))
    assert minimax.roofline_parts == ["routed experts (no measured bfloat16 fused MoE: 256 experts of "
                                      "3072 x 1536, top-8, each expert split over 4 GPUs)"]
    assert MoeKey("fp8", 7168, 2048, 8, 256, 1, 8).describe() == (
        "fp8 fused MoE: 256 experts of 7168 x 2048, top-8, expert parallelism over 8 GPUs")
    assert MlaKey(16, "fp8", "fp8_block").describe() == (
        "MLA with 16 query heads per GPU, fp8 KV cache, fp8_block projections")
    assert AttentionKey(8, 1, 64, "bfloat16", 128).describe() == (
        "attention with 8 query and 1 KV heads per GPU, head size 64, bfloat16 KV cache, a 128-token "
        "sliding window")
    for message in (text, *minimax.roofline_parts):
        assert "Key(" not in message
