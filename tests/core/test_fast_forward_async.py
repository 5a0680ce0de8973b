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
from kvsched.config import BATCH_QUEUE_SIZE
from kvsched.core.fast_forward import decode_stretch_plan, fast_forward_decode, fast_forward_decode_finishing
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
        pop = not (len(queue) < BATCH_QUEUE_SIZE and (out.total_num_scheduled_tokens > 0 or s.has_requests()))
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
        # The token every step samples (100) stops requests whose EOS it is.
        k, _, finishes = decode_stretch_plan(s, lambda r: 1 if 100 in r.all_stop_ids else 1 << 40)
        if finishes:
            assert not s.waiting, "an async stretch ends with a finish only when nothing waits"
        if k >= 1 and data.draw(st.integers(0, 3)) > 0:
            steps = data.draw(st.integers(1, k))
            stepped = copy.deepcopy(s)
            stepped_queue = [stepped.in_flight_outputs[0]]
            for _ in range(steps):
                _iteration(stepped, stepped_queue, 100)
            n = len(s.running)
            if finishes and steps == k:
                _, outputs = fast_forward_decode_finishing(s, steps, [100] * n, [100] * n)
                assert outputs
            else:
                fast_forward_decode(s, steps, [100] * n)
            s.check_invariants()
            assert _view(s) == _view(stepped)
            assert queue and len(queue) == 1
            queue[:] = list(s.in_flight_outputs)
        _iteration(s, queue, 100)
    assert not s.has_requests() and not queue


def test_an_async_stretch_jumps_and_keeps_one_batch_in_flight() -> None:
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=128,
                                  async_scheduling=True),
                  CacheConfig(num_gpu_blocks=64, block_size=4, enable_prefix_caching=True))
    for i in range(3):
        s.add_request(Request(f"r{i}", [i + 1] * 6, SamplingParams(max_tokens=30, eos_token_id=0)))
    queue: list[SchedulerOutput] = []
    for _ in range(4):
        _iteration(s, queue, 100)
    k, _, finishes = decode_stretch_plan(s)
    # Each request has 3 outputs and one more in flight: 30 - 4 iterations
    # until the next token would be the last one, and the one that applies it.
    assert (k, finishes) == (27, True)
    assert decode_stretch_plan(s, through_finish=False) == (26, 3 * 9, False)
    stepped = copy.deepcopy(s)
    stepped_queue = [stepped.in_flight_outputs[0]]
    for _ in range(10):
        _iteration(stepped, stepped_queue, 100)
    fast_forward_decode(s, 10, [100] * 3)
    assert _view(s) == _view(stepped)
    assert [len(r.output_token_ids) for r in s.running] == [13, 13, 13]
    with pytest.raises(ValueError, match="length stops only"):
        fast_forward_decode_finishing(s, 1, [100] * 3, [100, 0, 100])  # 0: r1's EOS


def _async_scheduler(max_tokens: list[int], prompt_len: int = 6) -> tuple[Scheduler, list[SchedulerOutput]]:
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=128,
                                  async_scheduling=True),
                  CacheConfig(num_gpu_blocks=64, block_size=4, enable_prefix_caching=True))
    for i, m in enumerate(max_tokens):
        s.add_request(Request(f"r{i}", [i + 1] * prompt_len, SamplingParams(max_tokens=m, eos_token_id=0)))
    return s, []


def test_an_async_stretch_runs_through_length_stops_and_leaves_the_rest_in_flight() -> None:
    s, queue = _async_scheduler([9, 30, 9])
    for _ in range(4):
        _iteration(s, queue, 100)
    # r0 and r2 have 3 outputs and one in flight: the 6th iteration from
    # here applies their 9th token.
    assert decode_stretch_plan(s) == (6, 3 * 9, True)
    assert decode_stretch_plan(s, through_finish=False) == (5, 3 * 9, False)
    stepped = copy.deepcopy(s)
    stepped_queue = [stepped.in_flight_outputs[0]]
    for _ in range(6):
        _iteration(stepped, stepped_queue, 100)
    _, outputs = fast_forward_decode_finishing(s, 6, [100] * 3, [100] * 3)
    assert [(o.request_id, o.finish_reason) for o in outputs] == [("r0", "length"), ("r2", "length")]
    assert _view(s) == _view(stepped)
    # The batch left in flight is r1's alone (vLLM schedules nothing for a
    # request whose batch in flight reaches its max_tokens).
    assert list(s.in_flight_outputs[0].num_scheduled_tokens) == ["r1"]


def test_an_async_stretch_ending_every_request_leaves_nothing_in_flight() -> None:
    s, queue = _async_scheduler([9, 9])
    for _ in range(4):
        _iteration(s, queue, 100)
    k, _, finishes = decode_stretch_plan(s)
    assert (k, finishes) == (6, True)
    stepped = copy.deepcopy(s)
    stepped_queue = [stepped.in_flight_outputs[0]]
    for _ in range(6):
        _iteration(stepped, stepped_queue, 100)
    fast_forward_decode_finishing(s, 6, [100] * 2, [100] * 2)
    assert not s.in_flight_outputs and not s.running
    assert _view(s) == _view(stepped)


def test_an_async_stretch_starts_with_a_prefill_in_flight() -> None:
    s, queue = _async_scheduler([30, 30])
    for _ in range(4):
        _iteration(s, queue, 100)
    s.add_request(Request("late", [7] * 10, SamplingParams(max_tokens=20)))
    _iteration(s, queue, 100)  # admits it: its prefill is in flight
    late = s.requests["late"]
    assert not late.output_token_ids and s.in_flight_outputs[0].num_scheduled_tokens["late"] == 10
    k, kv_tokens, _ = decode_stretch_plan(s)
    # late: its first token, 18 more, and the iteration that applies its 20th.
    assert (k, kv_tokens) == (20, 2 * (6 + 4) + 10), [r.num_tokens for r in s.running]
    stepped = copy.deepcopy(s)
    stepped_queue = [stepped.in_flight_outputs[0]]
    for _ in range(5):
        _iteration(stepped, stepped_queue, 100)
    fast_forward_decode(s, 5, [100] * 3)
    assert _view(s) == _view(stepped)
    assert len(late.output_token_ids) == 5


def test_an_async_stretch_does_not_end_with_a_finish_while_requests_wait() -> None:
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=2, max_model_len=128,
                                  async_scheduling=True),
                  CacheConfig(num_gpu_blocks=64, block_size=4, enable_prefix_caching=True))
    for i, m in enumerate([9, 30, 9]):
        s.add_request(Request(f"r{i}", [i + 1] * 6, SamplingParams(max_tokens=m)))
    queue: list[SchedulerOutput] = []
    for _ in range(4):
        _iteration(s, queue, 100)
    assert [r.request_id for r in s.waiting] == ["r2"] and s.decode_stable
    assert decode_stretch_plan(s) == (5, 2 * 9, False)
    with pytest.raises(ValueError, match="nothing waits"):
        fast_forward_decode_finishing(s, 6, [100] * 2, [100] * 2)
