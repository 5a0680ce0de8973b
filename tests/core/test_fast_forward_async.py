"""Fast-forward under async scheduling is exactly stepping vLLM's async engine loop.

A hypothesis differential test: random configs and requests driven through
the async loop (schedule the next batch, apply the older one's tokens); at
random points where ``decode_stretch_plan`` allows a stretch, a copy of the
scheduler steps it iteration by iteration while the original jumps with
``fast_forward_decode``. The two must agree on every request's tokens and
counters, the queues, the block tables, the free queue, the prefix cache
and the batch left in flight.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_properties import scheduler_configs

from kvsched import CacheConfig, ModelRunnerOutput, Request, SamplingParams, Scheduler, SchedulerConfig
from kvsched.core.fast_forward import decode_stretch_plan
from kvsched.core.output import SchedulerOutput


def _output_view(o: SchedulerOutput) -> tuple[Any, ...]:
    c = o.scheduled_cached_reqs
    return (o.num_scheduled_tokens, o.total_num_scheduled_tokens, [n.req_id for n in o.scheduled_new_reqs],
            c.req_ids, c.resumed_req_ids, c.new_block_ids, o.preempted_req_ids, o.finished_req_ids,
            o.scheduled_spec_decode_tokens, set(o.prefill_chunk_req_ids), o.admission_stop)


def _view(s: Scheduler) -> dict[str, Any]:
    kv = s.kv_cache_manager
    pool = kv.block_pool
    requests = {rid: tuple((name, copy.copy(getattr(r, name))) for name in Request.__slots__
                           if name not in ("block_hashes", "sampling_params", "prompt_tokens",
                                           "all_token_ids"))
                for rid, r in s.requests.items()}
    return {
        "requests": requests,
        "tokens": {rid: list(r.all_token_ids) for rid, r in s.requests.items()},
        "running": [r.request_id for r in s.running],
        "waiting": [r.request_id for r in s.waiting],
        "tables": dict(kv.req_to_blocks),
        "num_cached_block": dict(kv.num_cached_block),
        "free_queue": list(pool.free_queue),
        "ref_cnt": list(pool.ref_cnt),
        "cached": dict(pool.cached),
        "dups": {h: list(v) for h, v in pool.dup_cached.items()},
        "hash_of_block": dict(pool.hash_of_block),
        "finished_req_ids": set(s.finished_req_ids),
        "decode_stable": s.decode_stable,
        "in_flight": [_output_view(o) for o in s.in_flight_outputs],
    }


def _iteration(s: Scheduler, queue: list[SchedulerOutput], token: int) -> None:
    """One pass of vLLM's async engine loop (batch queue of 2)."""
    pop = bool(queue)
    if s.has_requests():
        out = s.schedule()
        queue.insert(0, out)
        pop = not (len(queue) < 2 and (out.total_num_scheduled_tokens > 0 or s.has_requests()))
    if pop:
        out = queue.pop()
        ids = list(out.num_scheduled_tokens)
        s.update_from_output(out, ModelRunnerOutput(
            ids, [[] if rid in out.prefill_chunk_req_ids else [token] for rid in ids]))
    s.check_invariants()


@st.composite
def roomy_configs(draw: st.DrawFn) -> tuple[SchedulerConfig, CacheConfig]:
    """Mostly caches and lengths with room for long decode stretches, and
    some of test_properties' tight ones."""
    if draw(st.integers(0, 3)) == 0:
        return draw(scheduler_configs())  # type: ignore[no-any-return]
    max_model_len = draw(st.integers(16, 160))
    seqs = draw(st.integers(1, 6))
    sched = SchedulerConfig(
        max_num_batched_tokens=draw(st.integers(max(seqs, 8), 96)), max_num_seqs=seqs,
        max_model_len=max_model_len, policy=draw(st.sampled_from(["fcfs", "priority"])),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 4])),
        scheduler_reserve_full_isl=draw(st.booleans()))
    cache = CacheConfig(num_gpu_blocks=draw(st.integers(8, 96)),
                        block_size=draw(st.sampled_from([1, 2, 4, 8])),
                        enable_prefix_caching=draw(st.booleans()))
    return sched, cache


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(roomy_configs(), st.data())
def test_async_stretch_equals_stepping(configs: Any, data: st.DataObject) -> None:
    sched_config, cache_config = configs
    s = Scheduler(dataclasses.replace(sched_config, async_scheduling=True), cache_config)
    usable = (cache_config.num_gpu_blocks - 1) * cache_config.block_size
    max_prompt = min(sched_config.max_model_len - 1, usable)
    queue: list[SchedulerOutput] = []
    for i in range(data.draw(st.integers(1, 6))):
        n = data.draw(st.integers(1, max(1, min(max_prompt, 40))))
        tokens = data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
        params = SamplingParams(max_tokens=data.draw(st.integers(1, max(1, min(120, usable + 1 - n)))),
                                eos_token_id=data.draw(st.sampled_from([None, None, 100])))
        try:
            s.add_request(Request(f"r{i}", tokens, params, arrival_time=float(i)))
        except ValueError:
            continue
    for _ in range(1000):
        if not s.has_requests() and not queue:
            break
        k, _, finishes = decode_stretch_plan(s)
        assert not finishes, "an async stretch never runs through a finish"
        if k > 1 and data.draw(st.integers(0, 3)) > 0:
            steps = data.draw(st.integers(1, k))
            stepped = copy.deepcopy(s)
            stepped_queue = [stepped.in_flight_outputs[0]]
            for _ in range(steps):
                _iteration(stepped, stepped_queue, 100)
            s.fast_forward_decode(steps, [100] * len(s.running))
            s.check_invariants()
            assert _view(s) == _view(stepped)
            assert queue and len(queue) == 1
            queue[0] = s.in_flight_outputs[0]
        _iteration(s, queue, 100)
    assert not s.has_requests() and not queue


def test_an_async_stretch_jumps_and_keeps_one_batch_in_flight() -> None:
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=128,
                                  async_scheduling=True),
                  CacheConfig(num_gpu_blocks=64, block_size=4, enable_prefix_caching=True))
    for i in range(3):
        s.add_request(Request(f"r{i}", [i + 1] * 6, SamplingParams(max_tokens=30)))
    queue: list[SchedulerOutput] = []
    for _ in range(4):
        _iteration(s, queue, 100)
    k, _, finishes = decode_stretch_plan(s)
    # Each request has 3 outputs and one more in flight: 30 - 4 iterations
    # until the next token would be the last one.
    assert (k, finishes) == (26, False)
    stepped = copy.deepcopy(s)
    stepped_queue = [stepped.in_flight_outputs[0]]
    for _ in range(10):
        _iteration(stepped, stepped_queue, 100)
    s.fast_forward_decode(10, [100] * 3)
    assert _view(s) == _view(stepped)
    assert [len(r.output_token_ids) for r in s.running] == [13, 13, 13]
    with pytest.raises(ValueError, match="does not run through a finish"):
        s.fast_forward_decode_finishing(1, [100] * 3, [100] * 3)
