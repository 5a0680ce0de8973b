"""The TTFT split (kvsched.sim.ttft_parts): per request its parts add up to
its TTFT on every kind of run (colocated, async, data-parallel replicas and
lockstep ranks, offloading, P/D with and without offloading or host terms),
the parts that can be priced by hand are, and the results' statistics are
the parts' own."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from kvsched.perf.hardware import get_hardware
from kvsched.sim.deployment import EngineOptions, build_deployment
from kvsched.sim.disagg import DisaggResult
from kvsched.sim.flags import parse_spec
from kvsched.sim.metrics import RecordTable
from kvsched.sim.run import prepare, run, serve_disaggregated
from kvsched.sim.simulator import SimConfig, Simulator
from kvsched.sim.ttft_parts import (
    COLOCATED_PARTS,
    DISAGGREGATED_PARTS,
    FloatArray,
    PhaseTable,
    colocated_parts,
    summary,
)
from kvsched.sim.workload import UNIQUE_TOKEN_BASE, Workload, WorkloadRequest

MODEL = "meta-llama/Llama-3.1-8B"
MOE = "Qwen3-30B-A3B"
# Llama-3.1-8B's KV per token: 32 layers x 8 KV heads x 128 x (K, V) x 2 bytes.
KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2
# The tight caches and block sizes below are vLLM 0.33's 16-token blocks:
# those cases simulate 0.33 (the default release, 0.34, has 64-token blocks).
VLLM_0_33 = ("--vllm-version", "0.33")


def flags(*extra: str, prompts: int = 24, rate: str = "8", model: str = MODEL,
          backend: str = "roofline") -> list[str]:
    return ["--model", model, "--hardware", "h100-sxm", "--step-time-backend", backend,
            "--dataset-name", "random", "--num-prompts", str(prompts), "--request-rate", rate,
            "--random-input-len", "1500", "--random-output-len", "32", "--random-range-ratio", "0.5",
            "--random-prefix-len", "512", "--seed", "5", "--max-model-len", "4096", *extra]


def ttfts(records: RecordTable) -> FloatArray:
    return np.array(records.first_token_time) - np.array(records.send_time)


def assert_adds_up(parts: dict[str, FloatArray], records: RecordTable) -> None:
    """Per request, the parts sum to its TTFT up to float rounding, none
    negative beyond it."""
    expected = ttfts(records)
    assert len(expected) == len(records) > 0
    for i, ttft in enumerate(expected):
        values = [float(v[i]) for v in parts.values()]
        assert math.isclose(sum(values), ttft, rel_tol=1e-12, abs_tol=1e-12), (records.request_id[i], values)
        assert min(values) >= -1e-12, (records.request_id[i], dict(zip(parts, values)))


def colocated(*extra: str, **kw: Any) -> tuple[dict[str, FloatArray], RecordTable, dict[str, Any]]:
    r = run(parse_spec(flags(*extra, **kw)))
    res = r.result
    parts = colocated_parts(res.records, res.phases, res.kv_offload is not None)
    return parts, res.records, r.metrics


def disaggregated(*extra: str, **kw: Any) -> tuple[DisaggResult, dict[str, Any]]:
    spec = parse_spec(flags(*extra, **kw))
    prepared = prepare(spec)
    assert prepared.prefill_deployment is not None
    result = serve_disaggregated(prepared.prefill_deployment, prepared.deployment, prepared.spec,
                                 prepared.accepted)
    return result, run(spec).metrics


@pytest.mark.parametrize("extra", [
    (), ("--async-scheduling",), ("--no-enable-chunked-prefill",), ("--max-num-batched-tokens", "512"),
    ("--num-gpu-blocks-override", "300", *VLLM_0_33),  # preemptions: recomputes count as prefill
    ("-dp", "2"), ("--kv-offloading-size", "4"), ("--kv-offloading-size", "4", "--async-scheduling"),
], ids=["plain", "async", "no-chunked", "chunked-512", "preempting", "dp2", "offload", "offload-async"])
def test_colocated_parts_add_up_per_request(extra: tuple[str, ...]) -> None:
    parts, records, metrics = colocated(*extra)
    offloading = "--kv-offloading-size" in extra
    assert tuple(parts) == tuple(p for p in COLOCATED_PARTS if offloading or p != "offload_load")
    assert_adds_up(parts, records)
    # The results' statistics are the parts' (means in ms, numpy's percentiles).
    saved = metrics["ttft_parts_ms"]
    assert list(saved) == list(parts)
    for name, seconds in parts.items():
        assert saved[name]["mean"] == pytest.approx(1e3 * float(np.mean(seconds)), rel=1e-12, abs=1e-12)
        p99 = 1e3 * float(np.percentile(seconds, 99))
        assert saved[name]["p99"] == pytest.approx(p99, rel=1e-12, abs=1e-12)
    assert sum(p["mean"] for p in saved.values()) == pytest.approx(metrics["mean_ttft_ms"], rel=1e-12)
    if "--num-gpu-blocks-override" in extra:
        assert metrics["num_preemptions"] > 0


def test_lockstep_ranks_parts_add_up() -> None:
    parts, records, metrics = colocated("-dp", "2", "--enable-expert-parallel", "--max-num-seqs", "8",
                                        model=MOE)
    assert_adds_up(parts, records)
    assert metrics["ttft_parts_ms"]["queue"]["p90"] > 0  # eight seats per rank: requests wait


def test_host_terms_make_the_arrival_part() -> None:
    parts, records, _ = colocated(backend="measured", prompts=8)
    assert_adds_up(parts, records)
    # The API server's handling and tokenisation before the engine sees it.
    assert np.all(parts["arrival"] > 0)


def test_a_lone_request_has_no_queue_and_prefills_in_one_step() -> None:
    # Kernel time only (no arrival delay): the whole TTFT is the prefill.
    parts, records, _ = colocated("--calibration", "none", prompts=1)
    assert parts["queue"].tolist() == [0.0] and parts["arrival"].tolist() == [0.0]
    assert parts["prefill"].tolist() == ttfts(records).tolist()
    # With the default host terms the roofline's request spends its arrival
    # delay (API server, tokenisation) before the prefill, and still no queue.
    parts, records, _ = colocated(prompts=1)
    assert parts["queue"].tolist() == [0.0] and parts["arrival"][0] > 0
    assert parts["arrival"][0] + parts["prefill"][0] == pytest.approx(ttfts(records)[0], rel=1e-12)


def doc_workload() -> Workload:
    """Documents A, B, C of 512 tokens (32 blocks) and 8 tokens of question,
    one at a time, then A again: the 64-block GPU cache holds two, so A's
    second prompt loads its 512 tokens from CPU memory (tests/sim/test_offload_sim.py)."""
    doc = {name: (100 + i, 512) for i, name in enumerate("ABC")}

    def req(i: int, name: str, at: float) -> WorkloadRequest:
        return WorkloadRequest(f"{name}{i}", at, (doc[name], (UNIQUE_TOKEN_BASE + i, 8)), 4)

    return Workload("docs", (req(0, "A", 0.0), req(1, "B", 1.0), req(2, "C", 2.0), req(3, "A", 3.0)))


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_cpu_hit_loaded_is_its_own_part(async_scheduling: bool) -> None:
    deployment = build_deployment(EngineOptions(
        model=MODEL, hardware="h100-sxm", step_time_backend="roofline", max_model_len=960,
        num_gpu_blocks_override=64, kv_offloading_size=1.0, async_scheduling=async_scheduling,
        vllm_version="0.33"))  # 0.33's 16-token blocks: the doc workload's 32 per document
    config = SimConfig(deployment.scheduler_config, deployment.cache_config, deployment.step_model,
                       offload=deployment.offload)
    result = Simulator(config, doc_workload()).run()
    parts = colocated_parts(result.records, result.phases, True)
    assert_adds_up(parts, result.records)
    load = dict(zip(result.records.request_id, parts["offload_load"].tolist()))
    # 32 blocks of 16 tokens x 128 KiB over the 64 GB/s host link, the link idle.
    assert load == {"A0": 0.0, "B1": 0.0, "C2": 0.0, "A3": pytest.approx(32 * 16 * KV_BYTES_PER_TOKEN / 64e9)}


@pytest.mark.parametrize("extra", [
    ("--disaggregation", "1P1D"), ("--disaggregation", "2P1D", "--async-scheduling"),
    ("--disaggregation", "1P2D", "--kv-offloading-size", "4"),
    ("--disaggregation", "1P1D", "--num-gpu-blocks-override", "300", *VLLM_0_33),
], ids=["1P1D", "2P1D-async", "1P2D-offload", "1P1D-tight-decode"])
def test_disaggregated_parts_add_up_per_request(extra: tuple[str, ...]) -> None:
    result, metrics = disaggregated(*extra, rate="12")
    parts = result.ttft_parts
    offloading = "--kv-offloading-size" in extra
    assert tuple(parts) == tuple(p for p in DISAGGREGATED_PARTS if offloading or p != "offload_load")
    assert_adds_up(parts, result.combined.records)
    assert np.all(parts["transfer"] > 0) and np.all(parts["first_token_step"] > 0)
    if "--num-gpu-blocks-override" in extra:
        # 300 blocks on the decode instance: legs wait for blocks before their read starts.
        assert parts["decode_admission"].max() > 0.1
    elif extra == ("--disaggregation", "1P1D"):
        assert parts["decode_admission"].max() > 0  # one behind another's step
    # The old four-part means (ttft_split_ms) are sums of the new parts.
    old = metrics["ttft_split_ms"]
    new = {name: 1e3 * float(np.mean(v)) for name, v in parts.items()}
    prefill_leg = sum(new[p] for p in ("arrival", "queue", "offload_load", "prefill") if p in new)
    assert old["prefill_leg_ms"] == pytest.approx(prefill_leg, rel=1e-9)
    assert old["hop_ms"] == pytest.approx(new["hop"], rel=1e-9, abs=1e-9)
    rest = new["decode_admission"] + new["transfer"] + new["decode_queue"] + new["first_token_step"]
    assert old["kv_wait_and_read_ms"] + old["decode_first_step_ms"] == pytest.approx(rest, rel=1e-9)
    saved = metrics["ttft_parts_ms"]
    assert {k: v["mean"] for k, v in saved.items()} == pytest.approx(new, rel=1e-12, abs=1e-12)


def test_a_lone_pd_request_reads_its_kv_at_the_links_price() -> None:
    result, _ = disaggregated("--disaggregation", "1P1D", *VLLM_0_33, prompts=1, backend="measured")
    parts = result.ttft_parts
    assert_adds_up(parts, result.combined.records)
    # Alone: no queue on either side before the read; the hop pays the decode
    # API server's handling (host terms).
    assert parts["queue"].tolist() == parts["decode_admission"].tolist() == [0.0]
    assert parts["hop"][0] > 0 and parts["arrival"][0] > 0
    tokens = result.combined.records.num_prompt_tokens[0]
    blocks = -(-tokens // 16)
    h100_bytes = blocks * 16 * KV_BYTES_PER_TOKEN
    h100 = get_hardware("h100-sxm")
    assert parts["transfer"][0] == pytest.approx(h100.comm_latency_s + h100_bytes / h100.scaleup_bw, rel=1e-9)


def test_summary_is_mean_median_p90_p99_in_ms() -> None:
    parts = {"queue": np.array([0.0, 0.001, 0.002, 0.010]), "prefill": np.array([0.02, 0.02, 0.02, 0.02])}
    out = summary(parts)
    assert list(out) == ["queue", "prefill"]
    assert out["queue"] == pytest.approx({"mean": 3.25, "median": 1.5, "p90": 7.6, "p99": 9.76})
    assert out["prefill"] == pytest.approx({"mean": 20.0, "median": 20.0, "p90": 20.0, "p99": 20.0})
    assert summary({"queue": np.array([])}) == {}


def test_misaligned_phases_are_a_bug_not_a_silent_split() -> None:
    records = RecordTable()
    records.append("a", 0.0, 1.0, 2.0, 10, 2, 0.0)
    with pytest.raises(AssertionError, match="not aligned"):
        colocated_parts(records, PhaseTable(), False)


@pytest.mark.parametrize("extra", [(), ("--async-scheduling",), ("--disaggregation", "1P1D"),
                                   ("--kv-offloading-size", "4")], ids=["sync", "async", "1P1D", "offload"])
def test_fast_forward_keeps_every_part(extra: tuple[str, ...]) -> None:
    # Stretches of decode steps change no request's phases: the same floats.
    fast = run(parse_spec(flags(*extra, prompts=16))).metrics["ttft_parts_ms"]
    stepped = run(parse_spec(flags(*extra, "--no-fast-forward", prompts=16))).metrics["ttft_parts_ms"]
    assert fast == stepped
