"""fast_forward_decode leaves exactly the state of stepping one by one."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kvsched import CacheConfig, ModelRunnerOutput, Request, SamplingParams, Scheduler, SchedulerConfig
from kvsched.core.fast_forward import decode_stretch_plan, fast_forward_decode, fast_forward_decode_finishing


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
    assert fast_forward_decode(jumped, k, [tokens[r.request_id] for r in jumped.running]) == free_each
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
        fast_forward_decode(s, 2, [5, 6])
    with pytest.raises(ValueError, match="stop"):
        fast_forward_decode(s, 5, [5, 6])
    assert _state(s) == before


# -- decode_stretch_limit: the one owner of fast-forward's preconditions -------

def decode_stretch_limit(s: Scheduler, steps_to_stop: Any = None) -> tuple[int, int]:
    """The plan of a stretch that stops before any request stops."""
    steps, kv_tokens, finishes = decode_stretch_plan(s, steps_to_stop, through_finish=False)
    assert not finishes
    return steps, kv_tokens


def test_limit_counts_steps_before_the_length_cap_and_the_callers_stop() -> None:
    s = _build([[1, 2, 3], [4, 5, 6, 7]], False, 200, max_tokens=10)
    _step(s, {"r0": 5, "r1": 6})
    _step(s, {"r0": 5, "r1": 6})
    # Both have 2 outputs; the 10th output ends each, so steps 0..6 are safe.
    assert decode_stretch_limit(s) == (7, 3 + 2 + 4 + 2)
    # The caller's model stops r1 at the step that samples its 4th further token.
    assert decode_stretch_limit(s, lambda r: 4 if r.request_id == "r1" else 1 << 40)[0] == 3


def test_limit_is_zero_until_every_request_has_its_first_token() -> None:
    # A chunked prefill that leaves exactly one prompt token looks like a
    # decode to the scheduler, but its first token is still to come (issue 9).
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=512,
                                  long_prefill_token_threshold=8),
                  CacheConfig(num_gpu_blocks=100, block_size=4, enable_prefix_caching=False))
    s.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=50, ignore_eos=True)))
    _step(s, {"a": 7})
    s.add_request(Request("b", list(range(10, 27)), SamplingParams(max_tokens=50, ignore_eos=True)))
    _step(s, {"a": 7, "b": 8})  # b: 8 of 17
    _step(s, {"a": 7, "b": 8})  # b: 16 of 17, nothing waits
    b = s.requests["b"]
    assert b.num_computed_tokens == len(b.all_token_ids) - 1 and not b.output_token_ids
    assert s.decode_stable
    assert decode_stretch_limit(s) == (0, 0)
    with pytest.raises(ValueError, match="not decoding"):
        fast_forward_decode(s, 3, [7, 8])
    _step(s, {"a": 7, "b": 8})  # b samples its first token
    assert decode_stretch_limit(s)[0] > 0


def test_limit_is_zero_while_admission_is_unsettled() -> None:
    s = _build([[1, 2, 3]], False, 200)
    _step(s, {"r0": 5})
    assert decode_stretch_limit(s)[0] > 0
    s.add_request(Request("late", [9, 9], SamplingParams(max_tokens=5, ignore_eos=True)))
    assert not s.decode_stable and decode_stretch_limit(s) == (0, 0)
    with pytest.raises(ValueError, match="not settled"):
        fast_forward_decode(s, 2, [5])
    _step(s, {"r0": 5, "late": 6})  # admits it; nothing waits any more
    assert s.decode_stable and not s.waiting
    s.finish_requests("late")  # nothing waits: a freed slot changes no admission
    assert s.decode_stable


def test_a_finish_unsettles_admission_only_when_something_waits() -> None:
    # max_num_seqs=1 holds "b" back for a stable reason; freeing the slot
    # (an abort or a finish) lets it in, so the stretch must stop.
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1, max_model_len=512),
                  CacheConfig(num_gpu_blocks=100, block_size=4, enable_prefix_caching=False))
    s.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True)))
    s.add_request(Request("b", [4, 5, 6], SamplingParams(max_tokens=3, ignore_eos=True)))
    _step(s, {"a": 7, "b": 8})
    _step(s, {"a": 7, "b": 8})  # pure decode, b held by max_num_seqs
    assert s.decode_stable and decode_stretch_limit(s)[0] == 0  # a stops next step
    _step(s, {"a": 7, "b": 8})  # a finishes
    assert not s.decode_stable


def test_limit_is_zero_with_an_admission_policy() -> None:
    from kvsched.core.policies import PrefillCadence

    s = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=512),
                  CacheConfig(num_gpu_blocks=100, block_size=4), admission_policy=PrefillCadence(2))
    s.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=50, ignore_eos=True)))
    _step(s, {"a": 7})
    _step(s, {"a": 7})
    assert s.decode_stable and decode_stretch_limit(s) == (0, 0)


def test_limit_stops_before_the_pool_runs_dry() -> None:
    # block_size 4, 8 usable blocks, 3 requests of 1 prompt token: after the
    # first step each holds one block and 5 are free. Decode step j computes
    # position 1 + j, which needs a new block at j = 3 (3 blocks, 2 left) and
    # j = 7 (3 more, only 2): 7 steps fit, the 8th preempts.
    s = _build([[1], [2], [3]], False, 9, max_tokens=20)
    tokens = {"r0": 5, "r1": 6, "r2": 7}
    _step(s, tokens)
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == 5
    assert decode_stretch_limit(s)[0] == 7
    for _ in range(7):
        _step(s, tokens)
    assert s.num_preemptions == 0
    _step(s, tokens)
    assert s.num_preemptions == 1


# -- stretches that end with the step in which requests stop ------------------

def _compare_finishing(s: Scheduler, tokens: dict[str, int], last: dict[str, int], k: int) -> list[str]:
    """Step k-1 times with ``tokens`` and once with ``last``, against one
    finishing jump; returns the ids that finished."""
    stepped, jumped = copy.deepcopy(s), copy.deepcopy(s)
    free_each = []
    for step in range(k):
        sample = tokens if step < k - 1 else last
        out = stepped.schedule()
        ids = list(out.num_scheduled_tokens)
        result = stepped.update_from_output(out, ModelRunnerOutput(ids, [[sample[r]] for r in ids]))
        stepped.check_invariants()
        free_each.append(stepped.kv_cache_manager.block_pool.get_num_free_blocks())
    order = [r.request_id for r in jumped.running]
    free_after, outputs = fast_forward_decode_finishing(jumped,
        k, [tokens[r] for r in order], [last[r] for r in order])
    jumped.check_invariants()
    assert free_after == free_each
    assert outputs == result.finished
    assert _state(jumped) == _state(stepped)
    assert jumped.finished_req_ids == stepped.finished_req_ids
    assert jumped.decode_stable == stepped.decode_stable
    return [o.request_id for o in outputs]


@pytest.mark.parametrize("caching", [True, False])
def test_finishing_stretch_by_length_cap_equals_stepping(caching: bool) -> None:
    # max_tokens 12: after one step each request has 1 output; r0 (prompt 5)
    # and r1 (prompt 3) reach 12 outputs at the 11th further step.
    s = _build([[1, 2, 3, 4, 5], [6, 7, 8], list(range(10, 31))], caching, 80, max_tokens=12)
    s.requests["r2"].stop_len += 5  # r2 runs on (a longer cap)
    tokens = {"r0": 101, "r1": 102, "r2": 103}
    _step(s, tokens)
    assert decode_stretch_plan(s) == (11, 6 + 4 + 22, True)
    assert _compare_finishing(s, tokens, tokens, 11) == ["r0", "r1"]


def test_finishing_stretch_by_eos_and_stop_token_equals_stepping() -> None:
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=16, max_model_len=512),
                  CacheConfig(num_gpu_blocks=80, block_size=4, enable_prefix_caching=True))
    s.add_request(Request("e", [1, 2, 3], SamplingParams(max_tokens=50, eos_token_id=7)))
    s.add_request(Request("t", [4, 5], SamplingParams(max_tokens=50, ignore_eos=True,
                                                      stop_token_ids=[9])))
    s.add_request(Request("o", [6], SamplingParams(max_tokens=50, ignore_eos=True)))
    tokens = {"e": 11, "t": 12, "o": 13}
    _step(s, tokens)
    # The caller's model samples EOS for "e" and stop token 9 for "t" at the 6th step.
    assert decode_stretch_plan(s, lambda r: 6 if r.request_id != "o" else 1 << 40) == (6, 4 + 3 + 2, True)
    assert _compare_finishing(s, tokens, {"e": 7, "t": 9, "o": 13}, 6) == ["e", "t"]


def test_finishing_stretch_refuses_a_stop_before_its_last_step() -> None:
    s = _build([[1, 2, 3]], False, 80, max_tokens=4)
    _step(s, {"r0": 5})
    before = _state(s)
    with pytest.raises(ValueError, match="stop"):
        fast_forward_decode_finishing(s, 5, [5], [5])
    assert _state(s) == before
