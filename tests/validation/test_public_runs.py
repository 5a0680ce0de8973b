"""The published real vLLM serving runs: the data's integrity and the mapping
of a row to the deployment and workload kvsched simulates."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from kvsched.sim.pricing import pricing_of
from kvsched.validation.public_runs import (
    DROP_REASONS,
    DROPPED,
    GPUSTACK_CASES,
    MIN_OUTPUT_SHARE,
    REJECTED_SOURCES,
    RUNS,
    SAME_ARCHITECTURE,
    MappedRun,
    PublicRun,
    aic_row,
    build_run_deployment,
    build_workload,
    map_run,
)
from kvsched.validation.silicon_rows import Refusal, SiliconRow

URL = re.compile(r"https://github\.com/gpustack/gpustack/blob/[0-9a-f]{40}/docs/performance-lab/"
                 r"[a-z0-9.-]+/[a-z0-9-]+\.md#L[1-9]\d*")


def _run(run_id: str) -> PublicRun:
    (run,) = [r for r in RUNS if r.id == run_id]
    return run


def test_every_row_names_its_source() -> None:
    assert len(RUNS) >= 20
    assert len({r.id for r in RUNS}) == len(RUNS)
    for r in RUNS:
        assert URL.fullmatch(r.url), r.url
        assert re.fullmatch(r"[0-9a-f]{40}", r.source.commit)
        assert r.source.license and r.source.gpus
        assert re.fullmatch(r"\d+\.\d+\.\d+", r.vllm_version)
        assert r.serve_command.startswith("vllm serve ")
        assert r.dataset == "random" and r.request_rate == math.inf and r.max_concurrency is None


def test_measurements_have_sane_units() -> None:
    for r in RUNS:
        m = r.measured
        assert (r.input_len, r.output_len, r.num_prompts) in GPUSTACK_CASES.values()
        assert m.completed == r.num_prompts, r.id
        assert r.output_share >= MIN_OUTPUT_SHARE, r.id
        # the source's prompt count drifts a few tokens below --random-input-len, never above
        assert 0.99 * r.input_len <= r.prompt_tokens <= r.input_len, r.id
        # seconds and tokens/s agree with each other (the source prints 2 decimals)
        assert m.output_throughput == pytest.approx(m.total_output_tokens / m.duration_s, rel=0.02), r.id
        assert m.total_token_throughput == pytest.approx(
            (m.total_input_tokens + m.total_output_tokens) / m.duration_s, rel=0.02), r.id
        assert 1.0 < m.duration_s < 3600.0
        for lat in (m.ttft, m.tpot, m.itl):
            assert 0.0 < lat.median <= lat.p99, r.id
        # Per request, the mean stays below the P99; over the token gaps it need not: under 1% of
        # the gaps (the decodes stalled behind prefills) can lift it, as in deepseek-v3.2/h200.md
        # line 981 (mean ITL 46.34 ms, P99 44.29 ms, as printed).
        for lat in (m.ttft, m.tpot):
            assert lat.mean <= lat.p99 * 1.0001, r.id
        # milliseconds: a TTFT never exceeds the run, a TPOT is between 1 ms and a few s
        assert 10.0 < m.ttft.mean < m.duration_s * 1000.0, r.id
        assert 1.0 < m.tpot.mean < 5000.0 and 1.0 < m.itl.mean < 5000.0, r.id
        assert m.derived_mean_e2e_ms > m.ttft.mean


def test_left_out_results_are_accounted_for() -> None:
    kept = {(r.source.path.removeprefix("docs/performance-lab/"), r.line) for r in RUNS}
    for d in DROPPED:
        assert d.reason in DROP_REASONS
        assert (d.doc, d.line) not in kept
        if d.reason == "short":
            assert d.output_share < MIN_OUTPUT_SHARE
    assert all(s.name and s.where and s.reason for s in REJECTED_SOURCES)


def test_qwen3_32b_a100_maps_to_the_deployment_vllm_serve_starts() -> None:
    run = _run("gpustack/qwen3-32b/a100/random-4k: Qwen3-32B")
    mapped = map_run(run)
    assert isinstance(mapped, MappedRun)
    o = mapped.options
    assert (o.model, o.hardware, o.tensor_parallel_size, o.data_parallel_size) == (
        "Qwen/Qwen3-32B", "a100-80gb", 1, 1)
    assert o.async_scheduling is False        # vLLM 0.11's default without --async-scheduling
    assert o.enable_prefix_caching is True    # V1's default
    assert (o.max_num_seqs, o.max_num_batched_tokens, o.max_model_len) == (None, None, None)
    assert o.step_time_backend == "auto"
    built = build_run_deployment(mapped)
    assert not isinstance(built, Refusal)
    deployment, notes = built
    sc = deployment.scheduler_config
    # vllm serve's defaults on an A100 (vLLM keeps the small ones there)
    assert (sc.max_num_seqs, sc.max_num_batched_tokens) == (256, 2048)
    # the context does not fit kvsched's KV cache: the longest request instead, said so
    assert sc.max_model_len == run.prompt_tokens + run.output_len == 3996 + 200
    assert any("max_model_len 4196" in n for n in notes)
    assert deployment.runtime.async_scheduling is False
    assert pricing_of(deployment).label == "roofline-fallback"   # no measured tables for A100
    workload = build_workload(run)
    assert len(workload.requests) == 500 and workload.max_concurrency is None
    assert {(q.arrival_time, q.output_len) for q in workload.requests} == {(0.0, 200)}
    assert {sum(n for _, n in q.prompt_runs) for q in workload.requests} == {3996}


def test_gpt_oss_tp2_async_maps_its_flags() -> None:
    run = _run("gpustack/gpt-oss-120b/h100/random-32k: gpt-oss-120b --async-scheduling -tp 2")
    mapped = map_run(run)
    assert isinstance(mapped, MappedRun)
    assert (mapped.options.model, mapped.options.hardware, mapped.options.tensor_parallel_size) == (
        "openai/gpt-oss-120b", "h100-sxm", 2)
    assert mapped.options.async_scheduling is True
    built = build_run_deployment(mapped)
    assert not isinstance(built, Refusal)
    deployment = built[0]
    assert deployment.parallel.tensor_parallel_size == 2
    assert deployment.scheduler_config.max_model_len == 131072   # the model's context: no flag, it fits
    assert (deployment.scheduler_config.max_num_seqs, deployment.scheduler_config.max_num_batched_tokens) == (
        1024, 8192)
    assert pricing_of(deployment).label == "measured"


def test_same_architecture_and_aic_row() -> None:
    run = _run("gpustack/deepseek-r1/h200/random-4k: DeepSeek-R1-0528 -tp 8")
    mapped = map_run(run)
    assert isinstance(mapped, MappedRun)
    assert mapped.options.model == SAME_ARCHITECTURE["deepseek-ai/DeepSeek-R1-0528"]
    assert mapped.options.model == "deepseek-ai/DeepSeek-R1"
    row = aic_row(run)
    assert isinstance(row, SiliconRow)
    assert (row.system, row.tp_size, row.attention_dp_size, row.moe_tp_size, row.moe_ep_size) == (
        "h200_sxm", 8, 1, 8, 1)
    assert (row.isl, row.osl, row.batch_size) == (run.prompt_tokens, 200, 500)  # all 500 fit max_num_seqs
    assert row.ttft_ms == run.measured.ttft.mean and row.source == run.url


def test_deepseek_v32_maps_its_flags_and_sparse_blocks() -> None:
    run = _run("gpustack/deepseek-v3.2/h200/random-1k: DeepSeek-V3.2 -tp 8 --tokenizer-mode deepseek_v32 "
               "--reasoning-parser deepseek_v3")
    assert (run.input_len, run.output_len, run.num_prompts, run.prompt_tokens) == (1000, 2000, 100, 1000)
    mapped = map_run(run)
    assert isinstance(mapped, MappedRun)
    o = mapped.options
    assert (o.model, o.hardware, o.tensor_parallel_size, o.async_scheduling) == (
        "deepseek-ai/DeepSeek-V3.2", "h200", 8, False)
    # no --block-size: the sparse indexer's 64-token kernel block, not the pinned 16
    assert o.block_size == 64
    assert any(n.startswith("--tokenizer-mode deepseek_v32 not modelled") for n in mapped.notes)
    assert any(n.startswith("--reasoning-parser deepseek_v3 not modelled") for n in mapped.notes)
    assert any("64-token KV blocks" in n for n in mapped.notes)
    built = build_run_deployment(mapped)
    assert not isinstance(built, Refusal)
    assert built[0].cache_config.block_size == 64
    row = aic_row(run)
    assert isinstance(row, SiliconRow)
    assert (row.system, row.tp_size, row.isl, row.osl, row.batch_size) == ("h200_sxm", 8, 1000, 2000, 100)


def test_chat_only_flags_need_a_value() -> None:
    run = dataclasses.replace(RUNS[0],
                              serve_command="vllm serve deepseek-ai/DeepSeek-R1-0528 --tokenizer-mode")
    refused = map_run(run)
    assert isinstance(refused, Refusal) and refused.reason == "server flag without a value"


def test_unknown_server_flags_are_refused() -> None:
    run = dataclasses.replace(RUNS[0], serve_command="vllm serve deepseek-ai/DeepSeek-R1-0528 --foo 1")
    refused = map_run(run)
    assert isinstance(refused, Refusal) and refused.reason == "server flag not mapped"
