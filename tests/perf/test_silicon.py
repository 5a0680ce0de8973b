"""kvsched.perf.silicon: aiconfigurator-core's real vLLM serving rows, their
mapping to kvsched deployments and InferenceX's client, one simulated row,
and AIConfigurator's own estimate.

Expected values are read off silicon_sample.csv and shared/facts/inferencex.md
by hand, not computed by the code under test. aiconfigurator-core must be
installed (the dev extra has it): nothing here skips without it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import sys
from collections import Counter
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import ModuleType

import pytest

from kvsched.perf import silicon
from kvsched.perf.silicon import (
    AicEstimate,
    AicEstimator,
    ErrorStats,
    Parallelism,
    Refusal,
    ServingRun,
    SiliconRow,
    SimulatedRow,
    build_run_deployment,
    build_workloads,
    concurrency_band,
    inferencex_lengths,
    load_rows,
    map_row,
    read_parallelism,
    simulate_row,
)
from kvsched.sim.deployment import build_deployment

REPO = Path(__file__).resolve().parents[2]

LLAMA70_H100 = "2026_04_06_llama_3_1_70b_h100_sxm_vllm_fp8_agg_1024x1024_c16_tp4_ep1_260"
GPTOSS_B200 = "2026_03_25_gpt_oss_120b_b200_sxm_vllm_fp4_agg_1024x8192_c16_tp2_0_ep1_0_613"
MINIMAX_DP = "minimaxm2_5_b200_vllm_fp8_agg_1024x1024_c256_cfg691"
QWEN32_NO_CONC = "qwen3_32b_qwen3_32b_h100_sxm_vllm_agg_4000x1000_c_tp1_0_epnone_4"
QWEN32_C8 = "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_vllm_agg_1024x128_c8_tp2_epnone_1"
QWEN235_TP1 = "qwen_qwen3_235b_a22b_fp8_qwen_qwen3_235b_a22b_fp8_h200_sxm_vllm_agg_1000x100_c8_tp1_epnone_2"
QWEN235_EP2 = "qwen_qwen3_235b_a22b_fp8_qwen_qwen3_235b_a22b_fp8_h200_sxm_vllm_agg_2000x500_c16_tp2_epnone_16"
LLAMA8_H200 = ("nvidia_llama_3_1_8b_instruct_fp8_nvidia_llama_3_1_8b_instruct_fp8_h200_sxm_vllm_agg_"
               "1000x100_c112_tp1_epnone_1")


@pytest.fixture(scope="module")
def rows() -> list[SiliconRow]:
    return load_rows()


@pytest.fixture(scope="module")
def by_id(rows: list[SiliconRow]) -> dict[str, SiliconRow]:
    return {r.id: r for r in rows}


@pytest.fixture(scope="module")
def aic() -> AicEstimator:
    return AicEstimator()


def mapped(row: SiliconRow) -> ServingRun:
    run = map_row(row)
    assert isinstance(run, ServingRun), run
    return run


# -- loading -----------------------------------------------------------------------


def test_vllm_agg_rows_per_system(rows: list[SiliconRow]) -> None:
    # silicon_sample.csv: 1,345 vLLM rows, 1,328 of them agg (17 disagg).
    assert Counter(r.system for r in rows) == {"b200_sxm": 623, "h200_sxm": 336, "h100_sxm": 237,
                                               "b300_sxm": 132}
    assert len({r.id for r in rows}) == 1328


def test_row_fields(by_id: dict[str, SiliconRow]) -> None:
    r = by_id[LLAMA70_H100]
    assert (r.model_path, r.system, r.precision, r.isl, r.osl) == (
        "meta-llama/Llama-3.1-70B", "h100_sxm", "fp8", 1024, 1024)
    assert (r.tp_size, r.attention_dp_size, r.moe_tp_size, r.moe_ep_size) == (4, 1, 4, 1)
    assert (r.batch_size, r.concurrency, r.concurrency_stated) == (16, 16, True)
    assert r.backend_version is None  # empty in the CSV
    assert r.ttft_ms == pytest.approx(121.413273, abs=1e-6)
    assert r.tpot_ms == pytest.approx(13.192186, abs=1e-6)


def test_concurrency_is_the_clients_not_the_per_rank_batch(by_id: dict[str, SiliconRow]) -> None:
    # silicon_concurrency=256 in the source; batch_size 64 per attention-DP rank (4).
    r = by_id[MINIMAX_DP]
    assert (r.batch_size, r.attention_dp_size, r.concurrency) == (64, 4, 256)
    # No silicon_concurrency= in the source, no attention-DP: batch_size.
    q = by_id[QWEN32_NO_CONC]
    assert (q.concurrency, q.concurrency_stated, q.moe_tp_size, q.moe_ep_size) == (24, False, None, None)
    assert q.precision == "fp8" and q.attention_dp_size == 1   # empty attention_dp_size -> 1


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModuleNotFoundError, match=r'pip install -e "\.\[measured\]"'):
        silicon.silicon_csv_path()
    with pytest.raises(ModuleNotFoundError, match=r'pip install -e "\.\[measured\]"'):
        AicEstimator()


# -- mapping -----------------------------------------------------------------------


def test_llama70_fp8_on_h100(by_id: dict[str, SiliconRow]) -> None:
    run = mapped(by_id[LLAMA70_H100])
    o = run.options
    assert (o.model, o.hardware, o.tensor_parallel_size, o.data_parallel_size) == (
        "meta-llama/Llama-3.1-70B", "h100-sxm", 4, 1)
    # FP8 weights on the fly: vLLM's --quantization fp8 (its --dtype is 16-bit).
    assert (o.enable_expert_parallel, o.enable_prefix_caching, o.dtype, o.quantization, o.kv_cache_dtype) == (
        False, False, "bf16", "fp8", "auto")
    # NVIDIA's collection: vLLM serve's defaults (1024 sequences >= CONC 16).
    assert (o.max_num_seqs, o.max_num_batched_tokens, o.gpu_memory_utilization, o.block_size) == (
        None, None, 0.9, 16)
    assert (run.concurrency, run.num_prompts, run.num_warmups) == (16, 160, 32)
    assert run.parallelism == Parallelism(4, 4, 1, False)


def test_gptoss_on_b200_takes_the_inferencex_script_flags(by_id: dict[str, SiliconRow]) -> None:
    # gptoss_fp4_b200: kv fp8, max-num-batched-tokens 8192, max-num-seqs 512.
    run = mapped(by_id[GPTOSS_B200])
    o = run.options
    # "fp4" is gpt-oss's own MXFP4: the checkpoint as named, no --quantization.
    assert (o.model, o.hardware, o.tensor_parallel_size, o.dtype, o.quantization) == (
        "openai/gpt-oss-120b", "b200", 2, "bf16", None)
    assert (o.kv_cache_dtype, o.max_num_batched_tokens, o.max_num_seqs) == ("fp8", 8192, 512)
    assert run.flags.script == "gptoss_fp4_b200"
    assert (run.num_prompts, run.num_warmups) == (160, 32)


def test_gptoss_on_hopper_runs_max_num_seqs_at_conc(rows: list[SiliconRow]) -> None:
    # gptoss_fp4_h100: max-num-seqs CONC.
    row = next(r for r in rows if r.model_path == "openai/gpt-oss-120b" and r.system == "h100_sxm"
               and r.concurrency == 64)
    assert mapped(row).options.max_num_seqs == 64


def test_moe_with_expert_parallel_and_renamed_checkpoints(by_id: dict[str, SiliconRow]) -> None:
    run = mapped(by_id[QWEN235_EP2])     # tp 2, moe_tp 1, moe_ep 2
    o = run.options
    # The checkpoints are passed as named; their own formats apply (Qwen's
    # -FP8: block FP8 weights; NVIDIA's ModelOpt -FP8: FP8 weights and KV).
    assert (o.model, o.hardware, o.tensor_parallel_size, o.enable_expert_parallel) == (
        "Qwen/Qwen3-235B-A22B-FP8", "h200", 2, True)
    d = build_deployment(o)
    assert (d.runtime.dtype, d.runtime.kv_cache_dtype) == ("fp8_block", "auto")
    small = mapped(by_id[LLAMA8_H200]).options
    assert (small.model, small.hardware, small.tensor_parallel_size) == (
        "nvidia/Llama-3.1-8B-Instruct-FP8", "h200", 1)
    d = build_deployment(small)
    assert (d.runtime.dtype, d.runtime.kv_cache_dtype) == ("fp8", "fp8")
    bf16 = mapped(by_id[QWEN32_C8]).options   # no precision in the CSV: the checkpoint's bf16
    assert (bf16.model, bf16.dtype, bf16.tensor_parallel_size) == ("Qwen/Qwen3-32B", "bf16", 2)


def test_attention_dp_read_as_tp_gpus(by_id: dict[str, SiliconRow]) -> None:
    # tp 4, attention-DP 4, moe_ep 16 on one 8-GPU node: 4 GPUs, DP4 x TP1, EP over all.
    assert read_parallelism(by_id[MINIMAX_DP], is_moe=True) == Parallelism(4, 1, 4, True)


def test_unexpressible_rows_say_why(rows: list[SiliconRow], by_id: dict[str, SiliconRow]) -> None:
    reasons = Counter(r.reason for r in map(map_row, rows) if isinstance(r, Refusal))
    # B300: MiniMax-M2.5 110 + Kimi-K2.5 22 rows; Qwen3-235B rows whose moe_tp x moe_ep != tp: 19.
    assert reasons == {"hardware not in kvsched's catalog": 132, "parallelism columns disagree": 19}
    refusal = map_row(by_id[QWEN235_TP1])
    assert isinstance(refusal, Refusal)
    assert "moe_tp 2 x moe_ep 1 = 2" in refusal.detail
    b300 = map_row(dataclasses.replace(by_id[LLAMA70_H100], system="b300_sxm"))
    assert b300 == Refusal("hardware not in kvsched's catalog", "b300_sxm")
    assert str(map_row(dataclasses.replace(by_id[LLAMA70_H100], precision="int4"))) == (
        "precision not expressible: 'int4' for meta-llama/Llama-3.1-70B: not the checkpoint's format")


def _first(rows: list[SiliconRow], model: str, system: str, precision: str) -> SiliconRow:
    return next(r for r in rows if (r.model_path, r.system, r.precision) == (model, system, precision))


@pytest.mark.parametrize(("model", "system", "precision", "checkpoint", "quantization", "weights",
                          "layers", "kv"), [
    # gpt-oss's "fp4" is its native MXFP4 (experts only)
    ("openai/gpt-oss-120b", "b200_sxm", "fp4", "openai/gpt-oss-120b", None, "mxfp4", "experts", "fp8"),
    ("openai/gpt-oss-120b", "h100_sxm", "fp4", "openai/gpt-oss-120b", None, "mxfp4", "experts", "auto"),
    # MiniMax-M2.5's "fp8" is its native block FP8; its "fp4" NVIDIA's NVFP4 repack (attention 16-bit)
    ("MiniMaxAI/MiniMax-M2.5", "h200_sxm", "fp8", "MiniMaxAI/MiniMax-M2.5", None, "fp8_block", "all",
     "fp8"),
    ("MiniMaxAI/MiniMax-M2.5", "b200_sxm", "fp4", "nvidia/MiniMax-M2.5-NVFP4", None, "nvfp4", "mlp",
     "fp8"),
    # Kimi-K2.5's "int4" is its native int4 experts; its "fp4" NVIDIA's repack
    ("moonshotai/Kimi-K2.5", "h200_sxm", "int4", "moonshotai/Kimi-K2.5", None, "int4", "experts", "auto"),
    ("moonshotai/Kimi-K2.5", "b200_sxm", "fp4", "nvidia/Kimi-K2.5-NVFP4", None, "nvfp4", "mlp", "fp8"),
    # Llama-3.1-70B "fp4": an NVFP4 ModelOpt checkpoint of every linear layer
    ("meta-llama/Llama-3.1-70B", "b200_sxm", "fp4", "meta-llama/Llama-3.1-70B", "modelopt_fp4", "nvfp4",
     "all", "auto"),
])
def test_precision_labels_map_to_checkpoint_formats(
        rows: list[SiliconRow], model: str, system: str, precision: str, checkpoint: str,
        quantization: str | None, weights: str, layers: str, kv: str) -> None:
    o = mapped(_first(rows, model, system, precision)).options
    assert (o.model, o.quantization) == (checkpoint, quantization)
    d = build_deployment(dataclasses.replace(o, step_time_backend="roofline", max_model_len=4096))
    assert (d.runtime.dtype, d.runtime.quantized_layers, d.runtime.kv_cache_dtype) == (weights, layers, kv)


def test_4_bit_rows_are_priced_by_both_backends(by_id: dict[str, SiliconRow]) -> None:
    for backend in ("roofline", "measured"):
        result = simulate_row(mapped(by_id[GPTOSS_B200]), backend)
        assert isinstance(result, SimulatedRow), result
        assert "(mxfp4)" in result.deployment


def test_backend_is_passed_to_the_engine_options(by_id: dict[str, SiliconRow]) -> None:
    run = mapped(by_id[LLAMA70_H100])
    for backend in ("roofline", "measured"):
        built = build_run_deployment(run, backend)
        assert not isinstance(built, Refusal)
        assert built[0].step_model.backend == backend


# -- the client --------------------------------------------------------------------


def test_lengths_use_the_old_clients_lower_bound_ratio() -> None:
    inputs, outputs = inferencex_lengths(1024, 8192, 1000)
    # [int(1024 x 0.8), 1024] = [819, 1024]; [int(8192 x 0.8), 8192] = [6553, 8192].
    assert min(inputs) >= 819 and max(inputs) <= 1024
    assert min(outputs) >= 6553 and max(outputs) <= 8192
    assert sum(inputs) / len(inputs) == pytest.approx(0.9 * 1024, rel=0.02)
    assert inferencex_lengths(1024, 8192, 1000) == (inputs, outputs)   # seeded


def test_warmups_copy_the_first_request(by_id: dict[str, SiliconRow]) -> None:
    run = mapped(by_id[QWEN32_C8])
    warmup, counted = build_workloads(run)
    assert (len(warmup), len(counted)) == (16, 80)
    assert warmup.max_concurrency == counted.max_concurrency == 8
    first = counted.requests[0]
    assert {(r.num_prompt_tokens, r.output_len) for r in warmup.requests} == {
        (first.num_prompt_tokens, first.output_len)}
    assert all(r.arrival_time == 0.0 for r in counted.requests)


# -- one row end to end ------------------------------------------------------------


def test_one_row_simulated_warmups_excluded(by_id: dict[str, SiliconRow]) -> None:
    run = mapped(by_id[QWEN32_C8])          # CONC 8, 1024 in / 128 out, TP2 H100
    result = simulate_row(run, "roofline")
    assert isinstance(result, SimulatedRow), result
    assert result.completed == 80 and result.failed == 0       # 10 x CONC counted
    assert result.warmups == 16                                # 2 x CONC, simulated first
    assert result.warmup_duration_s > 0 and result.duration_s > 0
    assert result.mean_ttft_ms > 0 and result.mean_tpot_ms > 0
    assert result.num_gpu_blocks > 0 and "roofline" in result.step_times


# -- AIConfigurator ----------------------------------------------------------------


def test_aic_estimate_of_a_known_row(by_id: dict[str, SiliconRow], aic: AicEstimator) -> None:
    estimate = aic.estimate(by_id[QWEN32_C8])
    assert isinstance(estimate, AicEstimate), estimate
    # aiconfigurator's cli_estimate gave 161.9 / 17.25 ms for this row (survey of
    # aiconfigurator-core 0.12.0, run separately with the upper aiconfigurator package).
    assert estimate.ttft_ms == pytest.approx(161.9, abs=0.05)
    assert estimate.tpot_ms == pytest.approx(17.25, abs=0.005)
    assert estimate.database_version == "0.24.0"


def test_aic_refusals_are_reasons(by_id: dict[str, SiliconRow], aic: AicEstimator) -> None:
    refusal = aic.estimate(by_id[QWEN235_TP1])    # moe_tp 2 with tp 1
    assert isinstance(refusal, Refusal)
    assert refusal.reason == "AIC: parallelism columns disagree (tp x dp != moe_tp x moe_ep)"


# -- errors ------------------------------------------------------------------------


def test_error_stats_and_bands() -> None:
    s = ErrorStats.of([0.1, -0.3, 0.2])
    assert s.n == 3
    assert s.mape == pytest.approx(0.2) and s.median_abs == pytest.approx(0.2)
    assert s.bias == pytest.approx(0.0)
    assert [concurrency_band(c) for c in (1, 8, 9, 64, 65, 512)] == ["1-8", "1-8", "9-64", "9-64",
                                                                     "65+", "65+"]
    with pytest.raises(ValueError, match="concurrency=0"):
        concurrency_band(0)
    with pytest.raises(ValueError, match="no errors"):
        ErrorStats.of([])


# -- the benchmark script ----------------------------------------------------------


def _script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    path = REPO / "benchmarks" / "validate_silicon.py"
    spec = importlib.util.spec_from_file_location("validate_silicon", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    # Its dataclasses look their module up while the file runs; removed after the test.
    monkeypatch.setitem(sys.modules, "validate_silicon", module)
    spec.loader.exec_module(module)
    return module


def test_script_reports_and_updates_the_doc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _script(monkeypatch)
    doc = tmp_path / "doc.md"
    doc.write_text(f"# t\n\n{script.BEGIN}\nold\n{script.END}\n\nafter\n", encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        assert script.main(["--system", "h100_sxm", "--model", "qwen3-32b", "--limit", "2", "--no-aic",
                            "--no-progress", "--json", str(tmp_path / "r.json"),
                            "--update-doc", str(doc)]) == 0
    text = doc.read_text(encoding="utf-8")
    assert "old" not in text and text.endswith(f"{script.END}\n\nafter\n")
    # Both backends by default: two rows, two predictions each.
    assert "| all | kvsched roofline | 2 |" in text and "| all | kvsched measured | 2 |" in text
    assert (tmp_path / "r.json").read_text(encoding="utf-8").count('"mean_ttft_ms"') == 4
    with pytest.raises(ValueError, match="--system='a100_sxm'"):
        script.main(["--system", "a100_sxm", "--no-aic"])
