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
from sched_helpers import scheduler_state
from test_properties import scheduler_configs

from kvsched import CacheConfig, ModelRunnerOutput, Request, SamplingParams, Scheduler, SchedulerConfig
from kvsched.config import BATCH_QUEUE_SIZE
from kvsched.core.fast_forward import decode_stretch_plan, fast_forward_decode, fast_forward_decode_finishing
from kvsched.core.kv_connector import KVTransferConfig
from kvsched.core.offloading_connector import OffloadingConnector, OffloadingWorker
from kvsched.core.offloading_manager import LRUPolicy
from kvsched.core.output import KVConnectorOutput, SchedulerOutput


def _output_view(o: SchedulerOutput) -> tuple[Any, ...]:
    c = o.scheduled_cached_reqs
    return (o.num_scheduled_tokens, o.total_num_scheduled_tokens, [n.req_id for n in o.scheduled_new_reqs],
            c.req_ids, c.resumed_req_ids, c.new_block_ids, o.preempted_req_ids, o.finished_req_ids,
            o.scheduled_spec_decode_tokens, set(o.prefill_chunk_req_ids), o.admission_stop)


def _view(s: Scheduler) -> dict[str, Any]:
    kv = s.kv_cache_manager
    return {**scheduler_state(s), "tables": dict(kv.req_to_blocks),
            "num_cached_block": dict(kv.num_cached_block),
            "in_flight": [_output_view(o) for o in s.in_flight_outputs]}


def _iteration(s: Scheduler, queue: list[SchedulerOutput], token: int,
               worker: OffloadingWorker | None = None,
               reports: dict[int, KVConnectorOutput] | None = None) -> None:
    """One pass of vLLM's async engine loop (batch queue of 2). With an
    offloading connector its (oracle) worker runs each batch as it is
    scheduled; its report goes with that batch's output (``reports``, by
    the SchedulerOutput's id)."""
    pop = bool(queue)
    if s.has_requests():
        out = s.schedule()
        if worker is not None and reports is not None:
            reports[id(out)] = worker.capture(out.kv_connector_metadata)[0]
        queue.insert(0, out)
        pop = not (len(queue) < BATCH_QUEUE_SIZE and (out.total_num_scheduled_tokens > 0 or s.has_requests()))
    if pop:
        out = queue.pop()
        ids = list(out.num_scheduled_tokens)
        s.update_from_output(out, ModelRunnerOutput(
            ids, [[] if rid in out.prefill_chunk_req_ids else [token] for rid in ids], None,
            reports.pop(id(out), None) if reports is not None else None))
    s.check_invariants()


def _worker_idle(worker: OffloadingWorker) -> bool:
    """Nothing in flight: no report can change the scheduler (the caller's
    side of the stretch precondition)."""
    return not worker.due_at and not any(worker.unsubmitted)


def _offloading(draw: st.DrawFn, cache_config: CacheConfig) -> tuple[OffloadingConnector, OffloadingWorker]:
    connector = OffloadingConnector(
        KVTransferConfig(kv_role="kv_both", kv_connector="OffloadingConnector"), cache_config.block_size,
        num_cpu_blocks=draw(st.sampled_from([1, 3, 8, 64])),
        blocks_per_chunk=draw(st.sampled_from([1, 2])),
        eviction_policy=draw(st.sampled_from(["lru", "arc"])),
        enable_prefix_caching=cache_config.enable_prefix_caching)
    worker = OffloadingWorker(load_steps=draw(st.integers(1, 3)), store_steps=draw(st.integers(1, 3)))
    return connector, worker


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
    # One time in three vLLM's OffloadingConnector (CPU cache, stores, loads).
    connector, worker = (_offloading(data.draw, cache_config) if data.draw(st.integers(0, 2)) == 0
                         else (None, None))
    s = Scheduler(dataclasses.replace(sched_config, async_scheduling=True), cache_config,
                  kv_connector=connector)
    reports: dict[int, KVConnectorOutput] = {}
    if connector is not None:
        connector.bind_kv_cache_manager(s.kv_cache_manager)
    usable = (cache_config.num_gpu_blocks - 1) * cache_config.block_size
    max_prompt = min(sched_config.max_model_len - 1, usable)
    queue: list[SchedulerOutput] = []
    for i in range(data.draw(st.integers(1, 6))):
        # (A one-token prompt loaded whole from the CPU asks the connector
        # again for ever: a livelock of vLLM 0.33's, not drawn.)
        n = data.draw(st.integers(1 if connector is None else 2, max(2, min(max_prompt, 40))))
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
        if k >= 1 and (worker is None or _worker_idle(worker)) and data.draw(st.integers(0, 3)) > 0:
            steps = data.draw(st.integers(1, k))
            stepped, stepped_worker = copy.deepcopy((s, worker))
            stepped_queue = [stepped.in_flight_outputs[0]]
            stepped_reports = {}
            if id(queue[0]) in reports:
                stepped_reports[id(stepped_queue[0])] = copy.deepcopy(reports[id(queue[0])])
            for _ in range(steps):
                _iteration(stepped, stepped_queue, 100, stepped_worker, stepped_reports)
            n = len(s.running)
            if finishes and steps == k:
                _, outputs = fast_forward_decode_finishing(s, steps, [100] * n, [100] * n)
                assert outputs
            else:
                fast_forward_decode(s, steps, [100] * n)
            s.check_invariants()
            if worker is not None:
                # The stretch's batches, each with the connector's idle metadata.
                assert connector is not None and stepped_worker is not None
                old_report = reports.pop(id(queue[0]), None)
                for _ in range(steps):
                    report, _ = worker.capture(connector.idle_metadata())
                    assert not report.finished_recving and report.kv_connector_worker_meta is None
                if s.in_flight_outputs:
                    reports[id(s.in_flight_outputs[0])] = report
                assert old_report is None or old_report.kv_connector_worker_meta is None
                assert vars(worker) == vars(stepped_worker)
                assert _offload_view(connector) == _offload_view(stepped.connector)
            assert _view(s) == _view(stepped)
            assert queue and len(queue) == 1
            queue[:] = list(s.in_flight_outputs)
        _iteration(s, queue, 100, worker, reports)
    assert not s.has_requests() and not queue


def test_an_async_stretch_with_offloading_jumps_once_the_stores_are_done() -> None:
    cache = CacheConfig(num_gpu_blocks=64, block_size=4, enable_prefix_caching=True)
    config = KVTransferConfig(kv_role="kv_both", kv_connector="OffloadingConnector")
    connector = OffloadingConnector(config, 4, num_cpu_blocks=16, enable_prefix_caching=True)
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=128,
                                  async_scheduling=True), cache, kv_connector=connector)
    connector.bind_kv_cache_manager(s.kv_cache_manager)
    worker = OffloadingWorker()
    reports: dict[int, KVConnectorOutput] = {}
    s.add_request(Request("a", [1] * 9 + [2] * 3, SamplingParams(max_tokens=40), arrival_time=0.0))
    s.add_request(Request("b", [3] * 8, SamplingParams(max_tokens=40), arrival_time=0.0))
    queue: list[SchedulerOutput] = []
    # The prefills' stores (3 and 2 chunks of 4 tokens) are placed with the
    # batch after them and complete one batch later.
    for _ in range(4):
        _iteration(s, queue, 100, worker, reports)
    assert len(connector.manager.policy.chunks) == 5  # type: ignore[attr-defined]
    assert not connector.jobs and not worker.due_at
    k, _, _ = decode_stretch_plan(s)
    # Each request may decode up to its 40th token: a stretch to the first stop.
    assert k >= 30
    stepped, stepped_worker = copy.deepcopy((s, worker))
    stepped_queue = [stepped.in_flight_outputs[0]]
    for _ in range(20):
        _iteration(stepped, stepped_queue, 100, stepped_worker, {})
    fast_forward_decode(s, 20, [100, 100])
    for _ in range(20):
        report, _ = worker.capture(connector.idle_metadata())
        assert report.kv_connector_worker_meta is None
    assert _view(s) == _view(stepped)
    assert vars(worker) == vars(stepped_worker)
    assert _offload_view(connector) == _offload_view(stepped.connector)


def _offload_view(connector: Any) -> tuple[Any, ...]:
    """The connector's state: its requests, jobs and CPU cache."""
    assert isinstance(connector, OffloadingConnector)
    policy = connector.manager.policy
    chunks = policy.chunks if isinstance(policy, LRUPolicy) else {**policy.t1, **policy.t2}  # type: ignore
    return ({rid: (list(st.keys), list(st.block_ids), st.next_stored_chunk, st.num_local_tokens,
                   dict(st.access.positions), set(st.jobs)) for rid, st in connector.reqs.items()},
            set(connector.jobs), connector.next_job_id,
            {k: (c.chunk_id, c.ref_cnt) for k, c in chunks.items()},
            dict(policy.ranks) if isinstance(policy, LRUPolicy) else None)


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
