"""The simulator: exact fast-forward, request accounting, time bookkeeping."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from kvsched.config import CacheConfig, SchedulerConfig
from kvsched.perf import get_hardware, get_model
from kvsched.perf.step_time import BatchShape, StepTimeModel
from kvsched.sim.simulator import SimConfig, SimResult, Simulator
from kvsched.sim.workload import Workload, WorkloadRequest, random_workload

MODEL = StepTimeModel(get_model("Llama-3.1-8B"), get_hardware("h100-sxm"))

# Varied workloads: each (name, scheduler kwargs, cache kwargs, workload kwargs, eos probability).
CASES: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any], float]] = [
    ("roomy_caching", {}, {"num_gpu_blocks": 4000}, {"request_rate": 20.0}, 0.0),
    ("no_caching", {}, {"num_gpu_blocks": 4000, "enable_prefix_caching": False},
     {"request_rate": 20.0}, 0.0),
    ("tight_kv_preempts", {}, {"num_gpu_blocks": 120}, {"request_rate": 50.0}, 0.0),
    ("all_at_once_shared_prefix", {"max_num_seqs": 16}, {"num_gpu_blocks": 400},
     {"prefix_len": 64}, 0.0),
    ("eos_sampling", {}, {"num_gpu_blocks": 2000}, {"request_rate": 30.0}, 0.02),
    ("priority_small_blocks", {"policy": "priority"}, {"num_gpu_blocks": 700, "block_size": 4},
     {"request_rate": 40.0}, 0.0),
    ("chunked_off_threshold", {"enable_chunked_prefill": False, "max_num_batched_tokens": 2048,
                               "max_model_len": 2048, "long_prefill_token_threshold": 64},
     {"num_gpu_blocks": 300}, {"request_rate": 25.0}, 0.0),
    ("max_concurrency", {}, {"num_gpu_blocks": 3000}, {"max_concurrency": 5}, 0.0),
]


def _run(case: tuple[str, dict[str, Any], dict[str, Any], dict[str, Any], float],
         fast_forward: bool) -> tuple[SimResult, Simulator]:
    _, sched_kw, cache_kw, wl_kw, eos = case
    sc = SchedulerConfig(**{"max_num_batched_tokens": 512, "max_num_seqs": 32,
                            "max_model_len": 4096, **sched_kw})
    cc = CacheConfig(**{"block_size": 16, "enable_prefix_caching": True, **cache_kw})
    workload = random_workload(num_prompts=60, input_len=200, output_len=120, range_ratio=0.5,
                               seed=7, **wl_kw)
    sim = Simulator(SimConfig(sc, cc, MODEL, eos_probability=eos, seed=3, fast_forward=fast_forward),
                    workload)
    return sim.run(), sim


def _comparable(result: SimResult) -> dict[str, Any]:
    metrics = result.metrics()
    for key in ("simulation_wall_seconds", "fast_forwarded_steps"):
        metrics.pop(key)
    steps = {f.name: list(getattr(result.steps, f.name)) for f in dataclasses.fields(result.steps)}
    return {"metrics": metrics, "records": [dataclasses.astuple(r) for r in result.records],
            "failed": result.failed, "steps": steps, "itls": sorted(result.itls.to_array().tolist())}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fast_forward_is_exact(case: tuple[str, dict[str, Any], dict[str, Any], dict[str, Any], float]
                               ) -> None:
    stepped, stepped_sim = _run(case, fast_forward=False)
    jumped, jumped_sim = _run(case, fast_forward=True)
    assert stepped.num_fast_forwarded_steps == 0
    assert jumped.num_fast_forwarded_steps > 0, "the case never fast-forwarded"
    assert _comparable(jumped) == _comparable(stepped)
    # The KV cache ends in the same state: free-queue order and every cached hash.
    a = stepped_sim.sched.kv_cache_manager.block_pool
    b = jumped_sim.sched.kv_cache_manager.block_pool
    assert list(a.free_queue) == list(b.free_queue)
    assert a.block_hash == b.block_hash and a.cached == b.cached and a.dup_cached == b.dup_cached
    jumped_sim.sched.check_invariants()


def test_preemption_case_preempts() -> None:
    result, _ = _run(CASES[2], fast_forward=True)
    assert result.num_preemptions > 0


def test_every_request_is_accounted_for() -> None:
    result, _ = _run(CASES[0], fast_forward=True)
    assert len(result.records) + len(result.failed) == 60
    for r in result.records:
        assert r.send_time <= r.first_token_time <= r.finish_time
        assert r.num_output_tokens >= 1


def _single_request_workload(prompt: int, output: int) -> Workload:
    req = WorkloadRequest("only", 0.0, ((5, prompt),), output)
    return Workload("one", (req,))


def test_single_request_timing_is_the_sum_of_its_steps() -> None:
    # One request alone: one prefill step, then one decode step per further token.
    sc = SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=8, max_model_len=4096)
    cc = CacheConfig(num_gpu_blocks=100, block_size=16, enable_prefix_caching=False)
    result = Simulator(SimConfig(sc, cc, MODEL), _single_request_workload(100, 5)).run()
    prefill = MODEL.step_time(BatchShape(100, 1, 1, 0, 0, 100, 100, 100 * 101 // 2))
    decodes = [MODEL.step_time(BatchShape.decode(1, 100 + i + 1)) for i in range(4)]
    (record,) = result.records
    assert record.first_token_time == pytest.approx(prefill, rel=1e-12)
    assert record.finish_time == pytest.approx(prefill + sum(decodes), rel=1e-12)
    assert record.num_output_tokens == 5
    assert len(result.steps) == 5


def test_a_request_that_cannot_fit_is_reported_failed_not_dropped() -> None:
    sc = SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=8, max_model_len=4096)
    cc = CacheConfig(num_gpu_blocks=10, block_size=16, enable_prefix_caching=False)
    result = Simulator(SimConfig(sc, cc, MODEL), _single_request_workload(500, 5)).run()
    assert not result.records
    assert [rid for rid, _ in result.failed] == ["only"]
    assert "KV blocks" in result.failed[0][1]


def test_idle_gaps_are_skipped_not_stepped() -> None:
    reqs = (WorkloadRequest("a", 0.0, ((5, 50),), 3), WorkloadRequest("b", 100.0, ((6, 50),), 3))
    sc = SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=8, max_model_len=4096)
    cc = CacheConfig(num_gpu_blocks=100, block_size=16)
    result = Simulator(SimConfig(sc, cc, MODEL), Workload("gap", reqs)).run()
    b = next(r for r in result.records if r.request_id == "b")
    assert b.send_time == 100.0 and b.first_token_time > 100.0
    assert len(result.steps) == 6  # 3 per request, none while idle


def test_eos_probability_shortens_outputs_deterministically() -> None:
    one, _ = _run(CASES[4], fast_forward=True)
    two, _ = _run(CASES[4], fast_forward=True)
    lengths = [r.num_output_tokens for r in one.records]
    assert lengths == [r.num_output_tokens for r in two.records]
    assert sum(lengths) < sum(60 * [120]) and min(lengths) >= 1


def test_max_concurrency_holds_requests_client_side() -> None:
    result, _ = _run(CASES[7], fast_forward=True)
    assert max(result.steps.num_running) <= 5
    # All 60 arrive at t=0, but only 5 are sent at once.
    assert sum(1 for r in result.records if r.send_time == 0.0) == 5
    assert not math.isnan(result.duration)
