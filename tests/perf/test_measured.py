"""The measured step-time backend: its figures against aiconfigurator's own
engine on the same tables, exactness for fast-forward, what it reports, and
how a deployment picks it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.cli import main
from kvsched.perf import get_hardware, get_model
from kvsched.perf.host import NO_HOST_TIME
from kvsched.perf.measured import MeasuredStepTimeModel
from kvsched.perf.step_time import BatchShape, ParallelConfig, RuntimeConfig, StepTimeModel
from kvsched.sim.deployment import EngineOptions, build_deployment

H100 = get_hardware("h100-sxm")
LLAMA_8B = MeasuredStepTimeModel(get_model("Llama-3.1-8B"), H100)


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
    # And the roofline, for contrast, is well below both (the finding).
    roof = StepTimeModel(get_model("Llama-3.1-70B"), H100, ParallelConfig(4), RuntimeConfig(dtype="fp8"))
    assert roof.gpu_time(BatchShape.decode(64, 64 * 1026)) < 0.85 * decode


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(1, 600), st.integers(0, 2_000_000), st.integers(1, 4), st.integers(1, 40))
def test_a_stretch_prices_each_step_as_stepping_does(num_reqs: int, extra_kv: int, per_step: int,
                                                     count: int) -> None:
    # Fast-forward is exact only if a stretch's step times are the very
    # floats step_time gives each step on its own.
    first = num_reqs + extra_kv
    stretch = LLAMA_8B.decode_step_times(num_reqs, first, num_reqs * per_step, count)
    single = [LLAMA_8B.step_time(BatchShape.decode(num_reqs, first + j * num_reqs * per_step))
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
    assert sm.roofline_parts == ["all-to-all"]
    assert sm._moe is not None
    assert sm._moe(64) == pytest.approx(0.216922e-3, rel=1e-4)
    assert sm._moe(72) == pytest.approx((0.216922 + 0.239578) / 2 * 1e-3, rel=1e-4)
    # Sharded experts see both ranks' tokens: 32 here and 32 there.
    router_and_shared = sum(c(32) for c in sm._moe_gemms)
    assert sm._moe_time(32, 64) == pytest.approx(router_and_shared + 0.216922e-3, rel=1e-4)
    assert "roofline for all-to-all" in sm.describe_backend()


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
