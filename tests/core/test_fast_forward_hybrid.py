"""Fast-forward over hybrid KV caches (full attention and sliding windows) is
exactly stepping: a hypothesis differential test.

Random layouts (one sliding group, as Mistral; full attention beside one or
two windows, as gpt-oss and Gemma; two full-attention groups), windows from
below one block to several, block sizes that differ between groups, every
retention interval vLLM takes (0, None, a multiple of the scheduler block),
prefix caching on and off,
synchronous or async scheduling (vLLM's engine loop, one batch in flight),
requests sharing prefixes and pools from tight (preemption) to roomy. At
random points where ``decode_stretch_plan`` allows a stretch, a copy steps
it while the original jumps: every request, every group's table and cached
count, the pool (free queue order, reference counts, hashes and their
duplicates), the batch left in flight (its new blocks per group) and the
free count after each step must agree.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from sched_helpers import scheduler_state

from kvsched import CacheConfig, ModelRunnerOutput, Request, SamplingParams, Scheduler, SchedulerConfig
from kvsched.config import BATCH_QUEUE_SIZE, KVCacheGroup
from kvsched.core.fast_forward import (
    decode_stretch_plan,
    fast_forward_decode,
    fast_forward_decode_finishing,
    stretch_refusal,
)
from kvsched.core.hybrid_kv_cache import HybridBlocks, HybridKVCacheManager
from kvsched.core.output import SchedulerOutput

EXAMPLES = int(os.environ.get("KVSCHED_FUZZ_EXAMPLES", "150"))
FUZZ_SEED = os.environ.get("KVSCHED_FUZZ_SEED")
# What the fuzzer reached (printed with -s): stretches compared, their
# steps, those during which a window freed blocks, async ones, finishing ones.
REACHED = {"stretches": 0, "steps": 0, "freed": 0, "async": 0, "finishing": 0, "waiting": 0,
           "kv_waiting": 0}


def _blocks_view(blocks: list[int]) -> Any:
    if isinstance(blocks, HybridBlocks):
        return list(blocks), [list(g) for g in blocks.per_group]
    return list(blocks)


def _output_view(o: SchedulerOutput) -> tuple[Any, ...]:
    c = o.scheduled_cached_reqs
    return (o.num_scheduled_tokens, o.total_num_scheduled_tokens, [n.req_id for n in o.scheduled_new_reqs],
            c.req_ids, c.resumed_req_ids, {rid: _blocks_view(b) for rid, b in c.new_block_ids.items()},
            o.preempted_req_ids, o.finished_req_ids, set(o.prefill_chunk_req_ids), o.admission_stop)


def _view(s: Scheduler) -> dict[str, Any]:
    kv = s.kv_cache_manager
    assert isinstance(kv, HybridKVCacheManager)
    return {
        **scheduler_state(s),
        "tables": [{rid: list(t) for rid, t in m.tables.items()} for m in kv.managers],
        "num_cached_block": [dict(m.num_cached_block) for m in kv.managers],
        "req_to_blocks": {rid: list(t) for rid, t in kv.req_to_blocks.items()},
        "shared_prefix_boundary": dict(kv.shared_prefix_boundary),
        "num_free": kv.block_pool.num_free,
        "num_preemptions": s.num_preemptions,
        "in_flight": [_output_view(o) for o in s.in_flight_outputs],
    }


@st.composite
def hybrid_caches(draw: st.DrawFn) -> CacheConfig:
    """Full attention and sliding windows in the layouts models use, with
    random windows, block sizes and retention intervals."""
    layout = draw(st.sampled_from(["swa", "full+swa", "full+swa", "full+swa+swa", "swa+full", "full+full"]))
    sizes = [1, 2, 4, 8, 16]
    groups: list[KVCacheGroup] = []
    for kind in layout.split("+"):
        bs = draw(st.sampled_from(sizes))
        if kind == "full":
            groups.append(KVCacheGroup("full_attention", bs))
        else:
            groups.append(KVCacheGroup("sliding_window", bs, sliding_window=draw(st.integers(1, 40))))
    if draw(st.booleans()):
        # Most models: one block size for every group.
        groups = [dataclasses.replace(g, block_size=groups[0].block_size) for g in groups]
    scheduler_block = math.lcm(*(g.block_size for g in groups))
    retention = draw(st.sampled_from([0, 0, None, scheduler_block, 2 * scheduler_block,
                                      4 * scheduler_block]))
    if layout == "full+full" and retention:
        retention = 0  # vLLM refuses an interval without a sliding group
    return CacheConfig(num_gpu_blocks=draw(st.integers(8, 200)), block_size=scheduler_block,
                       enable_prefix_caching=draw(st.booleans()), kv_groups=tuple(groups),
                       prefix_cache_retention_interval=retention)


def _iteration(s: Scheduler, queue: list[SchedulerOutput], token: int | dict[str, int]) -> None:
    """One step (sync) or one pass of vLLM's async engine loop; ``token``:
    what every request samples, or each request's."""
    if isinstance(token, int):
        token = dict.fromkeys(s.requests, token) | dict.fromkeys(
            [rid for o in queue for rid in o.num_scheduled_tokens], token)
    if not s.async_scheduling:
        out = s.schedule()
        ids = list(out.num_scheduled_tokens)
        s.update_from_output(out, ModelRunnerOutput(
            ids, [[] if rid in out.prefill_chunk_req_ids else [token[rid]] for rid in ids]))
        s.check_invariants()
        return
    pop = bool(queue)
    if s.has_requests():
        out = s.schedule()
        queue.insert(0, out)
        pop = not (len(queue) < BATCH_QUEUE_SIZE and (out.total_num_scheduled_tokens > 0 or s.has_requests()))
    if pop:
        out = queue.pop()
        ids = list(out.num_scheduled_tokens)
        s.update_from_output(out, ModelRunnerOutput(
            ids, [[] if rid in out.prefill_chunk_req_ids else [token[rid]] for rid in ids]))
    s.check_invariants()


@settings(max_examples=EXAMPLES, deadline=None, derandomize=FUZZ_SEED is None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@seed(int(FUZZ_SEED or 0))
@given(hybrid_caches(), st.data())
def test_hybrid_stretch_equals_stepping(cache_config: CacheConfig, data: st.DataObject) -> None:
    async_scheduling = data.draw(st.booleans())
    max_model_len = data.draw(st.integers(32, 200))
    seqs = data.draw(st.integers(1, 6))
    chunked = data.draw(st.booleans())
    budget = data.draw(st.integers(max(seqs, 8), 96))
    sched_config = SchedulerConfig(
        max_num_batched_tokens=budget if chunked else max(budget, max_model_len), max_num_seqs=seqs,
        max_model_len=max_model_len, policy=data.draw(st.sampled_from(["fcfs", "priority"])),
        enable_chunked_prefill=chunked, long_prefill_token_threshold=data.draw(st.sampled_from([0, 0, 4])),
        async_scheduling=async_scheduling)
    s = Scheduler(sched_config, cache_config)
    queue: list[SchedulerOutput] = []
    prefix = data.draw(st.lists(st.integers(1, 3), max_size=30))
    # Each request samples a token of its own, never in a prompt (the
    # module's premise, as the simulator's: a stretch's blocks cannot
    # become another request's prefix hit); sometimes it is its EOS.
    sampled: dict[str, int] = {}
    eos = data.draw(st.booleans())
    for i in range(data.draw(st.integers(1, 8))):
        n = data.draw(st.integers(1, 60))
        tokens = (prefix + data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n)))[
            :max_model_len - 1]
        sampled[f"r{i}"] = 100 + i
        params = SamplingParams(max_tokens=data.draw(st.integers(1, 120)),
                                eos_token_id=100 + i if eos and data.draw(st.booleans()) else None)
        try:
            s.add_request(Request(f"r{i}", tokens, params, arrival_time=float(i),
                                  priority=data.draw(st.integers(0, 2))))
        except ValueError:
            continue
    for _ in range(600):
        if not s.has_requests() and not queue:
            break
        k, _, finishes = decode_stretch_plan(
            s, lambda r: 1 if sampled[r.request_id] in r.all_stop_ids else 1 << 40)
        if k >= 1 and data.draw(st.integers(0, 3)) > 0:
            steps = data.draw(st.integers(1, k))
            n = len(s.running)
            # Requests wait and only the KV cache (the head's need) holds them.
            REACHED["kv_waiting"] += bool(s.waiting) and n < seqs and n < sched_config.max_num_batched_tokens
            REACHED["waiting"] += bool(s.waiting)
            stepped = copy.deepcopy(s)
            stepped_queue = list(stepped.in_flight_outputs)
            free_each: list[int] = []
            for _ in range(steps):
                _iteration(stepped, stepped_queue, sampled)
                free_each.append(stepped.kv_cache_manager.block_pool.get_num_free_blocks())
            mine = [sampled[r.request_id] for r in s.running]
            if finishes and steps == k:
                free_after, _ = fast_forward_decode_finishing(s, steps, mine, mine)
            else:
                free_after = fast_forward_decode(s, steps, mine)
            s.check_invariants()
            REACHED["stretches"] += 1
            REACHED["steps"] += steps
            REACHED["freed"] += any(b > a for a, b in pairwise(free_each))
            REACHED["async"] += async_scheduling
            REACHED["finishing"] += finishes and steps == k
            assert free_after == free_each
            assert _view(s) == _view(stepped)
            queue[:] = list(s.in_flight_outputs)
        _iteration(s, queue, sampled)
    if os.environ.get("KVSCHED_FUZZ_REPORT"):
        print("REACHED", REACHED)


def test_refuses_chunked_local_and_mamba_groups() -> None:
    for group in (KVCacheGroup("chunked_local_attention", 4, attention_chunk_size=16),
                  KVCacheGroup("mamba", 4)):
        cache = CacheConfig(num_gpu_blocks=64, block_size=4, enable_prefix_caching=False,
                            kv_groups=(KVCacheGroup("full_attention", 4), group))
        s = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=128), cache)
        s.add_request(Request("r0", [1, 2, 3], SamplingParams(max_tokens=50)))
        for _ in range(3):
            _iteration(s, [], 7)
        why = stretch_refusal(s)
        assert why is not None and group.kind.split("_")[0] in why.replace("Mamba", "mamba")


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_gpt_oss_like_layout_jumps(async_scheduling: bool) -> None:
    # Full attention beside a 128-token window, 16-token blocks: the stretch
    # frees the blocks leaving the window as it goes.
    cache = CacheConfig(num_gpu_blocks=200, block_size=16, kv_groups=(
        KVCacheGroup("full_attention", 16), KVCacheGroup("sliding_window", 16, sliding_window=128)))
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=4, max_model_len=1024,
                                  async_scheduling=async_scheduling), cache)
    for i in range(3):
        s.add_request(Request(f"r{i}", [i + 1] * (100 + 37 * i), SamplingParams(max_tokens=400)))
    queue: list[SchedulerOutput] = []
    while not decode_stretch_plan(s, through_finish=False)[0]:
        _iteration(s, queue, 7)
    k = decode_stretch_plan(s, through_finish=False)[0]
    # Past what the blocks free at its start would last: the stretch takes
    # again the blocks its windows free.
    taken_without_frees = 3 * 2 * -(-k // 16)
    assert k > 200 and taken_without_frees > s.kv_cache_manager.block_pool.num_free
    stepped = copy.deepcopy(s)
    stepped_queue = list(stepped.in_flight_outputs)
    free_each = []
    for _ in range(k):
        _iteration(stepped, stepped_queue, 7)
        free_each.append(stepped.kv_cache_manager.block_pool.get_num_free_blocks())
    assert fast_forward_decode(s, k, [7] * 3) == free_each
    assert _view(s) == _view(stepped)
    # The window freed blocks mid-stretch: the free count rose at some step.
    assert any(b > a for a, b in pairwise(free_each))


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_window_releasing_a_shared_block_frees_nothing(async_scheduling: bool) -> None:
    # r1 adopts r0's cached prefix; r0's window passes those blocks during
    # the stretch while r1's still holds them: they return to the pool only
    # with r1's release, so on a tight pool the stretch must not count them
    # as room for new blocks (stepping would preempt).
    prefix = [1, 2, 3] * 30
    compared = 0
    for num_blocks in range(330, 420, 6):
        cache = CacheConfig(num_gpu_blocks=num_blocks, block_size=1, prefix_cache_retention_interval=None,
                            kv_groups=(KVCacheGroup("full_attention", 1),
                                       KVCacheGroup("sliding_window", 1, sliding_window=100)))
        s = Scheduler(SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=4, max_model_len=512,
                                      async_scheduling=async_scheduling), cache)
        s.add_request(Request("r0", prefix + [2] * 50, SamplingParams(max_tokens=150, ignore_eos=True)))
        sampled = {"r0": 100, "r1": 101}
        queue: list[SchedulerOutput] = []
        for _ in range(3):
            _iteration(s, queue, sampled)
        s.add_request(Request("r1", prefix + [3] * 5, SamplingParams(max_tokens=150, ignore_eos=True)))
        for _ in range(200):
            k = decode_stretch_plan(s, through_finish=False)[0]
            if k:
                stepped = copy.deepcopy(s)
                stepped_queue = list(stepped.in_flight_outputs)
                free_each = []
                for _ in range(k):
                    _iteration(stepped, stepped_queue, sampled)
                    free_each.append(stepped.kv_cache_manager.block_pool.get_num_free_blocks())
                assert fast_forward_decode(s, k, [sampled[r.request_id] for r in s.running]) == free_each
                assert _view(s) == _view(stepped)
                compared += 1
                queue[:] = list(s.in_flight_outputs)
            if not s.has_requests():
                break
            _iteration(s, queue, sampled)
    assert compared
