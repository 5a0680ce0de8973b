"""Scheduler.fast_forward_decode leaves exactly the state of stepping one by one."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kvsched import CacheConfig, ModelRunnerOutput, Request, SamplingParams, Scheduler, SchedulerConfig


def _state(s: Scheduler) -> dict[str, Any]:
    kv = s.kv_cache_manager
    pool = kv.block_pool
    return {
        "running": [(r.request_id, list(r.all_token_ids), r.num_computed_tokens,
                     list(kv.req_to_blocks[r.request_id])) for r in s.running],
        "waiting": [r.request_id for r in s.waiting],
        "free_queue": list(pool.free_queue),
        "ref_cnt": list(pool.ref_cnt),
        "cached": dict(pool.cached),
        "dups": {h: list(v) for h, v in pool.dup_cached.items()},
        "hash_of_block": dict(pool.hash_of_block),
        "num_cached_block": dict(kv.num_cached_block),
    }


def _step(s: Scheduler, tokens: dict[str, int]) -> None:
    out = s.schedule()
    ids = list(out.num_scheduled_tokens)
    s.update_from_output(out, ModelRunnerOutput(
        ids, [[] if s.requests[r].is_prefill_chunk else [tokens[r]] for r in ids]))
    s.check_invariants()


def _build(prompts: list[list[int]], caching: bool, num_blocks: int, block_size: int = 4,
           policy: str = "fcfs", max_tokens: int = 200) -> Scheduler:
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=16, max_model_len=512,
                                  policy=policy),
                  CacheConfig(num_gpu_blocks=num_blocks, block_size=block_size,
                              enable_prefix_caching=caching))
    for i, p in enumerate(prompts):
        s.add_request(Request(f"r{i}", p, SamplingParams(max_tokens=max_tokens, ignore_eos=True)))
    return s


def _compare(s: Scheduler, tokens: dict[str, int], k: int) -> None:
    stepped, jumped = copy.deepcopy(s), copy.deepcopy(s)
    free_each = []
    for _ in range(k):
        _step(stepped, tokens)
        free_each.append(stepped.kv_cache_manager.block_pool.get_num_free_blocks())
    assert jumped.fast_forward_decode(k, [tokens[r.request_id] for r in jumped.running]) == free_each
    jumped.check_invariants()
    assert _state(jumped) == _state(stepped)


@pytest.mark.parametrize("caching", [True, False])
def test_distinct_requests(caching: bool) -> None:
    s = _build([[1, 2, 3, 4, 5], [6, 7, 8], list(range(10, 31))], caching, 80)
    tokens = {"r0": 101, "r1": 102, "r2": 103}
    _step(s, tokens)
    _compare(s, tokens, 23)


def test_identical_requests_register_duplicate_hashes_in_stepping_order() -> None:
    # Same prompt and same sampled tokens: every decode block of r1 repeats a
    # hash r0 registers in the same step, so the duplicate lists must come out
    # in stepping order.
    s = _build([[9] * 7, [9] * 7], True, 60)
    tokens = {"r0": 5, "r1": 5}
    _step(s, tokens)
    _compare(s, tokens, 17)
    assert s.kv_cache_manager.block_pool.dup_cached == {}  # (before the stretch)


def test_stretch_after_a_preemption_and_resume() -> None:
    # Two requests outgrow the cache: the second is preempted, resumes with
    # a prefix hit on its own freed blocks, and both then decode.
    s = _build([[1] * 4, [2] * 4], True, 10, block_size=2, max_tokens=12)
    tokens = {"r0": 7, "r1": 8}
    for _ in range(30):
        _step(s, tokens)
        if s.num_preemptions and not s.waiting and len(s.running) >= 1 and all(
                r.num_computed_tokens == len(r.all_token_ids) - 1 for r in s.running):
            break
    assert s.num_preemptions, "setup should preempt"
    assert s.kv_cache_manager.prefix_cache_stats.preempted_hits > 0
    remaining = min(r.stop_len - len(r.all_token_ids) for r in s.running)
    _compare(s, tokens, max(1, min(remaining - 1, 3)))


def test_refuses_a_stretch_that_would_stop_or_preempt() -> None:
    s = _build([[1, 2, 3], [4, 5, 6]], True, 3, max_tokens=6)
    _step(s, {"r0": 5, "r1": 6})
    before = _state(s)
    with pytest.raises(ValueError, match="more blocks"):
        s.fast_forward_decode(2, [5, 6])
    with pytest.raises(ValueError, match="stop"):
        s.fast_forward_decode(5, [5, 6])
    assert _state(s) == before
