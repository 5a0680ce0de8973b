"""Private prompts (kvsched.sim.workload.prompt_shares_nothing): the KV cache
manager names their blocks by position instead of hashing tokens. Proven the
same cache by running random workloads twice - private requests keyed, and
every request hashed from a plain token list - and requiring identical
decisions, block ids, free-queue order, prefix-cache statistics and (through
the simulator, fast-forward included) identical metrics."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsched import CacheConfig, ModelRunnerOutput, Request, SamplingParams, Scheduler, SchedulerConfig
from kvsched.core.output import SchedulerOutput
from kvsched.perf import get_hardware, get_model
from kvsched.perf.step_time import StepTimeModel
from kvsched.sim.simulator import SimConfig, SimResult, Simulator
from kvsched.sim.workload import (
    HASH_BLOCK_TOKEN_BASE,
    UNIQUE_TOKEN_BASE,
    Workload,
    WorkloadRequest,
    prompt_shares_nothing,
    random_workload,
)
from kvsched.sim.workload import model as workload_module

SHARED_TOKENS = (1, 2)  # shared-prefix tokens, as the random dataset's
# Configs, and per request: arrival step, its output token, keyed and hashed copies.
Scenario = tuple[SchedulerConfig, CacheConfig, list[tuple[int, int, Request, Request]]]


@st.composite
def prompt_runs(draw: st.DrawFn, index: int) -> tuple[tuple[int, int], ...]:
    """Private prompts, shared prefixes before private content, and
    Mooncake-like hash blocks (shared, at several alignments)."""
    kind = draw(st.sampled_from(["private", "private_then_shared", "prefix", "hash_blocks"]))
    own = (UNIQUE_TOKEN_BASE + index, draw(st.integers(1, 14)))
    if kind == "private":
        return (own,)
    if kind == "private_then_shared":
        return (own, (draw(st.sampled_from(SHARED_TOKENS)), draw(st.integers(1, 10))))
    if kind == "prefix":
        return ((draw(st.sampled_from(SHARED_TOKENS)), draw(st.integers(1, 12))), own)
    ids = draw(st.lists(st.integers(0, 2), min_size=1, max_size=3))
    return tuple((HASH_BLOCK_TOKEN_BASE + h, draw(st.sampled_from([4, 8, 3]))) for h in ids)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    max_model_len = 64
    chunked = draw(st.booleans())
    sc = SchedulerConfig(
        max_num_batched_tokens=draw(st.integers(8, 64)) if chunked else max_model_len,
        max_num_seqs=draw(st.integers(1, 6)),
        max_model_len=max_model_len, enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 5, 16])),
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        scheduler_reserve_full_isl=draw(st.booleans()))
    # Few blocks: preemptions, evictions of cached blocks, re-admission hits.
    cc = CacheConfig(num_gpu_blocks=draw(st.integers(40 // block_size + 2, 200 // block_size + 2)),
                     block_size=block_size, enable_prefix_caching=True)
    n = draw(st.integers(1, 9))
    specs = [WorkloadRequest(f"r{i}", float(draw(st.integers(0, 12))), draw(prompt_runs(i)),
                             draw(st.integers(1, 12))) for i in range(n)]
    workload = Workload("w", tuple(specs))  # checks the request-unique first tokens
    out = []
    for spec in workload.requests:
        params = SamplingParams(max_tokens=spec.output_len, ignore_eos=True)
        keyed = spec.to_request(params, spec.arrival_time)
        hashed = Request(spec.request_id, spec.prompt_token_ids(), params, arrival_time=spec.arrival_time)
        assert not hashed.private and keyed.private == prompt_shares_nothing(spec.prompt_runs)
        keyed.priority = hashed.priority = draw(st.integers(0, 2))
        # Sampled tokens are unique per request and apart from every prompt token.
        out.append((int(spec.arrival_time), 2**50 + int(spec.request_id[1:]), keyed, hashed))
    return sc, cc, out


def _view(out: SchedulerOutput) -> dict[str, Any]:
    cached = out.scheduled_cached_reqs
    return {
        "scheduled": list(out.num_scheduled_tokens.items()),
        "new": [(n.req_id, n.prompt_token_ids, n.block_ids, n.num_computed_tokens)
                for n in out.scheduled_new_reqs],
        "cached": (cached.req_ids, sorted(cached.resumed_req_ids), cached.new_block_ids,
                   cached.num_computed_tokens, cached.resumed_token_ids),
        "preempted": sorted(out.preempted_req_ids), "finished": sorted(out.finished_req_ids),
        "stop": out.admission_stop,
    }


def _pool_view(sched: Scheduler) -> tuple[Any, ...]:
    """Everything observable: the free queue in order, reference counts,
    block tables, statistics, and the hit every waiting request would get now
    (private blocks may lack an entry until their owner is preempted, so the
    cache maps themselves are compared through their lookups)."""
    kv = sched.kv_cache_manager
    pool = kv.block_pool
    hits = {r.request_id: kv.get_computed_blocks(r) for r in sched.waiting}
    return (list(pool.free_queue), pool.ref_cnt, kv.req_to_blocks, kv.num_cached_block, hits,
            dataclasses.astuple(kv.prefix_cache_stats), sched.num_preemptions)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios())
def test_private_keys_schedule_exactly_as_hashing(
        scenario: Scenario) -> None:
    sc, cc, requests = scenario
    keyed, hashed = Scheduler(sc, cc), Scheduler(sc, cc)
    token_of = {k.request_id: token for _, token, k, _ in requests}
    for step in range(400):
        for arrive, _, k, h in requests:
            if arrive == step:
                refused = []
                for sched, r in ((keyed, k), (hashed, h)):
                    try:
                        sched.add_request(r)
                        refused.append(None)
                    except ValueError as e:
                        refused.append(str(e))
                assert refused[0] == refused[1]
        if not hashed.has_unfinished_requests():
            assert not keyed.has_unfinished_requests()
            if step > 12:
                break
            continue
        outs = keyed.schedule(), hashed.schedule()
        assert _view(outs[0]) == _view(outs[1]), f"step {step}"
        sampled = [[] if hashed.requests[rid].is_prefill_chunk else [token_of[rid]]
                   for rid in outs[1].num_scheduled_tokens]
        results = [sched.update_from_output(out, ModelRunnerOutput(list(out.num_scheduled_tokens), sampled))
                   for sched, out in zip((keyed, hashed), outs)]
        assert results[0].outputs() == results[1].outputs()
        assert _pool_view(keyed) == _pool_view(hashed), f"step {step}"
        keyed.check_invariants()
    else:
        pytest.fail("did not finish in 400 steps")


# -- through the simulator: fast-forward and metrics --------------------------

MODEL = StepTimeModel(get_model("Llama-3.1-8B"), get_hardware("h100-sxm"))


def _comparable(result: SimResult) -> dict[str, Any]:
    metrics = result.metrics()
    metrics.pop("simulation_wall_seconds")
    steps = {f.name: list(getattr(result.steps, f.name)) for f in dataclasses.fields(result.steps)}
    return {"metrics": metrics, "records": [dataclasses.astuple(r) for r in result.records],
            "steps": steps, "queries": result.prefix_cache_queries, "hits": result.prefix_cache_hits}


@settings(max_examples=12, deadline=None, derandomize=True)
@given(st.sampled_from([0, 0, 48]), st.integers(60, 400), st.integers(0, 3), st.booleans(),
       st.sampled_from([0.0, 0.05]))
def test_simulated_metrics_equal_with_full_hashing(prefix_len: int, num_gpu_blocks: int, seed: int,
                                                   mooncake_like: bool, eos: float) -> None:
    sc = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=24, max_model_len=2048)
    cc = CacheConfig(num_gpu_blocks=num_gpu_blocks, block_size=16, enable_prefix_caching=True)
    workload = random_workload(num_prompts=40, input_len=160, output_len=90, range_ratio=0.5,
                               prefix_len=prefix_len, request_rate=40.0, seed=seed)
    if mooncake_like:  # every third request made of shared 512-token hash blocks instead
        workload = Workload("mixed", tuple(
            WorkloadRequest(r.request_id, r.arrival_time,
                            ((HASH_BLOCK_TOKEN_BASE + i % 2, 512), (HASH_BLOCK_TOKEN_BASE + 5 + i % 3, 40))
                            if i % 3 == 0 else r.prompt_runs, r.output_len)
            for i, r in enumerate(workload.requests)))
    config = SimConfig(sc, cc, MODEL, eos_probability=eos, seed=seed)
    keyed = _comparable(Simulator(config, workload).run())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(workload_module, "prompt_shares_nothing", lambda runs: False)
        hashed = _comparable(Simulator(config, workload).run())
    assert keyed == hashed
    assert keyed["metrics"]["num_preemptions"] > 0 or num_gpu_blocks > 150 or prefix_len


def test_workload_refuses_a_shared_request_unique_token() -> None:
    a = WorkloadRequest("a", 0.0, ((UNIQUE_TOKEN_BASE + 3, 5),), 2)
    b = WorkloadRequest("b", 1.0, ((UNIQUE_TOKEN_BASE + 3, 7),), 2)
    with pytest.raises(ValueError, match="both start with token"):
        Workload("w", (a, b))
    # Later in a prompt it is no privacy claim: allowed.
    Workload("w", (a, WorkloadRequest("c", 1.0, ((1, 4), (UNIQUE_TOKEN_BASE + 3, 7)), 2)))
