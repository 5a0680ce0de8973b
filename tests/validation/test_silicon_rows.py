"""kvsched.validation.silicon_rows: aiconfigurator-core's real vLLM serving rows,
their mapping to kvsched deployments and InferenceX's client.

Expected values are read off silicon_sample.csv and shared/facts/inferencex.md
by hand, not computed by the code under test. aiconfigurator-core must be
installed (the dev extra has it): nothing here skips without it. The rows
come from the ``rows`` / ``by_id`` fixtures of conftest.py.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections import Counter

import pytest

from kvsched.sim.deployment import build_deployment
from kvsched.validation import silicon_rows
from kvsched.validation.silicon_rows import (
    Parallelism,
    Refusal,
    ServingRun,
    SiliconRow,
    build_workloads,
    inferencex_lengths,
    map_row,
    read_parallelism,
)

LLAMA70_H100 = "2026_04_06_llama_3_1_70b_h100_sxm_vllm_fp8_agg_1024x1024_c16_tp4_ep1_260"
GPTOSS_B200 = "2026_03_25_gpt_oss_120b_b200_sxm_vllm_fp4_agg_1024x8192_c16_tp2_0_ep1_0_613"
MINIMAX_DP = "minimaxm2_5_b200_vllm_fp8_agg_1024x1024_c256_cfg691"
QWEN32_NO_CONC = "qwen3_32b_qwen3_32b_h100_sxm_vllm_agg_4000x1000_c_tp1_0_epnone_4"
QWEN32_C8 = "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_vllm_agg_1024x128_c8_tp2_epnone_1"
QWEN235_TP1 = "qwen_qwen3_235b_a22b_fp8_qwen_qwen3_235b_a22b_fp8_h200_sxm_vllm_agg_1000x100_c8_tp1_epnone_2"
QWEN235_EP2 = "qwen_qwen3_235b_a22b_fp8_qwen_qwen3_235b_a22b_fp8_h200_sxm_vllm_agg_2000x500_c16_tp2_epnone_16"
LLAMA8_H200 = ("nvidia_llama_3_1_8b_instruct_fp8_nvidia_llama_3_1_8b_instruct_fp8_h200_sxm_vllm_agg_"
               "1000x100_c112_tp1_epnone_1")


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
        silicon_rows.silicon_csv_path()


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
    # Qwen3-235B rows whose moe_tp x moe_ep != tp: 19. (The B300 rows, MiniMax-M2.5 110 +
    # Kimi-K2.5 22, map since issue 23 added b300 to the catalog.)
    assert reasons == {"parallelism columns disagree": 19}
    refusal = map_row(by_id[QWEN235_TP1])
    assert isinstance(refusal, Refusal)
    assert "moe_tp 2 x moe_ep 1 = 2" in refusal.detail
    unknown = map_row(dataclasses.replace(by_id[LLAMA70_H100], system="x900_sxm"))
    assert unknown == Refusal("hardware not in kvsched's catalog", "x900_sxm")
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
